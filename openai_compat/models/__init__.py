"""The model lifecycle: served names to loaded entries (`registry.py`), loading them
(`loading.py`, checked first by `preflight.py`), lazy loads, leases and unloads (`pool.py`,
`slots.py`) within a memory budget (`memory.py`), each entry's exact cache (`cache.py`), and
the offline demo models (`demo.py`)."""
