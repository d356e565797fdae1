"""Evaluate tab: did the tuning work? Pick a finished run (or a checkpoint), score it against its base model on
held-out data, and see the scores as a table and a chart (base next to tuned), warnings in plain words, and both
models' answers side by side; earlier evaluations of the run stay listed. Below it, Compare: two or more runs with
their loss curves overlaid, their latest scores side by side and their answers to the same held-out prompts.

Evaluating loads the run's model (and, with lm-eval tasks or a judge, more): one evaluation at a time, with a
progress bar. Everything comes from `Studio.evaluate` / `Studio.evaluation` / `Studio.compare`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from finetune.errors import UserError
from finetune.studio import Studio
from ui.formatting import one_line, plain
from ui.visitor import per_visitor

TABLE_HEADERS = ["Metric", "Base model", "Tuned", "Change"]
ANSWER_HEADERS = ["Prompt", "Reference", "Base model", "Tuned"]
CHART_COLUMNS = ["bar", "value", "model"]
CURVE_COLUMNS = ["step", "loss", "run"]
NO_RESULT = "No evaluation shown yet: pick a run and press **Evaluate**."


def table_frame(view: Any) -> pd.DataFrame:
    return pd.DataFrame(view.table if view is not None else [], columns=TABLE_HEADERS)


def chart_frame(view: Any) -> pd.DataFrame:
    """Bars of the 0-1 scores, each metric's base bar next to its tuned bar."""
    points = view.chart if view is not None else []
    rows = [{"bar": f"{p['metric']} · {p['model']}", "value": p["value"], "model": p["model"]} for p in points]
    return pd.DataFrame(rows, columns=CHART_COLUMNS)


