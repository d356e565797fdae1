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
    "context_from_readings", "estimate", "measured_cuda_overhead", "model_config_of", "propose",
]  # fmt: skip
