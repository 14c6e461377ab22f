"""infinity-emb's own server API (0.0.78): wire types in protocol.py, routes in routes.py."""
