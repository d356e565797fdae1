"""Padding-free packing: each micro batch as one row without padding, attention confined to each example.

    layout:     `finetune.data.collator(..., packing=True)` (transformers' `DataCollatorWithFlattening`): the micro
                batch's examples (the same ones, in the same order, as a padded batch) end to end in one row;
                position_ids restart at 0 for each example; each example's first label is -100, so no token learns
                to predict the next example; `cu_seq_lens_q/k` carry the boundaries
    attention:  `packed_sdpa`, registered here with transformers' AttentionInterface: block-diagonal causal attention
                from those boundaries (torch's varlen flash kernel on a CUDA GPU in 16 bits, else sdpa per example).
                With no boundaries (generation, padded batches) it is transformers' own sdpa.

Why a function of our own: transformers' sdpa confines a flattened batch only when it builds a (tokens x tokens) mask
from position_ids, and only when no cache exists; a model in training mode creates one (use_cache), and every example
then attends to the ones before it (tests/test_packing.py). Boundaries passed explicitly cannot be missed, and cost
no mask.

`enable(model)` switches a loaded model to it and proves confinement with a two-example probe; a model whose attention
ignores the interface (custom code) or needs what this function does not do (softcapping, attention sinks) trains
padded instead, with the reason in one line. The loss is the padded batch's: the same labels, masked the same way,
divided by the same count of trained tokens.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Iterator
from typing import Any

ATTENTION = "packed_sdpa"  # the name our attention function is registered under
# Attention features the function does not implement: a layer that passes one is refused, never computed without it.
UNSUPPORTED = ("softcap", "s_aux", "position_bias")
PROBE_LENGTHS = (5, 4)  # tokens of the two examples the confinement probe packs together


def is_packed(batch: dict[str, Any]) -> bool:
    """A micro batch laid out by the packing collator (every token real: no padding to leave out of a count)."""
    return "cu_seq_lens_q" in batch


def register() -> None:
    """Make `packed_sdpa` known to transformers (attention and mask); calling it again changes nothing."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION, packed_attention)
    AttentionMaskInterface.register(ATTENTION, packed_mask)


def packed_mask(*args: Any, **kwargs: Any) -> Any:
    """sdpa's mask, except for a whole training sequence without padding: none (the attention takes the boundaries),
    so no (tokens x tokens) mask is built when transformers spots packed position_ids."""
    from transformers.masking_utils import sdpa_mask

    whole = kwargs.get("q_length") == kwargs.get("kv_length") and not kwargs.get("q_offset")
    if kwargs.get("attention_mask") is None and whole:
        return None
    return sdpa_mask(*args, **kwargs)


def packed_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """Block-diagonal causal attention over the examples of a packed row; plain sdpa when the row is one sequence.

    query: (1, heads, tokens, dim); key, value: (1, kv_heads, tokens, dim); returns (1, tokens, heads, dim)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        cu = _boundaries_from_positions(kwargs.get("position_ids"), query, attention_mask)
    if cu is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    refused = [name for name in UNSUPPORTED if kwargs.get(name) is not None]
    if refused or query.shape[0] != 1 or key.shape[2] != query.shape[2]:
        why = f"{', '.join(refused)} is" if refused else "a cache or several rows are"
        raise NotImplementedError(f"packed attention: {why} not supported")
    window = kwargs.get("sliding_window")
    if _varlen_usable(query, window, dropout):
        return _varlen(module, query, key, value, cu, kwargs.get("max_length_q"), scaling), None
    return _per_example(module, query, key, value, _bounds(cu), dropout, scaling, window), None


def _boundaries_from_positions(position_ids: Any, query: Any, attention_mask: Any) -> Any:
    """Flattened examples passed without `cu_seq_lens` (positions restart inside one row): their boundaries, so they
    are confined all the same. None for an ordinary sequence, a padded batch, or a decoding step."""
    import torch

    if position_ids is None or attention_mask is not None or query.shape[0] != 1 or query.shape[2] < 2:
        return None
    positions = position_ids.reshape(-1)
    starts = torch.nonzero(positions[1:] <= positions[:-1]).reshape(-1) + 1
    if starts.numel() == 0:
        return None
    ends = torch.tensor([positions.numel()], device=starts.device)
    return torch.cat([torch.zeros(1, dtype=starts.dtype, device=starts.device), starts, ends])


_LAST = threading.local()  # per thread: a training step and an estimate's replay may run side by side


def _bounds(cu: Any) -> list[int]:
    """`cu_seq_lens` as Python ints, read once per micro batch (every layer passes the same tensor)."""
    if getattr(_LAST, "tensor", None) is not cu:
        _LAST.tensor, _LAST.bounds = cu, [int(b) for b in cu.tolist()]
    return _LAST.bounds


def _per_example(
    module: Any, query: Any, key: Any, value: Any, bounds: list[int], dropout: float, scale: Any, window: int | None
) -> Any:
    """sdpa on each example's slice, causal within it; the outputs end to end. Exact: each example sees what it
    sees alone, with no (tokens x tokens) mask and no compute spent across examples."""
    import torch
    import torch.nn.functional as F

    gqa = getattr(module, "num_key_value_groups", 1) > 1
    pieces = []
    for start, end in zip(bounds, bounds[1:], strict=False):
        if end <= start:
            continue
        q, k, v = (t[:, :, start:end] for t in (query, key, value))
        mask = _window_mask(end - start, window, query.device) if window else None
        pieces.append(
            F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale, is_causal=mask is None, enable_gqa=gqa
            )
        )
    if len(pieces) == 1:
        return pieces[0].transpose(1, 2).contiguous()
    return torch.cat([piece.transpose(1, 2) for piece in pieces], dim=1)  # (1, tokens, heads, dim), one copy


def _window_mask(length: int, window: int, device: Any) -> Any:
    """Causal attention to the last `window` tokens only (Mistral-style sliding window), as a boolean mask."""
    import torch

    i = torch.arange(length, device=device)
    distance = i[:, None] - i[None, :]
    return (distance >= 0) & (distance < window)


def _varlen_usable(query: Any, window: int | None, dropout: float) -> bool:
    """torch's varlen flash kernel: CUDA, 16-bit tensors, no sliding window or attention dropout (it has neither
    here), and a torch that has it."""
    if not query.is_cuda or window or dropout or query.dtype not in _half_dtypes():
        return False
    return _varlen_function() is not None


def _half_dtypes() -> tuple[Any, ...]:
    import torch

    return (torch.float16, torch.bfloat16)


def _varlen_function() -> Any:
    """torch.nn.attention.varlen.varlen_attn when this torch has it with the arguments used here, else None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    wanted = {"window_size", "scale", "enable_gqa"}
    return varlen_attn if wanted <= set(inspect.signature(varlen_attn).parameters) else None


