# syntax=docker/dockerfile:1
# A worker: one per GPU (compose gives each container one). CUDA *devel* image, because submissions build
# with load_inline and need nvcc; the torch wheel is the one built for the same CUDA major version (torch
# refuses an nvcc of another major). Defaults match the GPU hosts this project measures on: torch 2.11.0
# for CUDA 13.0, driver 580. The host's driver must support the image's CUDA version.
ARG CUDA_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG TORCH_VERSION=2.11.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu130
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1

# python3-dev: load_inline compiles against Python.h; g++ and ninja: the host side of every build.
# Not pinned to versions: the Ubuntu archive drops superseded ones, and the CUDA base tag already fixes the
# toolchain that matters (nvcc); security updates come with a rebuild.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev g++ ninja-build \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/harness \
 && /opt/harness/bin/pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"
COPY pyproject.toml README.md /src/
COPY harness /src/harness
RUN /opt/harness/bin/pip install /src && rm -rf /src

# Non-root, fixed uid. The root filesystem is read-only at run time (compose): builds and logs go to the data
# volume, evaluation temp dirs to the scratch volume, everything else (HOME, compiler temp) to a tmpfs /tmp.
RUN useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent harness \
 && install -d -o harness -g harness -m 0750 /var/lib/harness /scratch
ENV PATH=/opt/harness/bin:$PATH HARNESS_DATA_DIR=/var/lib/harness HARNESS_SCRATCH_DIR=/scratch HOME=/tmp \
    XDG_CACHE_HOME=/var/lib/harness/cache TRITON_CACHE_DIR=/var/lib/harness/cache/triton
USER 10001:10001
WORKDIR /var/lib/harness
CMD ["harness", "worker", "--gpus", "0"]
