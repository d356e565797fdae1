"""The one search: which settings make a run fit a device with headroom, ranked by what they honestly cost.

Start's proposal, the Memory tab's advice, `estimate --json`, `propose` and the paragraph after an out-of-memory
failure all read this one answer (`judge` fills it into an estimate; `finetune.memory.advice` words it).

The levers a run has: gradient checkpointing, micro batch x accumulation at the same effective batch (the effective
batch is never given up: accumulation keeps it at any micro batch), 8-bit / paged optimizers, LoRA rank, LoRA /
QLoRA, DeepSpeed ZeRO stage and CPU offload, the sequence length, whose positions come from the data's own token
lengths: the length that keeps every row whole, then halvings of it, packing where the plan can pack (it is off), and
for a vision-language model the images' longest side (fewer image tokens a row).
Every combination is priced with the estimator's formulas, scaled by how far they were from the replay of the
settings searched (about a millisecond each), and the first fitting ones are replayed to confirm the figure. A packed
micro batch is priced as the estimate prices it: by the real tokens of the data's longest rows (`stats_for` is the
one source of those lengths for both).

Ranking, lowest first: (does it cut a real share of the data, its score, how many changes). The score is the
estimated slowdown in per cent, plus quality points where what is trained changes, plus ten points per per cent of
training tokens a shorter sequence cuts off (measured on the data's own lengths). So the data is kept whole whenever
any combination can keep it; a cut comes first only when nothing else fits or when it costs nothing (at most 1% of
the rows and 0.5% of the tokens).

"Fits" keeps headroom: a combination fits when it leaves at least max(5% of the card, 1 GiB), the size of the
estimate's own error and of the caching allocator's swings. Inside that margin it is "tight": listed, never chosen.
When nothing fits, the answer names the smallest common card (or the number of GPUs, with ZeRO-3 and CPU offload) on
which the best combination fits, in one line.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Any

from finetune.config import TrainConfig
from finetune.errors import UserError
from finetune.memory import estimator as core
from finetune.memory.estimator import Advice, GiB, MemoryEstimate, Needed, stats_for
from finetune.plan import RunPlan

# Estimated extra training time per lever, as a fraction. Sources: checkpointing recomputes the forward pass of each
# block (one more forward of three passes: +20-35% in published measurements); QLoRA ran at 14.4k vs LoRA's 19.5k
# tokens/s on an H200 (+35%, docs/benchmarks.md); 8-bit AdamW steps cost about the same as 32-bit ones; a smaller micro
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
    # No compute on padding. bench/results/packing.md (bundled mixed set, 49% padding, 2 CPU cores): 2.6x the real
    # tokens per second of padded batches idle, 1.07x under heavy load; -0.30 stays conservative for other data.
    "packing": -0.30,
}
# What a change costs in what the model can learn, in the same points (a judgement, stated so it can be argued with).
# Halving the images' longest side keeps a quarter of their pixels: fine detail (small text, small objects) may be lost.
QUALITY_COST = {"optim8bit": 1, "lora": 30, "qlora": 8, "lora_rank_halving": 3, "image_side_halving": 12}
POINTS_PER_PERCENT_LOST = 10  # cutting 1% of the training tokens weighs like a 10% slowdown
UNKNOWN_LOSS = 0.10  # a cut of data whose lengths are unknown is priced as if it lost 10% of the tokens
NEGLIGIBLE_ROWS = 0.01  # a cut of at most 1% of the rows ...
NEGLIGIBLE_TOKENS = 0.005  # ... losing at most 0.5% of the tokens costs nothing worth a slower run
MIN_SEQ = 128  # the shortest sequence proposed
MIN_IMAGE_SIDE = 224  # the smallest longest image side proposed (pixels; vision encoders' common input size)
HEADROOM_SHARE = 0.05  # a fit leaves at least 5% of the card ...
HEADROOM_MIN = 1 * GiB  # ... and on a GPU at least 1 GiB (the CUDA allocator's swings; RAM has no such floor)
MAX_RESULTS = 6
MAX_TIGHT = 2  # tight combinations listed after the fitting ones
REPLAY_MAX_BILLIONS = 2.0  # above this size only the top two options are replayed (a replay takes 5-15 s here)
PRICE_BUDGET_S = 8.0  # seconds spent pricing combinations at most (each is a formula evaluation, ~1 ms)
NEEDED_REPLAYS = 3  # replays spent at most to confirm the combination named when nothing fits (5-15 s each)
GPU_COUNTS = (2, 4, 8, 16, 32, 64)  # GPU counts tried with ZeRO-3 + offload when no single card holds the run

# (order, title, what it costs in words) per kind of change, for single-lever titles.
KINDS = {
    "checkpointing": (1, "Turn on gradient checkpointing", "about +30% time: activations are recomputed"),
    "optim8bit": (2, "Use the 8-bit AdamW optimizer", "about the same speed; 8-bit optimizer states"),
    "microbatch": (3, "Smaller micro batch, more accumulation", "same effective batch; a little slower"),
    "lora_rank": (4, "Smaller LoRA rank", "same speed; the adapters can learn a little less"),
    "lora": (5, "LoRA instead of full fine-tuning", "faster; trains small adapters only, usually a little below full"),
    "zero": (6, "Shard with DeepSpeed ZeRO over the GPUs", "about +5-15% time: more communication between GPUs"),
    "qlora": (7, "QLoRA: a 4-bit base model", "about +35% time; a 4-bit base is slightly less accurate"),
    "offload": (8, "Offload optimizer states to CPU RAM (ZeRO)", "about 2x time: states cross PCIe every step"),
    "whole": (9, "Keep every row whole", "more memory; no row is cut"),
    "shorter": (10, "Shorter sequences", "faster; rows longer than this are cut"),
    "combine": (11, "Combine", ""),
    "packing": (12, "Skip padding (packing)", "faster; the same loss and gradients, no memory spent on padding"),
    "image_side": (13, "Smaller images", "fewer image tokens a row; fine detail may be lost"),
}


def margin_bytes(capacity: int, device: str = "cuda") -> int:
    """The headroom a fit must leave on a device of `capacity` bytes: max(5% of it, 1 GiB) on a GPU, 5% of RAM."""
    share = int(HEADROOM_SHARE * capacity)
    return max(share, HEADROOM_MIN) if device == "cuda" else share


def verdict(total: int, capacity: int, device: str = "cuda") -> str:
    """`fits` (headroom kept), `tight` (within the card, inside the margin) or `does not fit`."""
    if total <= capacity - margin_bytes(capacity, device):
        return "fits"
    return "tight" if total <= capacity else "does not fit"


@dataclass
class Step:
    """One position of one lever: its settings and what it costs."""

    kind: str
    changes: dict[str, Any]
    slowdown: float
    quality: float
    label: str  # what it changes, in words


@dataclass
class Combination:
    """A combination of lever positions, ranked and priced."""

    positions: tuple[int, ...]
    steps: list[Step]
    score: float
    lost: float | None
    significant: bool  # cuts a real share of the data (or an unknown one)
    total: int | None = None  # priced bytes (None: not priced yet, or refused by the config)
    replayed: bool = False  # `total` comes from a replay

    @property
    def key(self) -> tuple:
        return (self.significant, self.score, len(self.steps))

    @property
    def changes(self) -> dict[str, Any]:
        """The settings this combination changes."""
        return _merged(self.steps)


# ----------------------------------------------------------------------------- the data's lengths


def whole_length(config: TrainConfig, stats: Any) -> int | None:
    """The sequence length that keeps every row whole: the smallest power of two (>= MIN_SEQ) at or above the
    longest row, capped by what the model's position embeddings take; None when the lengths are unknown."""
    if stats is None or not getattr(stats, "lengths", None):
        return None
    length = max(MIN_SEQ, 1 << max(0, stats.max - 1).bit_length())
    limit = _model_limit(config)
    return min(length, limit) if limit else length


