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


UPLOADS_MARKER = ".finetune-uploads"  # in the root of the visitors' upload folders (finetune/access/uploads.py)


def mark_uploads_root(root: Path) -> None:
    """Mark `root` as holding visitors' uploads, so data read from under it names only files beside it."""
    root.mkdir(parents=True, exist_ok=True)
    (root / UPLOADS_MARKER).touch(exist_ok=True)


def is_uploaded(path: Path) -> bool:
    """Whether `path` lies in a visitors' upload folder (a parent holds UPLOADS_MARKER)."""
    return any((parent / UPLOADS_MARKER).is_file() for parent in Path(path).resolve().parents)
