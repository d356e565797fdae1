"""`TrainConfig`: the one typed description of a run.

The UI form, the YAML file, the CLI and the model card are views of it.

The YAML file is flat, one key per field. Field names follow `TrainingArguments` / PEFT / DeepSpeed where those exist.
This module is light on purpose (no torch, no transformers) so the UI can build its form without heavy imports.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from finetune import objectives
from finetune.errors import ConfigError

EMBEDDED_MODEL = "embedded:smollm2-135m-instruct"
BUNDLED_DATASET = "bundled:pirate"

SCHEDULERS = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "cosine_with_min_lr",
    "warmup_stable_decay",
)
# lr_scheduler_type → DeepSpeed's scheduler for backend: deepspeed (its engine loop). Other types are refused for that
# backend up front, so a run never silently uses a different schedule than the one asked for.
DEEPSPEED_SCHEDULERS = {
    "constant": "WarmupLR",
    "constant_with_warmup": "WarmupLR",
    "linear": "WarmupDecayLR",
    "cosine": "WarmupCosineLR",
}
LORA_INITS = ("true", "gaussian", "pissa", "olora")  # PEFT's `init_lora_weights` names
REPORTERS = ("none", "tensorboard", "trackio", "wandb")
# Every objective's `loss_type` names ("" = the objective's own default), from the objectives registry.
LOSS_TYPES = ("", *dict.fromkeys(loss for o in objectives.OBJECTIVES.values() for loss in o.loss_types))
LIGER_CHOICES = ("auto", "on", "off")
OFFLOAD = ("none", "cpu", "nvme")
RUNS_ON = ("this_machine", "slurm")

# Bounds on what a user can paste or upload: a run config is a few KB of flat keys, so anything far beyond is refused
# before it is parsed (YAML aliases can expand a few hundred bytes into gigabytes).
MAX_YAML_BYTES = 64 * 1024
MAX_YAML_DEPTH = 3  # the mapping, a list value (lora_target_modules), nothing deeper
MAX_TEXT_CHARS = 4096  # one text field: a Hub id, a path, a column name
MAX_INT = 2**31 - 1  # whole-number fields end up in C ints (torch, numpy, the Trainer)
MAX_SEED = 2**32 - 1  # numpy's seed range
# Text fields a YAML file may also give as a list (kept as comma-separated text): what each item must be.
LIST_FIELDS = {
    "lora_target_modules": (str, "give layer names as text, e.g. [q_proj, v_proj]"),
    "rewards": (str, "give rewards as text, e.g. [number_match, 'max_length:64']"),
    "reward_weights": ((int, float), "give one number per reward, e.g. [1, 0.5]"),
}


def _f(default: Any, help: str, group: str, **rules: Any) -> Any:
    """A dataclass field with help text, a form group and validation rules (choices, min, max)."""
    if callable(default):
        return field(default_factory=default, metadata={"help": help, "group": group, **rules})
    return field(default=default, metadata={"help": help, "group": group, **rules})


def _default_model() -> str:
    # A Space sets FINETUNE_DEFAULT_MODEL to the Hub id; locally the embedded copy works offline.
    return os.environ.get("FINETUNE_DEFAULT_MODEL") or EMBEDDED_MODEL


@dataclass
class TrainConfig:
    """Everything that defines a fine-tuning run. Defaults give a short, visible demo on a laptop CPU."""

    # --- Model
    model: str = _f(
        _default_model,
        "Base model: a Hub id (HuggingFaceTB/SmolLM2-135M-Instruct), a local directory, "
        f"or the embedded default `{EMBEDDED_MODEL}` (works offline).",
        "Model",
    )
    trust_remote_code: bool = _f(
        False, "Run Python code shipped with the model repository. Only for repositories you trust.", "Model"
    )
    task: str = _f(
        objectives.CAUSAL_LM,
        "causal_lm: instruction / chat tuning (SFT). sequence_classification: predict a label for a text (or pair).",
        "Model",
        choices=objectives.TASKS,
    )
    num_labels: int = _f(
        0, "Number of classes for sequence classification; 0 = count them in the data.", "Model", min=0
    )

    # --- Data
    dataset: str = _f(
        BUNDLED_DATASET,
        f"Training data: a local .jsonl/.json/.csv/.parquet file, a Hub dataset id, or `{BUNDLED_DATASET}` "
        "(the bundled pirate-tutor set: every answer in pirate speak, easy to see the tuning take hold).",
        "Data",
    )
    dataset_split: str = _f("train", "Split to train on (Hub datasets and bundled data).", "Data")
    eval_split: str = _f(
        "validation", "Split for evaluation loss; empty = no evaluation. Ignored if the data has no such split.", "Data"
    )
    text_column: str = _f(
        "", "Column with plain text (or the first sentence for classification); empty = detect.", "Data"
    )
    text_pair_column: str = _f(
        "", "Second sentence column for pair classification (MRPC: sentence2); empty = detect.", "Data"
    )
    prompt_column: str = _f("", "Column with the prompt for prompt/completion data; empty = detect.", "Data")
    completion_column: str = _f("", "Column with the answer; the loss is computed on it only. Empty = detect.", "Data")
    messages_column: str = _f("", "Column with chat messages [{role, content}]; empty = detect.", "Data")
    label_column: str = _f(
        "", "Column with the class label (classification) or the true/false label (kto); empty = detect.", "Data"
    )
    chosen_column: str = _f("", "Column with the preferred answer (dpo, orpo); empty = detect.", "Data")
    rejected_column: str = _f("", "Column with the worse answer (dpo, orpo); empty = detect.", "Data")
    max_seq_length: int = _f(
        256, "Longest tokenised example; longer ones are truncated. Memory grows linearly with it.", "Data", min=8
    )
    image_longest_side: int = _f(
        0,
        "Vision-language models: the longest side, in pixels, an image is resized to before the model sees it "
        "(Qwen-VL: max_pixels = this side squared). Image tokens, and so memory, grow with its square. "
        "0 = the model's own processor setting.",
        "Data",
        min=0,
        max=8192,
    )
    packing: bool = _f(
        True,
        "Train without padding: each micro batch's examples sit end to end in one row and attend only within "
        "themselves, so the loss and gradients are the padded batch's, with no compute spent on padding. Used where "
        "it applies (sft on a causal LM, more than one example per micro batch); the run log says when it is off.",
        "Data",
    )

    # --- Objective
    objective: str = _f(
        objectives.DEFAULT,
        "sft: learn to give the answers in the data (supervised fine-tuning). dpo: learn which of two answers is "
        "better (prompt, chosen, rejected). orpo: SFT and preference in one loss, no reference model. kto: learn from "
        "single answers marked good or bad (prompt, completion, label). grpo: learn from rewards: the model samples "
        "answers to each prompt and the rewards score them (prompt; rewards).",
        "Objective",
        choices=objectives.CHOICES,
    )
    beta: float | None = _f(
        None,
        "KL / preference strength; empty = the objective's usual value (dpo, orpo, kto: 0.1; grpo: 0, TRL's default: "
        "no KL term and no reference model). dpo/kto/grpo: how far the tuned model may move from the reference "
        "(higher stays closer). orpo: weight of the preference term beside the SFT loss.",
        "Objective",
        min=0.0,
        max=100.0,
        optional=True,
    )
    loss_type: str = _f(
        "",
        "DPO or GRPO loss; empty = the objective's default (dpo: rpo, grpo: dapo). DPO: rpo adds the SFT loss on the "
        "chosen answer, which keeps the model fluent while it learns the preference; sigmoid is the original DPO (use "
        "a small learning rate: it can drift into nonsense); ipo, a squared loss that does not over-fit clean pairs; "
        "hinge, SLiC's margin loss; robust tolerates some pairs labelled the wrong way round. GRPO (TRL's names): dapo "
        "averages over every token of the step (no length bias); grpo per answer's length; dr_grpo by a constant; "
        "bnpo over the micro batch's tokens; cispo, sapo, luspo and vespo are the papers' variants.",
        "Objective",
        choices=LOSS_TYPES,
    )
    rewards: str = _f(
        "",
        "grpo: what scores each sampled answer, comma-separated: number_match (the last number equals the answer "
        "column's), exact_match, regex:PATTERN, contains:TEXT, max_length:N (1 up to N tokens, 0 at 2N), "
        "python:FILE:FUNCTION (TRL's signature f(prompts, completions, **columns) -> list of numbers).",
        "Objective",
    )
    reward_weights: str = _f(
        "", "grpo: one weight per reward, comma-separated (1,0.5); empty = every reward weighs 1.", "Objective"
    )
    num_generations: int = _f(
        4,
        "grpo: answers sampled per prompt and compared with each other; it must divide the completions of a step "
        "(per_device_train_batch_size × gradient_accumulation_steps).",
        "Objective",
        min=2,
    )
    max_completion_length: int = _f(
        128, "grpo: longest sampled answer, in tokens (memory grows with it).", "Objective", min=1
    )
    temperature: float = _f(
        1.0,
        "grpo: sampling temperature of the answers (higher: more varied answers to learn from).",
        "Objective",
        min=0.01,
        max=10.0,
    )

    # --- Method
    method: str = _f(
        "lora",
        "full: train every weight (most memory). lora: small adapters, base frozen. "
        "qlora: LoRA on a 4-bit base (least memory, needs bitsandbytes).",
        "Method",
        choices=("full", "lora", "qlora"),
    )
    freeze_vision_tower: bool = _f(
        True,
        "Vision-language models: keep the image encoder's weights as they are (less memory; LoRA adapters go on the "
        "language model only). Off: it trains too (full) or gets adapters of its own (lora, qlora).",
        "Method",
    )
    freeze_projector: bool = _f(
        True,
        "Vision-language models: keep the projector (the layers that turn image features into the language model's "
        "tokens) as it is. Off: it trains in full, also under lora and qlora.",
        "Method",
    )
    lora_r: int = _f(8, "LoRA rank: higher learns more and uses more memory.", "Method", min=1, max=1024)
    lora_alpha: int = _f(16, "LoRA scaling (alpha / r multiplies the update); usually 2 × r.", "Method", min=1)
    lora_dropout: float = _f(0.05, "Dropout on the LoRA path; regularises small data.", "Method", min=0.0, max=0.9)
    lora_target_modules: str = _f(
        "all-linear", "Layers that get adapters: `all-linear` or comma-separated names (q_proj,v_proj).", "Method"
    )
    use_dora: bool = _f(
        False,
        "DoRA: adapt each weight's direction and magnitude separately. Often better at low rank; "
        "slower, and more activation memory (the weight norm is recomputed every step).",
        "Method",
    )
    use_rslora: bool = _f(
        False,
        "rsLoRA: scale the update by alpha/√r instead of alpha/r, so high ranks (r ≥ 32) keep learning.",
        "Method",
    )
    init_lora_weights: str = _f(
        "true",
        "How adapters start. true: B = 0, the tuned model starts as the base. gaussian: random A and B, scaled. "
        "pissa: from the base weights' principal components (converges faster; the saved adapter is converted to "
        "load on the unchanged base). olora: an orthonormal (QR) start.",
        "Method",
        choices=LORA_INITS,
    )
    quant_type: str = _f(
        "nf4", "4-bit data type for QLoRA: nf4 (best for weights) or fp4.", "Method", choices=("nf4", "fp4")
    )
    double_quant: bool = _f(
        True, "QLoRA: quantise the quantisation constants too (saves ~0.4 bit per weight).", "Method"
    )

    # --- Optimisation
    per_device_train_batch_size: int = _f(4, "Examples per step on each device (micro batch).", "Optimisation", min=1)
    gradient_accumulation_steps: int = _f(
        1, "Micro batches summed before each update: a larger effective batch at no memory cost.", "Optimisation", min=1
    )
    learning_rate: float = _f(
        5e-4,
        "Peak learning rate. LoRA likes 1e-4..1e-3; full fine-tuning 1e-5..5e-5.",
        "Optimisation",
        min=0.0,
        max=1.0,
    )
    weight_decay: float = _f(0.0, "Decoupled weight decay (AdamW).", "Optimisation", min=0.0, max=1.0)
    max_grad_norm: float = _f(1.0, "Clip the gradient norm to this; 0 = no clipping.", "Optimisation", min=0.0)
    optim: str = _f(
        "adamw_torch",
        "adamw_torch: standard. adamw_8bit: 8-bit states (~75% less optimizer memory). "
        "paged_adamw_8bit: also pages states to CPU under pressure. sgd: momentum SGD, least memory.",
        "Optimisation",
        choices=("adamw_torch", "adamw_8bit", "paged_adamw_8bit", "sgd"),
    )
    lr_scheduler_type: str = _f(
        "cosine",
        "How the learning rate changes over the run (cosine_with_min_lr ends at 10% of the peak; "
        "warmup_stable_decay holds the peak, then decays over the last 10% of the steps).",
        "Optimisation",
        choices=SCHEDULERS,
    )
    warmup_steps: int = _f(2, "Steps of linear warm-up from 0 to the learning rate.", "Optimisation", min=0)
    num_train_epochs: float = _f(1.0, "Passes over the data (used when max_steps is -1).", "Optimisation", min=0.01)
    max_steps: int = _f(40, "Optimizer steps to run; -1 = run num_train_epochs.", "Optimisation", min=-1)
    seed: int = _f(42, "Random seed for data order and initialisation.", "Optimisation", min=0, max=MAX_SEED)

    # --- Precision & memory
    precision: str = _f(
        "auto",
        "auto: bf16 on a GPU that supports it, else fp32. fp16/bf16 halve activation memory on a GPU; "
        "on a CPU they fall back to fp32.",
        "Precision & memory",
        choices=("auto", "fp32", "fp16", "bf16"),
    )
    gradient_checkpointing: bool = _f(
        False, "Recompute activations in the backward pass: much less memory, ~30% slower.", "Precision & memory"
    )
    liger_kernel: str = _f(
        "auto",
        "Liger's fused Triton kernels (RMSNorm, SwiGLU, RoPE, and a cross-entropy that never holds the full logits): "
        "faster, less memory. auto: on with a CUDA GPU, a supported model family and liger-kernel installed. "
        "on: require it. off: plain PyTorch.",
        "Precision & memory",
        choices=LIGER_CHOICES,
    )

    # --- DeepSpeed
    backend: str = _f(
        "trainer",
        "trainer: Hugging Face Trainer (uses DeepSpeed if zero_stage > 0). deepspeed: the DeepSpeed engine loop.",
        "DeepSpeed",
        choices=("trainer", "deepspeed"),
    )
    zero_stage: int = _f(
        0,
        "ZeRO stage: 0 off, 1 optimizer states, 2 + gradients, 3 + parameters sharded over GPUs.",
        "DeepSpeed",
        min=0,
        max=3,
    )
    offload_optimizer: str = _f(
        "none",
        "Move optimizer states to cpu or nvme (ZeRO ≥ 1): slower, less GPU memory.",
        "DeepSpeed",
        choices=OFFLOAD,
    )
    offload_param: str = _f("none", "Move parameters to cpu or nvme (ZeRO-3 only).", "DeepSpeed", choices=OFFLOAD)
    nvme_path: str = _f("", "Directory on a fast local disk for NVMe offload.", "DeepSpeed")

    # --- Output
    output_dir: str = _f(
        "", "Run directory; empty = a new folder under the runs root named after the time and model.", "Output"
    )
    logging_steps: int = _f(1, "Log the loss every N steps.", "Output", min=1)
    save_steps: int = _f(20, "Save a checkpoint every N steps (resume continues from the last one).", "Output", min=1)
    eval_steps: int = _f(20, "Evaluate (loss + sample answers) every N steps.", "Output", min=1)
    report_to: str = _f("none", "Also log to an experiment tracker.", "Output", choices=REPORTERS)

    # --- Where it runs (docs/cluster.md)
    runs_on: str = _f(
        "this_machine",
        "this_machine: train here (one process, or a process group). slurm: submit a batch job to a Slurm cluster "
        "(python -m finetune submit, or Start in the Train tab).",
        "Where it runs",
        choices=RUNS_ON,
    )
    nodes: int = _f(1, "slurm: machines (nodes) the job uses; one torchrun per node.", "Where it runs", min=1, max=1024)
    gpus_per_node: int = _f(
        1,
        "slurm: GPUs per node, one process each; 0 = one process per node on its CPUs.",
        "Where it runs",
        min=0,
        max=64,
    )
    slurm_partition: str = _f("", "slurm: the partition (queue); empty = the cluster's default.", "Where it runs")
    slurm_time: str = _f(
        "",
        "slurm: the time limit (HH:MM:SS, D-HH:MM:SS or minutes); empty = the partition's. A checkpoint is saved "
        "shortly before it.",
        "Where it runs",
    )
    slurm_account: str = _f("", "slurm: the account charged; empty = your default.", "Where it runs")
    slurm_extra: str = _f(
        "",
        "slurm: extra #SBATCH options, one per line or separated by ; (--constraint=a100; --qos=high).",
        "Where it runs",
    )

    def __post_init__(self) -> None:
        self.validate()

    # ----- validation
    def errors(self) -> list[ConfigError]:
        """Every problem in this config, one error per bad field (the UI shows each beside its field)."""
        problems: list[ConfigError] = []
        for f in fields(self):
            try:
                setattr(self, f.name, _coerce(f, getattr(self, f.name)))
                _check_rules(f, getattr(self, f.name))
            except ConfigError as exc:
                problems.append(exc)
        if problems:
            return problems
        return _cross_field_errors(self)

    def validate(self) -> None:
        """Raise the first problem as a `ConfigError`."""
        problems = self.errors()
        if problems:
            raise problems[0]

    # ----- views
    def to_dict(self) -> dict[str, Any]:
        """Plain dict in field order (the YAML file)."""
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        """YAML text with one key per field."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)

    def replace(self, **changes: Any) -> TrainConfig:
        """A validated copy with some fields changed."""
        return TrainConfig.from_dict({**self.to_dict(), **changes})

    @property
    def effective_batch_size(self) -> int:
        """Examples per optimizer step on one device."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """Build from a mapping; unknown keys are refused with the closest valid key."""
        if not isinstance(values, dict):
            raise ConfigError(f"config: expected a mapping of key: value, got {type(values).__name__}")
        for key in values:
            if key not in FIELD_NAMES:
                raise ConfigError(_unknown_key_message(str(key)), field=str(key))
        return cls(**values)

    @classmethod
    def from_yaml(cls, text: str) -> TrainConfig:
        """Parse YAML text (an empty document gives the defaults); oversized or alias-laden text is refused."""
        check_yaml_bounds(text)
        try:
            values = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except yaml.YAMLError as exc:
            raise ConfigError(yaml_error_message(exc)) from None
        return cls.from_dict(values or {})

    @classmethod
    def load(cls, path: str | Path) -> TrainConfig:
        """Read a YAML config file."""
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"--config: file not found: {p}")
        try:
            if p.stat().st_size > MAX_YAML_BYTES:
                raise ConfigError(_too_big_message(f"--config: {p}", p.stat().st_size))
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
            raise ConfigError(f"--config: cannot read {p}: {reason}") from None
        return cls.from_yaml(text)

    def save(self, path: str | Path) -> None:
        """Write the YAML file atomically."""
        from finetune.atomic import write_text

        write_text(Path(path), self.to_yaml())


FIELDS = {f.name: f for f in fields(TrainConfig)}
FIELD_NAMES = tuple(FIELDS)


def field_kind(name: str) -> str:
    """A field's value type: bool, int, float or str (an optional number is its number type)."""
    f = FIELDS[name]
    kind = f.type if isinstance(f.type, str) else f.type.__name__
    return kind.replace(" | None", "")


