"""Replay a training step on fake tensors and count live tensor storages: the peak memory without the memory.

The same `LiveBytes` counter on real tensors is how `bench/memory_accuracy.py` measures a real step.
Only imported when an estimate is computed (it imports torch and transformers).
"""

from __future__ import annotations

import contextlib
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

CATEGORY_OF_PHASE = {
    "setup": "other",
    "forward": "activations",
    "backward": "backward_temporaries",
    "optimizer": "optimizer_temporaries",
}


class LiveBytes(TorchDispatchMode):
    """Counts bytes of live tensor storages seen by the dispatcher; keeps the peak and its split by category."""

    def __init__(self) -> None:
        super().__init__()
        self._size: dict[int, int] = {}
        self._cat: dict[int, str] = {}
        self._refs: dict[int, Any] = {}
        self.by_cat: dict[str, int] = defaultdict(int)
        self.current = 0
        self.peak = 0
        self.peak_by_cat: dict[str, int] = {}
        self.phase = "setup"

    def _gone(self, key: int) -> None:
        """Storage freed: forget it."""
        n = self._size.pop(key, 0)
        self.by_cat[self._cat.pop(key, "other")] -= n
        self._refs.pop(key, None)
        self.current -= n

    def track(self, t: torch.Tensor, category: str | None = None) -> None:
        """Count the storage of `t` (once); a category re-tags an already counted storage."""
        st = t.untyped_storage()
        key = st._cdata
        n = st.nbytes()
        if key not in self._size:
            self._size[key] = 0
            self._cat[key] = category or CATEGORY_OF_PHASE.get(self.phase, "other")
            self._refs[key] = weakref.ref(st, lambda _r, k=key: self._gone(k))
        elif category is not None and category != self._cat[key]:
            self.by_cat[self._cat[key]] -= self._size[key]
            self.by_cat[category] += self._size[key]
            self._cat[key] = category
        if n != self._size[key]:
            self.by_cat[self._cat[key]] += n - self._size[key]
            self.current += n - self._size[key]
            self._size[key] = n
            if self.current > self.peak:
                self.peak = self.current
                self.peak_by_cat = {k: v for k, v in self.by_cat.items() if v}

    def reset_peak(self) -> None:
        """Start a new peak from the bytes live now."""
        self.peak = self.current
        self.peak_by_cat = {k: v for k, v in self.by_cat.items() if v}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.track(t)
        return out


@dataclass
class Plan:
    """How the engine runs a config on a device: dtypes, autocast, what is quantised and trained."""

    device: str = "cpu"
    method: str = "lora"
    weight_dtype: torch.dtype = torch.float32
    autocast_dtype: torch.dtype | None = None
    compute_dtype: torch.dtype = torch.float32
    task: str = "causal_lm"
    num_labels: int = 2
    batch: int = 1
    seq: int = 128
    accumulation: int = 1
    checkpointing: bool = False
    optim: str = "adamw_torch"
    foreach: bool = False
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.05
    lora_targets: str = "all-linear"
    quant_type: str = "nf4"
    double_quant: bool = True
    attn_implementation: str = "sdpa"
    extra: dict[str, Any] = field(default_factory=dict)


def plan_for(config: Any, device: str = "cuda") -> Plan:
    """The `Plan` our engine follows for a `TrainConfig` on `device` (cpu: fp32 kernels; cuda: bf16 unless fp32)."""
    half = _half_dtype(config.precision, device)
    weight = half if (half is not None and config.method != "qlora") else torch.float32
    return Plan(
        device=device,
        method=config.method,
        weight_dtype=weight,
        autocast_dtype=half,
        compute_dtype=half or torch.float32,
        task=config.task,
        num_labels=config.num_labels or 2,
        batch=config.per_device_train_batch_size,
        seq=config.max_seq_length,
        accumulation=config.gradient_accumulation_steps,
        checkpointing=config.gradient_checkpointing,
        optim=config.optim,
        foreach=device == "cuda",
        max_grad_norm=config.max_grad_norm,
        weight_decay=config.weight_decay,
        lora_r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        lora_targets=config.lora_target_modules,
        quant_type=config.quant_type,
        double_quant=config.double_quant,
    )


def _half_dtype(precision: str, device: str) -> torch.dtype | None:
    """The 16-bit dtype a run uses, or None for fp32 (always on CPU)."""
    if device != "cuda" or precision == "fp32":
        return None
    return torch.float16 if precision == "fp16" else torch.bfloat16


