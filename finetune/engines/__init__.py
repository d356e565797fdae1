"""Training engines. Each exposes `train(config, progress, resume_from) -> "completed" | "stopped"`."""

from __future__ import annotations

from pathlib import Path

from finetune.config import TrainConfig
from finetune.progress import Progress


def run_engine(config: TrainConfig, progress: Progress, resume_from: Path | None = None) -> str:
    """Run the engine the config asks for (imported lazily: both pull in torch)."""
    if config.backend == "deepspeed":
        from finetune.engines import deepspeed_engine

        return deepspeed_engine.train(config, progress, resume_from)
    from finetune.engines import hf_trainer

    return hf_trainer.train(config, progress, resume_from)
