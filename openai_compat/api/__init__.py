"""Everything a client calls except the Batch API (batch/): one package per API family, the shared
bare-path table (shared.py), probes, the playground, and the handler kit (request.py)."""
