"""Memory estimator: will this run fit? A breakdown in bytes, a fit verdict for a GPU, and ranked advice.

How: the model is built from its config on fake tensors (no weights, no memory) and one steady training step is
replayed exactly as the engine runs it (Trainer + PEFT + bitsandbytes), counting live tensor storages
(`finetune.memory.trace`). That peak is `tensor_bytes`. The analytic model (`finetune.memory.analytic`) explains it
component by component, prices the advice, and is the fallback where a replay cannot run (DeepSpeed ZeRO, offload).
For a GPU, the CUDA context and the caching allocator's slack are added on top (`estimator.cuda_overheads`).

Every estimate is of a run plan (`finetune.plan.plan_for(config, device, world_size=gpus)`): the device, precision,
dtypes, model class, DeepSpeed use and objective come from it. The core is `finetune.memory.estimator`; the advice
(`finetune.memory.advice`) builds on it; this package joins the two. Light to import: torch and transformers are
imported only when an estimate is computed.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from finetune.errors import UserError
from finetune.memory.advice import KINDS, Advice, Proposal, advice_text, advise, propose
from finetune.memory.estimator import (
    ALLOCATOR_SLACK,
    CALIBRATED_SOURCE,
    COMPONENT_ORDER,
    CUDA_CONTEXT,
    CUDA_KERNELS,
    GPU_CARDS,
    PHASE_NAMES,
    GiB,
    MemoryEstimate,
    MiB,
    check_args,
    context_from_readings,
    estimate_core,
    measured_cuda_overhead,
    model_config_of,
    with_verdict,
)

if TYPE_CHECKING:
    from finetune.plan import RunPlan

__all__ = [
    "ALLOCATOR_SLACK", "CALIBRATED_SOURCE", "COMPONENT_ORDER", "CUDA_CONTEXT", "CUDA_KERNELS", "GPU_CARDS", "KINDS",
    "PHASE_NAMES", "Advice", "GiB", "MemoryEstimate", "MiB", "Proposal", "advice_text", "context_from_readings",
    "estimate", "measured_cuda_overhead", "model_config_of", "propose", "register_cli",
]  # fmt: skip


def estimate(plan: RunPlan, gpu_gib: float | None = None) -> MemoryEstimate:
    """Peak memory per process of a training step of `plan` (its device, `world_size` GPUs), with the fit verdict
    and advice for `gpu_gib`."""
    check_args(plan, gpu_gib)
    est = estimate_core(plan)
    capacity = with_verdict(est, gpu_gib)
    if capacity is not None and not est.fits:
        est.advice = advise(plan, capacity, est)
    return est


# ----------------------------------------------------------------------------- command line


def register_cli(subparsers: Any) -> None:
    """Add `estimate` to the `python -m finetune` sub-commands."""
    from finetune.cli_args import add_config_args

    p = subparsers.add_parser(
        "estimate",
        help="estimate peak memory of a run, check it against a GPU, and suggest changes",
        description="Peak memory per device of one training step (replayed on fake tensors: no download of "
        "weights), with a breakdown, a fit verdict for --gpu-gib and ranked suggestions.",
    )
    add_config_args(p)
    p.add_argument("--device", default="cuda", help="cuda (default: a GPU run, bf16 unless fp32) or cpu (fp32)")
    p.add_argument("--gpus", default="1", help="GPUs per node (DDP replicas, or ZeRO shards)")
    p.add_argument("--gpu-gib", default=None, help=f"GPU memory in GiB, or a card: {', '.join(GPU_CARDS)}")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.set_defaults(func=run_cli)


def run_cli(args: Any) -> int:
    """Handle `python -m finetune estimate`; returns the exit code (bad input raises UserError)."""
    from finetune.cli_args import load_config
    from finetune.plan import plan_for

    config = load_config(getattr(args, "config", None), getattr(args, "set", None))
    device = str(getattr(args, "device", "cuda") or "cuda").lower()
    gpus = _parse_int(getattr(args, "gpus", 1), "--gpus")
    gib = _parse_gib(getattr(args, "gpu_gib", None))
    if device not in ("cpu", "cuda"):
        raise UserError(f"--device: {device!r} is not allowed; choose cpu or cuda", field="device")
    est = estimate(plan_for(config, device=device, world_size=gpus), gpu_gib=gib)
    print(json.dumps(est.to_dict(), indent=2) if getattr(args, "json", False) else est.render_text())
    return 0


def _parse_int(value: Any, flag: str) -> int:
    """A whole number >= 1 from the command line."""
    try:
        n = int(str(value))
    except ValueError:
        raise UserError(f"{flag}: {value!r} is not a whole number") from None
    if n < 1:
        raise UserError(f"{flag}: must be 1 or more")
    return n


def _parse_gib(value: Any) -> float | None:
    """--gpu-gib: a positive number of GiB, or the name of a card in GPU_CARDS (case and spaces ignored)."""
    if value in (None, ""):
        return None
    text = str(value).strip()
    try:
        gib = float(text)
    except ValueError:
        wanted = text.lower().replace(" ", "")
        for name, size in GPU_CARDS.items():
            if name.lower().replace(" ", "").startswith(wanted):
                return size
        raise UserError(
            f"--gpu-gib: {text!r} is not a number of GiB or a known card ({', '.join(GPU_CARDS)})"
        ) from None
    if not math.isfinite(gib) or gib <= 0:
        raise UserError(f"--gpu-gib: {text!r} must be a positive number of GiB")
    return gib
