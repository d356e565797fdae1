"""Training engines. Each exposes `train(plan, progress, resume_from) -> "completed" | "stopped"` and runs the run plan
it is given; the objective's record names its engine module (finetune/objectives.py)."""

from __future__ import annotations

import importlib
from pathlib import Path

from finetune.plan import RunPlan
from finetune.progress import Progress

# The record's engine -> module (imported lazily: all pull in torch); "trainer" runs on the Trainer or, with
# backend: deepspeed, on the DeepSpeed engine loop.
ENGINE_MODULES = {
    "trainer": "finetune.engines.hf_trainer",
    "preference": "finetune.engines.preference",
    "grpo": "finetune.engines.grpo",
}


def run_engine(plan: RunPlan, progress: Progress, resume_from: Path | None = None) -> str:
    """Run the engine the plan's objective asks for."""
    name = ENGINE_MODULES[plan.objective.engine]
    if plan.objective.engine == "trainer" and plan.config.backend == "deepspeed":
        name = "finetune.engines.deepspeed_engine"
    return importlib.import_module(name).train(plan, progress, resume_from)
