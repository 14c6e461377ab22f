"""The engines behind one set of calls: the native engine on sentence-transformers 6 and
transformers (`native.py`, its scheduler, runners and exported backends; the default), the
model-free `debug.py`, and infinity-emb's engine where that optional package is installed
(`infinity/`, the only place that reads its internals). `adapter.py` answers the server's
questions for either."""
