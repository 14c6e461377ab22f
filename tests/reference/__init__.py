"""Reference implementations run in environments of their own (scripts run in a subprocess)."""
