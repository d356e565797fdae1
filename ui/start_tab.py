"""Start tab, the first screen: pick a model, the data, the goal and the hardware; the app proposes a complete
configuration that fits, says why in a few plain sentences, and Start is right there.

It edits the same settings as the expert tabs: every choice and the proposal are written into the Configure form's
fields (`ConfigTab.fields`), and the summary here is read back from that form, so an expert edit shows here too.
Answers that take time (the data's preview and statistics, the proposal) show that they are pending, and an answer
for choices the user has changed since is dropped: each request carries a ticket, and only the newest ticket of a
page (gradio session) is shown.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr

from finetune import objectives
from finetune.config import BUNDLED_DATASET, EMBEDDED_MODEL, FIELD_NAMES, field_label
from finetune.errors import BusyError, UserError
from finetune.studio import BASE, Studio
from ui.config_tab import DATA_UPLOAD_TYPES, ConfigTab, number_box, parse_number
from ui.formatting import one_line, plain, preview_html, size
from ui.visitor import per_visitor

GOALS = {goal: record.goal_label for goal, record in objectives.GOALS.items()}  # goal -> its words
# The bundled data sets that suit a goal: a bundled choice follows the goal (pirate answers <-> pirate pairs).
GOAL_DATA = {record.bundled_data for record in objectives.OBJECTIVES.values() if record.bundled_data}
DETECTED, CARD, CPU = "gpu", "card", "cpu"
CUSTOM = "custom"  # the card choice for a size in GiB of one's own
PREFERRED_CARDS = ("A10G", "L4", "24 GB")  # a common first guess when no GPU is detected
SUMMARY_FIELDS = (  # what the summary shows; a change to one of these since the proposal is pointed out
    "model",
    "dataset",
    "task",
    "objective",
    "method",
    "lora_r",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_seq_length",
    "max_steps",
    "num_train_epochs",
    "gradient_checkpointing",
    "optim",
    "precision",
)
PENDING_PROPOSAL = "⏳ Working out a configuration that fits…"
PENDING_DATA = "⏳ Reading the data…"
CONVERTING = "⏳ Converting the embedded model to a form that loads fast (once, about a minute), then "
DATA_HINT = (
    "<div class='fs-note'><p>Pick the data (or press <b>Propose a configuration</b>) to see its first rows as the "
    "model sees them and how long its rows are in tokens.</p></div>"
)
NO_PROPOSAL = "Pick the four things above (or keep the defaults) and press **Propose a configuration**."
SESSIONS_KEPT = 2000  # newest tickets remembered (one per open page and kind); older pages just lose stale-dropping


class Tickets:
    """The newest request number per (page, kind): an answer whose number is no longer the newest is stale."""

    def __init__(self) -> None:
        self._latest: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._lock = threading.Lock()

    def issue(self, session: str, kind: str) -> int:
        """A new number for this page's `kind` of request; it makes every earlier one stale."""
        with self._lock:
            key = (session, kind)
            number = self._latest.pop(key, 0) + 1
            self._latest[key] = number
            while len(self._latest) > SESSIONS_KEPT:
                self._latest.popitem(last=False)
            return number

    def latest(self, session: str, kind: str) -> int:
        with self._lock:
            return self._latest.get((session, kind), 0)

    def current(self, session: str, kind: str, number: int | None) -> bool:
        """Whether `number` is still the newest request of its kind on this page."""
        with self._lock:
            return self._latest.get((session, kind), 0) == number


def session_of(request: gr.Request | None) -> str:
    """The page the request came from (tests calling handlers directly have none)."""
    return str(getattr(request, "session_hash", None) or "")


def goal_of(form: dict[str, Any]) -> str:
    """The first screen's goal for these settings (the objectives registry's record says which it belongs to)."""
    return objectives.of_values(form).goal


def model_label(name: str, reads_images: bool = False) -> str:
    """How the model list names a model: the embedded one says so, a vision-language model says it reads images."""
    if name == EMBEDDED_MODEL:
        return "SmolLM2-135M-Instruct, embedded (works offline)"
    return f"{name} (images + text)" if reads_images else name


def data_label(name: str) -> str:
    if name.startswith("bundled:"):
        return f"{name.split(':', 1)[1]} (bundled with the app)"
    return name


def hardware_choices(gpu: tuple[str, float] | None) -> list[tuple[str, str]]:
    """The hardware options: this machine's GPU first when it has one."""
    detected = [(f"This machine's GPU: {gpu[0]} · {gpu[1]:g} GiB", DETECTED)] if gpu else []
    return [*detected, ("A GPU card (plan for one)", CARD), ("This computer's CPU (a short demo)", CPU)]


