"""Advice that keeps the task feasible: combinations of memory-saving changes, ranked by what they honestly cost.

The search walks every combination of the levers a run has (gradient checkpointing, micro batch x accumulation at
the same effective batch, 8-bit / paged optimizers, LoRA rank, LoRA / QLoRA, DeepSpeed ZeRO stage and offload,
sequence length), cheapest first, and prices each with the estimator's formulas (scaled by how far they were from
the replay of the user's own settings; no new replay per combination). A combination that fits hides the more
drastic ones that contain it. The first fitting ones are then replayed to confirm the figure.

Cost, in points of one per cent of training time: each lever's estimated slowdown (stated in SPEED_COST), plus a
quality penalty where the training itself changes (a smaller rank, a 4-bit base, fewer trained parameters), plus
ten points per per cent of training tokens cut off by a shorter max_seq_length, measured on the dataset's own token
lengths (`finetune.data_stats`): cutting to 512 tokens is free when every row is shorter. Options that keep the data
whole come first; the first one is pre-selected by the UI.

Also here: `propose` (a complete configuration that fits, with reasons in plain words, for the first screen) and the
paragraph shown after an out-of-memory failure (`advice_text`).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any

from finetune.config import TrainConfig
from finetune.errors import UserError
from finetune.plan import packing_for

# Estimated extra training time per lever, as a fraction. Sources: checkpointing recomputes the forward pass of each
# block (one more forward of three passes: +20-35% in published measurements); QLoRA ran at 14.4k vs LoRA's 19.5k
# tokens/s on the H200 (DESIGN.md §4: +35%); 8-bit AdamW steps cost about the same as 32-bit ones; a smaller micro
# batch keeps the GPU less busy (a guess of +4% per halving while a micro batch holds fewer than 4096 tokens);
# ZeRO adds gradient communication; CPU offload moves every optimizer state over PCIe each step.
SPEED_COST = {
    "checkpointing": 0.30,
    "optim8bit": 0.0,
    "paged": 0.02,
    "microbatch_halving": 0.04,
    "qlora": 0.35,
    "lora": -0.20,  # full -> LoRA is faster (no optimizer step for the frozen weights)
    "zero2": 0.05,
    "zero3": 0.15,
    "offload": 1.00,
    "lora_rank": 0.0,
    "packing": -0.30,  # no compute on padding: 1.9x the real tokens/s on the bundled mixed set (bench/packing.py)
}
# What a change costs in what the model can learn, in the same points (a judgement, stated so it can be argued with).
QUALITY_COST = {"optim8bit": 1, "lora": 30, "qlora": 8, "lora_rank_halving": 3}
POINTS_PER_PERCENT_LOST = 10  # cutting 1% of the training tokens weighs like a 10% slowdown
MIN_SEQ = 128  # the shortest sequence proposed
MAX_RESULTS = 6
REPLAY_MAX_BILLIONS = 2.0  # above this size the top advice keeps its scaled formula figure (a replay takes 15-30 s)
PRICE_BUDGET_S = 3.0  # seconds spent pricing combinations at most (each is a formula evaluation, ~ms)

# (title, what it costs in words) per kind of change, for the single-lever titles and the old API.
KINDS = {
    "checkpointing": (1, "Turn on gradient checkpointing", "about +30% time: activations are recomputed"),
    "optim8bit": (2, "Use the 8-bit AdamW optimizer", "about the same speed; 8-bit optimizer states"),
    "microbatch": (3, "Smaller micro batch, more accumulation", "same effective batch; a little slower"),
    "lora_rank": (4, "Smaller LoRA rank", "same speed; the adapters can learn a little less"),
    "lora": (5, "LoRA instead of full fine-tuning", "faster; trains small adapters only, usually a little below full"),
    "zero": (6, "Shard with DeepSpeed ZeRO over the GPUs", "about +5-15% time: more communication between GPUs"),
    "qlora": (7, "QLoRA: a 4-bit base model", "about +35% time; a 4-bit base is slightly less accurate"),
    "offload": (8, "Offload optimizer states to CPU RAM (ZeRO)", "about 2x time: states cross PCIe every step"),
    "shorter": (9, "Shorter sequences", "faster; rows longer than this are cut"),
    "combine": (10, "Combine", ""),
    "packing": (11, "Skip padding (packing)", "faster; the same loss and gradients, no memory spent on padding"),
}


@dataclass
class Advice:
    """One set of changes that makes the run use less memory, keeping the effective batch size."""

    title: str
    changes: dict[str, Any]
    new_total_bytes: int
    cost: str  # what it costs, in words: speed, quality, data
    fits: bool | None = None
    kind: str = ""  # the lever when one; "combine" for several
    slowdown: float = 0.0  # estimated extra training time (0.3 = +30%; negative = faster)
    data_lost: float | None = 0.0  # share of training tokens cut off (None: the data's lengths are unknown)
    score: float = 0.0  # the ranking cost in points (lower first)
    kinds: list[str] = field(default_factory=list)  # every lever it pulls
    replayed: bool = False  # new_total_bytes comes from a replay of these settings (else: formulas scaled)

    @property
    def keeps_data(self) -> bool:
        """No training token is cut off (within 0.1%)."""
        return self.data_lost is not None and self.data_lost <= 0.001


@dataclass
class Step:
    """One position of one lever: its settings and what it costs."""

    kind: str
    changes: dict[str, Any]
    slowdown: float
    quality: float
    label: str  # what it changes, in words


@dataclass
class Proposal:
    """A complete configuration for the first screen: form values that fit, why, and the estimate."""

    values: dict[str, Any]  # every form field, keyed by field name
    reasons: list[str]  # two or three plain sentences
    estimate: Any  # the MemoryEstimate of these values
    fits: bool | None
    changes: dict[str, Any] = field(default_factory=dict)  # what differs from the values asked about


# ----------------------------------------------------------------------------- the levers


def _levers(config: TrainConfig, device: str, gpus: int) -> list[list[Step]]:
    """For each lever, its positions from mildest (the current setting, no change) to most drastic."""
    keep = Step("", {}, 0.0, 0.0, "")
    levers: list[list[Step]] = []
    if not config.gradient_checkpointing:
        levers.append([keep, Step("checkpointing", {"gradient_checkpointing": True}, SPEED_COST["checkpointing"], 0,
                                  "gradient checkpointing on")])  # fmt: skip
    levers.append([keep, *_micro_batches(config)])
    if config.optim == "adamw_torch":
        levers.append([
            keep,
            Step("optim8bit", {"optim": "adamw_8bit"}, SPEED_COST["optim8bit"], QUALITY_COST["optim8bit"],
                 "8-bit AdamW"),
            Step("optim8bit", {"optim": "paged_adamw_8bit"}, SPEED_COST["paged"], QUALITY_COST["optim8bit"],
                 "paged 8-bit AdamW"),
        ])  # fmt: skip
    levers.append([keep, *_methods(config, gpus)])
    levers.append([keep, *_sharding(config, device, gpus)])
    levers.append([keep, *_sequence_lengths(config)])
    if not config.packing and packing_for(config.replace(packing=True))[0]:
        levers.append([keep, Step("packing", {"packing": True}, SPEED_COST["packing"], 0, "packing on")])
    return [lever for lever in levers if len(lever) > 1]


def _micro_batches(config: TrainConfig) -> list[Step]:
    """Smaller micro batches with more accumulation: the same examples per optimizer step."""
    b, eff = config.per_device_train_batch_size, config.effective_batch_size
    out = []
    for d in (d for d in range(b - 1, 0, -1) if eff % d == 0):
        busy = d * config.max_seq_length >= 4096  # a micro batch this large still keeps a GPU busy
        slowdown = 0.0 if busy else SPEED_COST["microbatch_halving"] * math.log2(b / d)
        changes = {"per_device_train_batch_size": d, "gradient_accumulation_steps": eff // d}
        out.append(Step("microbatch", changes, slowdown, 0, f"batch {d} x {eff // d} accumulation"))
    return out


def _methods(config: TrainConfig, gpus: int) -> list[Step]:
    """LoRA rank, LoRA instead of full, QLoRA instead of LoRA (QLoRA needs the Trainer backend, no ZeRO)."""
    out: list[Step] = []
    if config.method in ("lora", "qlora"):
        r, halvings = config.lora_r // 2, 1
        while r >= 8:
            changes = {"lora_r": r, "lora_alpha": max(1, config.lora_alpha * r // config.lora_r)}
            out.append(Step("lora_rank", changes, 0.0, QUALITY_COST["lora_rank_halving"] * halvings, f"LoRA rank {r}"))
            r, halvings = r // 2, halvings + 1
    qlora_ok = config.backend == "trainer" and config.zero_stage == 0
    if config.method == "full":
        out.append(Step("lora", {"method": "lora"}, SPEED_COST["lora"], QUALITY_COST["lora"], "LoRA adapters"))
        if qlora_ok:
            out.append(Step("qlora", {"method": "qlora"}, SPEED_COST["lora"] + SPEED_COST["qlora"],
                            QUALITY_COST["lora"] + QUALITY_COST["qlora"], "QLoRA (4-bit base)"))  # fmt: skip
    elif config.method == "lora" and qlora_ok:
        out.append(Step("qlora", {"method": "qlora"}, SPEED_COST["qlora"], QUALITY_COST["qlora"], "QLoRA (4-bit base)"))
    return out


def _sharding(config: TrainConfig, device: str, gpus: int) -> list[Step]:
    """ZeRO stages over several GPUs, and optimizer offload to CPU RAM (not with a 4-bit base)."""
    if config.method == "qlora":
        return []
    out: list[Step] = []
    if gpus > 1:
        for stage in (s for s in (2, 3) if s > config.zero_stage):
            cost = SPEED_COST["zero2" if stage == 2 else "zero3"]
            out.append(Step("zero", {"zero_stage": stage}, cost, 0, f"ZeRO-{stage} over {gpus} GPUs"))
    if config.offload_optimizer == "none" and device == "cuda":
        changes = {"zero_stage": max(2, config.zero_stage), "offload_optimizer": "cpu"}
        out.append(Step("offload", changes, SPEED_COST["offload"], 0, "optimizer states in CPU RAM"))
    return out


def _sequence_lengths(config: TrainConfig) -> list[Step]:
    """Shorter max_seq_length, halving down to MIN_SEQ (their data cost is priced with the data's lengths)."""
    out, seq = [], config.max_seq_length
    while seq // 2 >= MIN_SEQ:
        seq //= 2
        out.append(Step("shorter", {"max_seq_length": seq}, 0.0, 0, f"{seq} tokens per row"))
    return out


# ----------------------------------------------------------------------------- the search


def _advise(config: TrainConfig, device: str, gpus: int, capacity: int, base: Any) -> list[Advice]:
    """Ranked combinations of changes that make the run fit within `capacity` bytes, cheapest honest cost first."""
    stats = _stats_for(config)
    ratio = min(1.25, max(0.8, base.tensor_bytes / max(1, base.analytic_tensor_bytes)))
    combos = _ranked_combinations(config, device, gpus, stats)
    found: list[tuple[tuple[int, ...], Advice]] = []
    started = time.monotonic()
    for positions, steps, score, lost in combos:
        if len(found) >= MAX_RESULTS or (found and time.monotonic() - started > PRICE_BUDGET_S):
            break  # (the first prices also build the census of each method: never stop before one fits)
        if any(_contains(positions, kept) for kept, _ in found):
            continue  # a milder combination inside this one already fits
        changes = _merged(steps)
        total = _price(config, changes, device, gpus, ratio)
        if total is None or total > capacity:
            continue
        found.append((positions, _advice(steps, changes, total, capacity, score, lost)))
    return _confirmed(config, device, gpus, capacity, [a for _, a in found])


def _ranked_combinations(config: TrainConfig, device: str, gpus: int, stats: Any) -> list[tuple]:
    """Every combination of lever positions with its cost: (positions, steps, score, tokens lost), best first."""
    levers = _levers(config, device, gpus)
    out = []
    for positions in itertools.product(*(range(len(lever)) for lever in levers)):
        if not any(positions):
            continue
        steps = [levers[i][p] for i, p in enumerate(positions) if p]
        lost = _tokens_lost(steps, stats, config)
        out.append((positions, steps, _score(steps, lost), lost))
    # Options that keep the data whole first; then the cheapest; then the fewest changes.
    out.sort(key=lambda c: (c[3] is None or c[3] > 0.001, c[2], len(c[1])))
    return out


def _contains(positions: tuple[int, ...], milder: tuple[int, ...]) -> bool:
    """True when `positions` pulls every lever `milder` pulls at least as far (it only adds cost)."""
    return all(m == 0 or (p >= m) for p, m in zip(positions, milder, strict=True))


def _tokens_lost(steps: list[Step], stats: Any, config: TrainConfig) -> float | None:
    """Share of training tokens a shorter max_seq_length cuts off; 0 without a cut; None when lengths are unknown."""
    seq = next((s.changes["max_seq_length"] for s in steps if s.kind == "shorter"), None)
    if seq is None:
        return 0.0
    if stats is None:
        return None
    return stats.tokens_lost(seq)


def _score(steps: list[Step], lost: float | None) -> float:
    """Points: slowdown in per cent, plus quality points, plus the data cut off (unknown counts as 10% of it)."""
    slowdown = _slowdown(steps)
    data = POINTS_PER_PERCENT_LOST * 100 * (0.1 if lost is None else lost)
    return 100 * max(slowdown, -0.5) + sum(s.quality for s in steps) + data


def _slowdown(steps: list[Step]) -> float:
    """Combined extra time: the levers' factors multiply."""
    factor = 1.0
    for s in steps:
        factor *= 1.0 + s.slowdown
    return factor - 1.0


def _merged(steps: list[Step]) -> dict[str, Any]:
    """All settings of the steps (offload's zero_stage wins over a lower one)."""
    changes: dict[str, Any] = {}
    for s in steps:
        for key, value in s.changes.items():
            changes[key] = max(value, changes[key]) if key == "zero_stage" and key in changes else value
    return changes


def _advice(steps: list[Step], changes: dict[str, Any], total: int, capacity: int, score: float, lost: Any) -> Advice:
    """An Advice: a title naming what changes, and the cost in words (speed, quality, data)."""
    kinds = [s.kind for s in steps]
    if len(steps) == 1:
        kind = steps[0].kind
        title = KINDS[kind][1] + (f" ({steps[0].label})" if kind in ("microbatch", "shorter", "lora_rank") else "")
    else:
        kind, title = "combine", " + ".join(s.label for s in steps)
        title = title[0].upper() + title[1:]
    slowdown = _slowdown(steps)
    speed = "about the same speed" if abs(slowdown) < 0.03 else f"about {slowdown:+.0%} time"
    parts = [speed]
    quality = [s.label for s in steps if s.quality and s.kind != "optim8bit"]
    if quality:
        parts.append("changes what is trained: " + ", ".join(quality))
    seq = changes.get("max_seq_length")
    if seq is not None:
        parts.append(
            f"data length unknown: rows over {seq} tokens are cut"
            if lost is None
            else ("every row still fits" if lost <= 0.001 else f"cuts {lost:.1%} of the training tokens")
        )
    return Advice(title, changes, int(total), "; ".join(parts), total <= capacity, kind, slowdown, lost, score, kinds)


def _price(config: TrainConfig, changes: dict[str, Any], device: str, gpus: int, ratio: float) -> int | None:
    """Total bytes after a change: the formulas, scaled by how far they were from the replay for this config."""
    from finetune import memory as mem

    try:
        new = config.replace(**changes)
    except UserError:
        return None
    if new.errors():
        return None  # a combination the config refuses (e.g. QLoRA with ZeRO)
    est = mem._estimate_core(new, device, gpus, trace_it=False)
    tensors = int(est.analytic_tensor_bytes * (ratio if mem._traceable(new) else 1.0))
    return tensors + sum(mem._overheads(tensors, new).values()) if device == "cuda" else tensors


def _confirmed(config: TrainConfig, device: str, gpus: int, capacity: int, advice: list[Advice]) -> list[Advice]:
    """Replay suggestions in rank order until one is confirmed to fit (its figure becomes the exact one); drop the
    ones the replay shows do not fit. Suggestions after the first confirmed one keep their formula figure."""
    from finetune import memory as mem

    out: list[Advice] = []
    replays = 0 if _billions(config) <= REPLAY_MAX_BILLIONS else 2  # a large model's replay takes 15-30 s here
    for a in advice:
        new = config.replace(**a.changes)
        if replays < 2 and mem._traceable(new) and not any(x.fits for x in out):
            replays += 1
            est = mem._estimate_core(new, device, gpus)
            a.new_total_bytes, a.fits, a.replayed = est.total_bytes, est.total_bytes <= capacity, True
            if not a.fits:
                continue
        out.append(a)
    return out


def _stats_for(config: TrainConfig) -> Any:
    """The data's token lengths, or None when they are not known without a download or the data cannot be read
    (then a cut's cost is unknown and cuts rank after every option that keeps the data)."""
    from finetune.data_stats import cached_or_local

    try:
        return cached_or_local(config)
    except Exception:  # noqa: BLE001 - advice without the data's lengths still helps: cuts are ranked last
        return None


# ----------------------------------------------------------------------------- the first screen's proposal


def propose(config: TrainConfig, device: str = "cuda", gpus: int = 1, gpu_gib: float | None = None) -> Proposal:
    """A configuration like `config` that fits `gpu_gib` (the best advice applied), with the reasons in words."""
    from finetune import memory as mem

    stats = _stats_for(config)
    start = _fit_to_data(config, stats)
    est = mem.estimate(start, device=device, gpus=gpus, gpu_gib=gpu_gib)
    chosen, advice = start, None
    if est.fits is False and est.advice:
        advice = est.advice[0]
        chosen = start.replace(**advice.changes)
        est = mem.estimate(chosen, device=device, gpus=gpus, gpu_gib=gpu_gib)
    asked = config.to_dict()
    values = chosen.to_dict()
    changes = {k: v for k, v in values.items() if asked.get(k) != v}
    reasons = _reasons(config, chosen, est, stats, advice, gpu_gib)
    return Proposal(values, reasons, est, est.fits, changes)


def _fit_to_data(config: TrainConfig, stats: Any) -> TrainConfig:
    """max_seq_length lowered to the smallest power of two (>= MIN_SEQ) that keeps every row whole: free memory."""
    if stats is None or not stats.lengths or config.packing:
        return config
    enough = max(MIN_SEQ, 1 << max(0, stats.max - 1).bit_length())
    return config.replace(max_seq_length=enough) if enough < config.max_seq_length else config


def _reasons(
    asked: TrainConfig, chosen: TrainConfig, est: Any, stats: Any, advice: Advice | None, gpu_gib: float | None
) -> list[str]:
    """Two or three sentences on why: the method, the batch and checkpointing, the data's length. (The fit verdict
    itself is the estimate's: the UI shows it beside these.)"""
    out = [_method_sentence(chosen, est)]
    batch = f"batch {chosen.per_device_train_batch_size} × {chosen.gradient_accumulation_steps} accumulation"
    if advice is not None:
        checkpointing = chosen.gradient_checkpointing and not asked.gradient_checkpointing
        how = f"gradient checkpointing and {batch}" if checkpointing else advice.title[0].lower() + advice.title[1:]
        out.append(
            f"As asked it needs more than {gpu_gib:g} GiB; {how} keeps the effective batch of "
            f"{chosen.effective_batch_size} ({advice.cost})."
        )
    elif est.fits:
        out.append(f"{batch[0].upper()}{batch[1:]} fits as set: nothing slower (checkpointing, a smaller micro batch) "
                   "is needed.")  # fmt: skip
    elif est.fits is False:
        out.append("No combination of the memory savers fits this card: choose a smaller model or a larger card.")
    if stats is not None and stats.lengths:
        seq = chosen.max_seq_length
        if seq < asked.max_seq_length and stats.max <= seq:
            out.append(f"Every row is at most {stats.max} tokens, so {seq} tokens per row keeps them whole and needs "
                       f"less memory than {asked.max_seq_length}.")  # fmt: skip
        else:
            out.append(f"{stats.share_within(seq):.0%} of the {stats.rows} rows fit {seq} tokens whole "
                       f"(longest {stats.max}).")  # fmt: skip
    return out


def _method_sentence(config: TrainConfig, est: Any) -> str:
    """Why the method: the base model's size in memory, as trained."""
    from finetune import memory as mem

    weights = est.sizes.get("weights", 0) + est.sizes.get("quant_constants", 0)
    params = _billions(config)
    if config.method == "qlora":
        full16 = 2 * params * 1e9 if params else 0
        than = f" instead of {full16 / 1e9:.0f} GB" if full16 else ""
        size = _size_name(params)
        return f"QLoRA keeps the {size} base in 4 bits: {weights / 1e9:.1f} GB{than}, and trains small adapters."
    if config.method == "lora":
        return f"LoRA trains small adapters on the frozen {_size_name(params)} base ({mem._size(weights)} of weights)."
    return f"Full fine-tuning updates every weight of the {_size_name(params)} model: the most memory, the most change."


def _billions(config: TrainConfig) -> float:
    """The model's parameter count in billions (from the census the estimate already made), 0 when unknown."""
    from finetune import memory as mem

    try:
        return mem._census(config, mem.model_config_of(config)).total / 1e9
    except Exception:  # noqa: BLE001 - only for the wording
        return 0.0


def _size_name(billions: float) -> str:
    """8.0 -> '8B'; 0.135 -> '135M'."""
    if not billions:
        return "base"
    return f"{billions:.0f}B" if billions >= 1.5 else f"{billions * 1000:.0f}M" if billions < 1 else f"{billions:.1f}B"


# ----------------------------------------------------------------------------- after an out-of-memory error


def advice_text(config: TrainConfig, gpus: int = 1) -> str:
    """A short paragraph for an out-of-memory failure: how much the run needs and what to change first."""
    from finetune import memory as mem

    device, capacity = _this_device()
    try:
        est = mem._estimate_core(config, device, gpus)
    except Exception as exc:  # noqa: BLE001 - never hide the OOM behind an estimator problem
        return f"Out of memory. (The memory estimate could not be computed: {exc}.) Try gradient_checkpointing: true."
    where = f"this {'GPU' if device == 'cuda' else 'machine'}"
    need = f"This run needs about {mem._size(est.total_bytes)} at the {est.peak_phase}"
    if capacity:
        need += f"; {where} has {mem._size(capacity)}"
    target = capacity if capacity and est.total_bytes > capacity else int(0.75 * est.total_bytes)
    advice = _advise(config, device, gpus, target, est)
    if not advice:
        return f"Out of memory. {need}. Reduce max_seq_length or per_device_train_batch_size."
    first = advice[0]
    lines = [
        f"Out of memory. {need}.",
        f"Change first: {first.title.lower()} ({_changes(first.changes)}), about {mem._size(first.new_total_bytes)}; "
        f"cost: {first.cost}.",
    ]
    if len(advice) > 1:
        lines.append(
            "Also possible: " + "; ".join(f"{a.title.lower()} ({_changes(a.changes)})" for a in advice[1:3]) + "."
        )
    lines.append("Each keeps your effective batch size. Estimate others with: python -m finetune estimate --config ...")
    return " ".join(lines)


def _changes(changes: dict[str, Any]) -> str:
    """`key: value` text of changes."""
    return ", ".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in changes.items())


def _this_device() -> tuple[str, int | None]:
    """The device a failed run used: the first GPU if any (with its memory), else the CPU (with RAM)."""
    import os

    import torch

    if torch.cuda.is_available():
        return "cuda", int(torch.cuda.get_device_properties(0).total_memory)
    try:
        return "cpu", int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return "cpu", None
