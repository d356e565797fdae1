"""Memory tab: will this run fit on my GPU? The breakdown as a table and a bar chart, a fit verdict with headroom,
ranked suggestions, and "Apply", which copies a suggestion into the shared form (the Configure tab).

Its fields mirror the same fields of the Configure tab: editing one here edits it there and back (and says so: it
changes the next run), and an estimate uses the Configure form with these values on top. Handlers receive both forms
keyed by name (gradio's `inputs_kwargs`); this tab's own fields arrive as `memory__NAME` (`MemoryTab.form_of`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import gradio as gr
import pandas as pd

from finetune.config import FIELD_NAMES, field_label
from finetune.errors import UserError
from finetune.studio import Studio, field_problem
from ui.config_tab import (
    ConfigTab,
    error_update,
    field_error_md,
    hidden_fields,
    make_field,
    number_box,
    parse_number,
    warn,
)
from ui.formatting import (
    GIB,
    advice_rows,
    breakdown_rows,
    breakdown_table,
    changes_text,
    details_markdown,
    plain,
    verdict_markdown,
)
from ui.visitor import per_visitor

MEMORY_FIELDS = (
    "model",
    "method",
    "precision",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_seq_length",
    "packing",
    "gradient_checkpointing",
    "optim",
    "lora_r",
    "backend",
    "zero_stage",
    "offload_optimizer",
)
CUSTOM = "custom"
DEFAULT_CARD_GIB = 24.0
PREFERRED_CARDS = ("A10G", "L4", "24 GB")  # a common first guess (the GPU of many Spaces)
ADVICE_HEADERS = ["#", "Suggestion", "Settings it changes", "New estimate", "Fits", "Cost"]
BREAKDOWN_HEADERS = ["Component", "Memory", "Share"]
OWN = "memory__"  # this tab's fields reach handlers as OWN + name, beside the Configure form's NAME


def gpu_cards() -> dict[str, float]:
    """Common cards (name → GiB) from the estimator."""
    return Studio.gpu_cards()


def card_choices(cards: dict[str, float]) -> list[tuple[str, str]]:
    return [(f"{name} · {gib:g} GiB usable", name) for name, gib in cards.items()] + [("Custom size (GiB)", CUSTOM)]


def default_card(cards: dict[str, float]) -> str:
    """A common 24 GB card if listed (a good first guess), else the first one."""
    for hint in PREFERRED_CARDS:
        for name in cards:
            if hint in name:
                return name
    return next(iter(cards), CUSTOM)


@dataclass
class MemoryTab:
    studio: Studio
    config: ConfigTab | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, Any] = field(default_factory=dict)
    device: Any = None
    card: Any = None
    custom_gib: Any = None
    gpus: Any = None
    estimate_btn: Any = None
    verdict: Any = None
    chart: Any = None
    table: Any = None
    comparisons: Any = None
    advice_table: Any = None
    advice_pick: Any = None
    apply_btn: Any = None
    applied: Any = None
    advice_state: Any = None
    answer: Any = None  # gr.State: (the estimate's updates, the inputs they were computed for)
    cards_cache: dict[str, float] | None = None

    cells: dict[str, Any] = field(default_factory=dict)

    def cards(self) -> dict[str, float]:
        if self.cards_cache is None:
            self.cards_cache = gpu_cards()
        return self.cards_cache

    @property
    def form(self) -> dict[str, Any]:
        """Both forms as gradio `inputs_kwargs`: the Configure fields by name, this tab's as OWN + name."""
        return {**self.config.form, **{OWN + n: c for n, c in self.fields.items()}}

    @staticmethod
    def form_of(values: dict[str, Any]) -> dict[str, Any]:
        """The settings to estimate: the Configure form with this tab's own fields (OWN + name) on top."""
        form = {n: v for n, v in values.items() if not n.startswith(OWN)}
        form.update({n[len(OWN) :]: v for n, v in values.items() if n.startswith(OWN)})
        return form

    # ----- handlers
    @per_visitor
    def estimate_for(
        self,
        device: str,
        card: str,
        custom_gib: float | None,
        gpus: float | None,
        request: gr.Request | None = None,
        **values: Any,
    ) -> tuple[list, str]:
        """The estimate's updates with the inputs they were computed for (shown only if those still hold)."""
        return self.estimate(device, card, custom_gib, gpus, **values), _stamp(device, card, custom_gib, gpus, values)

    def show_estimate(
        self, answer: tuple | None, device: str, card: str, custom_gib: float | None, gpus: float | None, **values: Any
    ) -> list:
        """The estimate, or, if the settings changed while it was worked out, a line asking for a new one."""
        if not answer:
            return [gr.skip()] * self.outputs_count
        updates, stamp = answer
        if stamp != _stamp(device, card, custom_gib, gpus, values):
            stale = "The settings changed while this was estimated: press **Estimate** again for the new ones."
            return [gr.update(value=stale), *[gr.skip()] * (self.outputs_count - 1)]
        return updates

    @property
    def outputs_count(self) -> int:
        """How many components an estimate updates (see `estimate`)."""
        return 8 + len(self.errors)

    @per_visitor
    def estimate(
        self,
        device: str,
        card: str,
        custom_gib: float | None,
        gpus: float | None,
        request: gr.Request | None = None,
        **values: Any,
    ) -> list:
        """The estimate for the Configure form with this tab's fields on top.

        Returns updates for: verdict, chart, breakdown table, comparisons, advice table, advice choice, apply button,
        advice state, this tab's field errors (in MEMORY_FIELDS order).
        """
        form = self.form_of(values)
        blank = [gr.update()] * 8
        _, problems = self.studio.check(form)
        if problems:
            return self._fail(blank, problems)
        on_gpu = device != "CPU"
        try:
            gpu_count = parse_number(gpus, whole=True)
            gpu_count = 1 if gpu_count is None else gpu_count
            if not isinstance(gpu_count, int) or isinstance(gpu_count, bool) or gpu_count < 1:
                raise UserError(f"gpus: {plain(gpus)} is not a whole number of 1 or more", field="gpus")
            gib = self._capacity(card, custom_gib) if on_gpu else None
            result = self.studio.estimate(
                form, device="cuda" if on_gpu else "cpu", gpus=gpu_count if on_gpu else 1, gpu_gib=gib
            )
        except UserError as exc:
            return self._fail(blank, {getattr(exc, "field", None) or "model": str(exc)})
        except Exception as exc:  # e.g. a model config that cannot be read: one line, never a traceback
            message = next(iter(field_problem(exc).values()))
            return self._fail(blank, {"model": f"model: cannot estimate this model: {message}"})
        where = card if on_gpu and card != CUSTOM else ("a custom GPU" if on_gpu else "this machine's memory (CPU)")
        verdict = verdict_markdown(result, where, gib, gpu_count if on_gpu else 1)
        rows = breakdown_rows(result)
        chart = pd.DataFrame([{"component": name, "GiB": round(value / GIB, 3)} for name, value, _ in rows])
        advice = list(result.advice or [])
        choices = [(f"{i}. {a.title}", i - 1) for i, a in enumerate(advice, start=1)]
        return [
            verdict,
            gr.update(value=chart, visible=True),
            gr.update(value=pd.DataFrame(breakdown_table(rows), columns=BREAKDOWN_HEADERS), visible=True),
            details_markdown(result),
            gr.update(value=pd.DataFrame(advice_rows(result), columns=ADVICE_HEADERS), visible=bool(advice)),
            gr.update(choices=choices, value=0 if choices else None, visible=bool(advice)),
            gr.update(visible=bool(advice)),
            [dict(a.changes or {}) for a in advice],
            *self._errors({}),
        ]

    def _capacity(self, card: str, custom_gib: float | None) -> float:
        custom_gib = parse_number(custom_gib)
        if card == CUSTOM or card not in self.cards():
            if isinstance(custom_gib, bool) or not isinstance(custom_gib, (int, float)) or not custom_gib > 0:
                raise UserError("custom GPU memory: give the card's memory in GiB, e.g. 24", field="gpu_gib")
            return float(custom_gib)
        return self.cards()[card]

    def _errors(self, problems: dict[str, str]) -> list:
        return [error_update(problems.get(n)) for n in MEMORY_FIELDS]

    def _fail(self, blank: list, problems: dict[str, str]) -> list:
        first = next(iter(problems.values()))
        shown = {n: m for n, m in problems.items() if n in MEMORY_FIELDS}
        # Problems in fields this tab does not show are named in the verdict line instead.
        verdict = f"⚠ {plain(first)}" + ("" if shown else " (change it in the Configure tab)")
        return [verdict, *blank[1:], *self._errors(shown)]

    def restore(self, saved: dict[str, Any] | None) -> list:
        """On page load: the settings kept in this browser for the Configure form, then for this tab's fields."""
        values = dict(zip(FIELD_NAMES, self.config.restore(saved), strict=True))
        return [*values.values(), *(values[n] for n in MEMORY_FIELDS)]

    @staticmethod
    def edited(name: str, value: Any) -> str:
        """What an edit here does to the next run, said where it was made (the Configure form holds it now)."""
        shown = str(value).lower() if isinstance(value, bool) else value
        return (
            f"✎ {field_label(name)} is now **{plain(shown)}** for the next run too: *Configure* and *Train* use the "
            "same settings."
        )

    def visibility(self, **values: Any) -> list:
        """Updates for this tab's cells (MEMORY_FIELDS order): hidden where the field does not apply."""
        hidden = hidden_fields(self.form_of(values))
        return [gr.update(visible=n not in hidden) for n in MEMORY_FIELDS]

    def apply(self, index: int | None, suggestions: list[dict[str, Any]] | None, **values: Any) -> list:
        """Copy a suggestion into the shared form: updates for every Configure field, this tab's fields, a message."""
        form = self.form_of(values)
        if index is None or not suggestions or not 0 <= int(index) < len(suggestions):
            warn("Estimate first, then pick a suggestion to apply.")
            return [gr.update()] * (len(FIELD_NAMES) + len(MEMORY_FIELDS)) + ["Nothing applied."]
        changes = suggestions[int(index)]
        form.update(changes)
        message = (
            f"✓ Applied: `{changes_text(changes)}`. The Configure tab now has these settings; the estimate below "
            "is for them."
        )
        return [form[n] for n in FIELD_NAMES] + [form[n] for n in MEMORY_FIELDS] + [message]


