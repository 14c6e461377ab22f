"""infinity-emb's engine (optional: its own environment, requirements/infinity.txt), and
everything that knows its internals: `internals.py` (the attributes of its engine, replicas,
batching queue and tokenizers this server reads, checked as a contract), `hooks.py` (what we
install in it: token counts, token-id inputs, raw logits), `feeder.py` (wave batching above
its queue), `engines.py` (its engines built and stopped, its refusals read: nothing outside
this folder imports infinity-emb). Nothing else in the package reads infinity-emb's
internals; `engine/adapter.py` answers the server's questions for either engine and sends
infinity-emb's here.
"""
