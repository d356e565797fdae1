"""Replay a training step on fake tensors and count live tensor storages: the peak memory without the memory.

The model is the engine's own: `finetune.model.loading.build_model(plan, model_config=...)` runs under `FakeTensorMode`
(the same base class, dtype, 4-bit packing, k-bit preparation and LoRA wrapping as a run), so engine and estimate
agree by construction (tests/test_memory_plan.py checks the trainable parameters). The step follows the plan's
objective as TRL 1.16 runs it (two sequences per DPO / ORPO example, the no-grad reference and KTO KL passes).
The same `LiveBytes` counter on real tensors is how `bench/memory_accuracy.py` measures a real step.
Only imported when an estimate is computed (it imports torch and transformers).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import threading
import weakref
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

if TYPE_CHECKING:
    from finetune.plan import RunPlan

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
    "kl": "reference_forward",  # KTO's no-grad policy pass over the KL sequences
    "reference": "reference_forward",  # the no-grad reference pass (adapters off, or the frozen copy)
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

    def training_peak(self, trainer: Any, *held: Any) -> int:
        """The peak of live tensors while `trainer` trains, counting the weights and buffers of its model and of each
        module in `held` (a reference model) from the start."""
        for module in (trainer.model, *held):
            for t in [*module.parameters(), *module.buffers()]:
                self.track(t)
        self.reset("train")
        with self:
            trainer.train()
        return self.peak

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


class ShadowValues(TorchDispatchMode):
    """Known values beside fake tensors, for vision-language models: their forward passes pick the real image tiles
    and the image token positions by value (boolean indexing, `.tolist()`), which fake tensors cannot answer. The
    replay's inputs are real tensors (token ids, masks, pixel values); every op whose tensor inputs all have known
    values computes its value too (outside the fake and counting modes: nothing of it is counted), so a
    data-dependent step takes the shape the real run gets. Weights never have values: the values stop there."""

    LIMIT = 1 << 27  # elements: a value larger than this is not kept (only inputs and index arithmetic need them)
    FACTORY_LIMIT = 1 << 20  # elements of a new integer tensor (arange, zeros) whose value is kept

    def __init__(self, fake_mode: Any, counter: LiveBytes | None = None) -> None:
        super().__init__()
        self.fake_mode = fake_mode
        self.counter = counter  # counts what this mode makes itself (the counter below never sees it)

    @staticmethod
    def known(x: Any) -> bool:
        """Whether a value is known: a real tensor, or a fake one with its value beside it."""
        from torch._subclasses.fake_tensor import FakeTensor

        return not isinstance(x, FakeTensor) or getattr(x, "_shadow", None) is not None

    @staticmethod
    def real(x: Any) -> Any:
        """The value of a known tensor (anything else as it is)."""
        from torch._subclasses.fake_tensor import FakeTensor

        return x._shadow if isinstance(x, FakeTensor) else x

    def _real_call(self, func: Any, args: Any, kwargs: dict) -> Any:
        from torch.utils._python_dispatch import _disable_current_modes
        from torch.utils._pytree import tree_map

        with _disable_current_modes():
            return func(*tree_map(self.real, args), **tree_map(self.real, kwargs))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensor
        from torch.utils._pytree import tree_leaves, tree_map

        kwargs = kwargs or {}
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        known = all(self.known(t) for t in tensors)  # (a factory, with no tensor inputs, is known: see below)
        if (
            known
            and tensors
            and func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default)
        ):
            return self._real_call(func, args, kwargs)
        try:
            out = func(*args, **kwargs)
        except (DynamicOutputShapeException, DataDependentOutputException):
            if not known:  # indexing an unknown tensor with a known boolean mask: index with its positions
                return func(*self._bool_masks_as_positions(args), **kwargs)
            real = self._real_call(func, args, kwargs)
            out = tree_map(lambda r: self._fake_of(r) if isinstance(r, torch.Tensor) else r, real)
            if self.counter is not None:  # the run's real op allocates its output: count it as the counter would
                for fake in tree_leaves(out):
                    if isinstance(fake, torch.Tensor):
                        self.counter.track(fake)
            return out
        fakes = [o for o in tree_leaves(out) if isinstance(o, FakeTensor)]
        if not tensors and any(o.is_floating_point() or o.numel() > self.FACTORY_LIMIT for o in fakes):
            known = False  # factories: only small index tensors (positions, offsets), never buffers to fill
        if known and fakes and sum(o.numel() for o in fakes) < self.LIMIT:
            real = self._real_call(func, args, kwargs)
            for fake, value in zip(tree_leaves(out), tree_leaves(real), strict=False):
                if isinstance(fake, FakeTensor) and isinstance(value, torch.Tensor):
                    fake._shadow = value
        return out

    def _fake_of(self, value: torch.Tensor) -> torch.Tensor:
        fake = self.fake_mode.from_tensor(value)
        fake._shadow = value
        return fake

    def _bool_masks_as_positions(self, args: tuple) -> tuple:
        """`index` / `index_put` arguments with each known boolean mask replaced by the positions it selects."""
        from torch.utils._python_dispatch import _disable_current_modes

        def positions(indices: Any) -> Any:
            if not isinstance(indices, (list, tuple)):
                return indices
            out: list[Any] = []
            for index in indices:
                if isinstance(index, torch.Tensor) and index.dtype == torch.bool and self.known(index):
                    with _disable_current_modes():
                        parts = self.real(index).nonzero().unbind(1)
                    out += [self._fake_of(p) for p in parts]
                else:
                    out.append(index)
            return out

        return tuple(positions(a) for a in args)


# ----------------------------------------------------------------------------- the step's settings, from the plan


def autocast_dtype(plan: RunPlan) -> torch.dtype | None:
    """The dtype the Trainer autocasts to, or None (fp32 runs)."""
    return plan.torch_dtype(plan.autocast_dtype) if plan.autocast_dtype else None


def foreach(plan: RunPlan) -> bool:
    """torch's optimizers and clip_grad_norm_ run their foreach (whole group) kernels on CUDA tensors."""
    return plan.device == "cuda"


