"""Training engines. Each exposes `train(plan, progress, resume_from) -> "completed" | "stopped"` and runs the run plan
it is given; the plan names the engine module (`RunPlan.engine`: the objective's, or the DeepSpeed loop)."""

from __future__ import annotations

import importlib
from pathlib import Path

from finetune.plan import RunPlan
from finetune.runs.progress import Progress


def run_engine(plan: RunPlan, progress: Progress, resume_from: Path | None = None) -> str:
    """Run the engine the plan names (`plan.engine`, decided by `finetune.plan.engine_for`; imported lazily: all pull
    in torch)."""
    return importlib.import_module(f"finetune.engines.{plan.engine}").train(plan, progress, resume_from)
