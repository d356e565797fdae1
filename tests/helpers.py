"""Helpers shared by the backend tests: tiny configs, data files, reading losses from a run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from finetune.config import TrainConfig
from finetune.rundir import RunDir


def mini_dataset() -> Path:
    """32 short, repetitive pirate answers: a random tiny model learns them within a few steps."""
    import tempfile

    path = Path(tempfile.gettempdir()) / "finetune-tests" / "pirate-mini.jsonl"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = [{"prompt": f"Question {i}?", "completion": "Arr, matey! Yo-ho-ho!"} for i in range(32)]
        write_jsonl(path, rows)
    return path


def tiny_config(model_dir: Path, **overrides: Any) -> TrainConfig:
    """A config that trains the tiny model on tiny data in a few seconds."""
    values: dict[str, Any] = {
        "model": str(model_dir),
        "dataset": str(mini_dataset()),
        "eval_split": "",
        "max_steps": 8,
        "learning_rate": 3e-2,
        "warmup_steps": 0,
        "lr_scheduler_type": "constant",
        "max_seq_length": 64,
        "per_device_train_batch_size": 4,
        "logging_steps": 1,
        "save_steps": 4,
        "eval_steps": 4,
        "lora_r": 8,
    }
    values.update(overrides)
    return TrainConfig.from_dict(values)


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def losses(run_dir: str | Path) -> list[tuple[int, float]]:
    """(step, loss) from the run's events."""
    return [(e["step"], e["loss"]) for e in RunDir(Path(run_dir)).read_events(("log",))]


def assert_loss_falls(run_dir: str | Path, k: int = 2) -> tuple[float, float]:
    """The mean of the last k losses is clearly below the mean of the first k."""
    values = [loss for _, loss in losses(run_dir)]
    assert len(values) >= 2 * k, values
    first, last = sum(values[:k]) / k, sum(values[-k:]) / k
    assert last < 0.9 * first, f"loss did not fall: {values}"
    return first, last