def sequences_per_example(plan: RunPlan) -> int:
    """Sequences one example puts in the batch (DPO and ORPO: a chosen and a rejected answer, as TRL concatenates
    them): the objective's record says."""
    return plan.objective.sequences


def build(model_config: Any, plan: RunPlan) -> torch.nn.Module:
    """The model the engine trains, made by the engine's own `finetune.model.loading.build_model` from the config (under
    fake tensors here), with gradient checkpointing and the preference trainers' setup as the engine gets them."""
    from finetune.model import loading

    model = loading.build_model(plan, model_config=model_config)  # PiSSA's SVD and OLoRA's QR run on fake tensors too
    model.train()
    if plan.objective.needs_trl:
        _as_trl_prepares(model, plan)
    if plan.config.gradient_checkpointing:  # Trainer(activation_checkpointing=True): non-reentrant
        loading.enable_checkpointing(model)
    if plan.packing:  # the packed attention the engine switches to (its confinement probe needs real values)
        from finetune.model import packing

        packing.use(model)
    return model


def reference_copy(model_config: Any, plan: RunPlan) -> torch.nn.Module:
    """Full fine-tuning's DPO / KTO reference: a frozen copy of the starting weights, made as the preference engine
    loads it (`loading.load_base`: the plan's class and dtype)."""
    from finetune.model import loading

    ref = loading.base_from_config(plan, model_config)
    ref.requires_grad_(False)
    ref.eval()
    _as_trl_prepares(ref, plan, outputs=("log_probs",))  # TRL asks a separate reference for log-probs only
    return ref


def _as_trl_prepares(model: torch.nn.Module, plan: RunPlan, outputs: tuple[str, ...] | None = None) -> None:
    """What TRL's trainers do to the model before training: dropout off (the preference trainers' default), and for
    DPO, KTO and GRPO the chunked log-prob head that never holds the whole logits."""
    from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model

    if plan.objective.disables_dropout:
        disable_dropout_in_model(model)
    if plan.objective.loss_kernel == "trl_chunked":
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        add_fused_lm_head(base, outputs=outputs or plan.objective.fused_outputs)


# ----------------------------------------------------------------------------- optimizer + step (as Trainer does)


