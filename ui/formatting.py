"""Small pure helpers the tabs share: sizes, durations, HTML snippets and tables built from backend data.

Nothing here talks to the backend or to gradio; every function takes plain data and returns plain data, so the
tabs stay short and these are easy to test.
"""

from __future__ import annotations

import html
import time
from typing import Any

from finetune import objectives
from finetune.studio import (
    CheckpointEvent,
    CompletionsEvent,
    EvalEvent,
    Event,
    LogEvent,
    MessageEvent,
    RunSummary,
    SamplesEvent,
    SavedEvent,
    StatusEvent,
)

GIB = 1024**3
MIB = 1024**2


def size(n: float | None) -> str:
    """Bytes as a short human figure: '1.23 GiB', '512 MiB'."""
    if n is None:
        return "–"
    n = float(n)
    if abs(n) >= GIB:
        return f"{n / GIB:.2f} GiB"
    if abs(n) >= MIB:
        return f"{n / MIB:.0f} MiB"
    if abs(n) >= 1024:
        return f"{n / 1024:.0f} KiB"
    return f"{n:.0f} bytes"


def duration(seconds: float | None) -> str:
    """Seconds as '45 s', '3 min 05 s', '2 h 10 min'."""
    if seconds is None:
        return "–"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def clock(timestamp: float | None) -> str:
    """A timestamp as 'YYYY-MM-DD HH:MM' (local time)."""
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp)) if timestamp else "–"


def number(value: float | None, digits: int = 4) -> str:
    return "–" if value is None else f"{value:.{digits}g}"


def esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def plain(text: Any) -> str:
    """User or backend text for Markdown / toasts: HTML special characters neutralised, quotes kept readable."""
    return html.escape(str(text), quote=False)


def one_line(exc: BaseException) -> str:
    """An unexpected exception as one line for the page (its type and first line; never a traceback)."""
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


# ----------------------------------------------------------------------------------------------- training progress
STATUS_WORDS = {
    "idle": ("No run yet", "#6b7280"),
    "pending": ("Starting", "#6b7280"),
    "loading": ("Loading the model and data", "#2563eb"),
    "running": ("Training", "#2563eb"),
    "stopping": ("Stopping: saving a checkpoint", "#d97706"),
    "stopped": ("Stopped", "#d97706"),
    "completed": ("Finished", "#16a34a"),
    "failed": ("Failed", "#dc2626"),
    "interrupted": ("Interrupted (its processes ended before it finished)", "#d97706"),
}


def progress_html(state: dict[str, Any] | None) -> str:
    """The progress bar with step, epoch, tokens/s, ETA and memory, as one block of HTML."""
    if not state:
        return (
            '<div class="fs-progress"><b>No run yet.</b> Press <b>Start training</b> to train with the settings '
            "from Configure (the defaults give a short demo).</div>"
        )
    status = state.get("status") or "idle"
    word, colour = STATUS_WORDS.get(status, (status, "#6b7280"))
    step, max_steps = int(state.get("step") or 0), int(state.get("max_steps") or 0)
    fraction = min(1.0, step / max_steps) if max_steps > 0 else 0.0
    loading = status in ("loading", "pending")
    bar_style = "fs-bar-fill fs-bar-loading" if loading else "fs-bar-fill"
    width = 100 if loading else round(fraction * 100, 1)
    facts = [
        f"step <b>{step}</b> / {max_steps if max_steps > 0 else '?'}",
        f"epoch {float(state.get('epoch') or 0):.2f}",
        f"loss {number(state.get('loss'))}",
    ]
    if state.get("eval_loss") is not None:
        facts.append(f"eval loss {number(state.get('eval_loss'))}")
    if state.get("tokens_per_second"):
        facts.append(f"{state['tokens_per_second']:.0f} tokens/s")
    if status in ("running", "loading") and state.get("eta_seconds") is not None:
        facts.append(f"ETA {duration(state['eta_seconds'])}")
    if state.get("memory_bytes"):
        facts.append(f"memory {size(state['memory_bytes'])}")
    who = ""
    if state.get("owner") or state.get("started_at"):
        who = f" · started by {esc(state.get('owner') or '?')} at {clock(state.get('started_at'))}"
    return (
        f'<div class="fs-progress" data-status="{esc(status)}" data-step="{step}">'
        f'<div class="fs-progress-head"><span class="fs-status" style="color:{colour}">{esc(word)}</span>'
        f'<span class="fs-run">run <code>{esc(state.get("run_id", ""))}</code>{who}</span></div>'
        f'<div class="fs-bar"><div class="{bar_style}" style="width:{width}%;background:{colour}"></div></div>'
        f'<div class="fs-facts">{" · ".join(facts)}</div>'
        + (f'<div class="fs-message">{esc(state["message"])}</div>' if state.get("message") else "")
        + "</div>"
    )