def card_choices(cards: dict[str, float]) -> list[tuple[str, str]]:
    """The common cards, smallest first, then a size of one's own."""
    return [(f"{name} · {gib:g} GiB", name) for name, gib in cards.items()] + [("Custom size (GiB)", CUSTOM)]


def first_card(cards: dict[str, float]) -> str | None:
    """A common 24 GB card if listed, else the first one."""
    for hint in PREFERRED_CARDS:
        for name in cards:
            if hint in name:
                return name
    return next(iter(cards), None)


def method_text(form: dict[str, Any]) -> str:
    method = form.get("method")
    if method == "full":
        return "full fine-tuning (every weight)"
    base = "QLoRA: LoRA adapters on a 4-bit base" if method == "qlora" else "LoRA adapters, base frozen"
    return f"{base} (rank {form.get('lora_r')})"


def length_text(form: dict[str, Any]) -> str:
    steps = parse_number(form.get("max_steps"))
    if isinstance(steps, (int, float)) and steps > 0:
        return f"{int(steps)} steps"
    return f"{form.get('num_train_epochs')} epoch(s) over the data"


def batch_text(form: dict[str, Any]) -> str:
    micro, accumulation = form.get("per_device_train_batch_size"), form.get("gradient_accumulation_steps")
    try:
        effective = f" = {int(micro) * int(accumulation)} examples per step"
    except (TypeError, ValueError):
        effective = ""
    tokens = form.get("max_seq_length")
    return f"{micro} per device × {accumulation} accumulation{effective}, up to {tokens} tokens each"


def run_summary(form: dict[str, Any], proposed: dict[str, Any] | None) -> str:
    """What Start will run, read from the shared form, and whether it still is the proposal whose fit was checked."""
    savers = "gradient checkpointing " + ("on" if form.get("gradient_checkpointing") else "off")
    lines = [
        "### What Start will run",
        f"- **Model:** `{plain(form.get('model'))}`",
        f"- **Data:** `{plain(form.get('dataset'))}`",
        f"- **Goal:** {GOALS[goal_of(form)]}",
        f"- **Method:** {method_text(form)}",
        f"- **Batch:** {batch_text(form)}",
        f"- **Length:** {length_text(form)}",
        f"- **Memory:** {savers}, optimizer `{plain(form.get('optim'))}`, precision `{plain(form.get('precision'))}`",
    ]
    if proposed and proposed.get("values"):
        changed = changed_since(form, proposed)
        if changed:
            names = ", ".join(field_label(n) for n in changed)
            lines.append(
                f"\nChanged since the proposal: **{names}**. The fit below was for the proposal; press **Propose a "
                "configuration** again or see the **Memory** tab."
            )
        if proposed.get("fit"):
            lines.append(f"\n{proposed['fit']}")
    return "\n".join(lines)


def changed_since(form: dict[str, Any], proposed: dict[str, Any]) -> list[str]:
    """The summary's fields whose value in the form differs from the proposal's."""
    values = proposed.get("values") or {}
    return [n for n in SUMMARY_FIELDS if n in values and str(values[n]) != str(form.get(n))]


def out_of_memory(form: dict[str, Any], proposed: dict[str, Any] | None) -> bool:
    """The proposal found that these very settings will run out of memory on the chosen hardware."""
    return bool(proposed) and proposed.get("fits") is False and not changed_since(form, proposed)


def fit_text(estimate: Any, verdict: str, where: str) -> str:
    """One line on the proposal's memory: how much, of what, whether it fits and with how much headroom."""
    total = getattr(estimate, "total_bytes", None)
    if not total:
        return ""
    need, gib = size(total), getattr(estimate, "gpu_gib", None)
    if not gib:
        return f"**Memory:** needs about {need} on {where}."
    left, margin = size(abs(estimate.headroom_bytes)), size(estimate.margin_bytes or 0)
    if verdict == "fits":
        return f"**Memory:** needs about {need} of {gib:g} GiB on {where}: fits, leaving {left} (a fit keeps {margin})."
    if verdict == "tight":
        return (
            f"**Memory:** ⚠ needs about {need} of {gib:g} GiB on {where}: tight, only {left} left (a fit keeps "
            f"{margin}); it may run out of memory."
        )
    return f"**Memory:** ⚠ needs about {need} of {gib:g} GiB on {where}: **it will run out of memory**."


