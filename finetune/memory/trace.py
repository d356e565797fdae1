"""Replay a training step on fake tensors and count live tensor storages: the peak memory without the memory.

The same `LiveBytes` counter on real tensors is how `bench/memory_accuracy.py` measures a real step.
Only imported when an estimate is computed (it imports torch and transformers).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

CATEGORY_OF_PHASE = {
    "setup": "activations",
    "forward": "activations",
    "forward_head": "logits_loss",
    "backward_head": "logits_loss",
    "backward_top_block": "backward_temporaries",
    "backward_blocks": "backward_temporaries",
    "backward_bottom_block": "backward_temporaries",
    "backward_tail": "backward_temporaries",
    "optimizer": "optimizer_temporaries",
}


class LiveBytes(TorchDispatchMode):
    """Counts bytes of live tensor storages seen by the dispatcher; keeps the peak of each phase and its split."""

    def __init__(self) -> None:
        super().__init__()
        self._size: dict[int, int] = {}
        self._cat: dict[int, str] = {}
        self._refs: dict[int, Any] = {}
        self.by_cat: dict[str, int] = defaultdict(int)
        self.current = 0
        self.phase = "setup"
        self.phase_peak: dict[str, int] = {}
        self.phase_split: dict[str, dict[str, int]] = {}

    @property
    def peak(self) -> int:
        """Highest live bytes seen in any phase."""
        return max(self.phase_peak.values(), default=self.current)

    @property
    def peak_split(self) -> dict[str, int]:
        """Bytes by category at the highest peak."""
        if not self.phase_peak:
            return {}
        return self.phase_split[max(self.phase_peak, key=self.phase_peak.get)]

    def set_phase(self, phase: str) -> None:
        """Enter a phase; its peak starts from the bytes live now."""
        self.phase = phase
        self._bump()

    def reset(self, phase: str = "setup") -> None:
        """Forget all peaks and enter `phase`."""
        self.phase_peak.clear()
        self.phase_split.clear()
        self.set_phase(phase)

    def _bump(self) -> None:
        if self.current > self.phase_peak.get(self.phase, -1):
            self.phase_peak[self.phase] = self.current
            self.phase_split[self.phase] = {k: v for k, v in self.by_cat.items() if v}

    def _gone(self, key: int) -> None:
        """Storage freed: forget it."""
        n = self._size.pop(key, 0)
        self.by_cat[self._cat.pop(key, "other")] -= n
        self._refs.pop(key, None)
        self.current -= n

    def track(self, t: torch.Tensor, category: str | None = None) -> None:
        """Count the storage of `t` (once); a category re-tags an already counted storage."""
        if t.device.type == "meta":
            return
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
            self._bump()

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
    lora_kwargs: dict = field(default_factory=dict)  # peft.LoraConfig arguments from the run plan (variants included)


def plan_for(config: Any, device: str = "cuda") -> Plan:
    """The `Plan` our engine (`finetune.models.load_model` + Trainer) follows for a `TrainConfig` on `device`.

    cpu: everything fp32. cuda: bf16 unless the config asks fp32/fp16; full fine-tuning keeps fp32 weights under
    autocast, LoRA puts a 16-bit base under fp32 adapters, QLoRA keeps non-quantised weights fp32.
    """
    half = _half_dtype(config.precision, device)
    weight = half if (half is not None and config.method == "lora") else torch.float32
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
        lora_kwargs=estimation_lora_kwargs(config) if config.method in ("lora", "qlora") else {},
    )


def estimation_lora_kwargs(config: Any) -> dict[str, Any]:
    """The run plan's `LoraConfig` arguments, with the default start: PiSSA / OLoRA only change the values the
    adapters start from (an SVD or QR of each weight), not what is allocated, and cannot run on fake tensors."""
    from finetune.plan import lora_plan

    return {**lora_plan(config).kwargs(), "init_lora_weights": True}


def _half_dtype(precision: str, device: str) -> torch.dtype | None:
    """The 16-bit dtype a run uses, or None for fp32 (always on CPU)."""
    if device != "cuda" or precision == "fp32":
        return None
    return torch.float16 if precision == "fp16" else torch.bfloat16


# ----------------------------------------------------------------------------- model building (as the engine does)


def lora_target_modules(spec: str) -> str | list[str]:
    """PEFT's `target_modules` value for our `lora_target_modules` text (the run plan decides it)."""
    from finetune.plan import lora_targets

    targets = lora_targets(spec)
    return targets if isinstance(targets, str) else list(targets)


