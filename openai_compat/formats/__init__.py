"""What goes into a model and what comes out, free of any model library: prompts, token
counts and windows, token-id input, images and audio fetched and decoded (`media.py`);
float/base64 vectors, int8/binary, sparse vectors. Each module here imports only `errors`
(and each other)."""