def stats_text(stats: Any, max_len: Any) -> str:
    """The data's token-length statistics in one line."""
    rows = getattr(stats, "rows", None)
    parts = [f"**{rows}** training rows"] if rows is not None else []
    lengths = [(k, getattr(stats, k, None)) for k in ("p50", "p90", "p99", "max")]
    shown = [f"{k} {int(v)}" for k, v in lengths if v is not None]
    if shown:
        parts.append("tokens per row: " + ", ".join(shown))
    share = getattr(stats, "fit_share", None)
    if share is None:
        share = getattr(stats, "share_fits", None)
    if share is not None:
        parts.append(f"{share:.0%} fit in {max_len} tokens")
    return " · ".join(parts)


@dataclass
class StartTab:
    studio: Studio
    config: ConfigTab | None = None
    train: Any = None  # the Train tab (its run view follows a run started here)
    tabs: Any = None  # the gr.Tabs (Start switches to Train)
    model: Any = None
    data: Any = None
    upload: Any = None
    data_info: Any = None
    goal: Any = None
    hardware: Any = None
    card: Any = None
    custom_gib: Any = None
    gpus: Any = None
    seq: Any = None  # the sequence length, shown and editable here (the form's max_seq_length)
    propose_btn: Any = None
    proposal: Any = None
    use_needed_btn: Any = None  # when nothing fits: write the combination for the hardware that holds it
    summary: Any = None
    start_btn: Any = None
    message: Any = None
    proposed: Any = None  # gr.State: the last proposal ({"values", "fit", "fits", "where", "needed"})
    pinned: Any = None  # gr.State: fields a proposal keeps (a length typed here; the settings used for a card)
    proposal_ticket: Any = None  # gr.State: the number of the newest proposal request sent from this page
    data_ticket: Any = None  # gr.State: the same for the data's preview and statistics
    gpu: tuple | None = None  # (name, GiB) of this machine's GPU; () when it has none; None until looked for
    cards: dict[str, float] = field(default_factory=dict)
    tickets: Tickets = field(default_factory=Tickets)

    # ----- reading the page
    @property
    def choices(self) -> list:
        """The first screen's own inputs (besides the shared form)."""
        return [
            self.model,
            self.data,
            self.goal,
            self.hardware,
            self.card,
            self.custom_gib,
            self.gpus,
            self.seq,
            self.proposed,
            self.pinned,
            self.proposal_ticket,
            self.data_ticket,
        ]

    @property
    def inputs(self) -> set:
        """Everything a handler reads: the choices and the Configure form (a set: handlers get {component: value})."""
        return {*self.choices, *self.config.fields.values()}

    def form(self, data: dict) -> dict[str, Any]:
        """The Configure form's values by field name."""
        return {name: data[self.config.fields[name]] for name in FIELD_NAMES if self.config.fields[name] in data}

    def hardware_of(self, data: dict) -> tuple[str, int, float | None, str]:
        """(device, gpus, GiB per GPU, words for it) from the hardware choice; a UserError for a bad size or count."""
        choice = data.get(self.hardware)
        if choice == CPU or (choice == DETECTED and not self.gpu):
            return "cpu", 1, None, "this computer's CPU"
        gpus = parse_number(data.get(self.gpus), whole=True)
        if gpus is None:
            gpus = 1
        if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
            raise UserError(f"number of GPUs: {plain(gpus)} is not a whole number of 1 or more", field="gpus")
        count = f"{gpus} × " if gpus > 1 else ""
        if choice == DETECTED:
            return "cuda", gpus, self.gpu[1], f"{count}this machine's {self.gpu[0]}"
        card = data.get(self.card)
        if card in self.cards:
            return "cuda", gpus, self.cards[card], f"{count}{card}"
        gib = parse_number(data.get(self.custom_gib))
        if isinstance(gib, bool) or not isinstance(gib, (int, float)) or not gib > 0:
            raise UserError(
                f"GPU memory: {plain(gib)} is not a size in GiB; type the card's memory, e.g. 24", "gpu_gib"
            )
        return "cuda", gpus, float(gib), f"{count}a {gib:g} GiB GPU"

    def pending_proposal(self, model: Any) -> str:
        """What a proposal waits for: the embedded model's one conversion first, when it has not happened yet."""
        if model == EMBEDDED_MODEL and not self.studio.embedded_ready():
            return CONVERTING + "working out a configuration that fits…"
        return PENDING_PROPOSAL

    def pending_data(self, model: Any) -> str:
        if model == EMBEDDED_MODEL and not self.studio.embedded_ready():
            return CONVERTING + "reading the data…"
        return PENDING_DATA

    # ----- handlers (tests call them with {component: value} dicts)
    def choose(self, data: dict, request: gr.Request | None = None) -> dict:
        """A choice changed: write it into the shared form and mark the data and the proposal as pending. The
        sequence length is the data's again: the next proposal measures it."""
        form = self.form(data)
        goal = data.get(self.goal) or goal_of({})
        dataset = self._matching_data(goal, data.get(self.data) or form.get("dataset"))
        session = session_of(request)
        chosen = {
            "model": data.get(self.model) or form.get("model"),
            "dataset": dataset,
            **objectives.goal_settings(self._goal_or_record(form, goal), given=self._set_by_user(form)),
        }
        return {
            **{self.config.fields[n]: v for n, v in chosen.items()},
            **self._kept({**form, **chosen}),
            self.data: gr.update(value=dataset, choices=self._data_choices(dataset)),
            self.data_ticket: self.tickets.issue(session, "data"),
            self.proposal_ticket: self.tickets.issue(session, "proposal"),
            self.pinned: [],
            self.data_info: self.pending_data(chosen["model"]),
            self.proposal: self.pending_proposal(chosen["model"]),
            self.message: "",
        }

    @staticmethod
    def _goal_or_record(form: dict[str, Any], goal: str) -> str:
        """What `goal_settings` is asked for: the goal, or the form's own record when it already belongs to that goal
        (orpo or kto chosen in Configure stay: they are preferences too)."""
        return objectives.of_values(form).name if goal_of(form) == goal else goal

    def _set_by_user(self, form: dict[str, Any]) -> list[str]:
        """The fields a goal may fill in that already hold the user's own value (neither the default nor empty): the
        goal keeps them, as `propose --goal` keeps what --set gave."""
        defaults = self.studio.default_values()
        return [n for n in objectives.GOAL_FIELDS if form.get(n) not in (defaults.get(n), "", None)]

    def choose_hardware(self, data: dict, request: gr.Request | None = None) -> dict:
        """The hardware changed: only the proposal depends on it."""
        choice = data.get(self.hardware)
        custom = choice == CARD and data.get(self.card) == CUSTOM
        typed = [n for n in data.get(self.pinned) or [] if n == "max_seq_length"]
        return {
            self.proposal_ticket: self.tickets.issue(session_of(request), "proposal"),
            self.pinned: typed,  # settings used for another card are proposed afresh
            self.card: gr.update(visible=choice == CARD),
            self.custom_gib: gr.update(visible=custom),
            self.gpus: gr.update(visible=choice != CPU),
            self.proposal: self.pending_proposal(data.get(self.model)),
            self.message: "",
        }

    def ask_proposal(self, data: dict, request: gr.Request | None = None) -> dict:
        """Propose pressed (or the card, its size or the count changed): a new ticket, shown as pending; proposed
        afresh but for a length typed here."""
        ticket = self.tickets.issue(session_of(request), "proposal")
        custom = data.get(self.hardware) == CARD and data.get(self.card) == CUSTOM
        return {
            self.proposal_ticket: ticket,
            self.pinned: [n for n in data.get(self.pinned) or [] if n == "max_seq_length"],
            self.proposal: self.pending_proposal(data.get(self.model)),
            self.custom_gib: gr.update(visible=custom),
            self.message: "",
        }

    def pin_seq(self, data: dict, request: gr.Request | None = None) -> dict:
        """The sequence length typed here: it goes into the form, and proposals keep it until the data changes."""
        seq = parse_number(data.get(self.seq), whole=True)  # the config refuses it in one line if it is none
        return {
            self.config.fields["max_seq_length"]: seq,
            **self._kept({**self.form(data), "max_seq_length": seq}),
            self.pinned: sorted({*(data.get(self.pinned) or []), "max_seq_length"}),
            self.proposal_ticket: self.tickets.issue(session_of(request), "proposal"),
            self.proposal: self.pending_proposal(data.get(self.model)),
            self.message: "",
        }

    @per_visitor
    def propose(self, data: dict, request: gr.Request | None = None) -> dict:
        """The one search's proposal for the chosen hardware, written into the shared form when it fits (when
        nothing fits, only on request: `use_needed`); dropped if the choices changed while it was worked out."""
        session = session_of(request)
        ticket = data.get(self.proposal_ticket)
        if not self.tickets.current(session, "proposal", ticket):
            return {self.proposal: gr.skip()}  # the choices changed while this request waited its turn
        form = self.form(data)
        pinned = tuple(data.get(self.pinned) or ())
        try:
            device, gpus, gib, where = self.hardware_of(data)
            proposal = self.studio.propose(form, device=device, gpus=gpus, gpu_gib=gib, pinned=pinned)
        except UserError as exc:
            answer = {self.proposal: f"⚠ No proposal: {plain(exc)}"}
        except Exception as exc:  # never a traceback in the page
            answer = {self.proposal: f"⚠ No proposal: {plain(one_line(exc))}"}
        else:
            answer = self._proposal_updates(form, proposal, where)
        return answer if self.tickets.current(session, "proposal", ticket) else _skip(answer)

    def _proposal_updates(self, form: dict[str, Any], proposal: Any, where: str) -> dict:
        values = {n: v for n, v in dict(proposal.values).items() if n in self.config.fields}
        fit = fit_text(proposal.estimate, proposal.verdict, where)
        reasons = "\n".join(f"- {plain(r)}" for r in proposal.reasons)
        if proposal.fits is False:
            # Nothing fits: the form keeps its values; the combination is written only when the user asks.
            needed = _needed_choice(proposal.needed, values)
            head = f"### ⚠ Nothing fits {plain(where)}: Start would run out of memory"
            note = (
                "Nothing was written into the settings. **Use these settings** writes them with the hardware that "
                "holds them; or pick a smaller model."
                if needed
                else "Nothing was written into the settings: pick a smaller model or more GPUs."
            )
            proposed = {"values": form, "fit": fit, "fits": False, "where": where, "needed": needed}
            return {
                self.proposal: f"{head}\n{reasons}\n\n{note}",
                self.summary: run_summary(form, proposed),
                self.proposed: proposed,
                self.use_needed_btn: gr.update(visible=needed is not None, value=_use_label(needed)),
                self.start_btn: gr.update(interactive=False),
            }
        new_form = {**form, **values}
        proposed = {"values": new_form, "fit": fit, "fits": proposal.fits, "where": where, "needed": None}
        updates = {self.config.fields[n]: v for n, v in values.items() if str(form.get(n)) != str(v)}
        return {
            **updates,
            **self._kept(new_form),
            self.seq: new_form.get("max_seq_length"),
            self.proposal: f"### Proposed for {plain(where)}\n{reasons}\n\nWritten into the settings: **Configure** "
            "shows every one of them.",
            self.summary: run_summary(new_form, proposed),
            self.proposed: proposed,
            self.use_needed_btn: gr.update(visible=False),
            self.start_btn: gr.update(interactive=True),
        }

    def use_needed(self, data: dict, request: gr.Request | None = None) -> dict:
        """Write the combination that fits the hardware named when nothing fit, and choose that hardware (a new
        proposal follows for it)."""
        needed = (data.get(self.proposed) or {}).get("needed")
        if not needed:
            return {self.message: "Nothing to use: press **Propose a configuration** first."}
        form = {**self.form(data), **needed["values"]}
        card = needed["card"] if needed["card"] in self.cards else CUSTOM
        return {
            **{self.config.fields[n]: v for n, v in needed["values"].items() if n in self.config.fields},
            **self._kept(form),
            self.pinned: needed["fields"],  # the next proposal, for that card, keeps the combination checked for it
            self.hardware: CARD,
            self.card: gr.update(value=card, visible=True),
            self.custom_gib: gr.update(value=needed["gib"], visible=card == CUSTOM),
            self.gpus: gr.update(value=needed["gpus"], visible=True),
            self.seq: form.get("max_seq_length"),
            self.proposal_ticket: self.tickets.issue(session_of(request), "proposal"),
            self.proposal: self.pending_proposal(form.get("model")),
            self.use_needed_btn: gr.update(visible=False),
            self.message: "",
        }

    @per_visitor
    def look_at_data(self, data: dict, request: gr.Request | None = None) -> dict:
        """The data's token-length statistics and its first examples as the model sees them (dropped if stale)."""
        session = session_of(request)
        ticket = data.get(self.data_ticket)
        if not self.tickets.current(session, "data", ticket):
            return {self.data_info: gr.skip()}
        form = self.form(data)
        stats, preview = self._stats_html(form), self._preview_html(form)
        answer = {self.data_info: stats if stats == preview else stats + preview}  # one problem said once
        return answer if self.tickets.current(session, "data", ticket) else _skip(answer)

    def _stats_html(self, form: dict[str, Any]) -> str:
        """The statistics line, or why there is none (the preview below may still work, and the other way round)."""
        try:
            return f"<p>{_md_bold(plain(stats_text(self.studio.data_stats(form), form.get('max_seq_length'))))}</p>"
        except UserError as exc:
            return f"<p class='fs-problem'>⚠ {plain(exc)}</p>"
        except Exception as exc:
            return f"<p class='fs-problem'>⚠ No token statistics: {plain(one_line(exc))}</p>"

    def _preview_html(self, form: dict[str, Any]) -> str:
        try:
            return preview_html(self.studio.preview_data(form, n=2))
        except UserError as exc:
            return f"<p class='fs-problem'>⚠ {plain(exc)}</p>"
        except Exception as exc:
            return f"<p class='fs-problem'>⚠ Cannot preview the data: {plain(one_line(exc))}</p>"

    def detect(self) -> list:
        """On page load: offer this machine's GPU, chosen, when it has one (looked for once per app)."""
        if self.gpu is None:
            self.gpu = self.studio.detected_gpu() or ()
        if not self.gpu:
            return [gr.skip(), gr.skip()]
        return [gr.update(choices=hardware_choices(self.gpu), value=DETECTED), gr.update(visible=True)]

    def show(self, data: dict) -> dict:
        """On opening the tab and on page load: the choices and the summary as the shared form says now (on load,
        with the settings this browser kept on top: the page restores them into the form at the same time)."""
        saved = data.get(self.config.saved) if self.config.saved is not None else None
        form = {**self.form(data), **{k: v for k, v in (saved or {}).items() if k in FIELD_NAMES}}
        model, dataset = form.get("model"), form.get("dataset")
        proposed = data.get(self.proposed)
        return {
            self.model: gr.update(value=model, choices=self._model_choices(model)),
            self.data: gr.update(value=dataset, choices=self._data_choices(dataset)),
            self.goal: goal_of(form),
            self.seq: form.get("max_seq_length"),
            self.summary: run_summary(form, proposed),
            self.start_btn: gr.update(interactive=not out_of_memory(form, proposed)),
        }

    @per_visitor
    def use_upload(self, files: Any, request: gr.Request | None = None) -> dict:
        """Keep uploaded data (the app's upload rules) and choose it as the data: one data file, a data file with
        its images, or a .zip holding both (the images stay beside the data file, as its paths name them)."""
        try:
            paths = [Path(getattr(f, "name", None) or str(f)) for f in (files if isinstance(files, list) else [files])]
            target = self.studio.add_uploads([(p, p.name) for p in paths])
            path = paths[0] if len(paths) == 1 else Path(target.rsplit("/", 1)[-1])
        except UserError as exc:
            return {self.message: f"⚠ {plain(exc)}"}
        except OSError as exc:
            return {self.message: f"⚠ dataset: cannot keep the uploaded file: {plain(one_line(exc))}"}
        return {
            self.data: gr.update(value=target, choices=self._data_choices(target)),
            self.message: f"Using the uploaded file `{plain(path.name)}` as the data.",
        }

    @per_visitor
    def start(self, data: dict, request: gr.Request | None = None) -> dict:
        """Start a run with the shared form (as the Train tab's Start does), then show it on the Train tab; refused
        in plain words when the proposal found these settings will run out of memory on the chosen hardware."""
        form = self.form(data)
        proposed = data.get(self.proposed)
        if out_of_memory(form, proposed):
            return {
                self.message: f"⚠ Not started: these settings will run out of memory on {plain(proposed['where'])}. "
                "Use the settings proposed for larger hardware, or pick a smaller model."
            }
        _, problems = self.studio.check(form)
        if problems:
            name, problem = next(iter(problems.items()))
            return {self.message: f"⚠ Not started: {plain(problem)} (see **{field_label(name)}** in Configure)."}
        try:
            state = self.studio.start(form)
        except BusyError as exc:
            return {self.message: f"⚠ {plain(exc)}"}
        except UserError as exc:
            return {self.message: f"⚠ Not started: {plain(exc)}"}
        except Exception as exc:
            return {self.message: f"⚠ Not started: {plain(one_line(exc))}"}
        return {
            self.message: f"▶ Started run `{state.run_id}` at {time.strftime('%H:%M:%S')}: follow it on **Train**.",
            self.train.viewing: state.run_id,
            self.train.shown: None,
            self.tabs: gr.Tabs(selected="train"),
        }

    def _kept(self, form: dict[str, Any]) -> dict:
        """The form for this browser's storage (a reload brings it back), as a Configure edit keeps it."""
        return {self.config.saved: form} if self.config.saved is not None else {}

    # ----- choices
    def _matching_data(self, goal: str, dataset: str) -> str:
        """The bundled set that suits the goal when the data is another goal's bundled set (pirate answers <->
        pirate pairs); the default set for a goal without one of its own."""
        target = objectives.GOALS[goal].bundled_data or BUNDLED_DATASET
        if dataset in GOAL_DATA and target in self.studio.bundled_datasets():
            return target
        return dataset

    def _model_choices(self, current: str | None) -> list[tuple[str, str]]:
        names = list(self.studio.popular_models())
        if EMBEDDED_MODEL not in names and not self.studio.policy.public:
            names.insert(0, EMBEDDED_MODEL)
        if current and current not in names:
            names.insert(0, current)
        return [(model_label(n, self.studio.takes_images(BASE, {"model": n})), n) for n in names]

    def _data_choices(self, current: str | None) -> list[tuple[str, str]]:
        names = self.studio.bundled_datasets()
        if current and current not in names:
            names.insert(0, current)
        return [(data_label(n), n) for n in names]


