"""OpenAI- and Cohere-compatible HTTP server for self-hosted embedding models on infinity-emb."""

__version__ = "0.1.0"