def build_model(model_config: Any, plan: Plan, trust_remote_code: bool = False) -> torch.nn.Module:
    """The model the engine would train, built from its config under whatever mode is active (fake or real)."""
    import copy

    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    cfg = copy.deepcopy(model_config)  # attention: transformers' default (sdpa where supported), as the engine gets
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
        model = auto.from_config(cfg, trust_remote_code=trust_remote_code, dtype=plan.weight_dtype)
    finally:
        torch.set_default_dtype(old)
    model.train()
    if plan.method == "qlora":
        quantize_4bit(model, plan)
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=plan.checkpointing)
    if plan.method in ("lora", "qlora"):
        model = wrap_lora(model, plan)
    if plan.checkpointing:  # Trainer(activation_checkpointing=True): non-reentrant, inputs made to require grad
        model.activation_checkpointing_enable()
    return model


def wrap_lora(model: torch.nn.Module, plan: Plan) -> torch.nn.Module:
    """`peft.get_peft_model` with the LoRA settings of the plan (adapters end up fp32, as PEFT's default autocast)."""
    from peft import LoraConfig, get_peft_model

    if plan.lora_kwargs:
        return get_peft_model(model, LoraConfig(**plan.lora_kwargs))
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
    from torch._subclasses.fake_tensor import unset_fake_temporarily
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
    skip = get_keys_to_not_convert(model)
    with unset_fake_temporarily():  # Linear4bit is built on the meta device; its weight is replaced below
        replace_with_bnb_linear(model, modules_to_not_convert=skip, quantization_config=qc)
    for name, module in model.named_modules():
        if isinstance(module, bnb.nn.Linear4bit) and name in originals:
            w = originals[name].detach()
            if issubclass(getattr(module, "source_cls", torch.nn.Linear), Conv1D):
                w = w.T
            module.weight = _quantized_param(w.contiguous(), module.weight, plan)
            if module.bias is not None:
                module.bias = torch.nn.Parameter(torch.zeros(module.bias.shape, dtype=w.dtype), requires_grad=False)
    model.is_loaded_in_4bit = True
    model.config.quantization_config = qc
    del originals


def _quantized_param(w: torch.Tensor, meta_param: Any, plan: Plan) -> torch.nn.Parameter:
    """A packed 4-bit weight with its QuantState, as `Params4bit._quantize` makes it (works on fake tensors too)."""
    import bitsandbytes as bnb

    packed, state = bnb.functional.quantize_4bit(
        w, blocksize=64, compress_statistics=plan.double_quant, quant_type=plan.quant_type, quant_storage=torch.uint8
    )
    if not isinstance(w, torch._subclasses.fake_tensor.FakeTensor):
        kwargs = {k: v for k, v in meta_param.__dict__.items() if k not in ("quant_state", "bnb_quantized", "data")}
        return bnb.nn.Params4bit(packed, requires_grad=False, quant_state=state, bnb_quantized=True, **kwargs)
    param = torch.nn.Parameter(packed, requires_grad=False)  # Params4bit cannot wrap a fake tensor
    for key, value in meta_param.__dict__.items():
        setattr(param, key, value)
    param.quant_state, param.bnb_quantized = state, True
    return param


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
    phase = counter.set_phase if counter else (lambda p: None)
    phase("forward")
    model.train()
    amp = torch.autocast("cpu", dtype=plan.autocast_dtype) if plan.autocast_dtype else contextlib.nullcontext()
    with amp:
        out = model(**batch)
    if plan.autocast_dtype is not None:  # accelerate's convert_outputs_to_fp32
        out = {k: (v.float() if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in out.items()}
    loss = out["loss"]
    del out
    phase("backward_head")
    loss.backward()
    del loss
    phase("optimizer")
    params = [p for p in model.parameters() if p.requires_grad]
    if plan.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(params, plan.max_grad_norm, foreach=plan.foreach or None)
    optimizer.step()
    model.zero_grad(set_to_none=True)
    phase("done")


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


def _prewarm_bitsandbytes() -> None:
    """Build bitsandbytes' lookup tables on real tensors (they read values, which fake tensors cannot give)."""
    import bitsandbytes.functional as F

    if "dynamic" not in F.name2qmap:
        F.name2qmap["dynamic"] = F.create_dynamic_map()


def _embeddings_in_fp32(model: torch.nn.Module, optimizer: Any) -> None:
    """Trainer keeps fp32 states for embeddings under an 8-bit bitsandbytes optimizer; do the same through a private
    override registry (bitsandbytes' process-wide one may hold a concurrent real run's entries)."""
    if getattr(optimizer, "mng", None) is None:
        return
    mng = type(optimizer.mng).__new__(type(optimizer.mng))
    mng.initialize()
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding) and module.weight.requires_grad:
            mng.pid2config[id(module.weight)] = {"optim_bits": 32}
    optimizer.mng = mng


