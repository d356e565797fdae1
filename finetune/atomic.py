"""Atomic file writes: write to a temporary name in the same directory, fsync, then rename."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_text(path: Path, text: str, durable: bool = True) -> None:
    """Replace `path` with `text` so readers see the old file or the new one, never half of it.

    `durable` also flushes the new file to the disk before the rename, so it survives a power cut; a file that is
    rewritten every half second (the live status) skips that: after a power cut the previous copy is as good."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def overwrite(path: Path, text: str) -> None:
    """Rewrite an existing file in place (not atomic: a reader may see it half-written for an instant). Only for a
    full disk, where the atomic way has no room for the new copy but the old file's own blocks do."""
    with open(path, "r+", encoding="utf-8") as fh:
        fh.write(text)
        fh.truncate()
        fh.flush()
        os.fsync(fh.fileno())


def write_json(path: Path, data: Any, durable: bool = True) -> None:
    """Atomically write `data` as indented JSON."""
    write_text(path, json.dumps(data, indent=2, default=str) + "\n", durable=durable)


def read_json(path: Path, default: Any = None) -> Any:
    """Read JSON, or `default` when the file is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return default
