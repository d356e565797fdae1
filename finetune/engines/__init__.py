"""Training engines. Each exposes `train(config, progress, resume_from) -> "completed" | "stopped"`."""

from __future__ import annotations

from pathlib import Path

from finetune.config import PREFERENCE_OBJECTIVES, TrainConfig
from finetune.plan import plan_for
from finetune.progress import Progress


def run_engine(config: TrainConfig, progress: Progress, resume_from: Path | None = None) -> str:
    """Run the engine the plan asks for (imported lazily: all pull in torch): preference objectives on TRL's
    trainers, SFT on the Trainer or the DeepSpeed loop."""
    if plan_for(config).objective in PREFERENCE_OBJECTIVES:
        from finetune.engines import preference

        return preference.train(config, progress, resume_from)
    if config.backend == "deepspeed":
        from finetune.engines import deepspeed_engine

        return deepspeed_engine.train(config, progress, resume_from)
    from finetune.engines import hf_trainer

    return hf_trainer.train(config, progress, resume_from)