def _model_limit(config: TrainConfig) -> int | None:
    """The model's longest sequence, from its config (None when unknown)."""
    from finetune.model.loading import max_positions

    try:
        return max_positions(core.model_config_of(config))
    except Exception:  # noqa: BLE001 - without the model's config the data alone decides
        return None


def cut_words(stats: Any, seq: int) -> str:
    """How many rows a cut to `seq` tokens shortens and by how much, in words ("" when none is)."""
    if stats is None or not stats.lengths:
        return ""
    longer = [n - seq for n in stats.lengths if n > seq]
    if not longer:
        return ""
    counted = len(stats.lengths)
    rows = round(len(longer) * stats.rows / counted) if stats.sampled else len(longer)
    about = "about " if stats.sampled else ""
    lost = stats.tokens_lost(seq)
    return (
        f"{about}{rows} of {stats.rows} rows lose up to {max(longer)} tokens each ({lost:.1%} of the training tokens)"
    )


def _negligible(stats: Any, seq: int) -> bool:
    """A cut to `seq` that costs nothing: at most NEGLIGIBLE_ROWS of the rows and NEGLIGIBLE_TOKENS of the tokens."""
    return 1 - stats.share_within(seq) <= NEGLIGIBLE_ROWS and stats.tokens_lost(seq) <= NEGLIGIBLE_TOKENS