# ----------------------------------------------------------------------------- model building (as the engine does)


def lora_target_modules(spec: str) -> str | list[str]:
    """PEFT's `target_modules` value for our `lora_target_modules` text."""
    spec = spec.strip()
    return "all-linear" if spec == "all-linear" else [s.strip() for s in spec.split(",") if s.strip()]


def build_model(model_config: Any, plan: Plan, trust_remote_code: bool = False) -> torch.nn.Module:
    """The model the engine would train, built from its config under whatever mode is active (fake or real)."""
    import copy

    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    cfg = copy.deepcopy(model_config)
    cfg._attn_implementation = plan.attn_implementation
    if plan.task == "sequence_classification":
        cfg.num_labels = plan.num_labels
        if getattr(cfg, "pad_token_id", None) is None:
            cfg.pad_token_id = 0
        auto = AutoModelForSequenceClassification
    else:
        auto = AutoModelForCausalLM
    old = torch.get_default_dtype()
    torch.set_default_dtype(plan.weight_dtype)
    try:
        model = auto.from_config(cfg, trust_remote_code=trust_remote_code)
    finally:
        torch.set_default_dtype(old)
    model.train()
    if plan.method == "qlora":
        quantize_4bit(model, plan)
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=plan.checkpointing)
    if plan.method in ("lora", "qlora"):
        model = wrap_lora(model, plan)
    if plan.checkpointing:
        model.activation_checkpointing_enable() if hasattr(model, "activation_checkpointing_enable") else None
    return model


def wrap_lora(model: torch.nn.Module, plan: Plan) -> torch.nn.Module:
    """`peft.get_peft_model` with the LoRA settings of the plan."""
    from peft import LoraConfig, get_peft_model

    task = "SEQ_CLS" if plan.task == "sequence_classification" else "CAUSAL_LM"
    lc = LoraConfig(
        r=plan.lora_r,
        lora_alpha=plan.lora_alpha,
        lora_dropout=plan.lora_dropout,
        target_modules=lora_target_modules(plan.lora_targets),
        task_type=task,
    )
    return get_peft_model(model, lc)


def quantize_4bit(model: torch.nn.Module, plan: Plan) -> None:
    """Swap linear layers for bitsandbytes `Linear4bit` and quantise them, as `from_pretrained(quantization_config)`."""
    import bitsandbytes as bnb
    from transformers import BitsAndBytesConfig
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers.base import get_keys_to_not_convert

    qc = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=plan.quant_type,
        bnb_4bit_use_double_quant=plan.double_quant,
        bnb_4bit_compute_dtype=plan.compute_dtype,
    )
    originals = {n: m.weight for n, m in model.named_modules() if isinstance(m, (torch.nn.Linear, Conv1D))}
    replace_with_bnb_linear(model, modules_to_not_convert=get_keys_to_not_convert(model), quantization_config=qc)
    for name, module in model.named_modules():
        if isinstance(module, bnb.nn.Linear4bit) and name in originals:
            w = originals[name].detach()
            if issubclass(getattr(module, "source_cls", torch.nn.Linear), Conv1D):
                w = w.T
            old = module.weight
            module.weight = bnb.nn.Params4bit(w.contiguous(), requires_grad=False, **old.__dict__).to("cpu")
            if module.bias is not None:
                module.bias = torch.nn.Parameter(torch.zeros(module.bias.shape, dtype=w.dtype), requires_grad=False)
    model.is_loaded_in_4bit = True
    model.config.quantization_config = qc
    del originals


# ----------------------------------------------------------------------------- optimizer + step (as Trainer does)


