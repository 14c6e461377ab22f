# The same server in a container, for Kubernetes or any container platform. Built and run by
# scripts/check_image.py (CI), which also says how to build it where no registry is reachable.
#   docker build -t openai-compat .                      # CPU torch; serves the packaged model offline
#   docker build -t openai-compat --build-arg PRELOAD_CONFIG=configs/production.toml .  # bake models in
#   docker build -t openai-compat --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .
#   docker build -t openai-compat --build-arg EXTRAS='[ray]' .   # for KubeRay
#   docker run -p 8000:8000 --read-only -v openai-compat-data:/data openai-compat
# Every option is an OPENAI_COMPAT_* variable (docs/configuration.md); arguments after the image
# name are passed to `openai-compat serve`. State lives in two volumes: /models (HF_HOME: hub
# models and ONNX/OpenVINO exports) and /data (the Batch API's files and jobs); the root file
# system can be read-only (temporary files go to /tmp: a tmpfs or emptyDir there).
# The base is any Debian-like image with python3 (>= 3.11) and its venv module: the official one
# by default, or one built locally (scripts/check_image.py: mmdebstrap, when no registry can be
# reached).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    HOME=/home/app \
    HF_HOME=/models \
    OPENAI_COMPAT_DATA_DIR=/data \
    XDG_CACHE_HOME=/tmp/cache \
    INFINITY_ANONYMOUS_USAGE_STATS=0 \
    DO_NOT_TRACK=1 \
    OPENAI_COMPAT_HOST=0.0.0.0 \
    OPENAI_COMPAT_PORT=8000

RUN python3 -m venv /opt/venv

# torch first, from PyTorch's CPU index: the torch of PyPI on x86-64 Linux is the CUDA build
# (several GB, useless without a GPU), and the project's requirements would pull that in. For a
# GPU image pass the CUDA index (cu128, ...) as TORCH_INDEX_URL.
ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN pip install "$TORCH_SPEC" --index-url "$TORCH_INDEX_URL" \
    && python -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

WORKDIR /app
COPY pyproject.toml README.md ./
COPY openai_compat ./openai_compat
COPY configs ./configs
# Not editable: the image needs no source tree at run time (it stays for the shipped configs).
# EXTRAS picks the package's extras: '[ray]' for KubeRay (deploy/kubernetes/rayservice.yaml).
ARG EXTRAS=""
RUN pip install ".$EXTRAS" && pip check

# A non-root user that owns only the two state folders.
RUN useradd --system --uid 10001 --user-group --home-dir /home/app --create-home app \
    && mkdir -p /models /data \
    && chown app:app /models /data

# Optionally download a config's hub models into the image (HF_HOME) at build time, so that
# replicas start without the network: pass the same file as OPENAI_COMPAT_CONFIG at run time.
ARG PRELOAD_CONFIG=""
USER app
RUN if [ -n "$PRELOAD_CONFIG" ]; then openai-compat download --config "$PRELOAD_CONFIG"; fi

VOLUME ["/models", "/data"]
EXPOSE 8000
# /health answers 200 while the process serves (also while models load); /ready is the
# readiness probe. No curl in the image: Python's own HTTP client.
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('OPENAI_COMPAT_PORT', '8000') + '/health', timeout=4)"]
# SIGTERM drains: /ready turns 503, in-flight requests finish, then the process exits 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["openai-compat", "serve"]