def build_optimizer(model: torch.nn.Module, plan: RunPlan) -> torch.optim.Optimizer:
    """Trainer's optimizer for the plan: decay / no-decay groups, torch AdamW, bitsandbytes 8-bit AdamW or SGD."""
    decay = [p for n, p in model.named_parameters() if p.requires_grad and not no_decay(n)]
    rest = [p for n, p in model.named_parameters() if p.requires_grad and no_decay(n)]
    groups = [{"params": decay, "weight_decay": plan.config.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    if plan.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=1e-4, foreach=foreach(plan))
    if plan.optimizer in ("adamw_8bit", "paged_adamw_8bit"):
        from bitsandbytes.optim import AdamW

        return AdamW(groups, lr=1e-4, optim_bits=8, is_paged=plan.optimizer.startswith("paged"))
    return torch.optim.AdamW(groups, lr=1e-4, foreach=foreach(plan))


def no_decay(name: str) -> bool:
    """Trainer's no-weight-decay rule: biases and norms."""
    import re

    return bool(re.search(r"bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.)|ln_", name))


def make_batch(
    plan: RunPlan, segments: list[int] | None = None, images: Any = None, model_config: Any = None
) -> dict[str, Any]:
    """A worst-case batch: every row `max_seq_length` tokens long (no padding), labels on every token; DPO / ORPO
    rows are chosen + rejected (two sequences per example), KTO adds the mismatched KL sequences. With `segments`
    (packing): one row of those examples end to end, as the packing collator lays a micro batch out. With `images`
    (a vision-language model's `ImageLoad`): each row starts with its images' tokens, the pixels beside them."""
    if segments:
        return packed_batch(segments)
    if images is not None:
        return image_batch(plan, images, model_config)
    config = plan.config
    rows = config.per_device_train_batch_size * sequences_per_example(plan)
    length = plan.objective.row_tokens(config)
    ids = torch.zeros((rows, length), dtype=torch.long)
    if plan.is_classifier:
        return {"input_ids": ids, "labels": torch.zeros((rows,), dtype=torch.long)}
    batch = {"input_ids": ids, "labels": torch.zeros((rows, length), dtype=torch.long)}
    if plan.objective.generation:  # only the sampled answer is scored, not the prompt before it
        batch["labels"][:, : config.max_seq_length] = -100
    if plan.objective.kl_pass:
        batch["kl_input_ids"] = torch.zeros_like(ids)
    return batch


def image_batch(plan: RunPlan, images: Any, model_config: Any) -> dict[str, Any]:
    """Rows of `max_seq_length` tokens (longer when the images need it: a run refuses cutting image tokens), each
    opening with its images' tokens (after the family's vision-start token where it has one), and the pixel inputs
    of those images from the model's image processor: real tensors, whose values the replay's `ShadowValues` reads."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from finetune.data.images import token_types
    from finetune.memory.images import blank, image_inputs, image_processor_for

    config = plan.config
    rows = config.per_device_train_batch_size
    length = images.row_length(plan.objective.row_tokens(config))
    token = getattr(model_config, "image_token_id", None) or getattr(model_config, "image_token_index", 0)
    start = getattr(model_config, "vision_start_token_id", None)
    with unset_fake_temporarily():
        ids = torch.zeros((rows, length), dtype=torch.long)
        at = 0
        for _ in range(images.images_per_row):
            if start is not None:
                ids[:, at] = start
                at += 1
            ids[:, at : at + images.tokens_per_image] = token
            at += images.tokens_per_image
        labels = ids.clone()
        labels[:, :at] = -100
        processor = image_processor_for(plan, model_config)
        pictures = [[blank(images.width, images.height)] * images.images_per_row for _ in range(rows)]
        # No attention mask: rows without padding attend causally, as a text replay's (the real run's all-ones mask
        # is dropped by transformers' own check).
        batch = {"input_ids": ids, "labels": labels}
        if images.images_per_row:
            batch.update(image_inputs(processor, pictures))
        batch.update(token_types(plan.vision.family, ids, token))
    return batch


def packed_batch(segments: list[int]) -> dict[str, Any]:
    """One packed row of examples `segments` tokens long: ids, labels, restarting positions and the boundaries
    (real tensors: the packed attention reads them as numbers)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    total = sum(segments)
    positions = [i for n in segments for i in range(n)]
    with unset_fake_temporarily():
        cu = torch.tensor([0, *itertools.accumulate(segments)], dtype=torch.int32)
        position_ids = torch.tensor([positions], dtype=torch.long)
    return {
        "input_ids": torch.zeros((1, total), dtype=torch.long),
        "labels": torch.zeros((1, total), dtype=torch.long),
        "position_ids": position_ids,
        "cu_seq_lens_q": cu,
        "cu_seq_lens_k": cu,
        "max_length_q": max(segments),
        "max_length_k": max(segments),
    }


def train_step(model, optimizer, batch, plan: RunPlan, counter: LiveBytes | None = None, reference=None) -> None:
    """One micro batch + optimizer step exactly as Trainer runs it (autocast + fp32 outputs under amp); preference
    objectives compute their loss as TRL 1.16 does (see `preference_loss`)."""
    phase = counter.set_phase if counter else (lambda p: None)
    phase("forward")
    model.train()
    dtype = autocast_dtype(plan)
    amp = torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext()
    with amp:
        if plan.objective.replay == "lm_loss":
            loss = _sft_loss(model, batch, plan)
        else:
            loss = preference_loss(model, batch, plan, phase, reference)
    phase("backward_head")
    loss.backward()
    del loss
    phase("optimizer")
    params = [p for p in model.parameters() if p.requires_grad]
    if plan.config.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(params, plan.config.max_grad_norm, foreach=foreach(plan) or None)
    optimizer.step()
    model.zero_grad(set_to_none=True)
    phase("done")


def _sft_loss(model, batch, plan: RunPlan) -> torch.Tensor:
    """transformers' own loss (the logits materialised), with accelerate's fp32 outputs under autocast."""
    out = model(**batch)
    if plan.autocast_dtype is not None:  # accelerate's convert_outputs_to_fp32
        out = {k: (v.float() if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in out.items()}
    return out["loss"]


def preference_loss(model, batch, plan: RunPlan, phase: Any, reference: Any = None) -> torch.Tensor:
    """The forwards of one TRL 1.16 preference step, in its order, and a loss of the same graph.

    DPO: the policy scores chosen + rejected in one batch through the fused log-prob head, then the reference scores
    them without gradients. KTO: first a no-grad policy pass over the KL sequences, then the policy pass, then the
    reference over both. ORPO: one pass with the whole logits, the chosen half's NLL and every row's log-probs; no
    reference. The reference is the model with its adapters off (LoRA / QLoRA) or `reference` (a frozen copy)."""
    ids, labels = batch["input_ids"], batch["labels"]
    if plan.objective.replay == "paired_logits":
        return _orpo_loss(model, ids, labels)
    if plan.objective.replay == "scored_fused":
        return _scored_loss(model, ids, labels, plan, phase, reference)
    kl = None
    if plan.objective.kl_pass:
        phase("kl")
        with torch.no_grad():
            kl = _sequence_logps(model, batch["kl_input_ids"]).mean()
        phase("forward")
    logps = _sequence_logps(model, ids)
    phase("reference")
    with torch.no_grad(), _reference_of(model, reference) as ref:
        if kl is not None:
            kl = (kl - _sequence_logps(ref, batch["kl_input_ids"]).mean()).clamp(min=0)
        ref_logps = _sequence_logps(ref, ids)
    phase("forward_head")
    beta = plan.beta
    if plan.objective.replay == "paired_fused":
        chosen, rejected = (logps - ref_logps).chunk(2, dim=0)
        return -torch.nn.functional.logsigmoid(beta * (chosen - rejected)).mean()
    return (1 - torch.sigmoid(beta * (logps - ref_logps - kl))).mean()  # KTO, every row desirable


def _scored_loss(model, ids: torch.Tensor, labels: torch.Tensor, plan: RunPlan, phase: Any, reference: Any) -> Any:
    """GRPO's step as TRL 1.16 runs it: with beta > 0 the reference first scores the sampled answers without
    gradients (adapters off, or the frozen copy), then the policy scores them through the fused head (the prompt
    positions are not projected); a policy-gradient loss of the same graph, with the KL term."""
    ref_logps = None
    if plan.reference is not None:
        phase("reference")
        with torch.no_grad(), _reference_of(model, reference) as ref:
            ref_logps = ref(input_ids=ids, labels=labels, fused_lm_head=True, use_cache=False).log_probs
        phase("forward")
    logps = model(input_ids=ids, labels=labels, fused_lm_head=True, use_cache=False).log_probs
    phase("forward_head")
    loss = -torch.exp(logps - logps.detach()).mean()
    if ref_logps is not None:
        delta = ref_logps - logps
        loss = loss + plan.beta * (torch.exp(delta) - delta - 1).mean()
    return loss


def _sequence_logps(model, ids: torch.Tensor) -> torch.Tensor:
    """Summed per-token log-probs of each row through TRL's fused head (no full logits)."""
    out = model(input_ids=ids, labels=ids, fused_lm_head=True, use_cache=False)
    return out.log_probs.sum(dim=1)


@contextlib.contextmanager
def _reference_of(model, reference):
    """The reference model: the frozen copy, or the policy with its adapters disabled (PEFT's context manager)."""
    if reference is not None:
        yield reference
    elif hasattr(model, "disable_adapter"):
        with model.disable_adapter():
            yield model
    else:
        yield model


def _orpo_loss(model, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """ORPO's concatenated forward (TRL's experimental ORPOTrainer): whole logits, the chosen half's cross-entropy
    on shifted logits, every row's log-probs through TRL's `selective_log_softmax`, the odds-ratio term."""
    from trl.trainer.utils import selective_log_softmax

    logits = model(input_ids=ids, use_cache=False).logits
    half = ids.shape[0] // 2
    chosen = logits[:half, :-1, :].contiguous()
    nll = torch.nn.functional.cross_entropy(chosen.view(-1, chosen.shape[-1]), labels[:half, 1:].reshape(-1))
    del chosen
    per_token = selective_log_softmax(logits[:, :-1, :], labels[:, 1:])
    logps = per_token.sum(-1) / labels.shape[1]
    c, r = logps[:half], logps[half:]
    log_odds = (c - r) - (torch.log1p(-torch.exp(c)) - torch.log1p(-torch.exp(r)))
    return nll - torch.nn.functional.logsigmoid(log_odds).mean()


def prime_optimizer(model, optimizer, plan: RunPlan, counter: LiveBytes | None = None) -> None:
    """Create the optimizer state (and accumulated grads when accumulating) so the traced step is a steady one."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    if plan.config.gradient_accumulation_steps == 1:
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


_LOCAL = threading.local()  # .plan: the RunPlan this thread is replaying (None elsewhere)
_PATCH_LOCK = threading.Lock()
_PATCH_USERS = [0]
_ORIGINALS: dict[str, Any] = {}


def _in_replay() -> RunPlan | None:
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
    if plan is not None and _all_true(attn_mask):
        # A mask that keeps every position (a vision tower's full tiles): the real run's check drops it and runs the
        # fused kernel; on fake tensors sdpa with a mask would take the math path and hold S x S probabilities.
        attn_mask = None
    return _ORIGINALS["sdpa"](query, key, value, attn_mask, dropout_p, *args, **kwargs)


def _all_true(mask: Any) -> bool:
    """A boolean mask whose known value (`ShadowValues`) keeps every position."""
    shadow = getattr(mask, "_shadow", None)
    return shadow is not None and shadow.dtype == torch.bool and bool(shadow.all())


def _trunc_normal(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """torch's truncated normal initialisation redraws until every value is in range (a test of values fake tensors
    cannot answer: SigLIP vision towers start so); a fake tensor's values do not matter, and nothing is allocated."""
    from torch._subclasses.fake_tensor import FakeTensor

    if _in_replay() is not None and isinstance(tensor, FakeTensor):
        return tensor
    return _ORIGINALS["trunc_normal_"](tensor, *args, **kwargs)


def _patch_trunc_normal(install: bool) -> None:
    """Install (or remove) `_trunc_normal` where torch and transformers' initialisation look it up."""
    from transformers import initialization

    if install:
        _ORIGINALS["trunc_normal_"] = torch.nn.init.trunc_normal_
    value = _trunc_normal if install else _ORIGINALS["trunc_normal_"]
    torch.nn.init.trunc_normal_ = value
    if "trunc_normal_" in initialization.TORCH_INIT_FUNCTIONS:
        initialization.TORCH_INIT_FUNCTIONS["trunc_normal_"] = value


def _tensor(data: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    """`torch.tensor` of a list holding fake scalars whose values are known (`ShadowValues`: Qwen-VL's position
    offsets): built from those values, as the real run builds it from real scalars."""
    if _in_replay() is not None and isinstance(data, (list, tuple)):
        from torch.utils._pytree import tree_map

        data = tree_map(lambda x: x._shadow if getattr(x, "_shadow", None) is not None else x, data)
    return _ORIGINALS["tensor"](data, *args, **kwargs)


def _deepcopy(self: torch.Tensor, memo: dict) -> torch.Tensor:
    """Deep-copy a fake tensor by cloning it. torch's own copies the storage bytes of a fake tensor whose data pointer
    is not null, reading memory it does not own: PEFT's copy of a classification head (`modules_to_save`) corrupted
    the heap and crashed the next estimate."""
    from torch._subclasses.fake_tensor import FakeTensor

    if _in_replay() is None or not isinstance(self, FakeTensor):
        return _ORIGINALS["deepcopy"](self, memo)
    if id(self) in memo:
        return memo[id(self)]
    with torch.no_grad():
        copied = self.clone()
    if isinstance(self, torch.nn.Parameter):
        copied = torch.nn.Parameter(copied, requires_grad=self.requires_grad)
    memo[id(self)] = copied
    own = set(vars(copied))  # the fake tensor's own bookkeeping (its mode, device): the clone has its own
    for key, value in vars(self).items():  # e.g. a packed 4-bit weight's quant_state, as Params4bit copies it
        if key not in own:
            setattr(copied, key, copy.deepcopy(value, memo))
    return copied


# PEFT modules that bound `dequantize_module_weight` by name at import (DoRA on a 4-bit base dequantises with it).
_PEFT_DEQUANTIZE_USERS = ("peft.utils.integrations", "peft.tuners.lora.dora", "peft.tuners.lora.variants")


def _dequantize_module_weight(module: torch.nn.Module) -> torch.Tensor:
    """PEFT's `dequantize_module_weight`, for the replay's packed 4-bit weights too. PEFT recognises bitsandbytes
    weights by their class, `Params4bit`, which cannot hold a fake tensor, and bitsandbytes' CPU dequantisation
    writes through the data pointer (a fake tensor has none): give the tensor a dequantisation allocates, the
    weight's full shape in the QuantState's dtype."""
    weight = getattr(module, "weight", None)
    state = getattr(weight, "quant_state", None)
    if _in_replay() is None or state is None or getattr(weight, "bnb_quantized", False) is not True:
        return _ORIGINALS["dequantize_module_weight"](module)
    return torch.empty(tuple(state.shape), dtype=state.dtype)


def _patch_peft_dequantize(install: bool) -> None:
    """Install (or remove) `_dequantize_module_weight` where PEFT looks it up."""
    import importlib

    modules = [importlib.import_module(name) for name in _PEFT_DEQUANTIZE_USERS]
    if install:
        _ORIGINALS["dequantize_module_weight"] = modules[0].dequantize_module_weight
    for module in modules:
        module.dequantize_module_weight = (
            _dequantize_module_weight if install else _ORIGINALS["dequantize_module_weight"]
        )


@contextlib.contextmanager
def _replaying(plan: RunPlan):
    """Mark this thread as replaying `plan`; the patched functions are installed while any replay runs."""
    import torch.nn.functional as F

    with _PATCH_LOCK:
        if _PATCH_USERS[0] == 0:
            _ORIGINALS.update(swap=torch.utils.swap_tensors, dropout=F.dropout, sdpa=F.scaled_dot_product_attention)
            _ORIGINALS["swap_tensors"] = _ORIGINALS.pop("swap")
            torch.utils.swap_tensors, F.dropout, F.scaled_dot_product_attention = _swap_tensors, _dropout, _sdpa
            _ORIGINALS["deepcopy"] = torch.Tensor.__deepcopy__
            torch.Tensor.__deepcopy__ = _deepcopy
            _ORIGINALS["tensor"], torch.tensor = torch.tensor, _tensor
            _patch_trunc_normal(install=True)
            _patch_peft_dequantize(install=True)
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
                torch.Tensor.__deepcopy__ = _ORIGINALS["deepcopy"]
                torch.tensor = _ORIGINALS["tensor"]
                _patch_trunc_normal(install=False)
                _patch_peft_dequantize(install=False)


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The repeated block list of a transformers model: the longest ModuleList (a vision-language model's language
    model's, whose vision tower may have more blocks)."""
    named = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    language = [(n, m) for n, m in named if n.endswith(LANGUAGE_LAYERS)]
    lists = [m for _, m in (language or named)]
    return max(lists, key=len) if lists else None


LANGUAGE_LAYERS = ("text_model.layers", "language_model.layers")  # vision-language models' decoder blocks


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
    layers[-1].register_forward_hook(lambda *_: _head_reached(counter))


def _head_reached(counter: LiveBytes) -> None:
    """The first forward pass left the last block (a forward hook must return None: a value replaces the output)."""
    if counter.phase == "forward":
        counter.set_phase("forward_head")


def _on_output_grad(layer: torch.nn.Module, phase: str, counter: LiveBytes) -> None:
    """Enter `phase` when backward reaches this block's output (tensor hooks: no module backward hooks needed)."""

    def hook(_module: Any, _args: Any, out: Any) -> None:
        _on_grad(out[0] if isinstance(out, (tuple, list)) else out, phase, counter)

    layer.register_forward_hook(hook)


def _on_grad(x: Any, phase: str, counter: LiveBytes) -> None:
    """Enter `phase` when the gradient of `x` is computed (only tensors of the first forward pass, not recomputed)."""
    if counter.phase == "forward" and torch.is_tensor(x) and x.requires_grad:
        x.register_hook(lambda _g: counter.set_phase(phase))


def text_config(model_config: Any) -> Any:
    """The language model's config (a vision-language model's text part; a text model's own)."""
    get = getattr(model_config, "get_text_config", None)
    return get() if callable(get) else model_config


def num_layers(model_config: Any) -> int:
    """Number of decoder blocks in a transformers config (a vision-language model's language model's)."""
    cfg = text_config(model_config)
    return int(getattr(cfg, "num_hidden_layers", 0) or getattr(cfg, "n_layer", 0) or 0)


def with_layers(model_config: Any, n: int) -> Any:
    """A copy of the config with `n` decoder blocks (per-layer lists cut to match; a vision tower kept whole)."""
    import copy

    whole = copy.deepcopy(model_config)
    cfg = text_config(whole)
    cfg.num_hidden_layers = n
    for key in ("layer_types", "mlp_layer_types"):
        value = getattr(cfg, key, None)
        if isinstance(value, list) and len(value) >= n:
            setattr(cfg, key, value[:n])
    return whole


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


def trace(
    model_config: Any, plan: RunPlan, small: int = 2, segments: list[int] | None = None, images: Any = None
) -> TraceResult:
    """Replay a steady step on fake tensors; deep models are traced at `small` and `small`+1 blocks and extrapolated.
    `segments`: a packed micro batch's example lengths (None: rows padded to max_seq_length, the worst case).

    Every phase peak is linear in the number of identical blocks, so two shallow traces give the deep one exactly
    (up to the block-count-independent parts, which both traces share).
    """
    total = num_layers(model_config)
    if total <= small + 2:
        return trace_once(model_config, plan, segments, images)
    a = trace_once(with_layers(model_config, small), plan, segments, images)
    b = trace_once(with_layers(model_config, small + 1), plan, segments, images)
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


@contextlib.contextmanager
def _shadows(mode: Any, on: bool, counter: LiveBytes | None = None):
    """`ShadowValues` over the fake mode when the replay has images (text replays do without)."""
    if not on:
        yield None
        return
    with ShadowValues(mode, counter) as shadows:
        yield shadows


@contextlib.contextmanager
def fake_tensors(plan: RunPlan):
    """Fake tensors (shapes and dtypes, no memory) for replaying `plan` in this thread: what `trace_once` builds and
    steps under, and how a test builds the replayed model."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    if plan.quantization is not None or "8bit" in plan.optimizer:
        _prewarm_bitsandbytes()
    with _replaying(plan), FakeTensorMode(allow_non_fake_inputs=True) as mode:
        yield mode


def trace_once(model_config: Any, plan: RunPlan, segments: list[int] | None = None, images: Any = None) -> TraceResult:
    """Build the model on fake tensors with the engine's function and replay one steady step, counting storages (a
    vision-language model's data-dependent steps read the values `ShadowValues` keeps)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with fake_tensors(plan) as mode, LiveBytes() as counter:
        model = build(model_config, plan)
        reference = reference_copy(model_config, plan) if plan.reference == "copy" else None
        with unset_fake_temporarily():  # bitsandbytes builds its lookup tables from values
            optimizer = build_optimizer(model, plan)
        _embeddings_in_fp32(model, optimizer)
        prime_optimizer(model, optimizer, plan, counter)
        if reference is not None:
            for t in [*reference.parameters(), *reference.buffers()]:
                counter.track(t, "reference_model")
        hook_layer_phases(model, counter)
        batch = make_batch(plan, segments, images, model_config)
        counter.reset("setup")
        with _shadows(mode, images is not None, counter):  # the step only: building the model needs no values
            train_step(model, optimizer, batch, plan, counter, reference)
        result = TraceResult(dict(counter.phase_peak), dict(counter.phase_split), num_layers(model_config))
        del model, optimizer, batch, reference
    result.phase_peak.pop("done", None)
    result.phase_split.pop("done", None)
    return result