def _needed_choice(needed: Any, values: dict[str, Any]) -> dict[str, Any] | None:
    """What `use_needed` writes: the combination and the hardware that holds it (None when there is none)."""
    if needed is None:
        return None
    card = needed.cards[0] if needed.cards else ""
    fields = sorted({*needed.changes, "max_seq_length"})
    return {"values": values, "card": card, "gib": needed.gpu_gib, "gpus": needed.gpus, "fields": fields}


def _use_label(needed: dict[str, Any] | None) -> str:
    """The button that writes the combination for the larger hardware."""
    if not needed:
        return "Use these settings"
    count = f"{needed['gpus']} × " if needed["gpus"] > 1 else ""
    hardware = needed["card"] or f"GPUs of {needed['gib']:g} GiB"
    return f"Use these settings, for {count}{hardware}"


def _skip(answer: dict) -> dict:
    """A stale answer: change nothing it would have changed."""
    return {component: gr.skip() for component in answer}


def _md_bold(text: str) -> str:
    """`**x**` as HTML bold (the statistics line sits in an HTML block)."""
    parts = text.split("**")
    return "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts))


# ----------------------------------------------------------------------------------------------- layout
def build(studio: Studio) -> StartTab:
    """The first screen's components (wired by `wire` once the Configure and Train tabs exist)."""
    tab = StartTab(studio)
    defaults = studio.default_values()
    tab.cards = studio.gpu_cards()
    gr.Markdown(
        "**Four choices, then Start.** The defaults work as they are: a small model learns to answer like a pirate "
        "in a few minutes, even on a CPU. Every choice here is written into the settings the other tabs show, so "
        "you can fine-tune any of them in **Configure** afterwards."
    )
    with gr.Row(equal_height=False):
        with gr.Column(min_width=300):
            tab.model = gr.Dropdown(
                choices=tab._model_choices(defaults["model"]),
                value=defaults["model"],
                allow_custom_value=True,
                label="1. Model",
                info="The embedded model, a popular one, or type any Hub id (owner/name).",
                elem_id="start-model",
            )
            tab.data = gr.Dropdown(
                choices=tab._data_choices(defaults["dataset"]),
                value=defaults["dataset"],
                allow_custom_value=True,
                label="2. Data",
                info="The bundled set, a Hub dataset id (owner/name), or upload a file below.",
                elem_id="start-data",
            )
            tab.upload = gr.UploadButton(
                "Upload a data file (.jsonl, .json, .csv, .parquet), with its images or as a .zip",
                file_types=list(DATA_UPLOAD_TYPES),
                file_count="multiple",
                size="sm",
                elem_id="start-upload",
            )
        with gr.Column(min_width=300):
            tab.goal = gr.Radio(
                [(label, key) for key, label in GOALS.items()],
                value=goal_of(defaults),
                label="3. Goal",
                elem_id="start-goal",
            )
            # This machine's GPU is looked for when the page loads (`detect`): building the UI never imports torch.
            tab.hardware = gr.Radio(hardware_choices(None), value=CPU, label="4. Hardware", elem_id="start-hardware")
            with gr.Row(equal_height=False):
                tab.card = gr.Dropdown(
                    card_choices(tab.cards),
                    value=first_card(tab.cards),
                    label="GPU card",
                    info="The memory a program can use on it; or a size of your own.",
                    visible=False,
                    elem_id="start-card",
                    min_width=220,
                )
                tab.custom_gib = number_box(
                    value=24.0, label="GPU memory (GiB)", visible=False, elem_id="start-gib", min_width=140
                )
                tab.gpus = number_box(
                    value=1, label="Number of GPUs", visible=False, elem_id="start-gpus", min_width=140
                )
    tab.data_info = gr.HTML(DATA_HINT, elem_id="start-data-info")
    with gr.Row(equal_height=False):
        with gr.Column(scale=3, min_width=300):
            with gr.Row(equal_height=True):
                tab.propose_btn = gr.Button("Propose a configuration", elem_id="start-propose", scale=2)
                tab.seq = number_box(
                    value=defaults["max_seq_length"],
                    label="Tokens per row (sequence length)",
                    info="Proposed from the data's own lengths; type another to keep it.",
                    elem_id="start-seq",
                    scale=1,
                    min_width=200,
                )
            tab.proposal = gr.Markdown(NO_PROPOSAL, elem_id="start-proposal")
            tab.use_needed_btn = gr.Button("Use these settings", visible=False, elem_id="start-use-needed")
        with gr.Column(scale=2, min_width=300):
            tab.summary = gr.Markdown(run_summary(defaults, None), elem_id="start-summary")
            tab.start_btn = gr.Button("Start training", variant="primary", elem_id="start-go")
            tab.message = gr.Markdown("", elem_id="start-message")
    tab.proposed = gr.State(None)
    tab.pinned = gr.State([])
    tab.proposal_ticket = gr.State(0)
    tab.data_ticket = gr.State(0)
    return tab