def field_optional(name: str) -> bool:
    """Whether a field may be left empty (it then takes the value the rest of the config implies)."""
    return bool(FIELDS[name].metadata.get("optional"))


def field_help(name: str) -> str:
    """Help text of one field."""
    return FIELDS[name].metadata["help"]


# What a person reads beside each field; the config key stays as a small hint for YAML and CLI users.
LABELS = {
    "model": "Base model",
    "trust_remote_code": "Trust the model's own code",
    "task": "Task",
    "num_labels": "Number of classes",
    "dataset": "Training data",
    "dataset_split": "Training split",
    "eval_split": "Evaluation split",
    "text_column": "Text column",
    "text_pair_column": "Second text column",
    "prompt_column": "Prompt column",
    "completion_column": "Answer column",
    "messages_column": "Conversation column",
    "label_column": "Label column",
    "chosen_column": "Preferred answer column",
    "rejected_column": "Worse answer column",
    "max_seq_length": "Longest example (tokens)",
    "image_longest_side": "Longest image side (pixels)",
    "packing": "Skip padding (pack examples)",
    "objective": "Training goal",
    "beta": "KL / preference strength (beta)",
    "loss_type": "Loss (DPO / GRPO)",
    "rewards": "Rewards",
    "reward_weights": "Reward weights",
    "num_generations": "Answers per prompt",
    "max_completion_length": "Longest answer (tokens)",
    "temperature": "Sampling temperature",
    "method": "Method",
    "freeze_vision_tower": "Freeze the vision tower",
    "freeze_projector": "Freeze the projector",
    "lora_r": "LoRA rank",
    "lora_alpha": "LoRA alpha",
    "lora_dropout": "LoRA dropout",
    "lora_target_modules": "Layers with adapters",
    "use_dora": "DoRA (weight-decomposed LoRA)",
    "use_rslora": "rsLoRA (rank-stabilised scaling)",
    "init_lora_weights": "Adapter initialisation",
    "quant_type": "4-bit data type",
    "double_quant": "Double quantisation",
    "per_device_train_batch_size": "Batch size per device",
    "gradient_accumulation_steps": "Gradient accumulation steps",
    "learning_rate": "Learning rate",
    "weight_decay": "Weight decay",
    "max_grad_norm": "Gradient clipping",
    "optim": "Optimizer",
    "lr_scheduler_type": "Learning-rate schedule",
    "warmup_steps": "Warm-up steps",
    "num_train_epochs": "Epochs",
    "max_steps": "Training steps",
    "seed": "Random seed",
    "precision": "Precision",
    "gradient_checkpointing": "Gradient checkpointing",
    "liger_kernel": "Liger fused kernels",
    "backend": "Training engine",
    "zero_stage": "ZeRO stage",
    "offload_optimizer": "Offload optimizer states",
    "offload_param": "Offload parameters",
    "nvme_path": "NVMe folder",
    "output_dir": "Run folder",
    "logging_steps": "Log every N steps",
    "save_steps": "Checkpoint every N steps",
    "eval_steps": "Evaluate every N steps",
    "report_to": "Experiment tracker",
    "runs_on": "Where it runs",
    "nodes": "Nodes",
    "gpus_per_node": "GPUs per node",
    "slurm_partition": "Partition",
    "slurm_time": "Time limit",
    "slurm_account": "Account",
    "slurm_extra": "Extra #SBATCH options",
}


