"""Shared fixtures: offline Hub, an isolated studio home, tiny models built once per session."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

# Tests never reach the network; set before transformers / huggingface_hub are imported.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
# `make test` runs three pytest-xdist workers on the 2-core machine. Each worker, and every process it starts, gets one
# CPU thread: two workers of two OpenMP threads each made the compute-bound tests 3x slower (threads spin-waiting for
# a core), so the whole suite gained little from the second worker.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
# DeepSpeed builds a C++ op (shm_comm) on first use into torch's extensions cache and rebuilds it whenever its build
# command changes. The command names the virtualenv's path, so checkouts sharing ~/.cache rebuilt it for each other
# at every switch (4 to 9 minutes each on a loaded 2-core machine, past the DeepSpeed tests' deadlines). One cache
# per virtualenv path (subprocesses inherit it) builds it once.
_VENV_KEY = hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions" / f"venv-{_VENV_KEY}"))

import pytest  # noqa: E402

from tests.shared import create_root, shared_folder  # noqa: E402
from tests.tiny import build_llama  # noqa: E402

# CI sets these so that the browser and Slurm tests run there instead of skipping: a missing program stops the suite
# at its start with one line, rather than as skips nobody reads.
NEEDED_PROGRAMS = {"FINETUNE_TESTS_NEED_BROWSER": "chromium", "FINETUNE_TESTS_NEED_SLURM": "sbatch"}


def pytest_sessionstart(session):
    """Stop at once when a program that this environment says the tests need is missing."""
    for variable, program in NEEDED_PROGRAMS.items():
        if os.environ.get(variable) and not shutil.which(program):
            raise pytest.UsageError(f"{variable} is set but {program} is missing (bash scripts/system_packages.sh)")


def pytest_configure(config):
    """The controlling process names the folder its workers share (tests/shared.py) before it starts them."""
    if not hasattr(config, "workerinput"):
        create_root()


@pytest.fixture(scope="session")
def tiny_model_dir():
    """A tiny random Llama + ChatML tokenizer on disk (2 layers, hidden 64), one for all workers (read-only)."""
    return shared_folder("tiny-llama", build_llama)


@pytest.fixture(scope="session")
def smollm_tokenizer_dir():
    """SmolLM2's tokenizer (from the embedded model), for tiny models exported as GGUF (read-only, shared)."""
    from tests.tiny import save_embedded_tokenizer

    return shared_folder("smollm2-tokenizer", save_embedded_tokenizer)


@pytest.fixture(scope="session")
def tiny_smollm_dir(smollm_tokenizer_dir):
    """The tiny random Llama with SmolLM2's tokenizer: a GGUF of it is one llama.cpp loads and tokenizes."""
    return shared_folder("tiny-smollm", lambda path: build_llama(path, tokenizer_dir=smollm_tokenizer_dir))


@pytest.fixture(autouse=True)
def studio_home(tmp_path, monkeypatch):
    """Each test gets its own runs root, so runs never leak between tests or into ~/.cache."""
    home = tmp_path / "studio-home"
    monkeypatch.setenv("FINETUNE_STUDIO_HOME", str(home))
    return home


# The modules that take over 20 s alone, slowest first (measured on the idle 2-core machine), except test_deepspeed,
# first: on a fresh virtualenv its first test compiles DeepSpeed's CPU op, which the other DeepSpeed modules wait for.
# Workers take whole modules (`--dist loadfile`) in collection order, so handing out the longest first keeps one
# worker from starting a long module while the others have nothing left; the other modules follow in their order.
SLOWEST_MODULES = (
    "test_deepspeed", "test_ui_browser", "test_ui_first_screen", "test_export", "test_bench_scripts",
    "test_launch_group", "test_slurm", "test_llama_cpp", "test_grpo", "test_ui_wiring", "test_evaluation",
    "test_safety", "test_cli", "test_push_gguf", "test_publish_privacy", "test_launch_lifecycle", "test_reliability",
    "test_default_path", "test_training", "test_memory", "test_space_mode", "test_propose", "test_vlm", "test_hub",
    "test_packing", "test_memory_plan", "test_lora_variants", "test_preference", "test_ui_vlm", "test_visitors",
)  # fmt: skip


def _module_rank(item) -> int:
    name = item.path.stem
    return SLOWEST_MODULES.index(name) if name in SLOWEST_MODULES else len(SLOWEST_MODULES)


def pytest_collection_modifyitems(config, items):
    """Slowest modules first (see SLOWEST_MODULES); `gpu` tests skipped with a reason where CUDA is unavailable."""
    import torch

    items.sort(key=_module_rank)  # stable: each module's tests keep their order
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; run on the lent GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
