# The environment lives in .venv at the repository root (override with VENV=...).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: run test lint setup model

setup: $(STAMP)

$(PY):
	python3 -m venv $(VENV)

# torch first, pinned: a bare or open-ranged torch would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --disable-pip-version-check -q torch==2.13.0
	$(PY) -m pip install --disable-pip-version-check -q -e '.[test]'
	touch $(STAMP)

# The CPU kernels (quantized products, decode attention) are built here (once per machine, ~2 min), not inside the
# first backend's start; where they cannot be built, torch's forms and SDPA serve, so a failure does not stop make.
model: $(STAMP)
	$(VENV)/bin/tidegate model pull smollm2
	-$(PY) -m backend.executor.cpu.block_kernel build

run: model
	$(VENV)/bin/tidegate up

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test: model lint
	$(VENV)/bin/python -m pytest -q --durations=25
