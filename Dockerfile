# The same server in a container, for Kubernetes or any container platform.
#   docker build -t openai-compat .
#   docker build -t openai-compat --build-arg PRELOAD_CONFIG=configs/production.toml .  # bake models in
#   docker run -p 8000:8000 -e OPENAI_COMPAT_MODEL=michaelfeil/bge-small-en-v1.5 openai-compat
# Every option is an OPENAI_COMPAT_* variable (see README); arguments after the image name are
# passed to `openai-compat serve`.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    HF_HOME=/models \
    INFINITY_ANONYMOUS_USAGE_STATS=0 \
    DO_NOT_TRACK=1 \
    OPENAI_COMPAT_HOST=0.0.0.0 \
    OPENAI_COMPAT_PORT=8000

RUN apt-get update && apt-get install -y --no-install-recommends libsndfile1 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
# torch first: "torch" is the CUDA build on x86-64; pass TORCH_SPEC to pin another build.
ARG TORCH_SPEC=torch
RUN pip install "$TORCH_SPEC"
COPY pyproject.toml README.md ./
COPY openai_compat ./openai_compat
COPY configs ./configs
RUN pip install .

# Optionally download a config's hub models into the image (HF_HOME) at build time.
ARG PRELOAD_CONFIG=""
RUN if [ -n "$PRELOAD_CONFIG" ]; then openai-compat download --config "$PRELOAD_CONFIG"; fi

EXPOSE 8000
# SIGTERM drains: /ready turns 503, in-flight requests finish, then the process exits 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["openai-compat", "serve"]
