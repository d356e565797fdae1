"""The one search's answer in words: the first screen's proposal (`propose`, also `python -m finetune propose`) and
the paragraph shown after an out-of-memory failure (`advice_text`). The search itself, its ranking and the headroom
rule live in `finetune.memory.search`; the Memory tab and `estimate --json` read the same options from an estimate.

A proposal starts from the fastest settings (no checkpointing, a plain AdamW, LoRA rather than QLoRA, the largest
micro batch up to 8 at the same effective batch, packing where the plan can pack) and the sequence length that keeps
every row of the data whole, then takes the search's best option if that does not fit with headroom. So it never
keeps a choice a proposal made for other data or other hardware: it is recomputed from the same start whenever those
change. A field the user set on purpose (`pinned`, e.g. the sequence length typed on the Start tab) is left as set.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from finetune.config import TrainConfig
from finetune.errors import UserError
from finetune.memory import estimator as core
from finetune.memory.estimator import Advice, GiB, Needed, size_text
from finetune.memory.search import billions, cut_words, estimate, search, stats_for, whole_length
from finetune.plan import RunPlan

MAX_MICRO_BATCH = 8  # the largest micro batch a proposal starts from (more rarely speeds a step up further)


@dataclass
class Proposal:
    """A complete configuration for the first screen: form values, why, and their estimate on the asked hardware.

    When nothing fits (`fits` False), `values` is the best combination for the hardware named in `needed`: the UI
    writes it into the form only when the user asks."""

    values: dict[str, Any]  # every form field, keyed by field name
    reasons: list[str]  # two to four plain sentences
    estimate: Any  # the MemoryEstimate of these values on the asked hardware
    fits: bool | None  # fits with headroom (None: no memory size was given, e.g. a CPU)
    changes: dict[str, Any] = field(default_factory=dict)  # what differs from the values asked about
    verdict: str = ""  # fits | tight | does not fit ("" without a memory size)
    needed: Needed | None = None  # when nothing fits: the smallest hardware that holds `values`
    rows_kept_whole: float | None = None  # share of the rows not cut at values["max_seq_length"] (None: unknown)
    data: dict[str, Any] | None = None  # the data's token-length figures (DataStats.to_dict), None when unknown

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict: the settings, the estimate, the headroom, the rows kept whole, the reasons."""
        est = self.estimate
        return {
            "fits": self.fits,
            "verdict": self.verdict,
            "settings": dict(self.values),
            "changes": dict(self.changes),
            "reasons": list(self.reasons),
            "total_bytes": getattr(est, "total_bytes", None),
            "gpu_gib": getattr(est, "gpu_gib", None),
            "headroom_bytes": getattr(est, "headroom_bytes", None),
            "margin_bytes": getattr(est, "margin_bytes", None),
            "rows_kept_whole": self.rows_kept_whole,
            "data": self.data,
            "needed": asdict(self.needed) if self.needed else None,
            "estimate": est.to_dict() if hasattr(est, "to_dict") else None,
        }

    def render_text(self) -> str:
        """The proposal for a terminal: the verdict, the reasons, the settings that differ from the defaults, the
        rows kept whole, and the command that trains it."""
        import shlex

        est = self.estimate
        where = f"{est.gpus} × {est.gpu_gib:g} GiB" if est.gpu_gib else est.device
        need = size_text(est.total_bytes)
        if self.fits:
            left, keep = size_text(est.headroom_bytes), size_text(est.margin_bytes)
            head = f"Proposal for {where}: fits, leaving {left} (a fit keeps {keep})"
        elif self.fits is None:
            head = f"Proposal for {where}: about {need} per device"
        else:
            head = f"Nothing fits {where} with headroom: it will run out of memory there"
        lines = [head, *(f"  - {r}" for r in self.reasons)]
        defaults = TrainConfig().to_dict()
        differ = {k: v for k, v in self.values.items() if defaults.get(k) != v}
        if differ:
            lines += ["", "Settings (those that differ from the defaults):"]
            lines += [f"  {k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in differ.items()]
        if self.rows_kept_whole is not None and self.data:
            lines.append(f"Rows kept whole: {self.rows_kept_whole:.0%} of {self.data['rows']}")
        sets = " ".join(
            f"--set {shlex.quote(f'{k}={str(v).lower() if isinstance(v, bool) else v}')}" for k, v in differ.items()
        )
        on = ""
        if self.needed is not None:
            count = f"{self.needed.gpus} × " if self.needed.gpus > 1 else ""
            on = f" on {count}{' or '.join(self.needed.cards) or f'{self.needed.gpu_gib:g} GiB GPUs'}"
        lines += ["", f"Train it{on}: python -m finetune train {sets}".rstrip()]
        return "\n".join(lines)


# ----------------------------------------------------------------------------- the proposal


def propose(plan: RunPlan, gpu_gib: float | None = None, pinned: tuple[str, ...] = ()) -> Proposal:
    """The best configuration like the plan's for its `world_size` devices of `gpu_gib` GiB (the search's answer),
    with the reasons in words; `pinned` fields are kept as set."""
    config = plan.config
    stats, unread = data_lengths(config)
    start = baseline(plan, stats, pinned)
    est = estimate(start, gpu_gib, advise=False)
    chosen, option, needed = start, None, None
    if est.fits is False:
        found = search(start, int(gpu_gib * GiB), est, stats, pinned)
        est.advice, est.needed = found.options, found.needed
        option = est.advice[0] if est.advice and est.advice[0].fits else None
        needed = None if option else est.needed
        changes = option.changes if option else (needed.changes if needed else {})
        chosen = start.replanned(**changes)
        if changes:
            est = estimate(chosen, gpu_gib, advise=option is not None)
    asked, values = config.to_dict(), chosen.config.to_dict()
    known = stats is not None and stats.lengths
    return Proposal(
        values=values,
        reasons=_reasons(chosen, est, stats, unread, option, needed, pinned),
        estimate=est,
        fits=est.fits,
        changes={k: v for k, v in values.items() if asked.get(k) != v},
        verdict=getattr(est, "verdict", ""),
        needed=needed,
        rows_kept_whole=stats.share_within(chosen.config.max_seq_length) if known else None,
        data=stats.to_dict() if stats is not None else None,
    )


def data_lengths(config: TrainConfig) -> tuple[Any, str]:
    """(the data's token lengths, "") or (None, why they are unknown): a proposal reads the data it proposes for."""
    from finetune.data.stats import data_stats

    try:
        return data_stats(config), ""
    except UserError as exc:
        return None, str(exc)
    except Exception as exc:  # noqa: BLE001 - a proposal without the data's lengths still helps
        text = str(exc).strip().splitlines()
        return None, (text[0] if text else type(exc).__name__)[:200]


def baseline(plan: RunPlan, stats: Any, pinned: tuple[str, ...] = ()) -> RunPlan:
    """Where a proposal starts: the fastest memory settings at the same effective batch (packing on where the plan
    can pack), and the sequence length that keeps every row whole (the length as set when the data's lengths are
    unknown). `pinned` fields stay."""
    config = plan.config
    eff = config.effective_batch_size
    micro = max(d for d in range(1, min(eff, MAX_MICRO_BATCH) + 1) if eff % d == 0)
    changes: dict[str, Any] = {
        "gradient_checkpointing": False,
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": eff // micro,
    }
    if config.optim in ("adamw_8bit", "paged_adamw_8bit"):
        changes["optim"] = "adamw_torch"
    if config.method == "qlora":
        changes["method"] = "lora"
    if config.backend == "trainer":
        changes.update(zero_stage=0, offload_optimizer="none", offload_param="none")
    whole = whole_length(config, stats)
    if whole:
        changes["max_seq_length"] = whole
    start = plan.replanned(**{k: v for k, v in changes.items() if k not in pinned})
    if "packing" not in pinned and not start.config.packing:
        packed = start.replanned(packing=True)
        if packed.packing:  # no compute and no memory spent on padding, the same loss
            return packed
    return start


def _reasons(
    chosen: RunPlan,
    est: Any,
    stats: Any,
    unread: str,
    option: Advice | None,
    needed: Needed | None,
    pinned: tuple[str, ...],
) -> list[str]:
    """Two to four sentences on why: the method, the memory (savers, headroom, or the hardware needed), the data."""
    out = [_method_sentence(chosen, est)]
    memory = _memory_sentence(chosen.config, est, option, needed)
    if memory:
        out.append(memory)
    out.append(_data_sentence(chosen.config, stats, unread, pinned))
    return out


def _memory_sentence(chosen: TrainConfig, est: Any, option: Advice | None, needed: Needed | None) -> str:
    """The memory in one sentence: what was turned on and what it leaves, or what hardware it needs."""
    if needed is not None:
        return needed.line
    if est.gpu_gib is None:
        return ""
    batch = f"batch {chosen.per_device_train_batch_size} × {chosen.gradient_accumulation_steps} accumulation"
    left = f"{size_text(est.headroom_bytes)} of headroom on {est.gpu_gib:g} GiB"
    if est.fits and option is None:
        return f"{batch[0].upper()}{batch[1:]} fits as set, leaving {left}: nothing slower is needed."
    if est.fits and option is not None:
        how = option.title[0].lower() + option.title[1:]
        return (
            f"The fastest settings need more than the card holds with headroom; {how} keeps the effective batch of "
            f"{chosen.effective_batch_size} ({_speed_words(option.slowdown)}) and leaves {left}."
        )
    state = "is tight" if getattr(est, "verdict", "") == "tight" else "does not fit"
    return f"It {state} on {est.gpu_gib:g} GiB (needs about {size_text(est.total_bytes)}): it will run out of memory."


def _speed_words(slowdown: float) -> str:
    return "about the same speed" if abs(slowdown) < 0.03 else f"about {slowdown:+.0%} time"


def _data_sentence(chosen: TrainConfig, stats: Any, unread: str, pinned: tuple[str, ...]) -> str:
    """The sequence length and what it does to the data, measured on the data's own token lengths."""
    seq = chosen.max_seq_length
    if stats is None or not stats.lengths:
        why = f" ({unread.rstrip('.')})" if unread else ""
        return f"The data's token lengths are unknown{why}: {seq} tokens per row as set; longer rows are cut."
    cut = cut_words(stats, seq)
    if not cut:
        return f"Every row is at most {stats.max} tokens, so {seq} tokens per row keeps them whole."
    if "max_seq_length" in pinned:
        return f"{seq} tokens per row, as you set it: {cut}."
    whole = whole_length(chosen, stats)
    if whole is not None and whole < stats.max:
        return f"The model takes at most {whole} tokens per row: {cut}."
    return f"{seq} tokens per row: {cut}; keeping every row whole ({whole} tokens) does not fit with headroom."


def _method_sentence(plan: RunPlan, est: Any) -> str:
    """Why the method: the base model's size in memory, as trained."""
    config = plan.config
    weights = est.sizes.get("weights", 0) + est.sizes.get("quant_constants", 0)
    params = billions(plan)
    if config.method == "qlora":
        full16 = 2 * params * 1e9 if params else 0
        than = f" instead of {full16 / 1e9:.0f} GB" if full16 else ""
        size = _size_name(params)
        return f"QLoRA keeps the {size} base in 4 bits: {weights / 1e9:.1f} GB{than}, and trains small adapters."
    if config.method == "lora":
        return f"LoRA trains small adapters on the frozen {_size_name(params)} base ({size_text(weights)} of weights)."
    return f"Full fine-tuning updates every weight of the {_size_name(params)} model: the most memory, the most change."


def _size_name(count: float) -> str:
    """8.0 -> '8B'; 0.135 -> '135M'."""
    if not count:
        return "base"
    return f"{count:.0f}B" if count >= 1.5 else f"{count * 1000:.0f}M" if count < 1 else f"{count:.1f}B"


# ----------------------------------------------------------------------------- after an out-of-memory error


def advice_text(plan: RunPlan) -> str:
    """A short paragraph for an out-of-memory failure of a run of `plan`: how much it needs and what to change
    first."""
    capacity = _device_memory(plan.device)
    try:
        est = core.estimate_core(plan)
    except Exception as exc:  # noqa: BLE001 - never hide the OOM behind an estimator problem
        return f"Out of memory. (The memory estimate could not be computed: {exc}.) Try gradient_checkpointing: true."
    where = f"this {'GPU' if plan.device == 'cuda' else 'machine'}"
    need = f"This run needs about {size_text(est.total_bytes)} at the {est.peak_phase}"
    if capacity:
        need += f"; {where} has {size_text(capacity)}"
    target = capacity if capacity and est.total_bytes > capacity else int(0.75 * est.total_bytes)
    found = search(plan, target, est, stats_for(plan.config))
    advice = [a for a in found.options if a.fits] or found.options
    if not advice:
        extra = f" {found.needed.line}" if found.needed else ""
        return f"Out of memory. {need}. Reduce max_seq_length or per_device_train_batch_size.{extra}"
    first = advice[0]
    lines = [
        f"Out of memory. {need}.",
        f"Change first: {first.title.lower()} ({_changes(first.changes)}), about "
        f"{size_text(first.new_total_bytes)}; cost: {first.cost}.",
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


def _device_memory(device: str) -> int | None:
    """Bytes of the device a failed run used: its GPU's memory, or this machine's RAM for a CPU run."""
    import os

    import torch

    if device == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None
