"""Memory estimator: will this run fit? A breakdown in bytes, a fit verdict for a GPU, and ranked advice.

How: the model is built from its config on fake tensors (no weights, no memory) and one steady training step is
replayed exactly as the engine runs it (Trainer + PEFT + bitsandbytes), counting live tensor storages
(`finetune.memory.trace`). That peak is `tensor_bytes`. The analytic model (`finetune.memory.analytic`) explains it
component by component, prices the advice, and is the fallback where a replay cannot run (DeepSpeed ZeRO, offload).
For a GPU, the CUDA context and the caching allocator's slack are added on top (`estimator.cuda_overheads`).

Every estimate is of a run plan (`finetune.plan.plan_for(config, device, world_size=gpus)`): the device, precision,
dtypes, model class, DeepSpeed use and objective come from it. The core is `finetune.memory.estimator`; the one
search for settings that fit with headroom (`finetune.memory.search`) builds on it, and the advice in words
(`finetune.memory.advice`: the proposal, the out-of-memory paragraph) on the search; this package joins them. Light
to import: torch and transformers are imported only when an estimate is computed.
"""

from __future__ import annotations

import json
from typing import Any

from finetune.errors import UserError
from finetune.memory.advice import Proposal, advice_text, propose
from finetune.memory.estimator import (
    ALLOCATOR_SLACK,
    CALIBRATED_SOURCE,
    COMPONENT_ORDER,
    CUDA_CONTEXT,
    CUDA_KERNELS,
    PHASE_NAMES,
    Advice,
    GiB,
    MemoryEstimate,
    MiB,
    Needed,
    context_from_readings,
    measured_cuda_overhead,
    model_config_of,
)
from finetune.memory.search import KINDS, estimate
from finetune.model.catalogue import GPU_CARDS

__all__ = [
    "ALLOCATOR_SLACK", "CALIBRATED_SOURCE", "COMPONENT_ORDER", "CUDA_CONTEXT", "CUDA_KERNELS", "GPU_CARDS", "KINDS",
    "PHASE_NAMES", "Advice", "GiB", "MemoryEstimate", "MiB", "Needed", "Proposal", "advice_text",
    "context_from_readings", "estimate", "measured_cuda_overhead", "model_config_of", "propose", "register_cli",
]  # fmt: skip


# ----------------------------------------------------------------------------- command line


def register_cli(subparsers: Any) -> None:
    """Add `estimate` to the `python -m finetune` sub-commands."""
    from finetune.cli.args import add_config_args

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
    from finetune.cli.args import load_config, parse_count, parse_gib
    from finetune.plan import plan_for

    config = load_config(getattr(args, "config", None), getattr(args, "set", None))
    device = str(getattr(args, "device", "cuda") or "cuda").lower()
    gpus = parse_count(getattr(args, "gpus", 1), "--gpus")
    gib = parse_gib(getattr(args, "gpu_gib", None))
    if device not in ("cpu", "cuda"):
        raise UserError(f"--device: {device!r} is not allowed; choose cpu or cuda", field="device")
    est = estimate(plan_for(config, device=device, world_size=gpus), gpu_gib=gib)
    print(json.dumps(est.to_dict(), indent=2) if getattr(args, "json", False) else est.render_text())
    return 0