def build_optimizer(model: torch.nn.Module, plan: Plan) -> torch.optim.Optimizer:
    """Trainer's optimizer for the plan: decay / no-decay groups, torch AdamW, bitsandbytes 8-bit AdamW or SGD."""
    decay = [p for n, p in model.named_parameters() if p.requires_grad and not _no_decay(n)]
    rest = [p for n, p in model.named_parameters() if p.requires_grad and _no_decay(n)]
    groups = [{"params": decay, "weight_decay": plan.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    if plan.optim == "sgd":
        return torch.optim.SGD(groups, lr=1e-4, foreach=plan.foreach)
    if plan.optim in ("adamw_8bit", "paged_adamw_8bit"):
        from bitsandbytes.optim import AdamW

        return AdamW(groups, lr=1e-4, optim_bits=8, is_paged=plan.optim.startswith("paged"))
    return torch.optim.AdamW(groups, lr=1e-4, foreach=plan.foreach)


def _no_decay(name: str) -> bool:
    """Trainer's no-weight-decay rule: biases and norms."""
    import re

    return bool(re.search(r"bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.)|ln_", name))


def make_batch(plan: Plan, vocab_size: int) -> dict[str, torch.Tensor]:
    """A worst-case batch: every row `seq` tokens long (no padding), labels on every token."""
    ids = torch.zeros((plan.batch, plan.seq), dtype=torch.long)
    if plan.task == "sequence_classification":
        return {"input_ids": ids, "labels": torch.zeros((plan.batch,), dtype=torch.long)}
    return {"input_ids": ids, "labels": torch.zeros((plan.batch, plan.seq), dtype=torch.long)}


def train_step(model, optimizer, batch, plan: Plan, counter: LiveBytes | None = None) -> None:
    """One micro batch + optimizer step exactly as Trainer runs it (autocast + fp32 outputs under amp)."""
    phase = (lambda p: setattr(counter, "phase", p)) if counter else (lambda p: None)
    phase("forward")
    model.train()
    amp = torch.autocast("cpu", dtype=plan.autocast_dtype) if plan.autocast_dtype else contextlib.nullcontext()
    with amp:
        out = model(**batch)
    if plan.autocast_dtype is not None:  # accelerate's convert_outputs_to_fp32
        out = {k: (v.float() if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in out.items()}
    loss = out["loss"]
    del out
    phase("backward")
    loss.backward()
    del loss
    phase("optimizer")
    params = [p for p in model.parameters() if p.requires_grad]
    if plan.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(params, plan.max_grad_norm, foreach=plan.foreach or None)
    optimizer.step()
    model.zero_grad(set_to_none=True)
    phase("setup")


def prime_optimizer(model, optimizer, plan: Plan, counter: LiveBytes | None = None) -> None:
    """Create the optimizer state (and accumulated grads when accumulating) so the traced step is a steady one."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    if plan.accumulation == 1:
        optimizer.zero_grad(set_to_none=True)
    if counter is not None:
        tag_state(model, optimizer, counter)


def tag_state(model, optimizer, counter: LiveBytes) -> None:
    """Tag live storages as weights / lora / gradients / optimizer so the peak can be split."""
    for name, p in model.named_parameters():
        counter.track(p, "lora" if "lora_" in name else "weights")
        if p.grad is not None:
            counter.track(p.grad, "gradients")
        qs = getattr(p, "quant_state", None)
        if qs is not None:
            for t in _quant_state_tensors(qs):
                counter.track(t, "quant_constants")
    for b in model.buffers():
        counter.track(b, "weights")
    for state in optimizer.state.values():
        for v in state.values():
            if torch.is_tensor(v):
                counter.track(v, "optimizer")
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda q: counter.track(q.grad, "gradients"))


def _quant_state_tensors(qs: Any) -> list[torch.Tensor]:
    """Tensors held by a bitsandbytes QuantState (absmax, code, nested state)."""
    out = [getattr(qs, k, None) for k in ("absmax", "code", "offset")]
    if getattr(qs, "state2", None) is not None:
        out += _quant_state_tensors(qs.state2)
    return [t for t in out if torch.is_tensor(t)]


@dataclass
class TraceResult:
    """Peak of live tensor bytes in a steady training step, split by category at the peak."""

    peak: int
    at_peak: dict[str, int]
    static: dict[str, int]


def trace(model_config: Any, plan: Plan, trust_remote_code: bool = False) -> TraceResult:
    """Build the model on fake tensors and replay one steady training step, counting live storages."""
    import warnings

    from torch._subclasses.fake_tensor import FakeTensorMode

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with FakeTensorMode(allow_non_fake_inputs=True), LiveBytes() as counter:
            model = build_model(model_config, plan, trust_remote_code)
            optimizer = build_optimizer(model, plan)
            prime_optimizer(model, optimizer, plan, counter)
            batch = make_batch(plan, model_config.vocab_size)
            static = {k: v for k, v in counter.by_cat.items() if v}
            counter.reset_peak()
            train_step(model, optimizer, batch, plan, counter)
            result = TraceResult(counter.peak, dict(counter.peak_by_cat), static)
            del model, optimizer, batch
    return result