def answers_frame(rows: list[list[str]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=ANSWER_HEADERS)


def result_markdown(view: Any) -> str:
    """What was scored, the warnings first, then the notes and the judge."""
    if view is None:
        return NO_RESULT
    result = view.result
    data = result.get("data") or {}
    lines = [
        f"**{plain(result.get('run'))}** ({plain(result.get('weights'))}, step {result.get('step')}) · "
        f"{result.get('rows')} rows of {plain(data.get('source'))} · saved as `eval/{plain(view.file)}`"
    ]
    lines += [f"⚠ **{plain(flag[0].upper() + flag[1:])}.**" for flag in view.flags]
    if view.judge:
        lines.append(plain(view.judge[0].upper() + view.judge[1:]) + ".")
    if view.confusion:
        head, *body = view.confusion
        table = [f"| {' | '.join(plain(c) for c in head)} |", "|" + "---|" * len(head)]
        table += [f"| {' | '.join(plain(c) for c in row)} |" for row in body]
        lines.append("**Confusion matrix** (rows: true label, columns: predicted)\n\n" + "\n".join(table))
    lines += [f"*{plain(note[0].upper() + note[1:])}.*" for note in view.notes]
    return "\n\n".join(lines)


@dataclass
class EvaluateTab:
    studio: Studio
    source: Any = None
    refresh_btn: Any = None
    data: Any = None
    split: Any = None
    limit: Any = None
    max_new_tokens: Any = None
    base: Any = None
    lm_eval: Any = None
    judge: Any = None
    include_path: Any = None
    num_fewshot: Any = None
    temperature: Any = None
    run_btn: Any = None
    message: Any = None
    table: Any = None
    chart: Any = None
    answers: Any = None
    history: Any = None
    compare_runs: Any = None
    compare_btn: Any = None
    compare_message: Any = None
    curves: Any = None
    compare_table: Any = None
    compare_answers: Any = None

    # ----- choices
    @per_visitor
    def choices(self, current: str | None = None, request: gr.Request | None = None) -> tuple[dict, dict]:
        """(the evaluation sources, the runs to compare), keeping the current source when it is still there."""
        sources = self.studio.evaluation_sources()
        values = [v for _, v in sources]
        runs = [r.run_id for r in self.studio.runs()]
        return (
            gr.update(choices=sources, value=current if current in values else (values[0] if values else None)),
            gr.update(choices=runs),
        )

    # ----- one run
    def outputs(self, view: Any, message: str | None = None, history: dict | None = None) -> dict:
        """{message, table, chart, answers[, history]} for one evaluation (or the empty view)."""
        out = {
            self.message: message if message is not None else result_markdown(view),
            self.table: table_frame(view),
            self.chart: chart_frame(view),
            self.answers: answers_frame(view.answers if view is not None else []),
        }
        if history is not None:
            out[self.history] = history
        return out

    @per_visitor
    def evaluate(
        self,
        source: str | None,
        data: str,
        split: str,
        limit: Any,
        max_new_tokens: Any,
        base: bool,
        lm_eval: str,
        judge: str,
        include_path: str,
        num_fewshot: Any,
        temperature: Any,
        request: gr.Request | None = None,
        progress: gr.Progress = gr.Progress(),  # noqa: B008 - gradio injects the page's progress bar here
    ) -> dict:
        """Run one evaluation with the form's options; its result (or one line saying why not)."""
        if not source:
            return self.outputs(None, "⚠ Pick a run (or a checkpoint) to evaluate first.")
        options = {
            "data": (data or "").strip(),
            "split": (split or "").strip(),
            "limit": _whole(limit),
            "max_new_tokens": _whole(max_new_tokens) or 64,
            "base": bool(base),
            "lm_eval": [t.strip() for t in (lm_eval or "").split(",") if t.strip()],
            "judge": (judge or "").strip(),
            "include_path": (include_path or "").strip(),
            "num_fewshot": _whole(num_fewshot),
            "temperature": float(temperature or 0.0),
        }
        try:
            view = self.studio.evaluate(source, options, progress=lambda f, text: progress(f, desc=text))
        except UserError as exc:
            return self.outputs(None, f"⚠ Not evaluated: {plain(exc)}")
        except Exception as exc:  # never a traceback in the page
            return self.outputs(None, f"⚠ Not evaluated: {plain(one_line(exc))}")
        return self.outputs(view, history=self.history_update(source.partition("@")[0], view.file))

    def history_update(self, run_id: str, selected: str | None = None) -> dict:
        """The run's earlier evaluations to pick from (newest first)."""
        try:
            names = self.studio.evaluations(run_id) if run_id else []
        except UserError:
            names = []
        return gr.update(choices=names, value=selected if selected in names else (names[0] if names else None))

    @per_visitor
    def show(self, source: str | None, name: str | None = None, request: gr.Request | None = None) -> dict:
        """A run's newest evaluation (or the one picked under *Earlier evaluations*), without running anything."""
        run_id = (source or "").partition("@")[0]
        if not run_id:
            return self.outputs(None, history=gr.update(choices=[], value=None))
        try:
            view = self.studio.evaluation(run_id, name)
        except UserError as exc:
            return self.outputs(None, f"⚠ {plain(exc)}")
        history = self.history_update(run_id, view.file if view is not None else None)
        if view is None:
            return self.outputs(None, f"`{plain(run_id)}` has no evaluation yet: press **Evaluate**.", history)
        return self.outputs(view, history=history)

    # ----- runs compared
    @per_visitor
    def compare(self, run_ids: list[str] | None, request: gr.Request | None = None) -> dict:
        """Loss curves overlaid, latest scores side by side and answers to the same prompts for the picked runs."""
        try:
            comparison = self.studio.compare(list(run_ids or []))
        except UserError as exc:
            return self.compared(None, f"⚠ {plain(exc)}")
        except Exception as exc:
            return self.compared(None, f"⚠ Cannot compare: {plain(one_line(exc))}")
        return self.compared(comparison)

    def compared(self, comparison: Any, message: str = "") -> dict:
        runs = comparison.runs if comparison is not None else []
        metrics = comparison.table if runs else []
        answers = [[row["prompt"], *[row.get(r, "") for r in runs]] for row in (comparison.answers if runs else [])]
        notes = [f"*{plain(n)}.*" for n in (comparison.notes if runs else [])]
        return {
            self.compare_message: message or "\n\n".join(notes) or f"Compared {len(runs)} runs.",
            self.curves: gr.update(
                value=pd.DataFrame(comparison.curves if runs else [], columns=CURVE_COLUMNS), visible=bool(runs)
            ),
            self.compare_table: pd.DataFrame(metrics, columns=["Metric", *runs]),
            self.compare_answers: pd.DataFrame(answers, columns=["Prompt", *runs]),
        }


def _whole(value: Any) -> int | None:
    """A whole number from a number field (None when empty)."""
    if value is None or value == "":
        return None
    return int(value) if float(value).is_integer() else value


# ----------------------------------------------------------------------------------------------- layout
def build(studio: Studio) -> EvaluateTab:
    tab = EvaluateTab(studio)
    gr.Markdown(
        "Did the tuning work? Score a run against the model it started from on held-out data: the loss on the "
        "reference answers, how close the generated answers come to them (exact match, ROUGE-L, the last number), "
        "a preference run's rewards, optional **lm-evaluation-harness** tasks (the bundled `pirate_quiz` works "
        "offline) and an optional judge model. A vision-language run answers image rows with their pictures (named "
        "by file in the answers). Results are kept in the run folder (`eval/`)."
    )
    with gr.Row(equal_height=False):
        tab.source = gr.Dropdown(
            choices=[],
            allow_custom_value=True,  # an API client may name any run (RUN or RUN@STEP); the backend confines it
            label="Run or checkpoint",
            elem_id="eval-source",
            scale=3,
            min_width=240,
        )
        tab.refresh_btn = gr.Button("Refresh", elem_id="eval-refresh", scale=0, min_width=110)
    with gr.Row(equal_height=False):
        tab.data = gr.Textbox(
            label="Data", placeholder="empty: the run's evaluation split", elem_id="eval-data", min_width=200
        )
        tab.split = gr.Textbox(label="Split", placeholder="e.g. validation", elem_id="eval-split", min_width=120)
        tab.limit = gr.Number(label="Rows at most", value=None, precision=0, minimum=1, elem_id="eval-limit")
        tab.max_new_tokens = gr.Number(
            label="Answer length (tokens)", value=64, precision=0, minimum=1, maximum=1024, elem_id="eval-tokens"
        )
    with gr.Row(equal_height=False):
        tab.base = gr.Checkbox(label="Also score the base model", value=True, elem_id="eval-base")
        tab.lm_eval = gr.Textbox(
            label="lm-eval tasks", placeholder="e.g. pirate_quiz (comma-separated)", elem_id="eval-lm-eval"
        )
        tab.judge = gr.Textbox(label="Judge model", placeholder="optional: a Hub id", elem_id="eval-judge")
    with gr.Accordion("More options", open=False):
        with gr.Row():
            tab.include_path = gr.Textbox(label="lm-eval task folder (--include-path)", elem_id="eval-include-path")
            tab.num_fewshot = gr.Number(label="lm-eval few-shot examples", value=None, precision=0, minimum=0)
            tab.temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)")
    tab.run_btn = gr.Button("Evaluate", variant="primary", elem_id="eval-run")
    tab.message = gr.Markdown(NO_RESULT, elem_id="eval-message")
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=280):
            tab.table = gr.Dataframe(
                table_frame(None),
                label="Scores: base model and tuned",
                interactive=False,
                elem_id="eval-table",
                elem_classes=["fs-table", "fs-nowrap"],
            )
        with gr.Column(scale=3, min_width=280):
            tab.chart = gr.BarPlot(
                chart_frame(None),
                x="bar",
                y="value",
                color="model",
                title="Scores (0 to 1): base next to tuned",
                x_title="",
                y_title="",
                color_map={"base": "#9ca3af", "tuned": "#ea580c"},
                color_title="",
                y_lim=[0, 1],
                sort=None,
                x_label_angle=-30,
                elem_id="eval-chart",
                height=300,
            )
    tab.answers = gr.Dataframe(
        answers_frame([]),
        label="Answers to the same prompts",
        interactive=False,
        wrap=True,
        elem_id="eval-answers",
        elem_classes=["fs-table"],
    )
    tab.history = gr.Dropdown(
        choices=[],
        allow_custom_value=True,  # an API client may name any file; the backend shows only the run's own
        label="Earlier evaluations of this run",
        elem_id="eval-history",
    )
    with gr.Accordion("Compare runs", open=True, elem_id="eval-compare"):
        with gr.Row(equal_height=False):
            tab.compare_runs = gr.Dropdown(
                choices=[],
                multiselect=True,
                allow_custom_value=True,
                label="Runs to compare (two or more)",
                elem_id="compare-runs",
                scale=3,
            )
            tab.compare_btn = gr.Button("Compare", elem_id="compare-run", scale=0, min_width=110)
        tab.compare_message = gr.Markdown("", elem_id="compare-message")
        tab.curves = gr.LinePlot(
            pd.DataFrame(columns=CURVE_COLUMNS),
            x="step",
            y="loss",
            color="run",
            title="Training loss",
            x_axis_format="d",
            color_title="",
            elem_id="compare-curves",
            height=260,
            visible=False,  # shown with the first comparison
        )
        tab.compare_table = gr.Dataframe(
            pd.DataFrame(columns=["Metric"]),
            label="Latest scores side by side",
            interactive=False,
            elem_id="compare-table",
            elem_classes=["fs-table", "fs-nowrap"],
        )
        tab.compare_answers = gr.Dataframe(
            pd.DataFrame(columns=["Prompt"]),
            label="Answers to the same held-out prompts",
            interactive=False,
            wrap=True,
            elem_id="compare-answers",
            elem_classes=["fs-table"],
        )
    return tab