def _varlen(module: Any, query: Any, key: Any, value: Any, cu: Any, max_len: Any, scale: Any) -> Any:
    """One varlen flash call over every example (causal within each): (1, tokens, heads, dim)."""
    import torch

    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))  # (tokens, heads, dim)
    if max_len is None:
        bounds = _bounds(cu)
        max_len = max(end - start for start, end in zip(bounds, bounds[1:], strict=False))
    cu = cu.to(device=query.device, dtype=torch.int32)
    longest = int(max_len)
    gqa = getattr(module, "num_key_value_groups", 1) > 1
    out = _varlen_function()(q, k, v, cu, cu, longest, longest, scale=scale, window_size=(-1, 0), enable_gqa=gqa)
    return out.unsqueeze(0)


# ----------------------------------------------------------------------------- switching a model over


def use(model: Any) -> None:
    """Switch `model` (a transformers model, PEFT-wrapped or not) to the packed attention."""
    register()
    _base(model).set_attn_implementation(ATTENTION)


def _base(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def enable(model: Any) -> str | None:
    """Switch `model` to packed attention and prove it confines each example; None when it does, else why not (the
    model is then back on its own attention, for padded batches)."""
    base = _base(model)
    before = base.config._attn_implementation
    try:
        use(model)
    except (ValueError, ImportError) as exc:
        return f"its attention cannot be switched ({str(exc).splitlines()[0][:120]})"
    why = confinement_problem(model)
    if why is not None:
        with contextlib.suppress(ValueError, ImportError):
            base.set_attn_implementation(before)
    return why


def confinement_problem(model: Any) -> str | None:
    """Run two examples packed in one row, and the second alone: its outputs must match. None when they do, else
    what went wrong, in words."""
    import torch

    first, second = _probe_ids(model)
    packed = {
        "input_ids": torch.cat([first, second]).unsqueeze(0),
        "position_ids": torch.cat([torch.arange(len(first)), torch.arange(len(second))]).unsqueeze(0),
    }
    cu = torch.tensor([0, len(first), len(first) + len(second)], dtype=torch.int32)
    packed.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=len(first), max_length_k=len(first))
    concatenated = {"input_ids": packed["input_ids"]}
    try:
        with _eval_mode(model):
            device = _device_of(model)
            alone = _logits(model, {"input_ids": second.unsqueeze(0)}, device)
            inside = _logits(model, packed, device)[:, len(first) :]
            mixed = _logits(model, concatenated, device)[:, len(first) :]
    except (NotImplementedError, ValueError, TypeError, RuntimeError) as exc:
        return f"its attention does not take packed rows ({str(exc).splitlines()[0][:120]})"
    leak = float((inside - alone).abs().max())
    cross_talk = float((mixed - alone).abs().max())  # what an unconfined layout changes: the scale to compare with
    if leak > 0.05 * cross_talk:
        return "its attention lets packed examples see each other"
    return None


def _probe_ids(model: Any) -> tuple[Any, Any]:
    """Two short token sequences inside the vocabulary, different from each other."""
    import torch

    vocab = int(getattr(model.config, "vocab_size", 0) or 100)
    generator = torch.Generator().manual_seed(0)
    first, second = (torch.randint(1, max(2, vocab - 1), (n,), generator=generator) for n in PROBE_LENGTHS)
    return first, second


def _device_of(model: Any) -> Any:
    for parameter in model.parameters():
        if parameter.device.type != "meta":
            return parameter.device
    import torch

    return torch.device("cpu")


def _logits(model: Any, batch: dict[str, Any], device: Any) -> Any:
    moved = {k: (v.to(device) if hasattr(v, "to") else v) for k, v in batch.items()}
    return model(**moved).logits.float()  # called as a training step calls it (a cache changes what sdpa does)


@contextlib.contextmanager
def _eval_mode(model: Any) -> Iterator[None]:
    """No dropout and no gradients for the probe; the model's training mode is restored after."""
    import torch

    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(training)