def problem_markdown(state: dict[str, Any] | None) -> str:
    """Plain words for a failed, stopped or interrupted run (with the estimator's advice after an OOM)."""
    if not state:
        return ""
    status = state.get("status")
    if status == "failed":
        text = f"**The run failed.** {state.get('error') or 'No reason was recorded.'}"
        if state.get("advice"):
            text += f"\n\n**What to try:** {state['advice']}"
        return text
    if status in ("stopped", "interrupted"):
        how = "Select it under *Runs* and press **Resume** to continue from its last checkpoint."
        return f"**Run {status} at step {state.get('step', 0)}.** {how}"
    return ""


def metric_facts(events: list[Event], objective: objectives.Objective) -> str:
    """The latest values the run's objective (its record) logs beside the loss ("reward margin 0.52 · chosen
    preferred 75% · ..."), or "" for a run whose objective logs none (SFT, classification)."""
    latest = next((e for e in reversed(events) if isinstance(e, LogEvent) and _facts(e, objective)), None)
    if latest is None:
        return ""
    facts = [f"{words} <b>{esc(shown)}</b>" for words, shown in _facts(latest, objective)]
    return f'<div class="fs-prefs" data-step="{latest.step}">step {latest.step}: ' + " · ".join(facts) + "</div>"


def _facts(event: LogEvent, objective: objectives.Objective) -> list[tuple[str, str]]:
    """(words, value) for each of the objective's metrics a logged step carries, in the record's order."""
    return [
        (words, f"{100 * value:.0f}%" if key in objective.percent else number(value, 3))
        for key, words, value in objective.facts_of(event.metrics)
    ]


def metric_rows(events: list[Event], objective: objectives.Objective) -> list[dict[str, Any]]:
    """Points for the objective's plot: {step, value, series} for each metric its record plots, of each logged
    step."""
    return [
        {"step": e.step, "value": value, "series": objective.fact_words(key)}
        for e in events
        if isinstance(e, LogEvent)
        for key, value in e.metrics.items()
        if objective.is_plotted(key)
    ]


COMPLETION_HEADERS = ["Prompt", "Sampled answer", "Rewards"]


def completion_rows(events: list[Event]) -> tuple[int | None, list[list[str]]]:
    """(step, rows) of the newest "completions" event (a run learning from rewards): each sampled answer with its
    prompt and what each reward gave it; (None, []) for runs without."""
    latest = next((e for e in reversed(events) if isinstance(e, CompletionsEvent)), None)
    if latest is None:
        return None, []
    rows = []
    for item in latest.completions:
        shown = " · ".join(f"{name} {number(value, 3)}" for name, value in item.rewards.items())
        rows.append([item.prompt, item.completion or "(empty answer)", shown])
    return latest.step, rows


