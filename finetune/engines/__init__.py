"""Training engines. Each exposes `train(plan, progress, resume_from) -> "completed" | "stopped"` and runs the run plan
it is given; the objective's record names its engine module (finetune/objectives/)."""

from __future__ import annotations

import importlib
from pathlib import Path

from finetune.plan import RunPlan
from finetune.runs.progress import Progress


def run_engine(plan: RunPlan, progress: Progress, resume_from: Path | None = None) -> str:
    """Run the engine the plan's objective names (imported lazily: all pull in torch); `backend: deepspeed` runs the
    explicit DeepSpeed loop instead (the config allows it only for objectives that loop can run)."""
    name = "deepspeed_engine" if plan.config.backend == "deepspeed" else plan.objective.engine
    return importlib.import_module(f"finetune.engines.{name}").train(plan, progress, resume_from)