# ----------------------------------------------------------------------------------------------- events
def wire(tab: StartTab, config: ConfigTab, train: Any, tabs: Any, start_tab: Any, demo: gr.Blocks) -> None:
    """Connect the first screen to the shared form, the Train tab and the tab bar."""
    tab.config, tab.train, tab.tabs = config, train, tabs
    quick = {"queue": False, "show_progress": "hidden", "api_visibility": "private"}
    # One proposal and one data reading at a time per app: a queued request already stale is skipped at once.
    proposing = {"api_visibility": "private", "show_progress": "minimal", "concurrency_id": "start-propose"}
    reading = {"api_visibility": "private", "show_progress": "minimal", "concurrency_id": "start-data"}
    form_out = [config.fields[n] for n in ("model", "dataset", "task", "objective", *objectives.GOAL_FIELDS)]
    kept = [config.saved] if config.saved is not None else []
    proposal_out = [
        *config.fields.values(), tab.seq, tab.proposal, tab.summary, tab.proposed, tab.use_needed_btn, tab.start_btn,
        *kept,
    ]  # fmt: skip
    pending = [
        *form_out, *kept, tab.data, tab.data_ticket, tab.proposal_ticket, tab.pinned, tab.data_info,
        tab.proposal, tab.message,
    ]  # fmt: skip

    def then_propose(event: Any) -> None:
        # The data is read again after the proposal: its share of rows that fit uses the proposed length.
        proposed = event.then(tab.propose, tab.inputs, proposal_out, **proposing)
        proposed.then(tab.look_at_data, tab.inputs, [tab.data_info], **reading)

    def then_look_and_propose(event: Any) -> None:
        event.then(tab.look_at_data, tab.inputs, [tab.data_info], **reading)
        then_propose(event)

    asked = [tab.proposal_ticket, tab.pinned, tab.proposal, tab.custom_gib, tab.message]
    for trigger in (tab.model.input, tab.data.input, tab.goal.input):
        then_look_and_propose(trigger(tab.choose, tab.inputs, pending, **quick))
    hardware_out = [tab.proposal_ticket, tab.pinned, tab.card, tab.custom_gib, tab.gpus, tab.proposal, tab.message]
    then_propose(tab.hardware.input(tab.choose_hardware, tab.inputs, hardware_out, **quick))
    # API clients use /propose (ui/api.py): the same answer, from the same backend search.
    proposing_triggers = (tab.card.input, tab.custom_gib.submit, tab.custom_gib.blur, tab.gpus.submit, tab.gpus.blur)
    for trigger in (*proposing_triggers, tab.propose_btn.click):
        then_propose(trigger(tab.ask_proposal, tab.inputs, asked, **quick))
    pinned = [config.fields["max_seq_length"], *kept, tab.pinned, tab.proposal_ticket, tab.proposal, tab.message]
    for trigger in (tab.seq.submit, tab.seq.blur):
        then_propose(trigger(tab.pin_seq, tab.inputs, pinned, **quick))
    used = [
        *config.fields.values(), *kept, tab.pinned, tab.hardware, tab.card, tab.custom_gib, tab.gpus, tab.seq,
        tab.proposal_ticket, tab.proposal, tab.use_needed_btn, tab.message,
    ]  # fmt: skip
    then_propose(tab.use_needed_btn.click(tab.use_needed, tab.inputs, used, **quick))
    uploaded = tab.upload.upload(tab.use_upload, tab.upload, [tab.data, tab.message], api_visibility="private")
    then_look_and_propose(uploaded.then(tab.choose, tab.inputs, pending, **quick))
    shown = [tab.model, tab.data, tab.goal, tab.seq, tab.summary, tab.start_btn]
    start_tab.select(tab.show, tab.inputs, shown, **quick)
    demo.load(tab.show, {*tab.inputs, config.saved}, shown, **quick)
    demo.load(tab.detect, None, [tab.hardware, tab.gpus], api_visibility="private", show_progress="hidden")
    tab.start_btn.click(
        tab.start,
        tab.inputs,
        [tab.message, train.viewing, train.shown, tabs],
        api_visibility="private",
        concurrency_limit=None,
    )