def loss_rows(events: list[Event], max_points: int = 600) -> list[dict[str, Any]]:
    """Points for the loss plot: {step, loss, series} for train ("log") and eval events. A long run's train curve
    is thinned to about `max_points` (every k-th point and the last), which keeps each refresh small."""
    train, evals = [], []
    for e in events:
        if isinstance(e, LogEvent):
            train.append({"step": e.step, "loss": e.loss, "series": "train"})
        elif isinstance(e, EvalEvent):
            evals.append({"step": e.step, "loss": e.eval_loss, "series": "eval"})
    if len(train) > max_points:
        every = -(-len(train) // max_points)
        train = train[::every] + ([train[-1]] if (len(train) - 1) % every else [])
    return train + evals


SCORE_NAMES = {"exact_match": "exact match", "rouge_l": "ROUGE-L", "number_match": "number match"}


def score_rows(scores: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Points for the held-out answers' scores by step ({step, value, series}), from `Studio.held_out_scores`."""
    return [
        {"step": int(entry["step"]), "value": float(value), "series": SCORE_NAMES.get(name, name)}
        for entry in scores
        for name, value in entry.items()
        if name != "step"
    ]


def evaluation_markdown(view: Any) -> str:
    """A run's latest evaluation in one line for the Train tab (with its warnings), or "" when it has none."""
    if view is None:
        return ""
    flags = "".join(f" ⚠ {plain(flag)}." for flag in view.flags)
    return f"**Latest evaluation** (`eval/{plain(view.file)}`): {plain(view.summary)}.{flags} Details in *Evaluate*."


def log_lines(events: list[Event], objective: objectives.Objective, limit: int = 14, recent_steps: int = 4) -> str:
    """The tail of the run's log as plain text, newest last, a logged step with the first few metrics of the run's
    objective. Only the latest few per-step loss lines are kept (the plot has them all), so messages, evaluations and
    checkpoints stay in view."""
    logs = [i for i, e in enumerate(events) if isinstance(e, LogEvent)]
    recent = set(logs[-recent_steps:])
    lines = []
    for i, e in enumerate(events):
        when = time.strftime("%H:%M:%S", time.localtime(e.time))
        if isinstance(e, MessageEvent):
            lines.append(f"{when}  {e.text}")
        elif isinstance(e, StatusEvent):
            extra = f": {e.error}" if e.error else ""
            lines.append(f"{when}  status → {e.status} (step {e.step}){extra}")
        elif isinstance(e, LogEvent) and i in recent:
            lr = f" · lr {e.learning_rate:.2e}" if e.learning_rate is not None else ""
            extra = "".join(f" · {words} {shown}" for words, shown in _facts(e, objective)[:3])
            lines.append(f"{when}  step {e.step} · loss {number(e.loss)}{lr}{extra}")
        elif isinstance(e, EvalEvent):
            lines.append(f"{when}  step {e.step} · eval loss {number(e.eval_loss)}")
        elif isinstance(e, CheckpointEvent):
            lines.append(f"{when}  saved {e.path or 'a checkpoint'}")
        elif isinstance(e, SamplesEvent):
            lines.append(f"{when}  answered {len(e.samples)} held-out prompts at step {e.step}")
        elif isinstance(e, SavedEvent):
            lines.append(f"{when}  saved the final weights")
    return "\n".join(lines[-limit:])


def sample_rows(events: list[Event], active: bool = True) -> tuple[list[str], list[list[str]]]:
    """(headers, rows): each held-out prompt with its answer at step 0 and at the latest evaluation."""
    samples = [e for e in events if isinstance(e, SamplesEvent)]
    if not samples:
        return ["Held-out prompt", "Answer before training", "Answer now"], []
    first, last = samples[0], samples[-1]
    if last is not first:
        now, waiting = f"Answer at step {last.step}", ""
    elif active:
        now, waiting = "Answer now", "… (answered again at the next evaluation)"
    else:
        now, waiting = "Answer now", "(no evaluation ran: answers are refreshed at each evaluation, every eval_steps)"
    headers = ["Held-out prompt", f"Answer before training (step {first.step})", now]
    latest = {(s.prompt, s.images): s.answer for s in last.samples}  # one question may ask about several pictures
    rows = []
    for s in first.samples:
        after = latest.get((s.prompt, s.images), "") if last is not first else waiting
        rows.append([s.shown_prompt, s.answer or "(empty answer)", after or "(empty answer)"])
    return headers, rows


RUN_HEADERS = ["Run", "Status", "Step", "Loss", "Eval loss", "Evaluation", "Resumable", "Folder"]
# A method in a few words, wherever the app names one (a run's title, what Start will train): QLoRA says what it is.
METHOD_WORDS = {"full": "full fine-tuning", "lora": "LoRA", "qlora": "QLoRA (4-bit base + LoRA)"}


def run_title(run: RunSummary) -> str:
    """A run as a person names it: model · method (· objective) · when it started."""
    parts = [run.model or run.run_id, METHOD_WORDS.get(run.method, run.method)]
    record = objectives.OBJECTIVES.get(run.objective)
    if record is not None and record.short:
        parts.append(record.short)
    if run.started_at:
        parts.append(time.strftime("%d %b %H:%M", time.localtime(run.started_at)))
    return " · ".join(p for p in parts if p)


def run_rows(runs: list[RunSummary]) -> list[list[Any]]:
    """The runs table: one row per run, newest first (the run training now at its live step)."""
    return [
        [
            run_title(r),
            STATUS_WORDS.get(r.status, (r.status, ""))[0],
            f"{r.step} / {r.max_steps or '?'}",
            number(r.loss),
            number(r.eval_loss),
            r.evaluation,
            "yes" if r.resumable else "",
            r.run_id,
        ]
        for r in runs
    ]


# ----------------------------------------------------------------------------------------------- data preview
def preview_html(preview: dict[str, Any], thumbnails: dict[str, str] | None = None) -> str:
    """The first examples as the model sees them: trained text highlighted, masked text greyed, token counts.
    Preference rows (examples with `sides`) show the prompt, then the chosen and the rejected answer (or kto's one
    answer and its label), each as the model reads it. Image rows show their images beside the text (`thumbnails`:
    an image URL by file path), each image's placeholder masked as the prompt is."""
    examples = preview.get("examples") or []
    thumbnails = thumbnails or {}
    head = (
        f"<p><b>Format:</b> {esc(preview.get('format', '?'))} · <b>{preview.get('rows', 0)}</b> training rows · "
        f"<b>{preview.get('eval_rows', 0)}</b> evaluation rows</p>"
    )
    if any(ex.get("columns") is not None for ex in examples):  # prompts alone: learning from rewards
        head += (
            '<p class="fs-legend"><span class="fs-masked">grey text</span> is the prompt as the model reads it; the '
            "model samples answers to it, which the rewards score (they also read the row's other columns, listed "
            "under it).</p>"
        )
        rows = "".join(_preference_example_html(i, ex) for i, ex in enumerate(examples, start=1))
        return f'<div class="fs-preview">{head}{rows}</div>'
    if any(ex.get("sides") for ex in examples):
        head += (
            '<p class="fs-legend"><span class="fs-masked">grey text</span> is the prompt and chat markup; the model '
            'learns to make the <span class="fs-trained">chosen</span> answer more likely than the rejected one (kto: '
            "answers marked good more likely, bad ones less).</p>"
        )
        rows = "".join(_preference_example_html(i, ex) for i, ex in enumerate(examples, start=1))
        return f'<div class="fs-preview">{head}{rows}</div>'
    head += (
        '<p class="fs-legend"><span class="fs-trained">highlighted text</span> is what the model learns to write '
        '(counted in the loss); <span class="fs-masked">grey text</span> is the prompt and chat markup, '
        "masked from the loss.</p>"
    )
    if any(ex.get("images") for ex in examples):
        head += (
            '<p class="fs-legend">Each <span class="fs-masked">&lt;image&gt;</span> stands for the next picture of '
            "the row, shown beside it: the model sees it as image tokens, never trained.</p>"
        )
    parts = []
    for i, ex in enumerate(examples, start=1):
        spans = "".join(
            f'<span class="{"fs-trained" if trained else "fs-masked"}">{esc(text)}</span>'
            for text, trained in ex.get("segments") or []
        )
        counts = f"{ex.get('tokens', '?')} tokens"
        if ex.get("trained_tokens") is not None:
            counts += f", {ex['trained_tokens']} trained"
        if ex.get("label") is not None:
            counts += f", label {esc(ex['label'])}"
        text = f'<pre class="fs-example-text">{spans}</pre>'
        images = ex.get("images") or []
        if images:
            counts += f", {len(images)} image{'s' if len(images) != 1 else ''}"
            text = f'<div class="fs-example-row">{_thumbs_html(images, thumbnails)}{text}</div>'
        parts.append(f'<div class="fs-example"><div class="fs-example-head">Example {i} · {counts}</div>{text}</div>')
    return f'<div class="fs-preview">{head}{"".join(parts)}</div>'


def _thumbs_html(images: list[str], thumbnails: dict[str, str]) -> str:
    """A row's pictures in order, each titled by its file name (its name alone where no thumbnail could be made)."""
    shown = []
    for number, path in enumerate(images, start=1):
        name = esc(str(path).replace("\\", "/").rsplit("/", 1)[-1])
        uri = thumbnails.get(str(path))
        picture = f'<img src="{esc(uri)}" alt="{name}">' if uri else '<span class="fs-thumb-missing">?</span>'
        caption = f"<figcaption>{number}. {name}</figcaption>"
        shown.append(f'<figure class="fs-thumb" title="{name}">{picture}{caption}</figure>')
    return f'<div class="fs-thumbs">{"".join(shown)}</div>'


# How each side of a preference row is titled and styled in the preview.
_SIDE_TITLES = {"prompt": "Prompt", "chosen": "Chosen (preferred)", "rejected": "Rejected", "completion": "Answer"}


def _preference_example_html(number: int, example: dict[str, Any]) -> str:
    """One preference row: each side titled, with its token count, the prompt greyed."""
    label = example.get("label")
    head = f"Example {number} · {example.get('tokens', '?')} tokens"
    if label is not None:
        head += " · marked good" if label is True else " · marked bad" if label is False else f" · label {esc(label)}"
    sides = []
    for side in example.get("sides") or []:
        name = str(side.get("name", ""))
        style = "fs-masked" if name == "prompt" else f"fs-trained fs-{esc(name)}"
        title = f"{_SIDE_TITLES.get(name, esc(name))} · {side.get('tokens', '?')} tokens"
        sides.append(
            f'<div class="fs-side-head">{title}</div>'
            f'<pre class="fs-example-text"><span class="{style}">{esc(side.get("text", ""))}</span></pre>'
        )
    columns = example.get("columns") or {}
    if columns:
        shown = " · ".join(f"{esc(name)}: {esc(value)}" for name, value in columns.items())
        sides.append(f'<div class="fs-side-head">{shown}</div>')
    return f'<div class="fs-example"><div class="fs-example-head">{head}</div>{"".join(sides)}</div>'


# ----------------------------------------------------------------------------------------------- memory estimate
def pretty_name(name: str) -> str:
    return str(name).replace("_", " ")


def breakdown_rows(estimate: Any) -> list[tuple[str, float, float]]:
    """(component, bytes, share of the total) rows: live tensors at the peak (largest first), then device overheads.
    Components with nothing live at the peak are left out."""
    components = {n: v for n, v in dict(estimate.components or {}).items() if v}
    overheads = {n: v for n, v in dict(estimate.overheads or {}).items() if v}
    total = float(estimate.total_bytes or 0) or float(sum(components.values()) + sum(overheads.values())) or 1
    rows = [
        (pretty_name(n), float(v), float(v) / total)
        for n, v in sorted(components.items(), key=lambda kv: -float(kv[1]))
    ]
    rows += [(f"{pretty_name(n)} (overhead)", float(v), float(v) / total) for n, v in overheads.items()]
    return rows


def breakdown_table(rows: list[tuple[str, float, float]]) -> list[list[str]]:
    return [[name, size(value), f"{100 * share:.0f}%"] for name, value, share in rows]


def changes_text(changes: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_yaml_word(v)}" for k, v in (changes or {}).items())


def _yaml_word(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def advice_rows(estimate: Any) -> list[list[Any]]:
    """[rank, suggestion, settings, new total, fits?, cost] for each ranked suggestion."""
    return [
        [
            i,
            a.title,
            changes_text(a.changes or {}),
            size(a.new_total_bytes),
            "tight" if getattr(a, "tight", False) else {True: "yes", False: "no"}.get(a.fits, ""),
            a.cost,
        ]
        for i, a in enumerate(estimate.advice or [], start=1)
    ]


def verdict_markdown(estimate: Any, card: str, capacity_gib: float | None, gpus: int) -> str:
    """A clear fit / tight / does-not-fit sentence with the headroom (and, when nothing fits, the hardware that
    would hold the run)."""
    total = estimate.total_bytes
    fits, headroom = estimate.fits, estimate.headroom_bytes
    where = f"{card}" + (f" · {capacity_gib:g} GiB" if capacity_gib else "") + (f" × {gpus} GPUs" if gpus > 1 else "")
    whole = " of the whole GPU (as nvidia-smi shows it)" if estimate.device == "cuda" else ""
    per = (" per GPU" if gpus > 1 else "") + whole
    margin = getattr(estimate, "margin_bytes", None)
    keeps = f" (a fit keeps at least {size(margin)} free)" if margin else ""
    needed = getattr(estimate, "needed", None)
    options = (
        " The suggestions below keep your effective batch size; pick one and press **Apply**."
        if estimate.advice
        else ""
    )
    if needed is not None:
        options += f"\n\n⚠ {needed.line}"
    if fits is True:
        spare = f", {size(headroom)} to spare{keeps}" if headroom is not None else ""
        return f"### ✓ Fits on {where}\nNeeds about **{size(total)}**{per}{spare}."
    if getattr(estimate, "verdict", "") == "tight":
        return (
            f"### ⚠ Tight on {where}\nNeeds about **{size(total)}**{per}: only {size(headroom)} to spare{keeps}, "
            f"less than the estimate's error and the allocator's swings.{options}"
        )
    if fits is False:
        short = f"; {size(-float(headroom))} short" if headroom is not None else ""
        return f"### ✗ Does not fit on {where}\nNeeds about **{size(total)}**{per}{short}.{options}"
    return f"### Estimated peak: about **{size(total)}**{per}"


def details_markdown(estimate: Any) -> str:
    """How the figure was made (replayed step or formulas, where the peak falls), notes, and other estimators."""
    parts = []
    method, phase = estimate.method, estimate.peak_phase
    if method == "traced":
        parts.append("Measured by replaying one training step on fake tensors (no weights are downloaded).")
    elif method == "analytic":
        parts.append("Estimated with formulas.")
    if phase:
        parts.append(f"The peak is at the {phase}.")
    compared = estimate.compared_with or {}
    if compared.get("tensor_bytes") and compared.get("total_bytes"):
        parts.append(
            f"Tensors at peak ({size(estimate.tensor_bytes)}): compare with {compared['tensor_bytes']}. "
            f"Total: compare with {compared['total_bytes']}."
        )
    if estimate.overhead_source:
        parts.append(f"Overheads (CUDA context, kernels, allocator reserve): {estimate.overhead_source}.")
    parts += [f"{note[0].upper()}{note[1:]}." for note in estimate.notes or [] if note]
    items = list((estimate.comparisons or {}).items())
    if items:
        others = " · ".join(
            f"{pretty_name(name)}: {size(value) if isinstance(value, (int, float)) else plain(value)}"
            for name, value in items
        )
        parts.append(f"Other ways of estimating, for comparison (they miss activations or guess): {others}.")
    return " ".join(parts)
