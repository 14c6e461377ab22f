"""The ground floor every other floor stands on, importing nothing else of the package:
errors (the API errors and their families' bodies), logs, the CPUs this process may use,
the server's lifecycle (drain, readiness, daemon threads) and request bodies parsed off the
event loop."""
