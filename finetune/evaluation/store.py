"""Evaluations kept in the run folder: `eval/<timestamp>.json`, one file per evaluation, never overwritten, and
nothing else of the run touched (the trained files are only read)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from finetune.atomic import read_json

FOLDER = "eval"


def save(run_path: Path, result: dict[str, Any]) -> Path:
    """Write `result` as a new eval/<YYYYmmdd-HHMMSS>[-N].json of the run (a name already taken gets the next N)."""
    folder = Path(run_path) / FOLDER
    folder.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(result.get("time") or time.time()))
    text = json.dumps(result, indent=1, ensure_ascii=False, default=str) + "\n"
    for n in range(1, 1000):
        path = folder / (f"{stamp}.json" if n == 1 else f"{stamp}-{n}.json")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)  # never replaces an earlier evaluation
        except FileExistsError:
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        return path
    raise FileExistsError(f"{folder}: no free name for an evaluation at {stamp}")


def history(run_path: Path) -> list[Path]:
    """The run's evaluation files, oldest first (a file still being written, or torn, is skipped by `load`)."""
    folder = Path(run_path) / FOLDER
    try:
        return sorted((p for p in folder.glob("*.json") if p.is_file()), key=_order)
    except OSError:
        return []


def load(path: Path) -> dict[str, Any] | None:
    """One evaluation, or None when the file is not a complete evaluation."""
    value = read_json(Path(path))
    return value if isinstance(value, dict) and "tuned" in value else None


def latest(run_path: Path) -> dict[str, Any] | None:
    """The run's newest complete evaluation, or None."""
    for path in reversed(history(run_path)):
        value = load(path)
        if value is not None:
            return value
    return None


def _order(path: Path) -> tuple[str, int]:
    """eval/20260101-120000.json before eval/20260101-120000-2.json before the next second's."""
    parts = path.stem.split("-")
    n = parts[2] if len(parts) > 2 else "1"
    return ("-".join(parts[:2]), int(n) if n.isdigit() else 0)