_LOCAL = threading.local()  # .plan: the Plan this thread is replaying (None elsewhere)
_PATCH_LOCK = threading.Lock()
_PATCH_USERS = [0]
_ORIGINALS: dict[str, Any] = {}


def _in_replay() -> Plan | None:
    """The plan this thread is replaying, if any: patched functions act as the originals in every other thread."""
    return getattr(_LOCAL, "plan", None)


def _swap_tensors(t1: torch.Tensor, t2: torch.Tensor) -> None:
    """Let `Module.to` move fake parameters: `swap_tensors` refuses tensors fake mode holds weak references to."""
    try:
        _ORIGINALS["swap_tensors"](t1, t2)
    except RuntimeError:
        if _in_replay() is None:
            raise
        t1.data = t2.data


def _dropout(input, p=0.5, training=True, inplace=False):  # noqa: A002 - torch's signature
    """CUDA dropout keeps a bool mask where the CPU kernel keeps an fp32 noise tensor: replay CUDA's."""
    plan = _in_replay()
    if plan is None or plan.device != "cuda":
        return _ORIGINALS["dropout"](input, p, training, inplace)
    return torch.native_dropout(input, p, True)[0] if training and p > 0 else input


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, *args, **kwargs):
    """CUDA flash attention drops out inside the kernel; CPU sdpa with dropout keeps the S x S probabilities."""
    plan = _in_replay()
    if plan is not None and plan.device == "cuda":
        dropout_p = 0.0
    return _ORIGINALS["sdpa"](query, key, value, attn_mask, dropout_p, *args, **kwargs)


@contextlib.contextmanager
def _replaying(plan: Plan):
    """Mark this thread as replaying `plan`; the patched functions are installed while any replay runs."""
    import torch.nn.functional as F

    with _PATCH_LOCK:
        if _PATCH_USERS[0] == 0:
            _ORIGINALS.update(swap=torch.utils.swap_tensors, dropout=F.dropout, sdpa=F.scaled_dot_product_attention)
            _ORIGINALS["swap_tensors"] = _ORIGINALS.pop("swap")
            torch.utils.swap_tensors, F.dropout, F.scaled_dot_product_attention = _swap_tensors, _dropout, _sdpa
        _PATCH_USERS[0] += 1
    _LOCAL.plan = plan
    try:
        yield
    finally:
        _LOCAL.plan = None
        with _PATCH_LOCK:
            _PATCH_USERS[0] -= 1
            if _PATCH_USERS[0] == 0:
                torch.utils.swap_tensors = _ORIGINALS["swap_tensors"]
                F.dropout, F.scaled_dot_product_attention = _ORIGINALS["dropout"], _ORIGINALS["sdpa"]


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The repeated block list of a transformers model (the longest ModuleList)."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    return max(lists, key=len) if lists else None


def hook_layer_phases(model: torch.nn.Module, counter: LiveBytes) -> None:
    """Mark the output head in forward; split backward into head, first block, middle blocks, last block, tail.

    Within each phase the peak sits at a fixed place (its start or its end), so each phase peak grows linearly with
    the number of blocks, which is what makes two shallow traces enough (see `trace`).
    """
    layers = decoder_layers(model)
    if layers is None:
        return
    _on_output_grad(layers[-1], "backward_top_block", counter)
    if len(layers) > 2:
        _on_output_grad(layers[-2], "backward_blocks", counter)
    _on_output_grad(layers[0], "backward_bottom_block", counter)
    layers[0].register_forward_pre_hook(lambda _m, args: _on_grad(args[0] if args else None, "backward_tail", counter))
    # (checkpointing re-runs the forward of a block during backward: only the first pass marks the head)
    layers[-1].register_forward_hook(lambda *_: counter.phase == "forward" and counter.set_phase("forward_head"))