# ----------------------------------------------------------------------------------------------- layout
def build(studio: Studio) -> MemoryTab:
    tab = MemoryTab(studio)
    defaults = studio.default_values()
    gr.Markdown(
        "**Will it fit?** Pick the GPU you will train on and press **Estimate memory**. The estimate counts "
        "the weights, the LoRA parameters, gradients, optimizer state and activations for your batch and sequence "
        "length. These fields are the same as in *Configure*: change them in either place."
    )
    with gr.Row():
        with gr.Column(scale=3):
            hidden = hidden_fields(defaults)
            with gr.Row(equal_height=False, elem_classes=["fs-fields"]):
                for name in MEMORY_FIELDS:
                    with gr.Column(min_width=200, visible=name not in hidden, elem_id=f"mem-cell-{name}") as cell:
                        tab.cells[name] = cell
                        tab.fields[name] = make_field(name, defaults[name], prefix="mem")
                        tab.errors[name] = field_error_md(name, prefix="mem")
        with gr.Column(scale=1, min_width=260):
            tab.device = gr.Radio(
                ["GPU", "CPU"],
                value="GPU",
                label="Train on",
                elem_id="mem-device",
                info="GPU: check against a card's memory. CPU: the estimate of a CPU run.",
            )
            cards = tab.cards()
            tab.card = gr.Dropdown(
                choices=card_choices(cards),
                value=default_card(cards),
                label="GPU",
                elem_id="mem-card",
                info="Common cards (the memory a program can use), or a custom size.",
            )
            tab.custom_gib = number_box(
                value=DEFAULT_CARD_GIB,
                label="Custom GPU memory (GiB)",
                elem_id="mem-gib",
                visible=default_card(cards) == CUSTOM,
            )
            tab.gpus = number_box(
                value=1,
                label="Number of GPUs",
                elem_id="mem-gpus",
                info="With ZeRO (zero_stage ≥ 1) the states are split over them.",
            )
            tab.estimate_btn = gr.Button("Estimate memory", variant="primary", elem_id="mem-estimate")
    tab.verdict = gr.Markdown("Press **Estimate memory** to see whether these settings fit.", elem_id="mem-verdict")
    with gr.Row(equal_height=False):
        tab.chart = gr.BarPlot(
            pd.DataFrame({"component": [], "GiB": []}),
            x="component",
            y="GiB",
            title="Where the memory goes",
            x_title=" ",
            y_title="GiB",
            sort="-y",
            x_label_angle=-30,
            elem_id="mem-chart",
            height=320,
            visible=False,
        )
        tab.table = gr.Dataframe(
            headers=BREAKDOWN_HEADERS,
            label="Breakdown",
            interactive=False,
            elem_id="mem-table",
            elem_classes=["fs-table"],
            wrap=True,
            visible=False,
        )
    tab.comparisons = gr.Markdown("", elem_id="mem-comparisons", elem_classes=["fs-note"])
    tab.advice_table = gr.Dataframe(
        headers=ADVICE_HEADERS,
        label="Ways to make it fit with headroom (best first: least slowdown, data kept whole, same effective batch)",
        interactive=False,
        visible=False,
        elem_id="mem-advice",
        elem_classes=["fs-table"],
        wrap=True,
        column_widths=["5%", "28%", "28%", "12%", "7%", "20%"],
    )
    with gr.Row():
        tab.advice_pick = gr.Dropdown(
            choices=[], label="Suggestion to apply", visible=False, elem_id="mem-pick", scale=3
        )
        tab.apply_btn = gr.Button("Apply", elem_id="mem-apply", scale=1, min_width=120, visible=False)
    tab.applied = gr.Markdown("", elem_id="mem-applied")
    tab.advice_state = gr.State([])
    tab.answer = gr.State(None)
    return tab


