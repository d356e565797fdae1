"""The run plan: every decision about how a `TrainConfig` runs on a machine, made once.

The engines, the DeepSpeed config, preflight, the memory estimator, launch commands, chat, export and the model card
read a `RunPlan`; none of them re-derives "which device", "which dtype", "which LoRA targets", "uses DeepSpeed",
"which engine" or "which model class" from the config. The one decision made later, at run time, is packing's veto
by the loaded model (`without_packing`): the run records that plan as its plan.json. A new method variant (DoRA,
rsLoRA, PiSSA) is a field here plus its config key, nothing else.

Light on purpose: building a plan imports torch only to ask whether a GPU is there (and only when the caller did not
say which device), never transformers or peft; `lora_config()` / `quantization_config()` import those when called.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from finetune import objectives
from finetune.config import TrainConfig
from finetune.errors import ConfigError
from finetune.objectives import Objective

# Our optimizer names → `TrainingArguments.optim`.
TRAINER_OPTIMIZERS = {
    "adamw_torch": "adamw_torch",
    "adamw_8bit": "adamw_bnb_8bit",
    "paged_adamw_8bit": "paged_adamw_8bit",
    "sgd": "sgd",
}
_TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}  # bytes per element of each dtype a plan names


@dataclass(frozen=True)
class LoraPlan:
    """PEFT `LoraConfig` arguments, variants included."""

    r: int
    alpha: int
    dropout: float
    target_modules: str | tuple[str, ...]  # "all-linear" or module names
    task_type: str  # "CAUSAL_LM" | "SEQ_CLS"
    use_dora: bool = False
    use_rslora: bool = False
    init: str = "true"  # PEFT's init_lora_weights name: true | gaussian | pissa | olora
    modules_to_save: tuple[str, ...] = ()  # modules trained in full beside the adapters (an unfrozen projector)

    @property
    def init_lora_weights(self) -> bool | str:
        """The value PEFT takes (`True` for the default B = 0 start)."""
        return True if self.init == "true" else self.init

    @property
    def rewrites_base(self) -> bool:
        """PiSSA and OLoRA move part of the base weights into the adapter: saving must convert it back."""
        return self.init in ("pissa", "olora")

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `peft.LoraConfig`."""
        targets = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        return {
            "r": self.r,
            "lora_alpha": self.alpha,
            "lora_dropout": self.dropout,
            "target_modules": targets,
            "task_type": self.task_type,
            "use_dora": self.use_dora,
            "use_rslora": self.use_rslora,
            "init_lora_weights": self.init_lora_weights,
            **(
                {"modules_to_save": [m.rsplit(".", 1)[-1] for m in self.modules_to_save]}
                if self.modules_to_save
                else {}
            ),
        }


@dataclass(frozen=True)
class QuantPlan:
    """bitsandbytes 4-bit settings for QLoRA."""

    quant_type: str
    double_quant: bool
    compute_dtype: str  # torch dtype name


@dataclass(frozen=True)
class VisionFamily:
    """Where a vision-language family keeps its parts (module paths in the transformers model)."""

    vision: str  # the image encoder (vision tower)
    projector: tuple[str, ...]  # what turns image features into language-model tokens
    language: str  # the language model
    vision_blocks: str  # the vision tower's repeated blocks, relative to `vision`
    vision_linears: tuple[str, ...]  # the vision blocks' linear layers
    image_token: str  # the placeholder the chat template writes for an image (the processor expands it)