def _on_output_grad(layer: torch.nn.Module, phase: str, counter: LiveBytes) -> None:
    """Enter `phase` when backward reaches this block's output (tensor hooks: no module backward hooks needed)."""

    def hook(_module: Any, _args: Any, out: Any) -> None:
        _on_grad(out[0] if isinstance(out, (tuple, list)) else out, phase, counter)

    layer.register_forward_hook(hook)


def _on_grad(x: Any, phase: str, counter: LiveBytes) -> None:
    """Enter `phase` when the gradient of `x` is computed (only tensors of the first forward pass, not recomputed)."""
    if counter.phase == "forward" and torch.is_tensor(x) and x.requires_grad:
        x.register_hook(lambda _g: counter.set_phase(phase))


def num_layers(model_config: Any) -> int:
    """Number of decoder blocks in a transformers config."""
    return int(getattr(model_config, "num_hidden_layers", 0) or getattr(model_config, "n_layer", 0) or 0)


def with_layers(model_config: Any, n: int) -> Any:
    """A copy of the config with `n` decoder blocks (per-layer lists cut to match)."""
    import copy

    cfg = copy.deepcopy(model_config)
    cfg.num_hidden_layers = n
    for key in ("layer_types", "mlp_layer_types"):
        value = getattr(cfg, key, None)
        if isinstance(value, list) and len(value) >= n:
            setattr(cfg, key, value[:n])
    return cfg


@dataclass
class TraceResult:
    """Peak live tensor bytes of a steady training step, by phase, with the split by category at the peak."""

    phase_peak: dict[str, int]
    phase_split: dict[str, dict[str, int]]
    layers_traced: int = 0

    @property
    def peak(self) -> int:
        """Highest peak of any phase."""
        return max(self.phase_peak.values())

    @property
    def peak_phase(self) -> str:
        """Phase holding the highest peak."""
        return max(self.phase_peak, key=self.phase_peak.get)

    @property
    def split(self) -> dict[str, int]:
        """Bytes by category at the highest peak."""
        return self.phase_split[self.peak_phase]


def trace(model_config: Any, plan: Plan, trust_remote_code: bool = False, small: int = 2) -> TraceResult:
    """Replay a steady step on fake tensors; deep models are traced at `small` and `small`+1 blocks and extrapolated.

    Every phase peak is linear in the number of identical blocks, so two shallow traces give the deep one exactly
    (up to the block-count-independent parts, which both traces share).
    """
    total = num_layers(model_config)
    if total <= small + 2:
        return trace_once(model_config, plan, trust_remote_code)
    a = trace_once(with_layers(model_config, small), plan, trust_remote_code)
    b = trace_once(with_layers(model_config, small + 1), plan, trust_remote_code)
    k = total - small - 1
    # The middle blocks' peak lies within one block's worth of the first or last block's: those two stand for it.
    linear = [p for p in b.phase_peak if p in a.phase_peak and p != "backward_blocks"]
    peaks = {p: b.phase_peak[p] + k * (b.phase_peak[p] - a.phase_peak[p]) for p in linear}
    splits = {}
    for p in linear:
        split = b.phase_split[p]
        base = a.phase_split.get(p, {})
        splits[p] = {c: v + k * (v - base.get(c, 0)) for c, v in split.items()}
    return TraceResult(peaks, splits, layers_traced=small + 1)


def trace_once(model_config: Any, plan: Plan, trust_remote_code: bool = False) -> TraceResult:
    """Build the model on fake tensors and replay one steady training step, counting live storages."""
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

    if plan.method == "qlora" or "8bit" in plan.optim:
        _prewarm_bitsandbytes()
    with _replaying(plan), FakeTensorMode(allow_non_fake_inputs=True), LiveBytes() as counter:
        model = build_model(model_config, plan, trust_remote_code)
        with unset_fake_temporarily():  # bitsandbytes builds its lookup tables from values
            optimizer = build_optimizer(model, plan)
        _embeddings_in_fp32(model, optimizer)
        prime_optimizer(model, optimizer, plan, counter)
        hook_layer_phases(model, counter)
        batch = make_batch(plan, model_config.vocab_size)
        counter.reset("setup")
        train_step(model, optimizer, batch, plan, counter)
        result = TraceResult(dict(counter.phase_peak), dict(counter.phase_split), num_layers(model_config))
        del model, optimizer, batch
    result.phase_peak.pop("done", None)
    result.phase_split.pop("done", None)
    return result