# ----------------------------------------------------------------------------------------------- events
def _same(value: Any) -> Any:
    return value


def wire(tab: MemoryTab, config: ConfigTab, demo: gr.Blocks) -> None:
    tab.config = config
    mine = [tab.fields[n] for n in MEMORY_FIELDS]
    errors = [tab.errors[n] for n in MEMORY_FIELDS]
    # One form: a user edit on either side is copied to the other (user edits only, so the copy cannot echo back).
    # A server call, not a browser-only function: the other tab is not in the page until it is opened.
    mirror = {"queue": False, "show_progress": "hidden", "api_visibility": "private"}
    for name in MEMORY_FIELDS:
        for source, target in ((tab.fields[name], config.fields[name]), (config.fields[name], tab.fields[name])):
            edited = source.blur if isinstance(source, (gr.Textbox, gr.Number)) else source.input
            copied = edited(_same, source, target, **mirror)
            if source is tab.fields[name]:  # then check (and keep) the form, as an edit in Configure does
                copied.then(
                    config.check_quiet, None, [*config.error_outputs, config.saved], inputs_kwargs=config.form, **mirror
                )
                edited(lambda value, name=name: tab.edited(name, value), source, tab.applied, **mirror)
    for name in ("method", "zero_stage"):  # also on programmatic changes (Configure's edits, Apply, a reload)
        tab.fields[name].change(
            tab.visibility,
            None,
            [tab.cells[n] for n in MEMORY_FIELDS],
            inputs_kwargs={OWN + n: tab.fields[n] for n in ("method", "zero_stage")},
            **mirror,
        )
    tab.device.change(
        lambda d: [gr.update(visible=d == "GPU")] * 3,
        tab.device,
        [tab.card, tab.custom_gib, tab.gpus],
        queue=False,
        show_progress="hidden",
        api_visibility="undocumented",
    )
    tab.card.change(
        lambda c: gr.update(visible=c == CUSTOM),
        tab.card,
        tab.custom_gib,
        queue=False,
        show_progress="hidden",
        api_visibility="undocumented",
    )
    outputs = [
        tab.verdict,
        tab.chart,
        tab.table,
        tab.comparisons,
        tab.advice_table,
        tab.advice_pick,
        tab.apply_btn,
        tab.advice_state,
        *errors,
    ]
    inputs = [tab.device, tab.card, tab.custom_gib, tab.gpus]
    # Pending at once; the answer is shown only if the settings are still the ones it was computed for.
    tab.estimate_btn.click(
        lambda: "⏳ Estimating…", None, tab.verdict, queue=False, show_progress="hidden", api_visibility="private"
    ).then(
        tab.estimate_for, inputs, tab.answer, inputs_kwargs=tab.form, api_visibility="private", show_progress="hidden"
    ).then(
        tab.show_estimate,
        [tab.answer, *inputs],
        outputs,
        inputs_kwargs=tab.form,
        show_progress="hidden",
        api_visibility="private",
    )
    # A page reload brings back the settings kept in this browser, on both tabs.
    demo.load(tab.restore, config.saved, [*config.inputs, *mine], api_visibility="undocumented", show_progress="hidden")
    tab.apply_btn.click(
        tab.apply,
        [tab.advice_pick, tab.advice_state],
        [*config.inputs, *mine, tab.applied],
        inputs_kwargs=tab.form,
        api_visibility="undocumented",
    ).then(
        tab.estimate,
        inputs,
        outputs,
        inputs_kwargs=tab.form,
        api_visibility="undocumented",
        show_progress_on=[tab.verdict],
    )


def _stamp(device: Any, card: Any, custom_gib: Any, gpus: Any, values: dict[str, Any]) -> str:
    """The inputs of an estimate as one comparable string."""
    return json.dumps([device, card, custom_gib, gpus, values], sort_keys=True, default=str)