# model_type -> its parts. Idefics3 and SmolVLM share a layout (SmolVLM is Idefics3 on SmolLM2); Qwen3-VL's projector
# adds the deep-stack mergers; Gemma 3 counts as a vision-language model only when its config has a vision part.
VISION_FAMILIES: dict[str, VisionFamily] = {
    "idefics3": VisionFamily(
        "model.vision_model", ("model.connector",), "model.text_model", "encoder.layers",
        ("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"), "<image>",
    ),
    "qwen2_vl": VisionFamily(
        "model.visual", ("model.visual.merger",), "model.language_model", "blocks",
        ("qkv", "proj", "fc1", "fc2"), "<|image_pad|>",
    ),
    "qwen2_5_vl": VisionFamily(
        "model.visual", ("model.visual.merger",), "model.language_model", "blocks",
        ("qkv", "proj", "gate_proj", "up_proj", "down_proj"), "<|image_pad|>",
    ),
    "qwen3_vl": VisionFamily(
        "model.visual", ("model.visual.merger", "model.visual.deepstack_merger_list"), "model.language_model",
        "blocks", ("qkv", "proj", "linear_fc1", "linear_fc2"), "<|image_pad|>",
    ),
    "gemma3": VisionFamily(
        "model.vision_tower", ("model.multi_modal_projector",), "model.language_model", "encoder.layers",
        ("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"), "<start_of_image>",
    ),
}  # fmt: skip
VISION_FAMILIES["smolvlm"] = VISION_FAMILIES["idefics3"]
# The language models' linear layers `all-linear` means (Llama, Qwen and Gemma blocks alike).
LANGUAGE_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Why a vision-language run pads its micro batches (plan.json's packing_note).
VISION_UNPACKED = "image rows are padded: each row's images go with it, and the packed attention takes text only"


@dataclass(frozen=True)
class VisionPlan:
    """A vision-language model: its family, what trains, and the image size its processor is set to."""

    family: str  # config.json's model_type
    freeze_vision_tower: bool
    freeze_projector: bool
    image_longest_side: int  # 0: the processor's own setting

    @property
    def parts(self) -> VisionFamily:
        """The family's module paths."""
        return VISION_FAMILIES[self.family]

    def frozen_prefixes(self) -> tuple[str, ...]:
        """Module paths whose weights stay as they are (full fine-tuning sets them so; LoRA freezes every base
        weight anyway)."""
        parts = self.parts
        return (parts.vision,) * self.freeze_vision_tower + parts.projector * self.freeze_projector

    def unquantized(self) -> tuple[str, ...]:
        """Modules QLoRA keeps out of 4 bits: the vision tower and the projector (small, and sensitive), by their full
        paths (transformers matches a skipped module from the start of its name)."""
        return (self.parts.vision, *self.parts.projector)


@dataclass(frozen=True)
class RunPlan:
    """How one config runs on one machine: device, world, precision and dtypes, model class, quantisation, PEFT,
    DeepSpeed, optimizer and batch."""

    config: TrainConfig
    device: str  # "cuda" | "cpu"
    world_size: int
    precision: str  # the precision actually used: fp32 | bf16 | fp16
    model_class: str  # the transformers Auto class the task needs
    weight_dtype: str  # dtype the weights load in (torch name)
    compute_dtype: str  # dtype the matmuls run in (torch name)
    autocast_dtype: str | None  # mixed precision under autocast, or None
    quantization: QuantPlan | None
    lora: LoraPlan | None
    deepspeed: bool  # DeepSpeed runs the step (its engine loop, or the Trainer with a ds config)
    engine: str  # the module under finetune/engines/ that runs the step (`engine_for`)
    optimizer: str  # our optimizer name (config.optim); `trainer_optim` maps it
    effective_batch: int  # examples per optimizer step over the whole world
    objective: Objective = objectives.OBJECTIVES[objectives.DEFAULT]  # the objectives registry's record
    reference: str | None = None  # "adapter-off" (the base under the adapter), "copy" (a frozen copy) or None
    liger: bool = False  # Liger's fused kernels patch the model (CUDA + liger-kernel installed)
    beta: float = 0.1  # the objective's KL / preference weight (the config's, else the objective's default)
    loss_type: str = ""  # the objective's loss (the config's, else the objective's default; "" without a choice)
    packing: bool = False  # micro batches without padding, attention confined per example (finetune/model/packing.py)
    packing_note: str = ""  # why packing is on or off for this run, in a few words (a run-time veto's reason too)
    vision: VisionPlan | None = None  # a vision-language model (None: a text model)

    @property
    def trainer_optim(self) -> str:
        """`TrainingArguments.optim` for this plan."""
        return TRAINER_OPTIMIZERS[self.optimizer]

    @property
    def packing_line(self) -> str:
        """The run log's line on packing: 'packing: on: ...' or 'packing: off: why'."""
        return f"packing: {'on' if self.packing else 'off'}: {self.packing_note}"

    @property
    def is_classifier(self) -> bool:
        """The run trains a classification head (its objective's record says)."""
        return self.objective.is_classifier

    def without_packing(self, why: str) -> RunPlan:
        """This plan with packing vetoed at run time (the loaded model cannot keep packed examples apart): padded
        micro batches, `why` as its note. The run records this plan, and its log line is its `packing_line`."""
        return replace(self, packing=False, packing_note=f"{why}; this run pads its micro batches instead")

    def torch_dtype(self, name: str | None = None) -> Any:
        """A torch dtype by our name (default: the weight dtype)."""
        import torch

        return getattr(torch, name or self.weight_dtype)

    def auto_class(self) -> Any:
        """The transformers Auto class to load or build the model with."""
        import transformers

        return getattr(transformers, self.model_class)

    def lora_config(self) -> Any:
        """`peft.LoraConfig` for this plan (None for full fine-tuning)."""
        if self.lora is None:
            return None
        from peft import LoraConfig

        return LoraConfig(**self.lora.kwargs())

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-able data (the run's plan.json): every decision, the objective by its record's name; the
        config itself is the run's config.yaml."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "config"}
        values["objective"] = self.objective.name
        for name in ("lora", "quantization", "vision"):
            part = values[name]
            values[name] = None if part is None else {f.name: getattr(part, f.name) for f in fields(part)}
        if values["lora"] is not None and not isinstance(values["lora"]["target_modules"], str):
            values["lora"]["target_modules"] = list(values["lora"]["target_modules"])
        if values["lora"] is not None:
            values["lora"]["modules_to_save"] = list(values["lora"]["modules_to_save"])
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any], config: TrainConfig) -> RunPlan:
        """A plan read back from `to_dict()` data, for the run whose config is `config`."""
        known = {f.name for f in fields(cls)} - {"config"}
        data = {k: v for k, v in values.items() if k in known}
        data["objective"] = objectives.OBJECTIVES.get(data.get("objective", ""), objectives.of(config))
        data.setdefault("engine", engine_for(config))  # plan.json of a run from before the plan named its engine
        if data.get("lora") is not None:
            lora = dict(data["lora"])
            targets = lora["target_modules"]
            lora["target_modules"] = targets if isinstance(targets, str) else tuple(targets)
            lora["modules_to_save"] = tuple(lora.get("modules_to_save", ()))
            data["lora"] = LoraPlan(**lora)
        if data.get("quantization") is not None:
            data["quantization"] = QuantPlan(**data["quantization"])
        if data.get("vision") is not None:
            data["vision"] = VisionPlan(**data["vision"])
        return cls(config=config, **data)

    def replanned(self, world_size: int | None = None, **changes: Any) -> RunPlan:
        """The plan of this config with some fields changed, on the same device and world (or `world_size`
        processes): the estimator's what-ifs."""
        return plan_for(self.config.replace(**changes), device=self.device, world_size=world_size or self.world_size)

    def for_merge(self) -> RunPlan:
        """How an export merges the adapter into the base: on the CPU, in float32, never on a 4-bit base (a QLoRA
        run's adapter merges into the full-precision weights)."""
        return replace(
            self,
            device="cpu",
            precision="fp32",
            weight_dtype="float32",
            compute_dtype="float32",
            autocast_dtype=None,
            quantization=None,
            liger=False,
        )

    def placement(self) -> str:
        """Where a model loaded with this plan goes on this machine: the plan's GPU when there is one, else the CPU
        (a run trained on a GPU can still be chatted with here)."""
        return "cuda" if self.device == "cuda" and _cuda_available() else "cpu"

    def quantization_config(self) -> Any:
        """`transformers.BitsAndBytesConfig` for QLoRA (None otherwise)."""
        if self.quantization is None:
            return None
        import torch
        from transformers import BitsAndBytesConfig

        q = self.quantization
        skip = {"llm_int8_skip_modules": [*self.vision.unquantized(), "lm_head"]} if self.vision else {}
        return BitsAndBytesConfig(
            **skip,
            load_in_4bit=True,
            bnb_4bit_quant_type=q.quant_type,
            bnb_4bit_use_double_quant=q.double_quant,
            bnb_4bit_compute_dtype=getattr(torch, q.compute_dtype),
            bnb_4bit_quant_storage=torch.uint8,
        )


