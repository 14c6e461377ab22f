"""The original tutorial's API (models by model_index): types in protocol.py, routes."""
