# Two commands on a fresh machine: `make run` and `make test`. Both set up .venv first (idempotent).
# TORCH names the torch to install; the CPU build 2.13.0 lies on this project's machines' disk.
# On a GPU host with its own CUDA torch, use `make run TORCH=` to keep that one (a venv with
# --system-site-packages sees it).
PYTHON ?= python3
TORCH ?= torch==2.13.0
SERVE_ARGS ?=
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: run test lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(if $(TORCH),,--system-site-packages) $(VENV)
	$(VENV)/bin/pip install -q $(TORCH) -e '.[dev]'
	touch $(STAMP)

# The service: API on 127.0.0.1:8000, SQLite in $HARNESS_DATA_DIR, a worker for the local GPUs (or the CPU).
# The first start prints an admin token and leaves it in $HARNESS_DATA_DIR/admin-token, so a fresh user can
# submit at once while the port stays closed to others (see README, "Run the service").
run: $(STAMP)
	$(VENV)/bin/harness serve $(SERVE_ARGS)

test: $(STAMP)
	$(VENV)/bin/python -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check harness tests

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