# ----------------------------------------------------------------------------- the levers


def _levers(plan: RunPlan, stats: Any, pinned: tuple[str, ...]) -> list[list[Step]]:
    """For each lever, its positions from the current setting (no change) to the most drastic. Which combinations of
    them the rules allow is not decided here: `allowed` asks the config's own validation."""
    config = plan.config
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
    levers.append([keep, *_methods(plan)])
    levers.append([keep, *_sharding(config, plan.device, plan.world_size)])
    levers.append([keep, *_sequence_lengths(config, stats)])
    levers.append([keep, *_image_sides(plan)])
    if not config.packing and plan.replanned(packing=True).packing:
        levers.append([keep, Step("packing", {"packing": True}, SPEED_COST["packing"], 0, "packing on")])
    return [lever for lever in levers if len(lever) > 1 and not any(k in pinned for s in lever for k in s.changes)]


def _micro_batches(config: TrainConfig) -> list[Step]:
    """Smaller micro batches with more accumulation: the same examples per optimizer step."""
    b, eff = config.per_device_train_batch_size, config.effective_batch_size
    out = []
    for d in (d for d in range(b - 1, 0, -1) if eff % d == 0):
        busy = d * config.max_seq_length >= 4096  # a micro batch this large still keeps a GPU busy
        slowdown = 0.0 if busy else SPEED_COST["microbatch_halving"] * math.log2(b / d)
        changes = {"per_device_train_batch_size": d, "gradient_accumulation_steps": eff // d}
        out.append(Step("microbatch", changes, slowdown, 0, f"batch {d} × {eff // d} accumulation"))
    return out


def _methods(plan: RunPlan) -> list[Step]:
    """LoRA rank, LoRA instead of full, QLoRA instead of LoRA."""
    config = plan.config
    out: list[Step] = []
    if config.method in ("lora", "qlora"):
        r, halvings = config.lora_r // 2, 1
        while r >= 8:
            changes = {"lora_r": r, "lora_alpha": max(1, config.lora_alpha * r // config.lora_r)}
            out.append(Step("lora_rank", changes, 0.0, QUALITY_COST["lora_rank_halving"] * halvings, f"LoRA rank {r}"))
            r, halvings = r // 2, halvings + 1
    if config.method == "full":
        out.append(Step("lora", {"method": "lora"}, SPEED_COST["lora"], QUALITY_COST["lora"], "LoRA adapters"))
        out.append(Step("qlora", {"method": "qlora"}, SPEED_COST["lora"] + SPEED_COST["qlora"],
                        QUALITY_COST["lora"] + QUALITY_COST["qlora"], "QLoRA (4-bit base)"))  # fmt: skip
    elif config.method == "lora":
        out.append(Step("qlora", {"method": "qlora"}, SPEED_COST["qlora"], QUALITY_COST["qlora"], "QLoRA (4-bit base)"))
    return out


def _sharding(config: TrainConfig, device: str, gpus: int) -> list[Step]:
    """ZeRO stages over several GPUs, and optimizer offload from the GPU to CPU RAM."""
    out: list[Step] = []
    if gpus > 1:
        for stage in (s for s in (2, 3) if s > config.zero_stage):
            cost = SPEED_COST["zero2" if stage == 2 else "zero3"]
            out.append(Step("zero", {"zero_stage": stage}, cost, 0, f"ZeRO-{stage} over {gpus} GPUs"))
    if config.offload_optimizer == "none" and device == "cuda":
        changes = {"zero_stage": max(2, config.zero_stage), "offload_optimizer": "cpu"}
        out.append(Step("offload", changes, SPEED_COST["offload"], 0, "optimizer states in CPU RAM"))
    return out


def _sequence_lengths(config: TrainConfig, stats: Any) -> list[Step]:
    """The length that keeps every row whole (when the data's lengths are known), then its halvings down to MIN_SEQ;
    the current length is the lever's resting position. Their data cost is priced with the data's lengths."""
    whole = whole_length(config, stats)
    top = whole or config.max_seq_length
    lengths = [top] if whole else []
    while top // 2 >= MIN_SEQ:
        top //= 2
        lengths.append(top)
    out = []
    for seq in (s for s in lengths if s != config.max_seq_length):
        if seq == whole:
            out.append(Step("whole", {"max_seq_length": seq}, 0.0, 0, f"{seq} tokens per row (every row whole)"))
        else:
            out.append(Step("shorter", {"max_seq_length": seq}, 0.0, 0, f"{seq} tokens per row"))
    return out


def _image_sides(plan: RunPlan) -> list[Step]:
    """A vision-language run's images at a smaller longest side: halvings of the side they have now (the data's
    largest image, or the setting when it is smaller) down to MIN_IMAGE_SIDE, each naming the tokens an image then
    becomes. None where the side does not change the tokens (Gemma 3: always 256)."""
    if plan.vision is None:
        return []
    load = core.image_load_of(plan)
    side = load.longest_side(plan.vision.image_longest_side)
    out: list[Step] = []
    fewest, halvings = load.tokens_per_image, 0
    while side // 2 >= MIN_IMAGE_SIDE:
        side, halvings = side // 2, halvings + 1
        tokens = core.image_load_of(plan.replanned(image_longest_side=side)).tokens_per_image
        if tokens < fewest:
            label = f"longest image side {side} px: {tokens} tokens an image instead of {load.tokens_per_image}"
            quality = QUALITY_COST["image_side_halving"] * halvings
            out.append(Step("image_side", {"image_longest_side": side}, 0.0, quality, label))
            fewest = tokens
    return out


# ----------------------------------------------------------------------------- ranking


def combinations(plan: RunPlan, stats: Any = None, pinned: tuple[str, ...] = ()) -> list[Combination]:
    """Every combination of changes the search weighs for `plan`, best first (`pinned` fields unchanged). Whether the
    rules allow one is asked when it is priced (`allowed`): the config's validation, not a list of the search's."""
    return _ranked(plan.config, _levers(plan, stats, pinned), stats)


def allowed(plan: RunPlan, changes: dict[str, Any], world_size: int | None = None) -> RunPlan | None:
    """The plan after `changes` (on `world_size` processes, default the plan's) when `TrainConfig`'s validation, the
    one set of compatibility rules, accepts them; None when it refuses them (e.g. QLoRA under ZeRO-3)."""
    try:
        return plan.replanned(world_size=world_size, **changes)
    except UserError:
        return None


def _ranked(config: TrainConfig, levers: list[list[Step]], stats: Any) -> list[Combination]:
    """Every combination of lever positions (but the one that changes nothing), best first."""
    out = []
    for positions in itertools.product(*(range(len(lever)) for lever in levers)):
        if not any(positions):
            continue
        steps = [levers[i][p] for i, p in enumerate(positions) if p]
        seq = next((s.changes["max_seq_length"] for s in steps if "max_seq_length" in s.changes), None)
        lost, significant = _data_cost(config, stats, seq)
        out.append(Combination(positions, steps, _score(steps, lost), lost, significant))
    out.sort(key=lambda c: c.key)
    return out


def _data_cost(config: TrainConfig, stats: Any, seq: int | None) -> tuple[float | None, bool]:
    """(share of tokens lost, whether that is a real cost) at `seq` tokens (None: the length as set)."""
    if stats is None or not stats.lengths:
        return (0.0, False) if seq is None else (None, True)  # the user's own length, or a cut of unknown cost
    length = config.max_seq_length if seq is None else seq
    return stats.tokens_lost(length), not _negligible(stats, length)


def _score(steps: list[Step], lost: float | None) -> float:
    """Points: slowdown in per cent, plus quality points, plus the data cut off (unknown counts as UNKNOWN_LOSS)."""
    data = POINTS_PER_PERCENT_LOST * 100 * (UNKNOWN_LOSS if lost is None else lost)
    return 100 * max(_slowdown(steps), -0.5) + sum(s.quality for s in steps) + data


def _slowdown(steps: list[Step]) -> float:
    """Combined extra time: the levers' factors multiply."""
    factor = 1.0
    for s in steps:
        factor *= 1.0 + s.slowdown
    return factor - 1.0


def _contains(positions: tuple[int, ...], milder: tuple[int, ...]) -> bool:
    """True when `positions` pulls every lever `milder` pulls at least as far (it only adds cost)."""
    return all(m == 0 or (p >= m) for p, m in zip(positions, milder, strict=True))


def _merged(steps: list[Step]) -> dict[str, Any]:
    """All settings of the steps (offload's zero_stage wins over a lower one)."""
    changes: dict[str, Any] = {}
    for s in steps:
        for key, value in s.changes.items():
            changes[key] = max(value, changes[key]) if key == "zero_stage" and key in changes else value
    return changes


def combo_title(steps: list[Step]) -> str:
    """What a combination changes, in words."""
    if len(steps) == 1:
        kind = steps[0].kind
        detail = kind in ("microbatch", "shorter", "lora_rank", "image_side")
        if kind == "whole":
            return f"{KINDS[kind][1]} ({steps[0].changes['max_seq_length']} tokens per row)"
        return KINDS[kind][1] + (f" ({steps[0].label})" if detail else "")
    title = " + ".join(s.label for s in steps)
    return title[0].upper() + title[1:]


def _advice(combo: Combination, config: TrainConfig, stats: Any, capacity: int, device: str) -> Advice:
    """An Advice: a title naming what changes, and the cost in words (speed, quality, data)."""
    steps, total = combo.steps, int(combo.total or 0)
    changes = _merged(steps)
    slowdown = _slowdown(steps)
    parts = ["about the same speed" if abs(slowdown) < 0.03 else f"about {slowdown:+.0%} time"]
    quality = [s.label for s in steps if s.quality and s.kind != "optim8bit"]
    if quality:
        parts.append("changes what is trained: " + ", ".join(quality))
    seq = changes.get("max_seq_length", config.max_seq_length)
    cut = cut_words(stats, seq)
    if "max_seq_length" in changes or cut:
        if combo.lost is None:
            parts.append(f"data length unknown: rows over {seq} tokens are cut")
        else:
            parts.append(cut or "every row still fits")
    kind = steps[0].kind if len(steps) == 1 else "combine"
    state = verdict(total, capacity, device)
    return Advice(
        combo_title(steps), changes, total, "; ".join(parts), state == "fits", kind, slowdown, combo.lost,
        combo.score, [s.kind for s in steps], tight=state == "tight", headroom_bytes=capacity - total, cut=cut,
    )  # fmt: skip


# ----------------------------------------------------------------------------- pricing


def _price(plan: RunPlan, changes: dict[str, Any], ratio: float, world_size: int | None = None) -> int | None:
    """Total bytes after a change (on `world_size` processes, default the plan's): the formulas, scaled by how far
    they were from the replay of the searched settings; None for a combination the config refuses (`allowed`)."""
    new = allowed(plan, changes, world_size)
    if new is None:
        return None
    est = core.estimate_core(new, trace_it=False)
    tensors = int(est.analytic_tensor_bytes * (ratio if core.traceable(new) else 1.0))
    return tensors + sum(core.cuda_overheads(tensors, new).values()) if new.device == "cuda" else tensors


def _replay(plan: RunPlan) -> int:
    """The replayed total of this plan (formulas where a replay cannot run)."""
    return int(core.estimate_core(plan).total_bytes)


def billions(plan: RunPlan) -> float:
    """The model's parameter count in billions (from the census the estimate already made), 0 when unknown."""
    try:
        return core.census_of(plan).total / 1e9
    except Exception:  # noqa: BLE001 - only for how many replays to spend
        return 0.0


# ----------------------------------------------------------------------------- the search


@dataclass
class Search:
    """The ranked options for one device, and, when none fits with headroom, the hardware that would hold it."""

    options: list[Advice]  # the first that fits is the one to pre-select
    needed: Needed | None = None


def search(
    plan: RunPlan,
    capacity: int,
    base: Any,
    stats: Any = None,
    pinned: tuple[str, ...] = (),
) -> Search:
    """Ranked combinations of changes that make `plan` fit `capacity` bytes per device with headroom (tight ones
    after them); when none does, the smallest hardware on which the best one fits (`Search.needed`).
    `base` is the estimate of `plan` itself (its replay scales the formulas); `pinned` fields are not changed."""
    config, device = plan.config, plan.device
    ratio = min(1.25, max(0.8, base.tensor_bytes / max(1, base.analytic_tensor_bytes)))
    combos = combinations(plan, stats, pinned)
    fitting: list[Combination] = []
    tight: list[Combination] = []
    started = time.monotonic()
    for combo in combos:
        if len(fitting) >= MAX_RESULTS or (fitting and time.monotonic() - started > PRICE_BUDGET_S):
            break
        if any(_contains(combo.positions, kept.positions) for kept in fitting):
            continue  # a milder combination inside this one already fits
        combo.total = _price(plan, combo.changes, ratio)
        if combo.total is None or combo.total > capacity:
            continue
        if verdict(combo.total, capacity, device) == "fits":
            fitting.append(combo)
        elif len(tight) < MAX_TIGHT:
            tight.append(combo)
    options = [_advice(c, config, stats, capacity, device) for c in fitting]
    options = _confirmed(plan, capacity, options)
    options += [_advice(c, config, stats, capacity, device) for c in tight]
    options.sort(key=lambda a: not a.fits)  # a replay may have shown a fitting one to be tight: after the others
    needed = None
    if not any(a.fits for a in options):
        needed = _needed(plan, capacity, combos, ratio, base, stats)
    return Search(options[: MAX_RESULTS + MAX_TIGHT], needed)


def _confirmed(plan: RunPlan, capacity: int, advice: list[Advice]) -> list[Advice]:
    """Replay options in rank order until one is confirmed to fit with headroom (its figure becomes the exact one);
    an option the replay shows over the card is dropped, one inside the margin becomes tight. Options after the
    first confirmed one keep their formula figure."""
    out: list[Advice] = []
    replays = 0 if billions(plan) <= REPLAY_MAX_BILLIONS else 2
    for a in advice:
        new = plan.replanned(**a.changes)
        if replays < 2 and core.traceable(new) and not any(x.fits for x in out):
            replays += 1
            total = _replay(new)
            state = verdict(total, capacity, plan.device)
            a.new_total_bytes, a.headroom_bytes, a.replayed = total, capacity - total, True
            a.fits, a.tight = state == "fits", state == "tight"
            if state == "does not fit":
                continue
        out.append(a)
    return out


# ----------------------------------------------------------------------------- when nothing fits


def _needed(
    plan: RunPlan, capacity: int, combos: list[Combination], ratio: float, base: Any, stats: Any
) -> Needed | None:
    """The smallest common card (the same number of them) on which the best combination fits with headroom,
    keeping the data whole if any card can; else how many of the asked card, with ZeRO-3 and CPU offload."""
    config, gpus = plan.config, plan.world_size
    if plan.device != "cuda":
        return None
    started = time.monotonic()
    for combo in combos:  # every combination's price (the search stopped pricing early only when some fitted)
        if combo.total is None and time.monotonic() - started < PRICE_BUDGET_S:
            combo.total = _price(plan, combo.changes, ratio)
    as_is = Combination((), [], 0.0, *_data_cost(config, stats, None), total=base.total_bytes, replayed=True)
    candidates = sorted([as_is, *combos], key=lambda c: c.key)
    replays = 0
    for keep_data in (True, False):
        for gib, names in _larger_cards(capacity):
            card = int(gib * GiB)
            for combo in candidates:
                if (keep_data and combo.significant) or combo.total is None or verdict(combo.total, card) != "fits":
                    continue
                if not combo.replayed and replays < NEEDED_REPLAYS:  # the formulas can be far off: confirm
                    combo.total, combo.replayed = _confirmed_total(plan, combo), True
                    replays += 1
                    if verdict(combo.total, card) != "fits":
                        continue
                return _needed_card(combo, combo.total, gib, names, gpus, capacity)
    return _needed_gpus(plan, capacity, stats)


def _larger_cards(capacity: int) -> list[tuple[float, list[str]]]:
    """(GiB, card names) of the common cards larger than `capacity` bytes, smallest first."""
    from finetune.model.catalogue import GPU_CARDS

    sizes: dict[float, list[str]] = {}
    for name, gib in GPU_CARDS.items():
        if gib * GiB > capacity:
            sizes.setdefault(gib, []).append(name)
    return sorted(sizes.items())


def _confirmed_total(plan: RunPlan, combo: Combination) -> int:
    """The replayed total of a combination (its formula figure where a replay cannot run)."""
    new = plan.replanned(**combo.changes)
    return _replay(new) if core.traceable(new) else int(combo.total or 0)


def _needed_card(combo: Combination, total: int, gib: float, names: list[str], gpus: int, capacity: int) -> Needed:
    """The answer naming a card."""
    cards = " or ".join(_article(n) for n in names)
    count = f"{gpus} × " if gpus > 1 else ""
    what = combo_title(combo.steps) if combo.steps else "The settings as they are"
    needs = "needs" if combo.steps else "need"
    line = (
        f"Nothing fits {capacity / GiB:.1f} GiB{' per GPU' if gpus > 1 else ''}, even with every memory saver: it "
        f"will run out of memory. {what} {needs} about {core.size_text(total)}: it fits {count}{cards} ({gib:g} GiB "
        "usable) with headroom."
    )
    return Needed(line, gib, gpus, list(names), combo.changes, total, what)


def _article(name: str) -> str:
    """'an A100 (80 GB)', 'a T4 (16 GB)'."""
    return ("an " if name[:1] in "AEHIL" or name.startswith(("RTX", "L4")) else "a ") + name


def _needed_gpus(plan: RunPlan, capacity: int, stats: Any) -> Needed | None:
    """How many GPUs of the asked size hold the run with ZeRO-3, parameters and optimizer states in CPU RAM,
    checkpointing and a micro batch of 1 (the data kept whole when its lengths are known)."""
    config = plan.config
    changes: dict[str, Any] = {
        "zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu", "gradient_checkpointing": True,
        "per_device_train_batch_size": 1, "gradient_accumulation_steps": config.effective_batch_size,
    }  # fmt: skip
    if allowed(plan, changes) is None and allowed(plan, {**changes, "method": "lora"}) is not None:
        changes["method"] = "lora"  # the config refuses this with a 4-bit base (ZeRO-3): LoRA on the 16-bit base
    whole = whole_length(config, stats)
    if whole:
        changes["max_seq_length"] = whole
    for count in (n for n in GPU_COUNTS if n > plan.world_size):
        total = _price(plan, changes, 1.0, world_size=count)
        if total is not None and verdict(total, capacity) == "fits":
            line = (
                f"Nothing fits one card of {capacity / GiB:.1f} GiB, and no common card holds this run: it will run "
                f"out of memory. With ZeRO-3 and parameters and optimizer states in CPU RAM it needs about "
                f"{core.size_text(total)} per GPU on {count} of these GPUs (about 2x slower, and much CPU RAM)."
            )
            return Needed(line, capacity / GiB, count, [], changes, total, "ZeRO-3 with CPU offload")
    return None


# ----------------------------------------------------------------------------- the verdict on an estimate


def estimate(plan: RunPlan, gpu_gib: float | None = None, advise: bool = True) -> MemoryEstimate:
    """Peak memory per process of a training step of `plan` (its device, `world_size` GPUs), with the fit verdict
    for `gpu_gib` (headroom kept) and, unless `advise` is False, this search's ranked options when it does not fit."""
    core.check_args(plan, gpu_gib)
    est = core.estimate_core(plan)
    return judge(est, plan, gpu_gib, advise=advise) if gpu_gib else est


def judge(est: MemoryEstimate, plan: RunPlan, gpu_gib: float, advise: bool = True) -> MemoryEstimate:
    """Fill an estimate's fit verdict for `gpu_gib` GiB per device (headroom kept), and (with `advise`) when it does
    not fit with headroom, the ranked options and the hardware needed. Returns `est`."""
    capacity = int(gpu_gib * GiB)
    state = verdict(est.total_bytes, capacity, plan.device)
    est.gpu_gib, est.headroom_bytes = float(gpu_gib), capacity - est.total_bytes
    est.fits, est.verdict, est.margin_bytes = state == "fits", state, margin_bytes(capacity, plan.device)
    if state != "fits" and advise:
        found = search(plan, capacity, est, stats_for(plan.config))
        est.advice, est.needed = found.options, found.needed
    return est
