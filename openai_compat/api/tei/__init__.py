"""Hugging Face text-embeddings-inference's API: wire types in protocol.py, routes in routes.py."""