def plan_for(config: TrainConfig, device: str | None = None, world_size: int | None = None) -> RunPlan:
    """The plan for `config` on `device` ("cuda" or "cpu"; default: this machine) with `world_size` processes
    (default: the launcher's WORLD_SIZE, else 1)."""
    real = device is None
    if device is None:
        device = "cuda" if _cuda_available() else "cpu"
    if world_size is None:
        import os

        world_size = int(os.environ.get("WORLD_SIZE", "1"))
    precision = resolve_precision(config.precision, device, check_hardware=real)
    objective = objectives.of(config)
    half = None if precision == "fp32" else _TORCH_DTYPES[precision]
    # Full fine-tuning keeps fp32 master weights (autocast casts on the fly); LoRA adapters train on a 16-bit base;
    # QLoRA's non-quantised weights stay fp32 next to the 4-bit ones.
    weight = half if (half is not None and config.method == "lora") else "float32"
    vision = vision_plan(config)
    packing, packing_note = packing_for(config)
    if vision is not None and packing:
        packing, packing_note = False, VISION_UNPACKED
    return RunPlan(
        config=config,
        device=device,
        world_size=world_size,  # (the estimator refuses fewer than one process in plain words)
        precision=precision,
        model_class=model_class_for(objective, vision),
        weight_dtype=weight,
        compute_dtype=half or "float32",
        autocast_dtype=half,
        quantization=_quant_plan(config, half) if config.method == "qlora" else None,
        lora=lora_plan(config, vision) if config.method in ("lora", "qlora") else None,
        deepspeed=uses_deepspeed(config),
        engine=engine_for(config),
        optimizer=config.optim,
        effective_batch=config.per_device_train_batch_size * config.gradient_accumulation_steps * max(1, world_size),
        objective=objective,
        reference=objective.reference_kind(config),
        liger=uses_liger(config, device),
        beta=objective.beta(config),
        loss_type=objective.loss_type(config),
        packing=packing,
        packing_note=packing_note,
        vision=vision,
    )


