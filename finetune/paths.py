"""Where Finetune Studio keeps its caches and runs, and where the files shipped with the package lie."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent  # the finetune package
BUNDLED = PACKAGE / "bundled"  # data sets, model configs and lm-eval tasks shipped with the app


def studio_home() -> Path:
    """Root for caches and runs: `$FINETUNE_STUDIO_HOME`, else /data/finetune-studio on a Space, else ~/.cache."""
    env = os.environ.get("FINETUNE_STUDIO_HOME")
    if env:
        return Path(env).expanduser()
    # A Hugging Face Space with persistent storage mounts it at /data; runs must survive restarts there.
    if os.environ.get("SPACE_ID") and Path("/data").is_dir() and os.access("/data", os.W_OK):
        return Path("/data/finetune-studio")
    return Path("~/.cache/finetune-studio").expanduser()


def runs_root() -> Path:
    """Directory that holds one sub-directory per run."""
    return studio_home() / "runs"


def model_cache() -> Path:
    """Directory for converted models (the embedded GGUF → safetensors)."""
    return studio_home() / "models"
