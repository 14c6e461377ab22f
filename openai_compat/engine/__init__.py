"""The engines behind one interface (contract.py's Engine): the native engine on
sentence-transformers 6 and transformers (`native.py`, its scheduler, runners and exported
backends; the default), the model-free `debug.py`, and infinity-emb's engine where that
optional package is installed (`infinity/`, the only place that imports it). `build.py`
decides which engine runs a model and builds and stops them."""
