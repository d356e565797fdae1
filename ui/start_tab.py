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

from finetune.config import BUNDLED_DATASET, EMBEDDED_MODEL, FIELD_NAMES, PREFERENCE_OBJECTIVES, field_label
from finetune.errors import BusyError, UserError
from finetune.studio import Studio
from ui.config_tab import ConfigTab
from ui.formatting import one_line, plain, preview_html
from ui.visitor import per_visitor

GOALS = {
    "sft": "Style or instructions: answer like the examples (SFT)",
    "dpo": "Preferences: learn which of two answers is better (DPO)",
    "classify": "Classification: predict a label for a text",
}
GOAL_SETTINGS = {  # goal → (task, objective) written into the form
    "sft": ("causal_lm", "sft"),
    "dpo": ("causal_lm", "dpo"),
    "classify": ("sequence_classification", "sft"),
}
PAIRS_DATASET = "bundled:pirate-pairs"  # the bundled preference pairs (same prompts, pirate answer preferred)
DETECTED, CARD, CPU = "gpu", "card", "cpu"
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
    """The first screen's goal for these settings."""
    if form.get("task") == "sequence_classification":
        return "classify"
    return "dpo" if form.get("objective") in PREFERENCE_OBJECTIVES else "sft"


def model_label(name: str) -> str:
    if name == EMBEDDED_MODEL:
        return "SmolLM2-135M-Instruct, embedded (works offline)"
    return name


def data_label(name: str) -> str:
    if name.startswith("bundled:"):
        return f"{name.split(':', 1)[1]} (bundled with the app)"
    return name


def hardware_choices(gpu: tuple[str, float] | None) -> list[tuple[str, str]]:
    """The hardware options: this machine's GPU first when it has one."""
    detected = [(f"This machine's GPU: {gpu[0]} · {gpu[1]:g} GiB", DETECTED)] if gpu else []
    return [*detected, ("A GPU card (plan for one)", CARD), ("This computer's CPU (a short demo)", CPU)]


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
    steps = form.get("max_steps")
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
        changed = [n for n in SUMMARY_FIELDS if n in proposed["values"] and proposed["values"][n] != form.get(n)]
        if changed:
            names = ", ".join(field_label(n) for n in changed)
            lines.append(
                f"\nChanged since the proposal: **{names}**. The fit below was for the proposal; press **Propose a "
                "configuration** again or see the **Memory** tab."
            )
        if proposed.get("fit"):
            lines.append(f"\n{proposed['fit']}")
    return "\n".join(lines)