def resolve_precision(precision: str, device: str, check_hardware: bool = True) -> str:
    """fp16/bf16 need a GPU; `auto` is bf16 where the GPU supports it, else fp32. CPU runs are fp32."""
    if device != "cuda":
        return "fp32"
    bf16_ok = _bf16_supported() if check_hardware else True
    if precision == "auto":
        return "bf16" if bf16_ok else "fp32"
    if precision == "bf16" and not bf16_ok:
        raise ConfigError("precision: bf16 is not supported by this GPU; use fp16 or fp32", field="precision")
    return precision


def model_class_for(objective: Objective, vision: VisionPlan | None = None) -> str:
    """The transformers Auto class an objective trains (a vision-language model: its image-text-to-text class)."""
    if objective.is_classifier:
        return "AutoModelForSequenceClassification"
    return "AutoModelForImageTextToText" if vision is not None else "AutoModelForCausalLM"


def vision_family(model: str) -> str | None:
    """The vision-language family (config.json's model_type) of a model, from its config alone (a local directory,
    the local Hub cache, or the offline catalogue); None for a text model or one not known here."""
    values = model_config_values(model)
    if not values:
        return None
    family = values.get("model_type")
    if family not in VISION_FAMILIES or not isinstance(values.get("vision_config"), dict):
        return None
    return family


def vision_plan(config: TrainConfig) -> VisionPlan | None:
    """The vision-language part of a plan, when the model is one and the task generates text."""
    family = vision_family(config.model)
    if family is None or objectives.of(config).is_classifier:
        return None
    return VisionPlan(
        family=family,
        freeze_vision_tower=config.freeze_vision_tower,
        freeze_projector=config.freeze_projector,
        image_longest_side=config.image_longest_side,
    )