# ----------------------------------------------------------------------------------------------- events
def wire(tab: EvaluateTab, demo: gr.Blocks, evaluate_tab: Any = None) -> None:
    shown = [tab.message, tab.table, tab.chart, tab.answers, tab.history]
    form = [
        tab.source, tab.data, tab.split, tab.limit, tab.max_new_tokens, tab.base, tab.lm_eval, tab.judge,
        tab.include_path, tab.num_fewshot, tab.temperature,
    ]  # fmt: skip
    quiet = {"api_visibility": "private", "show_progress": "hidden"}
    refresh = (tab.choices, tab.source, [tab.source, tab.compare_runs])
    tab.refresh_btn.click(*refresh, **quiet).then(tab.show, tab.source, shown, **quiet)
    if evaluate_tab is not None:
        evaluate_tab.select(*refresh, **quiet).then(tab.show, tab.source, shown, **quiet)
    tab.source.input(tab.show, tab.source, shown, **quiet)
    tab.history.input(tab.show, [tab.source, tab.history], shown, **quiet)
    # API clients use /evaluate and /compare (ui/api.py)
    tab.run_btn.click(tab.evaluate, form, shown, api_visibility="private", concurrency_limit=1)
    compared = [tab.compare_message, tab.curves, tab.compare_table, tab.compare_answers]
    tab.compare_btn.click(tab.compare, tab.compare_runs, compared, api_visibility="private", concurrency_limit=None)
