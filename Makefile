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

model: $(STAMP)
	$(VENV)/bin/tidegate model pull smollm2

run: model
	$(VENV)/bin/tidegate up

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test: model lint
	$(VENV)/bin/python -m pytest -q --durations=25
