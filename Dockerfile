# Pixelsmith training image: the project installed with its tested constraints on NVIDIA's CUDA runtime image.
#   docker build -t pixelsmith .
#   docker run --gpus all -v "$PWD/outputs:/workspace/outputs" pixelsmith                 # the main job
#   docker run --gpus all -v "$PWD/outputs:/workspace/outputs" pixelsmith pixelsmith-train hardware=h100 ...
#   docker run -v "$PWD/datasets:/workspace/datasets" pixelsmith pixelsmith-prepare source=... dest=... format=shards
# The torch wheel from PyPI carries its own CUDA libraries; the base image supplies the CUDA user-space and the
# NVIDIA container runtime the driver. Runs as an unprivileged user (uid 10001: Ubuntu images already have a
# 1000); outputs go to /workspace/outputs (mount it).
ARG BASE_IMAGE=nvidia/cuda:13.0.0-cudnn-runtime-ubuntu24.04
FROM ${BASE_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

WORKDIR /app
# Dependencies first (a layer that survives code edits), then the project itself.
COPY pyproject.toml setup.py constraints.txt README.md ./
COPY src ./src
COPY conf ./conf
COPY data ./data
# Every entry script by pattern (train.py, evaluate.py, bench.py, stylize.py where the style part is kept): a fork
# that deletes a part's script builds without an edit here (README "Removing a part").
COPY *.py ./
COPY benchmarks ./benchmarks
# With the stream extra: data=shards and `pixelsmith-prepare ... format=shards` need litdata (and its object-store
# clients); simplejpeg speeds up JPEG decoding in the loader.
RUN pip install -c constraints.txt ".[stream]" \
    && useradd --create-home --uid 10001 --user-group pixelsmith \
    && mkdir -p /workspace/outputs \
    && chown -R pixelsmith:pixelsmith /workspace

USER 10001:10001
WORKDIR /workspace
# SIGTERM (docker stop, Kubernetes) ends the run after the current iteration with last.ckpt (train.preemption).
STOPSIGNAL SIGTERM
CMD ["pixelsmith-train"]