def field_label(name: str) -> str:
    """The human label of one field (the key itself if none is set)."""
    return LABELS.get(name, name)


def field_groups() -> dict[str, list[str]]:
    """Field names by form group, in declaration order."""
    groups: dict[str, list[str]] = {}
    for f in fields(TrainConfig):
        groups.setdefault(f.metadata["group"], []).append(f.name)
    return groups


def check_yaml_bounds(text: str) -> None:
    """Refuse YAML a flat config never needs before it is built: too long, aliases (`*name`), or deep nesting.

    Scanning the event stream costs microseconds per KB and builds nothing, so an alias bomb is refused at once.
    """
    size = len(text.encode("utf-8", errors="replace"))
    if size > MAX_YAML_BYTES:
        raise ConfigError(_too_big_message("config", size))
    depth = 0
    try:
        for event in yaml.parse(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            if isinstance(event, yaml.AliasEvent):
                raise ConfigError("config: YAML aliases (*name) are not supported in a run config; write values out")
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    raise ConfigError("config: nested too deeply; a run config is flat: one `key: value` per line")
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_error_message(exc)) from None


def yaml_error_message(exc: yaml.YAMLError) -> str:
    """'config: not valid YAML at line N: problem', one line, for a YAML syntax error or a character YAML refuses
    (a NUL byte: 'at character N: control characters are not allowed (#x0000)')."""
    if isinstance(exc, yaml.reader.ReaderError):
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        return f"config: not valid YAML at character {exc.position + 1}: {exc.reason} (#x{code:04x})"
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}" if mark else ""
    problem = getattr(exc, "problem", None) or (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"config: not valid YAML{where}: {problem}"


def _too_big_message(what: str, size: int) -> str:
    return f"{what}: {size // 1024} KB is too large for a run config (at most {MAX_YAML_BYTES // 1024} KB)"


def parse_set_option(item: str) -> tuple[str, str]:
    """Split a CLI `--set key=value` item."""
    if "=" not in item:
        raise ConfigError(f"--set: expected key=value, got {item!r}")
    key, value = item.split("=", 1)
    key = key.strip()
    if key not in FIELDS:
        raise ConfigError(f"--set: {_unknown_key_message(key)}", field=key)
    return key, value.strip()


def _unknown_key_message(key: str) -> str:
    close = difflib.get_close_matches(key, FIELD_NAMES, n=1, cutoff=0.5)
    hint = f"; did you mean '{close[0]}'?" if close else f"; valid keys: {', '.join(FIELD_NAMES)}"
    return f"{key}: unknown config key{hint}"


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def _coerce(f: dataclasses.Field, value: Any) -> Any:
    """Turn YAML / CLI / form values into the field's type, or raise a clear error."""
    kind = field_kind(f.name)
    name = f.name
    if f.metadata.get("optional") and (value is None or (isinstance(value, str) and not value.strip())):
        return None  # empty: the value the rest of the config implies (the objective's own beta)
    if name == "init_lora_weights" and isinstance(value, bool):
        return "true" if value else value  # PEFT's True; False (random, for debugging) is not offered
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise ConfigError(f"{name}: {_short(value)} is not a boolean; use true or false", field=name)
    if kind == "int":
        if isinstance(value, bool):
            raise ConfigError(f"{name}: {_short(value)} is not a whole number", field=name)
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise ConfigError(f"{name}: {_short(value)} is not a whole number{_range_text(f)}", field=name)
    if kind == "float":
        if isinstance(value, bool):
            raise ConfigError(f"{name}: {_short(value)} is not a number", field=name)
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: {_short(value)} is not a number{_range_text(f)}", field=name) from None
        if not math.isfinite(number):
            raise ConfigError(f"{name}: {_short(value)} is not a finite number", field=name)
        return number
    # str
    if value is None:
        return ""
    if isinstance(value, (list, tuple)) and name in LIST_FIELDS:
        if len(value) > 1000 or not all(isinstance(v, LIST_FIELDS[name][0]) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{name}: {LIST_FIELDS[name][1]}", field=name)
        value = ",".join(str(v) for v in value)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and name in ("dataset_split", "eval_split"):
        return str(value)
    if not isinstance(value, str):
        raise ConfigError(f"{name}: {_short(value)} is not text", field=name)
    if len(value) > MAX_TEXT_CHARS:
        raise ConfigError(f"{name}: {len(value)} characters is too long (at most {MAX_TEXT_CHARS})", field=name)
    return value.strip()


def _short(value: Any) -> str:
    """A value for an error line: its repr, cut so a pasted megabyte never floods the terminal or the page."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _range_text(f: dataclasses.Field, hi: Any = None) -> str:
    lo, hi = f.metadata.get("min"), f.metadata.get("max", hi)
    if lo is not None and hi is not None:
        return f"; allowed: {lo} to {hi}"
    if lo is not None:
        return f"; allowed: ≥ {lo}"
    return ""


def _check_rules(f: dataclasses.Field, value: Any) -> None:
    choices = f.metadata.get("choices")
    if choices and value not in choices:
        close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(
            f"{f.name}: {_short(value)} is not allowed{hint}; choose one of: {', '.join(choices)}", field=f.name
        )
    if value is None:
        return  # an optional number left empty
    lo, hi = f.metadata.get("min"), f.metadata.get("max")
    if hi is None and field_kind(f.name) == "int":
        hi = MAX_INT
    if lo is not None and value < lo:
        raise ConfigError(f"{f.name}: {_short(value)} is out of range{_range_text(f)}", field=f.name)
    if hi is not None and value > hi:
        raise ConfigError(f"{f.name}: {_short(value)} is out of range{_range_text(f, hi)}", field=f.name)


def _cross_field_errors(c: TrainConfig) -> list[ConfigError]:
    """Contradictions between fields; each error names the field to change."""
    out: list[ConfigError] = []

    def bad(name: str, message: str) -> None:
        out.append(ConfigError(f"{name}: {message}", field=name))

    if not c.model:
        bad("model", "empty; give a Hub id, a local directory or " + EMBEDDED_MODEL)
    if not c.dataset:
        bad("dataset", f"empty; give a data file, a Hub dataset id or {BUNDLED_DATASET}")
    if not c.lora_target_modules and c.method != "full":
        bad("lora_target_modules", "empty; use all-linear or names like q_proj,v_proj")
    if c.max_steps == 0:
        bad("max_steps", "0 would train nothing; use a positive number or -1 for num_train_epochs")
    if c.offload_param != "none" and c.zero_stage != 3:
        bad("offload_param", f"{c.offload_param!r} needs zero_stage: 3 (parameter offload is a ZeRO-3 feature)")
    if c.offload_optimizer != "none" and c.zero_stage == 0:
        bad("offload_optimizer", f"{c.offload_optimizer!r} needs zero_stage 1, 2 or 3")
    if "nvme" in (c.offload_optimizer, c.offload_param) and not c.nvme_path:
        bad("nvme_path", "NVMe offload needs nvme_path: a directory on a fast local disk")
    if c.offload_optimizer == "nvme" and c.zero_stage in (1, 2):
        bad("offload_optimizer", "'nvme' needs zero_stage: 3 (ZeRO 1-2 offload the optimizer to cpu only)")
    if c.offload_optimizer != "none" and c.optim != "adamw_torch":
        bad("optim", f"{c.optim!r} cannot be offloaded; offload_optimizer runs DeepSpeed's CPU AdamW: use adamw_torch")
    if c.backend == "deepspeed" and c.method == "qlora":
        bad("method", "qlora is not supported with backend: deepspeed; use backend: trainer or method: lora")
    if c.backend == "deepspeed" and c.optim != "adamw_torch":
        bad("optim", f"{c.optim!r} is not available with backend: deepspeed (it runs AdamW); use adamw_torch")
    if c.backend == "deepspeed" and c.lr_scheduler_type not in DEEPSPEED_SCHEDULERS:
        bad(
            "lr_scheduler_type",
            f"{c.lr_scheduler_type!r} is not available with backend: deepspeed; use {', '.join(DEEPSPEED_SCHEDULERS)}",
        )
    if c.zero_stage == 3 and c.method == "qlora":
        bad("zero_stage", "ZeRO-3 cannot shard 4-bit QLoRA weights here; use zero_stage 0-2 or method: lora")
    if c.method == "full":
        for name in ("use_dora", "use_rslora"):
            if getattr(c, name):
                bad(name, "applies to lora and qlora (method: full trains every weight); set it false or change method")
        if c.init_lora_weights != "true":
            bad("init_lora_weights", "applies to lora and qlora (method: full has no adapters); use true")
    if c.init_lora_weights in ("pissa", "olora") and (c.backend == "deepspeed" or c.zero_stage == 3):
        bad(
            "init_lora_weights",
            f"{c.init_lora_weights} needs backend: trainer with zero_stage 0-2 (its final adapter is converted "
            "from the whole weights)",
        )
    if c.method == "qlora" and c.init_lora_weights in ("pissa", "olora"):
        bad(
            "init_lora_weights",
            f"{c.init_lora_weights} rewrites the base weights, which QLoRA keeps in 4 bits; use method: lora",
        )
    out += [ConfigError(f"{name}: {message}", field=name) for name, message in objectives.config_problems(c)]
    if c.method == "qlora" and c.optim == "sgd":
        pass  # allowed: SGD on LoRA weights works, just unusual
    if c.slurm_time and not SLURM_TIME.fullmatch(c.slurm_time.strip()):
        bad("slurm_time", f"{c.slurm_time[:40]!r} is not a Slurm time limit; use HH:MM:SS, D-HH:MM:SS or minutes")
    try:
        sbatch_extra_options(c.slurm_extra)
    except ConfigError as exc:
        out.append(exc)
    return out


# Slurm's time limit formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
SLURM_TIME = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}")


def sbatch_extra_options(text: str) -> list[str]:
    """The `slurm_extra` setting as sbatch options, one per item (`--qos=high`); a line may keep its `#SBATCH `."""
    options = []
    for item in re.split(r"[\n;]", text or ""):
        item = item.strip()
        if item.startswith("#SBATCH"):
            item = item[len("#SBATCH") :].strip()
        if not item:
            continue
        if not item.startswith("-") or any(ch in item for ch in "\r\0`$"):
            raise ConfigError(
                f"slurm_extra: {item[:60]!r} is not an sbatch option; give options like --qos=high, one per line",
                field="slurm_extra",
            )
        options.append(item)
    return options
