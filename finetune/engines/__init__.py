"""Training engines. Each exposes `train(config, progress, resume_from) -> "completed" | "stopped"`; the objective's
record names its engine module (finetune/objectives.py)."""

from __future__ import annotations

import importlib
from pathlib import Path

from finetune.config import TrainConfig
from finetune.plan import plan_for
from finetune.progress import Progress

# The record's engine -> module (imported lazily: all pull in torch); "trainer" runs on the Trainer or, with
# backend: deepspeed, on the DeepSpeed engine loop.
ENGINE_MODULES = {"trainer": "finetune.engines.hf_trainer", "preference": "finetune.engines.preference"}


def run_engine(config: TrainConfig, progress: Progress, resume_from: Path | None = None) -> str:
    """Run the engine the plan's objective asks for."""
    objective = plan_for(config).objective
    name = ENGINE_MODULES[objective.engine]
    if objective.engine == "trainer" and config.backend == "deepspeed":
        name = "finetune.engines.deepspeed_engine"
    return importlib.import_module(name).train(config, progress, resume_from)