def fit_text(estimate: Any, fits: bool | None, where: str) -> str:
    """One line on the proposal's memory: how much, of what, and whether it fits."""
    total = getattr(estimate, "total_bytes", None)
    if not total:
        return ""
    need = f"{total / 2**30:.2f} GiB" if total >= 2**30 else f"{total / 2**20:.0f} MiB"
    gib = getattr(estimate, "gpu_gib", None)
    if gib:
        verdict = "fits" if fits else "does **not** fit"
        return f"**Memory:** needs about {need} of {gib:g} GiB on {where}: {verdict}."
    return f"**Memory:** needs about {need} on {where}."


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
    gpus: Any = None
    propose_btn: Any = None
    proposal: Any = None
    summary: Any = None
    start_btn: Any = None
    message: Any = None
    proposed: Any = None  # gr.State: the last proposal applied ({"values", "fit"})
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
            self.gpus,
            self.proposed,
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
        """(device, gpus, GiB per GPU, words for it) from the hardware choice."""
        choice = data.get(self.hardware)
        gpus = max(1, int(data.get(self.gpus) or 1))
        count = f"{gpus} × " if gpus > 1 else ""
        if choice == DETECTED and self.gpu:
            return "cuda", gpus, self.gpu[1], f"{count}this machine's {self.gpu[0]}"
        if choice == CARD and data.get(self.card) in self.cards:
            return "cuda", gpus, self.cards[data[self.card]], f"{count}{data[self.card]}"
        return "cpu", 1, None, "this computer's CPU"

    # ----- handlers (tests call them with {component: value} dicts)
    def choose(self, data: dict, request: gr.Request | None = None) -> dict:
        """A choice changed: write it into the shared form and mark the data and the proposal as pending."""
        form = self.form(data)
        goal = data.get(self.goal) or "sft"
        task, objective = GOAL_SETTINGS[goal]
        if goal == "dpo" and form.get("objective") in PREFERENCE_OBJECTIVES:
            objective = form["objective"]  # keep orpo / kto chosen in Configure: they are preferences too
        dataset = self._matching_data(goal, data.get(self.data) or form.get("dataset"))
        session = session_of(request)
        chosen = {"model": data.get(self.model) or form.get("model"), "dataset": dataset, "task": task}
        chosen["objective"] = objective
        return {
            **{self.config.fields[n]: v for n, v in chosen.items()},
            **self._kept({**form, **chosen}),
            self.data: gr.update(value=dataset, choices=self._data_choices(dataset)),
            self.data_ticket: self.tickets.issue(session, "data"),
            self.proposal_ticket: self.tickets.issue(session, "proposal"),
            self.data_info: PENDING_DATA,
            self.proposal: PENDING_PROPOSAL,
        }

    def choose_hardware(self, data: dict, request: gr.Request | None = None) -> dict:
        """The hardware changed: only the proposal depends on it."""
        choice = data.get(self.hardware)
        return {
            self.proposal_ticket: self.tickets.issue(session_of(request), "proposal"),
            self.card: gr.update(visible=choice == CARD),
            self.gpus: gr.update(visible=choice != CPU),
            self.proposal: PENDING_PROPOSAL,
            self.message: "",
        }

    def ask_proposal(self, request: gr.Request | None = None) -> dict:
        """Propose pressed: a new ticket, shown as pending."""
        ticket = self.tickets.issue(session_of(request), "proposal")
        return {self.proposal_ticket: ticket, self.proposal: PENDING_PROPOSAL, self.message: ""}

    @per_visitor
    def propose(self, data: dict, request: gr.Request | None = None) -> dict:
        """Propose a configuration that fits the chosen hardware and write it into the shared form; dropped if the
        choices changed while it was worked out."""
        session = session_of(request)
        ticket = data.get(self.proposal_ticket)
        if not self.tickets.current(session, "proposal", ticket):
            return {self.proposal: gr.skip()}  # the choices changed while this request waited its turn
        form = self.form(data)
        device, gpus, gib, where = self.hardware_of(data)
        try:
            proposal = self.studio.propose(form, device=device, gpus=gpus, gpu_gib=gib)
        except UserError as exc:
            answer = {self.proposal: f"⚠ No proposal: {plain(exc)}"}
        except Exception as exc:  # never a traceback in the page
            answer = {self.proposal: f"⚠ No proposal: {plain(one_line(exc))}"}
        else:
            answer = self._proposal_updates(form, proposal, where)
        return answer if self.tickets.current(session, "proposal", ticket) else _skip(answer)

    def _proposal_updates(self, form: dict[str, Any], proposal: Any, where: str) -> dict:
        values = {n: v for n, v in dict(proposal.values).items() if n in self.config.fields}
        new_form = {**form, **values}
        fit = fit_text(proposal.estimate, proposal.fits, where)
        reasons = "\n".join(f"- {plain(r)}" for r in proposal.reasons)
        head = "### Proposed for " + plain(where)
        if proposal.fits is False:
            head += "\n⚠ Nothing tried fits this hardware; this is the closest. Pick a larger card or a smaller model."
        proposed = {"values": new_form, "fit": fit}
        updates = {self.config.fields[n]: v for n, v in values.items() if form.get(n) != v}
        return {
            **updates,
            **self._kept(new_form),
            self.proposal: f"{head}\n{reasons}\n\nWritten into the settings: **Configure** shows every one of them.",
            self.summary: run_summary(new_form, proposed),
            self.proposed: proposed,
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
        return {
            self.model: gr.update(value=model, choices=self._model_choices(model)),
            self.data: gr.update(value=dataset, choices=self._data_choices(dataset)),
            self.goal: goal_of(form),
            self.summary: run_summary(form, data.get(self.proposed)),
        }

    @per_visitor
    def use_upload(self, file: Any, request: gr.Request | None = None) -> dict:
        """Keep an uploaded data file (the app's upload rules) and choose it as the data."""
        try:
            path = Path(getattr(file, "name", None) or str(file))
            target = self.studio.add_upload(path, path.name)
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
        """Start a run with the shared form (as the Train tab's Start does), then show it on the Train tab."""
        form = self.form(data)
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
        """The bundled set that suits the goal when the data is a bundled one (pirate answers ↔ pirate pairs)."""
        bundled = self.studio.bundled_datasets()
        if goal == "dpo" and dataset == BUNDLED_DATASET and PAIRS_DATASET in bundled:
            return PAIRS_DATASET
        if goal != "dpo" and dataset == PAIRS_DATASET:
            return BUNDLED_DATASET
        return dataset

    def _model_choices(self, current: str | None) -> list[tuple[str, str]]:
        names = list(self.studio.popular_models())
        if EMBEDDED_MODEL not in names and not self.studio.policy.public:
            names.insert(0, EMBEDDED_MODEL)
        if current and current not in names:
            names.insert(0, current)
        return [(model_label(n), n) for n in names]

    def _data_choices(self, current: str | None) -> list[tuple[str, str]]:
        names = self.studio.bundled_datasets()
        if current and current not in names:
            names.insert(0, current)
        return [(data_label(n), n) for n in names]


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
                "Upload a data file (.jsonl, .json, .csv, .parquet)",
                file_types=[".jsonl", ".json", ".csv", ".parquet"],
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
            card = first_card(tab.cards)
            tab.card = gr.Dropdown(
                [(f"{name} · {gib:g} GiB", name) for name, gib in tab.cards.items()],
                value=card,
                label="GPU card",
                visible=False,
                elem_id="start-card",
            )
            tab.gpus = gr.Number(value=1, precision=0, label="Number of GPUs", visible=False, elem_id="start-gpus")
    tab.data_info = gr.HTML(DATA_HINT, elem_id="start-data-info")
    with gr.Row(equal_height=False):
        with gr.Column(scale=3, min_width=300):
            tab.propose_btn = gr.Button("Propose a configuration", elem_id="start-propose")
            tab.proposal = gr.Markdown(NO_PROPOSAL, elem_id="start-proposal")
        with gr.Column(scale=2, min_width=300):
            tab.summary = gr.Markdown(run_summary(defaults, None), elem_id="start-summary")
            tab.start_btn = gr.Button("Start training", variant="primary", elem_id="start-go")
            tab.message = gr.Markdown("", elem_id="start-message")
    tab.proposed = gr.State(None)
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
    form_out = [config.fields[n] for n in ("model", "dataset", "task", "objective")]
    kept = [config.saved] if config.saved is not None else []
    proposal_out = [*config.fields.values(), tab.proposal, tab.summary, tab.proposed, *kept]
    pending = [*form_out, *kept, tab.data, tab.data_ticket, tab.proposal_ticket, tab.data_info, tab.proposal]

    def then_propose(event: Any) -> None:
        # The data is read again after the proposal: its share of rows that fit uses the proposed length.
        proposed = event.then(tab.propose, tab.inputs, proposal_out, **proposing)
        proposed.then(tab.look_at_data, tab.inputs, [tab.data_info], **reading)

    def then_look_and_propose(event: Any) -> None:
        event.then(tab.look_at_data, tab.inputs, [tab.data_info], **reading)
        then_propose(event)

    for trigger in (tab.model.input, tab.data.input, tab.goal.input):
        then_look_and_propose(trigger(tab.choose, tab.inputs, pending, **quick))
    hardware_out = [tab.proposal_ticket, tab.card, tab.gpus, tab.proposal, tab.message]
    then_propose(tab.hardware.input(tab.choose_hardware, tab.inputs, hardware_out, **quick))
    asked = [tab.proposal_ticket, tab.proposal, tab.message]
    for trigger in (tab.card.input, tab.gpus.submit, tab.gpus.blur, tab.propose_btn.click):
        then_propose(trigger(tab.ask_proposal, None, asked, **quick))
    uploaded = tab.upload.upload(tab.use_upload, tab.upload, [tab.data, tab.message], api_visibility="private")
    then_look_and_propose(uploaded.then(tab.choose, tab.inputs, pending, **quick))
    shown = [tab.model, tab.data, tab.goal, tab.summary]
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
