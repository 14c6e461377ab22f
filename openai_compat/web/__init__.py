"""The HTTP shell around the floors: the FastAPI app and its mount table (`app.py`), the
uvicorn server and its drain (`server.py`), the gateway every request passes (`middleware.py`:
keys, limits, sizes, metrics, the access line) and the POST fast path (`fastpath.py`)."""
