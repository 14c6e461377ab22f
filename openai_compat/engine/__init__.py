"""The engine side: the adapter over infinity-emb's internals (see adapter.py)."""
