"""Cohere's API (embed and rerank, v1 and v2): wire types in protocol.py, routes in embed.py and
rerank.py."""