def uses_deepspeed(config: TrainConfig) -> bool:
    """DeepSpeed runs the step: its own engine loop, or the Trainer with a ZeRO config."""
    return config.backend == "deepspeed" or config.zero_stage > 0


def engine_for(config: TrainConfig) -> str:
    """The module under finetune/engines/ that runs the step: the explicit DeepSpeed loop for `backend: deepspeed`
    (the config allows it only for objectives that loop can run), else the one the objective's record names."""
    return "deepspeed_engine" if config.backend == "deepspeed" else objectives.of(config).engine


def launch_plan(config: TrainConfig, world_size: int) -> RunPlan:
    """The plan of `config` launched on `world_size` GPUs (`launch-command`): this machine's when it has a GPU, else
    a GPU elsewhere (the precision as asked, `auto` as bf16: the hardware there is not known here)."""
    return plan_for(config, device=None if _cuda_available() else "cuda", world_size=world_size)


def packing_for(config: TrainConfig) -> tuple[bool, str]:
    """Whether micro batches train without padding (`finetune.model.packing`), and the reason in one line. On where it
    helps and the objective's trainer can (its record's `unpacked_because` says why not): more than one example per
    micro batch (one example has no padding to remove)."""
    if not config.packing:
        return False, "packing: false in the settings"
    why = objectives.of(config).unpacked_because
    if why:
        return False, why
    if config.per_device_train_batch_size == 1:
        return False, "one example per micro batch has no padding to remove"
    return True, "each micro batch is one row without padding, attention confined to each example"


# The causal-LM model families (config.json's model_type) liger-kernel 0.8.5 patches: the text models of its
# `liger_kernel.transformers.monkey_patch.MODEL_TYPE_TO_APPLY_LIGER_FN` (tests/test_liger.py checks this list against
# that table where liger-kernel is installed). Kept here so a CPU machine without it still plans a GPU run.
LIGER_MODEL_TYPES = frozenset(
    {
        "deepseek_v2", "deepseek_v3", "exaone4", "falcon_h1", "gemma", "gemma2", "gemma3_text", "glm4", "gpt_oss",
        "granite", "hunyuan_v1_dense", "hunyuan_v1_moe", "llama", "ministral", "mistral", "mixtral", "nemotron",
        "olmo2", "olmo3", "phi3", "qwen2", "qwen3", "qwen3_moe", "smollm3",
    }
)  # fmt: skip


def uses_liger(config: TrainConfig, device: str | None = None, strict: bool = False) -> bool:
    """Whether Liger's fused Triton kernels patch the model: they need a CUDA GPU, a causal LM of a family Liger
    patches and the liger-kernel package. `auto` takes them where they can run; `on` asks for them (`strict`, as in
    preflight: a one-line ConfigError naming liger_kernel where they cannot run on this machine)."""
    if config.liger_kernel == "off":
        return False
    if device is None:
        device = "cuda" if _cuda_available() else "cpu"
    reason = _liger_blocker(config, device)
    installed = _liger_installed()
    if config.liger_kernel == "on":
        if strict and (reason or not installed):
            why = reason or "the liger-kernel package is not installed (pip install -r requirements-gpu.txt)"
            raise ConfigError(f"liger_kernel: on, but {why}; choose auto or off", field="liger_kernel")
        return reason is None  # planning for a GPU elsewhere: the run there installs it (requirements-gpu.txt)
    return reason is None and installed


def liger_model_type(model: str) -> str | None:
    """The model family (config.json's model_type) of a local model or a Hub model whose config is in the local
    cache (`runs.preflight.model_ready` fetched it), without loading anything; None when it is not known here."""
    from finetune.config import EMBEDDED_MODEL

    if model == EMBEDDED_MODEL:
        return "llama"  # SmolLM2 is a Llama
    values = model_config_values(model, catalogue=False)
    model_type = values.get("model_type") if values else None
    return model_type if isinstance(model_type, str) else None


