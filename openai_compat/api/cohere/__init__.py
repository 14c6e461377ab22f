"""Cohere's embed API (v1 and v2): wire types in protocol.py, routes in embed.py."""
