"""Every check before a run writes anything: the model and data can be read, the plan's options suit this machine, the
run folder is new or empty, and a resume only changes what its checkpoint can take.

The order is config -> plan -> preflight(plan): the checks read the plan's decisions (device, objective, model class,
LoRA targets, Liger) instead of deriving them again. Only `model_ready` comes before the plan, since the plan reads
the model's family from its config.json."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

from finetune.config import TrainConfig
from finetune.errors import ConfigError, os_reason
from finetune.runs.rundir import RunDir

if TYPE_CHECKING:
    from finetune.plan import RunPlan

# Settings a checkpoint is bound to: its weights, optimizer state or format would not fit a change.
RESUME_FIXED = (
    "model",
    "task",
    "num_labels",
    "method",
    "lora_r",
    "lora_alpha",
    "lora_target_modules",
    "quant_type",
    "double_quant",
    "backend",
    "zero_stage",
    "optim",
    "output_dir",
    "objective",  # a checkpoint's optimizer state and reference belong to the loss it was trained with
    "chosen_column",
    "rejected_column",
)


def model_ready(config: TrainConfig) -> None:
    """The model can be found, and its config.json is on this machine (a Hub model's is fetched into the Hub cache):
    the plan reads the model's family from it (Liger), so this runs before the plan is made."""
    from finetune.config import EMBEDDED_MODEL
    from finetune.model import loading

    if config.model == EMBEDDED_MODEL:
        loading.embedded_gguf_path()
        return
    loading.resolve_model_path(config.model)
    loading.load_model_config(config.model, config.trust_remote_code)


def data_ready(config: TrainConfig) -> list[str] | None:
    """The training data can be found and read, and has the columns the settings name (needs no model); its columns
    when it was read here (local data), else None."""
    from finetune.data.loading import FILE_TYPES, load_raw

    path = Path(config.dataset).expanduser()
    if config.dataset.startswith("bundled:") or path.suffix.lower() in FILE_TYPES or path.exists():
        # Local data is small enough to read now: a bad file is refused before any run directory exists.
        train_raw, _ = load_raw(config)
        columns_ready(config, list(train_raw.column_names))
        return list(train_raw.column_names)
    hub_dataset_ready(config)
    return None


def preflight(plan: RunPlan) -> None:
    """Cheap checks of a plan before its run directory exists: the data can be read, the model takes the plan's
    sequence length, head and LoRA targets, and what the plan decided can run on this machine (`model_ready` first)."""
    from finetune import plan as plans
    from finetune.config import EMBEDDED_MODEL
    from finetune.model import loading

    config = plan.config
    columns = data_ready(config)
    if columns is not None:  # image data needs a vision-language model, and such a model image data
        from finetune.data.detection import detect_format
        from finetune.engines.common import check_vision_data

        check_vision_data(plan, detect_format(columns, config).kind)
    if config.model != EMBEDDED_MODEL or loading.embedded_cache_dir().is_dir():
        from finetune.engines.common import check_sequence_length

        check_sequence_length(config)
        loading.check_model(plan)  # the plan's head and LoRA targets, from the model's config alone
    if config.report_to not in ("none",):
        import importlib.util

        if importlib.util.find_spec(config.report_to) is None:
            raise ConfigError(f"report_to: {config.report_to} is not installed; use none or install it", "report_to")
    gpu_only(plan)
    preference_ready(plan)
    plans.uses_liger(config, plan.device, strict=True)  # liger_kernel: on where Liger cannot run is refused now


def columns_ready(config: TrainConfig, columns: list[str]) -> None:
    """The data's columns suit the objective (its format is detected); prompts for rewards also have the columns the
    rewards read."""
    from finetune.data.detection import detect_format
    from finetune.data.kinds import DataKind

    fmt = detect_format(columns, config)
    if fmt.kind is DataKind.PROMPTS:
        rewards_ready(config, columns)


def rewards_ready(config: TrainConfig, columns: list[str]) -> None:
    """Learning from rewards: the columns the built-in rewards compare with are in the data, and each python: reward's
    file exists, runs and defines its function (the file runs once here)."""
    from finetune.objectives import rewards

    specs = rewards.parse(config.rewards)
    rewards.check_columns(specs, columns)
    rewards.check_files(specs)


def hub_dataset_ready(config: TrainConfig) -> None:
    """A Hub dataset is loaded as Start will load it (downloaded once into the Hub cache, which the run then reads):
    its splits and columns checked. Offline, only a copy already on this machine can be used; without one the answer
    is one plain line at once, instead of the Hub client's error when the run starts."""
    from finetune.config import BUNDLED_DATASET
    from finetune.data.loading import load_raw
    from finetune.model import catalogue

    if not catalogue.hub_reachable() and not _hub_copy_here(config.dataset):
        raise ConfigError(
            f"dataset: {config.dataset} is a Hub dataset, this machine cannot reach the Hugging Face Hub (offline) "
            f"and has no copy of it; use a local file or {BUNDLED_DATASET}, or connect and check again",
            "dataset",
        )
    train_raw, _ = load_raw(config)
    columns_ready(config, list(train_raw.column_names))


def _hub_copy_here(dataset: str) -> bool:
    """Whether the Hub cache on this machine holds files of this dataset repository (then it loads offline)."""
    from huggingface_hub import constants

    folder = Path(constants.HF_HUB_CACHE) / f"datasets--{dataset.replace('/', '--')}" / "snapshots"
    try:
        return folder.is_dir() and any(folder.iterdir())
    except OSError:
        return False


def preference_ready(plan: RunPlan) -> None:
    """Objectives that run on TRL's trainers are refused, naming the field, where TRL is not installed."""
    import importlib.util

    from finetune import objectives

    if plan.objective.needs_trl and importlib.util.find_spec("trl") is None:
        raise ConfigError(
            f"objective: {plan.config.objective} needs the trl package (pip install trl==1.16.0); or use objective: "
            f"{objectives.DEFAULT}",
            "objective",
        )


def check_new_run_dir(path: Path) -> None:
    """A new run's folder must be new or empty, and creatable: anything else is refused before a byte is written."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing != path and not existing.is_dir():
        raise ConfigError(
            f"output_dir: {existing} is a file, so {path} cannot be a folder; choose another", "output_dir"
        )
    if existing == path:
        if not path.is_dir():
            raise ConfigError(f"output_dir: {path} is a file, not a folder; choose a new folder", "output_dir")
        if RunDir(path).exists():
            raise ConfigError(f"output_dir: {path} already holds a run; resume it or choose another", "output_dir")
        try:
            has_files = any(path.iterdir())
        except OSError as exc:
            raise ConfigError(f"output_dir: cannot read {path}: {os_reason(exc)}", "output_dir") from None
        if has_files:
            raise ConfigError(
                f"output_dir: {path} already has files in it and is not a run; choose a new or empty folder",
                "output_dir",
            )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"output_dir: cannot write in {existing}: permission denied", "output_dir")


def checkpoint_step(checkpoint: Path) -> int:
    """The optimizer step a checkpoint folder (checkpoint-N) was saved at."""
    return int(checkpoint.name.rsplit("-", 1)[-1])


def check_resume_overrides(saved: TrainConfig, wanted: TrainConfig, step: int) -> None:
    """Refuse resume settings the checkpoint cannot take, before the run is touched."""
    for name in RESUME_FIXED:
        before, after = getattr(saved, name), getattr(wanted, name)
        if before != after:
            raise ConfigError(
                f"{name}: cannot change on resume (the checkpoint was trained with {before!r}, asked {after!r}); "
                "start a new run for that",
                name,
            )
    if wanted.max_steps != -1 and wanted.max_steps <= step:
        raise ConfigError(
            f"max_steps: {wanted.max_steps} is not beyond the checkpoint's step {step}; give a larger number "
            "to train further",
            "max_steps",
        )


def gpu_only(plan: RunPlan) -> None:
    """Options that only make sense with a GPU are refused for a plan on the CPU, with a clear reason."""
    if plan.device == "cuda":
        return
    if "nvme" in (plan.config.offload_optimizer, plan.config.offload_param):
        raise ConfigError("offload_optimizer: NVMe offload needs a GPU; this machine has none", "offload_optimizer")


def confined_path(root: Path, value: str) -> Path:
    """A run directory chosen in the UI: a plain name under the runs root (no absolute paths, no `..`)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", value) or ".." in value:
        raise ConfigError(
            f"output_dir: {value!r} must be a plain run name (letters, digits, . _ -) inside the runs folder",
            field="output_dir",
        )
    return root / value


def unique_run_path(root: Path, config: TrainConfig) -> Path:
    """A new run folder named after the time, the model and the method."""
    model = re.sub(r"[^A-Za-z0-9]+", "-", Path(config.model.split(":")[-1]).name).strip("-").lower()[:40] or "model"
    base = f"{time.strftime('%Y%m%d-%H%M%S')}-{model}-{config.method}"
    path, n = root / base, 1
    while path.exists():
        n += 1
        path = root / f"{base}-{n}"
    return path
