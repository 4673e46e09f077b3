# syntax=docker/dockerfile:1
# The API (and the one-shot migration step): no CUDA. torch is a dependency of the package, so the CPU
# build goes in first; the API never imports it, but `harness reeval --regrade-only` and CPU evaluations
# can run from this image too.
ARG PYTHON_IMAGE=python:3.12-slim-bookworm
FROM ${PYTHON_IMAGE}

ARG TORCH_VERSION=2.11.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1

RUN python -m venv /opt/harness \
 && /opt/harness/bin/pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"
COPY pyproject.toml README.md /src/
COPY harness /src/harness
RUN /opt/harness/bin/pip install /src && rm -rf /src

# A fixed uid, so volume ownership is the same on every host; the writable places are volumes or tmpfs.
RUN useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent harness \
 && install -d -o harness -g harness -m 0750 /var/lib/harness
ENV PATH=/opt/harness/bin:$PATH HARNESS_DATA_DIR=/var/lib/harness HOME=/tmp HARNESS_HOST=0.0.0.0 \
    HARNESS_PORT=8000
USER 10001:10001
WORKDIR /var/lib/harness
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
CMD ["harness", "serve", "--no-worker"]
