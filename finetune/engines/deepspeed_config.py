"""The DeepSpeed JSON, generated from the run plan (`finetune/plan.py`) and never hand-edited.

Two views of the same settings:
- `deepspeed_config(plan, ...)`: every value filled in, for the explicit engine loop (`backend: deepspeed`) and for
  export (`python -m finetune launch-command --ds-config out.json`, planned for the GPUs it launches on).
  `train_batch_size` = micro batch × accumulation × the plan's world size, consistent by construction.
- `trainer_deepspeed_config(plan)`: the same structure with `"auto"` wherever `Trainer` fills the value from its
  `TrainingArguments` (batch sizes, clipping, optimizer hyper-parameters, precision, bucket sizes), so the two can
  never disagree. The Trainer keeps its own learning-rate scheduler (any `lr_scheduler_type`).

The device, precision and world size are the plan's: nothing here asks torch whether a GPU is there. The one thing
looked up on this machine is whether DeepSpeed's own Adam kernels are built or can be built (`use_torch_adam`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from finetune.config import DEEPSPEED_SCHEDULERS, TrainConfig
from finetune.errors import ConfigError

if TYPE_CHECKING:
    from finetune.plan import RunPlan

DS_CONFIG_NAME = "ds_config.json"

# lr_scheduler_type → DeepSpeed scheduler (the engine loop), decided with the config's validation.
SCHEDULERS = DEEPSPEED_SCHEDULERS

ADAM_BETAS = (0.9, 0.999)  # TrainingArguments' defaults, so both backends optimise the same way
ADAM_EPS = 1e-8

# fp16: dynamic loss scaling (loss_scale 0) starting at 2**16, halved on overflow, doubled after 1000 clean steps.
FP16_LOSS_SCALING = {
    "loss_scale": 0,
    "initial_scale_power": 16,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1,
}

# Bucket sizes (elements) when the model's hidden size is not known: DeepSpeed's defaults.
DEFAULT_REDUCE_BUCKET = 500_000_000
DEFAULT_PREFETCH_BUCKET = 50_000_000
DEFAULT_PERSISTENCE_THRESHOLD = 100_000
NVME_AIO = {
    "block_size": 1_048_576,
    "queue_depth": 8,
    "intra_op_parallelism": 1,
    "single_submit": False,
    "overlap_events": True,
}


# --------------------------------------------------------------------------- what the machine offers
def use_torch_adam(plan: RunPlan) -> bool:
    """True when DeepSpeed should step `torch.optim.AdamW` instead of its own kernels.

    DeepSpeed's Adam is a C++/CUDA extension compiled on first use: FusedAdam on a GPU (needs nvcc), DeepSpeedCPUAdam
    for optimizer offload (needs a C++ compiler). For a plan on the CPU that compile takes minutes for no gain, so
    torch's AdamW (the same update rule) is used; on a GPU DeepSpeed's own kernels are used when they are prebuilt or
    can be built here.
    """
    if plan.device != "cuda":
        return True
    try:
        from deepspeed.git_version_info import installed_ops
    except ImportError:
        return True
    offload = plan.config.offload_optimizer != "none"
    op = "cpu_adam" if offload else "fused_adam"
    if installed_ops.get(op):
        return False
    if shutil.which("ninja") is None and not _has_ninja_module():
        return True
    if offload:
        return shutil.which("c++") is None and shutil.which("g++") is None
    from torch.utils.cpp_extension import CUDA_HOME

    return not CUDA_HOME


def _has_ninja_module() -> bool:
    import importlib.util

    return importlib.util.find_spec("ninja") is not None


# --------------------------------------------------------------------------- the engine's full config
def deepspeed_config(
    plan: RunPlan,
    *,
    total_steps: int | None = None,
    hidden_size: int | None = None,
    torch_adam: bool | None = None,
) -> dict[str, Any]:
    """The complete DeepSpeed config of a plan: its world size, device and precision.

    total_steps: optimizer steps of the run (for the decaying schedulers; default max_steps). hidden_size: the
    model's, to size the communication buckets the way Hugging Face does (hidden², 0.9·hidden², 10·hidden);
    DeepSpeed's defaults otherwise. torch_adam: step torch's AdamW (default: `use_torch_adam(plan)`).
    """
    config = plan.config
    if plan.world_size < 1:
        raise ConfigError(f"world size: {plan.world_size} must be at least 1")
    cuda = plan.device == "cuda"
    steps = total_steps if total_steps and total_steps > 0 else max(config.max_steps, 1)
    torch_adam = use_torch_adam(plan) if torch_adam is None else torch_adam

    micro = config.per_device_train_batch_size
    accumulation = config.gradient_accumulation_steps
    out: dict[str, Any] = {
        "train_batch_size": micro * accumulation * plan.world_size,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": config.max_grad_norm,  # 0 = no clipping
        "optimizer": _optimizer(config, torch_adam, lr=config.learning_rate, weight_decay=config.weight_decay),
        "scheduler": _scheduler(config, steps),
        **_precision(plan.precision),
        "zero_optimization": _zero(config, cuda, _buckets(hidden_size)),
        "steps_per_print": 1_000_000_000,  # the run reports progress itself
        "wall_clock_breakdown": False,
    }
    if "nvme" in (config.offload_optimizer, config.offload_param):
        out["aio"] = dict(NVME_AIO)
    return out


def trainer_deepspeed_config(plan: RunPlan) -> dict[str, Any]:
    """The config for `TrainingArguments(deepspeed=...)`: `"auto"` wherever Trainer fills the value.

    The optimizer section is set only for `optim: adamw_torch` (DeepSpeed's AdamW, required with optimizer offload);
    other optimizers are created by Trainer. No scheduler section: Trainer's `lr_scheduler_type` applies.
    """
    config = plan.config
    out: dict[str, Any] = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "fp16": {"enabled": "auto", **FP16_LOSS_SCALING},
        "bf16": {"enabled": "auto"},
        "zero_optimization": _zero(config, plan.device == "cuda", _buckets(None, auto=True)),
        "steps_per_print": 1_000_000_000,
        "wall_clock_breakdown": False,
    }
    if config.optim == "adamw_torch":
        out["optimizer"] = _optimizer(config, use_torch_adam(plan), lr="auto", weight_decay="auto", auto=True)
    if "nvme" in (config.offload_optimizer, config.offload_param):
        out["aio"] = dict(NVME_AIO)
    return out


def write_ds_config(ds_config: dict[str, Any], directory: str | Path) -> Path:
    """Write `ds_config.json` atomically into a run directory (or any directory); returns its path."""
    from finetune.atomic import write_text

    path = Path(directory) / DS_CONFIG_NAME
    write_text(path, json.dumps(ds_config, indent=2) + "\n")
    return path


# --------------------------------------------------------------------------- sections
def _optimizer(config: TrainConfig, torch_adam: bool, lr: Any, weight_decay: Any, auto: bool = False) -> dict:
    if config.optim != "adamw_torch":
        # backend: deepspeed refuses other optimizers in config validation; a direct caller gets the same message.
        raise ConfigError(
            f"optim: {config.optim!r} is not available with the DeepSpeed engine; use adamw_torch", field="optim"
        )
    params: dict[str, Any] = {
        "lr": lr,
        "betas": "auto" if auto else list(ADAM_BETAS),
        "eps": "auto" if auto else ADAM_EPS,
        "weight_decay": weight_decay,
    }
    if torch_adam:
        params["torch_adam"] = True
    return {"type": "AdamW", "params": params}


def _scheduler(config: TrainConfig, total_steps: int) -> dict[str, Any]:
    """WarmupLR (constant), WarmupDecayLR (linear) or WarmupCosineLR (cosine), linear warm-up over warmup_steps.

    DeepSpeed warms up over at least 2 steps; with warmup_steps 0 the warm-up starts at the full rate instead
    (min = max), so "no warm-up" still means the full learning rate from the first step. Every listed scheduler
    runs with any max_steps ≥ 1 and warmup_steps ≥ 0 (tests/test_schedulers.py steps each through such runs).
    """
    kind = SCHEDULERS.get(config.lr_scheduler_type)
    if kind is None:
        raise ConfigError(
            f"lr_scheduler_type: {config.lr_scheduler_type!r} is not available with backend: deepspeed; "
            f"use one of: {', '.join(SCHEDULERS)}",
            field="lr_scheduler_type",
        )
    warmup = config.warmup_steps if config.lr_scheduler_type != "constant" else 0
    steps = max(1, warmup)
    # DeepSpeed warns when a run is shorter than its warm-up (at least 2 steps there). Lengthening such a run to
    # the warm-up changes no rate it uses: every step of it is still warm-up.
    total_steps = max(total_steps, steps, 2)
    lr = config.learning_rate
    if kind == "WarmupCosineLR":
        params: dict[str, Any] = {
            "total_num_steps": total_steps,
            "warmup_min_ratio": 0.0 if warmup else 1.0,
            "warmup_num_steps": steps,
            "cos_min_ratio": 0.0,
            "warmup_type": "linear",
        }
    else:
        params = {
            "warmup_min_lr": 0.0 if warmup else lr,
            "warmup_max_lr": lr,
            "warmup_num_steps": steps,
            "warmup_type": "linear",
        }
        if kind == "WarmupDecayLR":
            params["total_num_steps"] = total_steps
    return {"type": kind, "params": params}


def _precision(precision: str) -> dict[str, Any]:
    """The plan's resolved precision (fp32 | fp16 | bf16) as DeepSpeed's sections."""
    if precision == "fp16":
        return {"fp16": {"enabled": True, **FP16_LOSS_SCALING}}
    if precision == "bf16":
        return {"bf16": {"enabled": True}}
    return {}  # fp32: neither section, DeepSpeed trains in full precision


def _buckets(hidden_size: int | None, auto: bool = False) -> dict[str, Any]:
    if auto:
        return {"reduce": "auto", "prefetch": "auto", "persistence": "auto"}
    if hidden_size:
        return {
            "reduce": hidden_size * hidden_size,
            "prefetch": int(0.9 * hidden_size * hidden_size),
            "persistence": 10 * hidden_size,
        }
    return {
        "reduce": DEFAULT_REDUCE_BUCKET,
        "prefetch": DEFAULT_PREFETCH_BUCKET,
        "persistence": DEFAULT_PERSISTENCE_THRESHOLD,
    }


def _offload(device: str, config: TrainConfig, cuda: bool) -> dict[str, Any]:
    section: dict[str, Any] = {"device": device, "pin_memory": cuda}  # page-locked host memory: GPU copies only
    if device == "nvme":
        section["nvme_path"] = config.nvme_path
    return section


def _zero(config: TrainConfig, cuda: bool, buckets: dict[str, Any]) -> dict[str, Any]:
    stage = config.zero_stage
    zero: dict[str, Any] = {"stage": stage}
    if stage == 0:
        return zero
    # Overlapping gradient reduction with the backward pass needs separate GPU streams; on a CPU it only adds copies.
    zero.update(
        {
            "overlap_comm": cuda,
            "contiguous_gradients": True,
            "reduce_scatter": True,
            "reduce_bucket_size": buckets["reduce"],
        }
    )
    if stage in (1, 2):
        zero["allgather_bucket_size"] = buckets["reduce"] if buckets["reduce"] != "auto" else DEFAULT_REDUCE_BUCKET
    if config.offload_optimizer != "none":
        zero["offload_optimizer"] = _offload(config.offload_optimizer, config, cuda)
    if stage == 3:
        zero.update(
            {
                "stage3_prefetch_bucket_size": buckets["prefetch"],
                "stage3_param_persistence_threshold": buckets["persistence"],
                "stage3_max_live_parameters": 1_000_000_000,
                "stage3_max_reuse_distance": 1_000_000_000,
                "sub_group_size": 1_000_000_000,
                # Without this, saving under ZeRO-3 writes no usable weights: gather the shards on rank 0.
                "stage3_gather_16bit_weights_on_model_save": True,
            }
        )
        if config.offload_param != "none":
            zero["offload_param"] = _offload(config.offload_param, config, cuda)
    return zero