def model_config_values(model: str, catalogue: bool = True) -> dict[str, Any] | None:
    """config.json of a local model, of a Hub model in the local cache, or (`catalogue`) of a Hub id the offline
    catalogue holds, as a dict, without loading anything; None when none is here (the embedded model: a Llama)."""
    import json
    from pathlib import Path

    from finetune.config import EMBEDDED_MODEL

    if model == EMBEDDED_MODEL:
        return None
    path = Path(model).expanduser() / "config.json"
    if not path.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model, "config.json")
        except Exception:  # noqa: BLE001 - not a Hub id (a path that does not exist): unknown family
            cached = None
        if not isinstance(cached, str):
            if not catalogue:
                return None
            from finetune.model import catalogue as bundled

            return bundled.config_values(model) if bundled.is_hub_id(model) else None
        path = Path(cached)
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return values if isinstance(values, dict) else None


def _liger_blocker(config: TrainConfig, device: str) -> str | None:
    """Why Liger cannot run for this config on `device` (None: it can, given the package)."""
    if device != "cuda":
        return "Liger's kernels need a CUDA GPU and this run has none"
    objective = objectives.of(config)
    if objective.is_classifier:
        return "Liger's kernels serve causal_lm only (its fused loss replaces the language-model head's)"
    if not objective.liger:
        serves = ", ".join(o.name for o in objectives.OBJECTIVES.values() if o.liger)
        return f"the {objective.name} trainer does not use Liger's kernels (only {serves} does)"
    if config.backend == "deepspeed":
        return "the DeepSpeed engine loop does not apply Liger's kernels (backend trainer does, with ZeRO too)"
    family = liger_model_type(config.model)
    if family not in LIGER_MODEL_TYPES:
        known = "unknown" if family is None else repr(family)
        return f"the model family ({known}) is not one Liger patches (llama, mistral, qwen2/3, gemma, phi3, ...)"
    return None


def _liger_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("liger_kernel") is not None


def lora_targets(text: str) -> str | tuple[str, ...]:
    """`all-linear` (PEFT picks every linear layer but the output head; `all` means the same) or module names."""
    value = text.strip()
    if value in ("all-linear", "all"):
        return "all-linear"
    return tuple(name.strip() for name in value.split(",") if name.strip())


def lora_plan(config: TrainConfig, vision: VisionPlan | None = None) -> LoraPlan:
    """The adapter settings of a LoRA / QLoRA config (a vision-language model's: `vision_lora_targets`)."""
    targets = lora_targets(config.lora_target_modules)
    return LoraPlan(
        r=config.lora_r,
        alpha=config.lora_alpha,
        dropout=config.lora_dropout,
        target_modules=vision_lora_targets(targets, vision) if vision is not None else targets,
        modules_to_save=() if vision is None or vision.freeze_projector else vision.parts.projector,
        task_type="SEQ_CLS" if objectives.of(config).is_classifier else "CAUSAL_LM",
        use_dora=config.use_dora,
        use_rslora=config.use_rslora,
        init=config.init_lora_weights,
    )


def vision_lora_targets(targets: str | tuple[str, ...], vision: VisionPlan) -> str:
    """A full-name pattern (PEFT matches a string target against each whole module name) for the adapters of a
    vision-language model: the language model's blocks only, so `all-linear` never reaches the vision tower or the
    projector; with the vision tower unfrozen, its blocks' linear layers too."""
    import re

    parts = vision.parts
    names = LANGUAGE_LINEARS if targets == "all-linear" else targets
    language = rf"{re.escape(parts.language)}\.layers\.\d+\.(?:.*\.)?(?:{'|'.join(map(re.escape, names))})"
    patterns = [language]
    if not vision.freeze_vision_tower:
        blocks = f"{re.escape(parts.vision)}\\.{re.escape(parts.vision_blocks)}"
        patterns.append(rf"{blocks}\.\d+\.(?:.*\.)?(?:{'|'.join(parts.vision_linears)})")
    return rf"(?:.*\.)?(?:{'|'.join(patterns)})"


def _quant_plan(config: TrainConfig, half: str | None) -> QuantPlan:
    return QuantPlan(quant_type=config.quant_type, double_quant=config.double_quant, compute_dtype=half or "float32")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _bf16_supported() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
