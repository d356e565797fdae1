"""Train tab: what is about to run, start, stop and resume; the progress bar, the live loss plot (and what the run's
objective logs beside it: a preference run's rewards), held-out answers then and now, the log tail, and the list of
runs by a readable name.

A `gr.Timer` polls once a second. The tick reads the in-memory training state and, only when something changed
(a new step, status, message or event), the run's event log; otherwise it changes nothing. Handlers return
{component: update} for what they change. A page reload or a second browser tab finds the running run on load and
follows it; a line about a start or resume (or another page's "busy") goes when that run ends.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from finetune import objectives
from finetune.config import FIELD_NAMES, field_label
from finetune.errors import BusyError, UserError
from finetune.studio import Event, RunPreview, RunSummary, Studio
from ui.config_tab import ConfigTab, form_stamp, kind_of, parse_number, warn
from ui.formatting import (
    COMPLETION_HEADERS,
    METHOD_WORDS,
    RUN_HEADERS,
    completion_rows,
    evaluation_markdown,
    log_lines,
    loss_rows,
    metric_facts,
    metric_rows,
    one_line,
    plain,
    problem_markdown,
    progress_html,
    run_rows,
    run_title,
    sample_rows,
    score_rows,
    size,
)
from ui.visitor import per_visitor

TICK_SECONDS = 1.0
SERIES = ("train", "eval")
CHANGED_SHOWN = 8  # settings changed from the defaults named in the summary (then "and N more")


def loss_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The plot's data. Every series is present from the start (a blank point where it has none yet): the plot
    fixes its legend on first draw and would not show a series that appears later, such as the first evaluation."""
    have = {r["series"] for r in rows}
    blanks = [
        {"step": rows[0]["step"] if rows else 0, "loss": float("nan"), "series": s} for s in SERIES if s not in have
    ]
    return pd.DataFrame(rows + blanks, columns=["step", "loss", "series"])


EMPTY_LOSS = loss_frame([])


def metric_frame(rows: list[dict[str, Any]], objective: Any = None) -> pd.DataFrame:
    """The objective plot's data (a preference run's reward margin and KL, ...) by step; the objective's fixed series
    are present from the start (a blank point), so the legend drawn first holds them."""
    have = {r["series"] for r in rows}
    fixed = [objective.fact_words(k) for k in objective.plotted if "*" not in k] if objective is not None else []
    blanks = [{"step": 0, "value": float("nan"), "series": s} for s in fixed if s not in have]
    return pd.DataFrame(rows + blanks, columns=["step", "value", "series"])


def scores_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The held-out answers' scores by step (ROUGE-L, exact match, number match against the references)."""
    return pd.DataFrame(rows, columns=["step", "value", "series"])


def plan_markdown(preview: RunPreview, changed: list[str], values: dict[str, Any] | None = None) -> str:
    """What Start would run, in plain words: model, data, method and goal, length, batch, where, memory."""
    if preview.max_steps > 0:
        length = f"**{preview.max_steps} steps**"
    else:
        length = f"**{preview.epochs:g} epoch{'s' if preview.epochs != 1 else ''}**"
    where = "a GPU" if preview.device == "cuda" else "this machine's CPU"
    if preview.processes > 1:
        where += f" × {preview.processes} processes"
    if (values or {}).get("runs_on") == "slurm":
        where = slurm_words(values or {})
    memory = (
        f"about **{size(preview.estimate_bytes)}** at the peak"
        if preview.estimate_bytes
        else f"no memory estimate ({plain(preview.estimate_note)})"
        if preview.estimate_note
        else "no memory estimate"
    )
    lines = [
        f"**Start will train** `{plain(preview.model)}` on `{plain(preview.dataset)}`: "
        f"{METHOD_WORDS.get(preview.method, preview.method)}, "
        f"{objectives.label(preview.objective)}.",
        f"{length} of {preview.effective_batch} examples each, up to {preview.max_seq_length} tokens per example, "
        f"on {where}; {memory}.",
        batches_text(preview),
    ]
    if changed:
        more = f" and {len(changed) - CHANGED_SHOWN} more" if len(changed) > CHANGED_SHOWN else ""
        lines.append(
            f"Changed from the defaults (in *Configure* or *Memory*): {', '.join(changed[:CHANGED_SHOWN])}{more}."
        )
    return "\n\n".join(line for line in lines if line)


def slurm_words(values: dict[str, Any]) -> str:
    """Where a Slurm run trains, in words: 'a Slurm cluster: 2 nodes × 8 GPUs, partition gpu, at most 04:00:00'."""
    nodes, gpus = parse_number(values.get("nodes")) or 1, parse_number(values.get("gpus_per_node")) or 0
    each = f"{gpus:g} GPU{'s' if gpus != 1 else ''}" if gpus else "their CPUs"
    words = f"a **Slurm cluster**: {nodes:g} node{'s' if nodes != 1 else ''} × {each}"
    if values.get("slurm_partition"):
        words += f", partition {plain(values['slurm_partition'])}"
    if values.get("slurm_time"):
        words += f", at most {plain(values['slurm_time'])}"
    return words + " (Start submits the batch script)"


def batches_text(preview: RunPreview) -> str:
    """How micro batches are laid out, in plain words (the plan's packing decision and its reason)."""
    if preview.packing:
        return "No compute on padding: each micro batch is packed into one row, attention kept within each example."
    note = preview.packing_note
    return f"Micro batches are padded to their longest example ({plain(note)})." if note else ""


def changed_settings(values: dict[str, Any], defaults: dict[str, Any]) -> list[str]:
    """'Label = value' for each setting that differs from the defaults."""
    out = []
    for name in FIELD_NAMES:
        value = values.get(name)
        if kind_of(name) in ("int", "float"):
            value = parse_number(value)  # number fields hold the text typed (an optional one may be left empty)
        if name in values and value != defaults.get(name) and {value, defaults.get(name)} != {"", None}:
            shown = str(value).lower() if isinstance(value, bool) else ("(empty)" if value in ("", None) else value)
            out.append(f"{field_label(name)} = {plain(shown)}")
    return out


@dataclass
class TrainTab:
    studio: Studio
    config: ConfigTab | None = None
    plan: Any = None
    plan_stamp: Any = None
    processes: Any = None
    where: Any = None
    script_btn: Any = None
    script: Any = None
    script_file: Any = None
    job_log: Any = None
    start_btn: Any = None
    stop_btn: Any = None
    resume_btn: Any = None
    message: Any = None
    progress: Any = None
    problem: Any = None
    plot: Any = None
    prefs: Any = None
    prefs_plot: Any = None
    scores_plot: Any = None
    evaluation: Any = None
    completions: Any = None
    samples: Any = None
    log: Any = None
    runs_table: Any = None
    run_pick: Any = None
    refresh_btn: Any = None
    timer: Any = None
    viewing: Any = None
    shown: Any = None

    # ----- what is about to run
    @per_visitor
    def describe(self, request: gr.Request | None = None, **values: Any) -> tuple[str, str]:
        """(the summary of what Start would run, the form stamp it is for)."""
        try:
            preview = self.studio.preview_run(values)
        except UserError as exc:
            text = f"⚠ Start would refuse these settings: {plain(exc)}. Fix it in the *Configure* tab."
            return text, form_stamp(values)
        except Exception as exc:  # never a traceback in the page
            return f"⚠ Cannot describe these settings: {plain(one_line(exc))}", form_stamp(values)
        text = plan_markdown(preview, changed_settings(values, self.studio.default_values()), values)
        return text, form_stamp(values)

    def show_plan(self, text: Any, stamp: Any, **values: Any) -> Any:
        """The summary, unless the form changed since it was computed (then nothing: a newer one is on its way)."""
        return text if stamp == form_stamp(values) else gr.skip()

    # ----- reading a run
    def run_state(self, run_id: str) -> dict[str, Any] | None:
        """The live state when `run_id` is this process's current/last run, else its summary."""
        state = self.studio.state()
        if state is not None and state.run_id == run_id:
            return state.to_dict()
        run = self.studio.run(run_id)
        return dataclasses.asdict(run) if run is not None else None

    def events(self, run_id: str) -> list[Event]:
        try:
            return self.studio.events(run_id)
        except UserError:
            return []

    def run_objective(self, run_id: str) -> objectives.Objective:
        """The objective's record the run trains with (plain SFT's for a run that cannot say)."""
        try:
            return self.studio.objective(run_id)
        except UserError:
            return objectives.OBJECTIVES[objectives.DEFAULT]

    def held_out_scores(self, run_id: str, events: list[Event]) -> list[dict[str, Any]]:
        """The run's held-out answers scored against their references, step by step ([] when it has none)."""
        try:
            return self.studio.held_out_scores(run_id, events)
        except UserError:
            return []

    def latest_evaluation(self, run_id: str) -> Any:
        """The run's newest evaluation (`python -m finetune eval` or the Evaluate tab), or None."""
        try:
            return self.studio.evaluation(run_id)
        except UserError:
            return None

    def key(self, run_id: str) -> tuple:
        """What, if changed, needs a redraw. Cheap: the in-memory state and a stat() or two of the run's files
        (a run of another process, such as a multi-GPU launch, is followed through its files)."""
        state = self.studio.state()
        if state is not None and state.run_id == run_id:
            stamp = self.studio.run_stamp(run_id)
            return (run_id, state.status, state.step, state.message, state.loss, state.eval_loss, stamp[0])
        if not run_id:
            return ("",)
        return (run_id, "files", *self.studio.run_stamp(run_id))

    def runs_key(self) -> tuple:
        """Changes when this process's run changes status or a run folder appears or goes."""
        state = self.studio.state()
        return (*((state.run_id, state.status) if state is not None else ("", "")), self.studio.runs_stamp())

    def table_key(self) -> tuple:
        """`runs_key` plus the live step: the runs table shows the step the run is at."""
        state = self.studio.state()
        live = (state.step, state.loss, state.eval_loss) if state is not None and state.active else ()
        return (*self.runs_key(), *live)

    # ----- handlers
    def render(self, run_id: str) -> dict:
        """{progress, problem, plot, preference line and plot, samples, log} for one run (or the empty page)."""
        if not run_id:
            return {
                self.progress: progress_html(None),
                self.problem: "",
                self.plot: EMPTY_LOSS,
                self.prefs: "",
                self.prefs_plot: gr.update(value=metric_frame([]), visible=False),
                self.scores_plot: gr.update(value=scores_frame([]), visible=False),
                self.evaluation: "",
                self.completions: completions_update(None, []),
                self.samples: _samples_frame([], []),
                self.log: "",
                self.job_log: gr.update(value="", visible=False),
            }
        state = self.run_state(run_id)
        events = self.events(run_id)
        objective = self.run_objective(run_id)
        metrics = metric_rows(events, objective)
        headers, samples = sample_rows(events, active=(state or {}).get("status") in ("pending", "loading", "running"))
        scores = score_rows(self.held_out_scores(run_id, events))
        return {
            self.progress: progress_html(state or {"run_id": run_id, "status": "unknown"}),
            self.problem: problem_markdown(state),
            self.plot: loss_frame(loss_rows(events)),
            self.prefs: metric_facts(events, objective),
            self.prefs_plot: gr.update(
                value=metric_frame(metrics, objective), visible=bool(metrics), title=objective.plot_title
            ),
            self.scores_plot: gr.update(value=scores_frame(scores), visible=bool(scores)),
            self.evaluation: evaluation_markdown(self.latest_evaluation(run_id)),
            self.completions: completions_update(*completion_rows(events)),
            self.samples: _samples_frame(headers, samples),
            self.log: log_lines(events, objective),
            self.job_log: self.job_log_update(run_id),
        }

    def job_log_update(self, run_id: str) -> dict:
        """The Slurm job's log of a run submitted to Slurm (hidden for a run that trained here)."""
        try:
            script, text = self.studio.submitted_script(run_id), self.studio.job_log(run_id)
        except UserError:
            script, text = "", ""
        return gr.update(value=text or "(the job has written nothing yet)", visible=bool(script))

    def runs_outputs(self, runs: list[RunSummary], selected: str | None = None) -> dict:
        """{run choice, start, stop, resume}: Resume only for a selected run that can resume, while nothing runs."""
        ids = [r.run_id for r in runs]
        value = selected if selected in ids else (ids[0] if ids else None)
        chosen = next((r for r in runs if r.run_id == value), None)
        state = self.studio.state()
        active = bool(state and state.active)
        return {
            self.run_pick: gr.update(choices=[(_run_label(r), r.run_id) for r in runs], value=value),
            self.start_btn: gr.update(interactive=not active),
            self.stop_btn: gr.update(interactive=active),
            self.resume_btn: gr.update(interactive=bool(chosen and chosen.resumable and not active)),
        }

    @per_visitor
    def tick(self, viewing: str, shown: tuple | list | None, request: gr.Request | None = None) -> dict:
        """Called by the timer: updates for whatever changed since `shown` (the keys drawn last), nothing else."""
        state = self.studio.state()
        if not viewing and state is not None and state.active:
            viewing = state.run_id  # someone started a run while this page showed none: follow it
        key, runs_key, table_key = self.key(viewing), self.runs_key(), self.table_key()
        old = [tuple(k) for k in shown] if shown and len(shown) == 3 else [(), (), ()]
        out: dict = {self.viewing: viewing, self.shown: [list(key), list(runs_key), list(table_key)]}
        if key != old[0]:
            out.update(self.render(viewing))
        if table_key != old[2]:
            runs = self.studio.runs()
            out[self.runs_table] = pd.DataFrame(run_rows(runs), columns=RUN_HEADERS)
            if runs_key != old[1]:
                out.update(self.runs_outputs(runs, viewing))
                if old[1] and not (state is not None and state.active):
                    out[self.message] = ""  # "Started…", "Resuming…" or "busy" ends with the run it was about
        return out

    @per_visitor
    def attach(self, request: gr.Request | None = None) -> dict:
        """On page load: follow the running run, else show the newest run; same outputs as `tick`."""
        state = self.studio.state()
        if state is not None and state.active:
            viewing = state.run_id
        else:
            runs = self.studio.runs()
            viewing = runs[0].run_id if runs else ""
        return self.tick(viewing, None)

    @per_visitor
    def select(self, run_id: str | None, request: gr.Request | None = None) -> dict:
        """Show another run: same outputs as `tick`, redrawn."""
        return self.tick(run_id or "", None)

    def processes_choice(self) -> dict:
        """The processes dropdown: 1..max_processes, shown only where more than one is possible."""
        most = max_processes(self.studio)
        return gr.update(choices=list(range(1, most + 1)), value=1, visible=most > 1)

    def start_kwargs(self, processes: Any) -> dict[str, int]:
        """`processes=N` for `Studio.start` when more than one is chosen (and the backend can launch them)."""
        count = int(processes or 1) if isinstance(processes, (int, float)) else 1
        if count > 1 and "processes" in inspect.signature(self.studio.start).parameters:
            return {"processes": count}
        return {}

    @per_visitor
    def start(self, request: gr.Request | None = None, processes: Any = 1, **values: Any) -> dict:
        """Start a run from the Configure form (and the processes choice): {message, viewing, shown, *Configure error
        outputs}."""
        problems_out = self.config.error_outputs
        _, problems = self.studio.check(values)
        if problems:
            first = next(iter(problems.values()))
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            text = f"⚠ Not started: {plain(first)}{more}. Fix it in the Configure tab."
            return {self.message: text, **dict(zip(problems_out, self.config.problem_updates(problems), strict=True))}
        try:
            state = self.studio.start(values, **self.start_kwargs(processes))
        except BusyError as exc:
            warn(str(exc))
            return {self.message: f"⚠ {plain(exc)}"}
        except UserError as exc:
            updates = self.config.exception_updates(exc) if getattr(exc, "field", None) in self.config.fields else []
            return {self.message: f"⚠ Not started: {plain(exc)}", **dict(zip(problems_out, updates, strict=False))}
        except Exception as exc:  # never a traceback in the page
            return {self.message: f"⚠ Not started: {plain(one_line(exc))}"}
        message = (
            f"▶ Started run `{state.run_id}` at {time.strftime('%H:%M:%S')}. The model loads first (a few seconds), "
            "then the loss plot fills in."
        )
        clean = dict(zip(problems_out, self.config.problem_updates({}), strict=True))
        script = self.studio.submitted_script(state.run_id) if values.get("runs_on") == "slurm" else ""
        if not script:
            return {self.message: message, self.viewing: state.run_id, self.shown: None, **clean}
        message = (
            f"▶ Submitted run `{state.run_id}` to Slurm at {time.strftime('%H:%M:%S')}: it waits in the queue until "
            "its nodes are free, then the loss plot fills in. Below: the batch script exactly as submitted."
        )
        return {
            self.message: message,
            self.viewing: state.run_id,
            self.shown: None,
            **clean,
            **self.script_updates(script),
        }

    def script_updates(self, script: str) -> dict:
        """{script, script_file}: a batch script shown and offered as a file."""
        path = self.studio.script_file(script)
        return {
            self.script: gr.update(value=script, visible=True),
            self.script_file: gr.update(value=str(path), visible=True),
        }

    @per_visitor
    def show_script(self, request: gr.Request | None = None, **values: Any) -> dict:
        """The batch script Start would submit for the form's settings: {message, script, script_file, output_dir}.
        The run folder it names goes into the form's output_dir, so Start submits exactly the script shown."""
        try:
            script, folder = self.studio.batch_script(values)
        except UserError as exc:
            hidden = gr.update(visible=False)
            return {self.message: f"⚠ {plain(exc)}", self.script: hidden, self.script_file: hidden}
        note = f"Start submits this script as shown; its run folder `{folder}` is now the *Run folder* in Configure."
        return {self.message: note, self.config.fields["output_dir"]: folder, **self.script_updates(script)}

    @per_visitor
    def stop(self, request: gr.Request | None = None, run: str | None = None) -> str:
        """Stop `run` (or this visitor's run training now) after a checkpoint. `request` first: the button sends no
        input, and gradio puts the request where the handler's signature has it."""
        try:
            stopping = self.studio.stop(run)
        except UserError as exc:
            return f"⚠ {plain(exc)}"
        if stopping and self.studio.stop_words():
            return f"■ {plain(self.studio.stop_words())}."
        if stopping:
            return "■ Stopping: the current step finishes and a checkpoint is saved, so you can resume later."
        return "Nothing is running."

    @per_visitor
    def resume(self, request: gr.Request | None, run_id: str | None) -> dict:
        """{message, viewing, shown} (only the message when nothing resumes)."""
        if not run_id:
            return {self.message: "Pick a run under *Runs* first."}
        try:
            state = self.studio.resume(run_id)
        except UserError as exc:
            warn(str(exc))
            return {self.message: f"⚠ {plain(exc)}"}
        except Exception as exc:
            return {self.message: f"⚠ Not resumed: {plain(one_line(exc))}"}
        return {
            self.message: f"▶ Resuming `{state.run_id}` from its last checkpoint.",
            self.viewing: state.run_id,
            self.shown: None,
        }


def completions_update(step: int | None, rows: list[list[str]]) -> dict:
    """The sampled answers of a run learning from rewards, newest step first shown; hidden for other runs."""
    label = f"Sampled answers at step {step}, with their rewards" if step is not None else "Sampled answers"
    return gr.update(value=pd.DataFrame(rows, columns=COMPLETION_HEADERS), visible=bool(rows), label=label)


def _samples_frame(headers: list[str], rows: list[list[str]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=headers or ["Held-out prompt", "Answer before training", "Answer now"])


def _run_label(run: RunSummary) -> str:
    return f"{run_title(run)} · {run.status} · {run.run_id}"


def max_processes(studio: Studio) -> int:
    """How many processes a run may use here (1 until the backend can launch process groups)."""
    probe = getattr(studio, "max_processes", None)
    try:
        return max(1, int(probe())) if callable(probe) else 1
    except Exception:  # a machine the backend cannot read: one process, as before
        return 1


# ----------------------------------------------------------------------------------------------- layout
def build(studio: Studio) -> TrainTab:
    tab = TrainTab(studio)
    gr.Markdown(
        "Train with the settings from *Start* or *Configure*. The plot shows the training loss falling (and the "
        "evaluation loss, if your data has an evaluation split). Below it, the same held-out questions are answered "
        "by the model before training and now, so you can see the tuning take hold."
    )
    tab.plan = gr.Markdown("", elem_id="train-plan", elem_classes=["fs-plan"])
    tab.plan_stamp = gr.State("")
    with gr.Row(equal_height=False):
        tab.where = gr.Radio(
            choices=[("This machine", "this_machine"), ("A Slurm cluster", "slurm")],
            value="this_machine",
            label="Where it runs",
            info="A Slurm cluster: nodes, GPUs per node, partition and time limit are in Configure → Where it runs.",
            elem_id="train-where",
            scale=3,
        )
        tab.script_btn = gr.Button("Show batch script", elem_id="train-show-script", scale=0, min_width=170)
    tab.script = gr.Code(
        label="Batch script (what Start submits with sbatch)",
        language="shell",
        visible=False,
        interactive=False,
        elem_id="train-script",
    )
    tab.script_file = gr.File(
        label="Download the batch script", visible=False, interactive=False, elem_id="train-script-file"
    )
    with gr.Row(equal_height=False):
        tab.processes = gr.Dropdown(  # offered on page load (counting GPUs imports torch: not while building)
            choices=[1],
            value=1,
            label="Processes (GPUs)",
            info="More than one launches a process group (torchrun) on this machine.",
            elem_id="train-processes",
            visible=False,
            scale=0,
            min_width=180,
        )
        tab.start_btn = gr.Button("Start training", variant="primary", elem_id="train-start", scale=0, min_width=170)
        tab.stop_btn = gr.Button(
            "Stop", variant="stop", elem_id="train-stop", scale=0, min_width=100, interactive=False
        )
        tab.message = gr.Markdown("", elem_id="train-message")
    tab.progress = gr.HTML(progress_html(None), elem_id="train-progress")
    tab.problem = gr.Markdown("", elem_id="train-problem", elem_classes=["fs-problem"])
    with gr.Row(equal_height=False):
        with gr.Column(scale=3, min_width=300):
            tab.plot = gr.LinePlot(
                EMPTY_LOSS,
                x="step",
                y="loss",
                color="series",
                title="Loss",
                x_title="step",
                y_title="loss",
                color_map={"train": "#ea580c", "eval": "#2563eb"},
                color_title="",
                x_axis_format="d",
                elem_id="train-plot",
                height=300,
            )
            tab.prefs = gr.HTML("", elem_id="train-prefs")
            tab.prefs_plot = gr.LinePlot(
                metric_frame([]),
                x="step",
                y="value",
                color="series",
                title="Preference: reward margin (chosen − rejected) and KL",
                x_title="step",
                y_title="",
                color_map={"reward margin": "#16a34a", "KL": "#7c3aed"},
                color_title="",
                x_axis_format="d",
                elem_id="train-prefs-plot",
                height=200,
                visible=False,
            )
            tab.scores_plot = gr.LinePlot(
                scores_frame([]),
                x="step",
                y="value",
                color="series",
                title="Held-out answers against their references",
                x_title="step",
                y_title="score (0-1)",
                color_title="",
                x_axis_format="d",
                y_lim=[0, 1],
                elem_id="train-scores-plot",
                height=200,
                visible=False,
            )
            tab.evaluation = gr.Markdown("", elem_id="train-evaluation")
        with gr.Column(scale=2, min_width=260):
            tab.log = gr.Textbox(
                label="Log (latest)", lines=14, max_lines=14, interactive=False, elem_id="train-log", autoscroll=True
            )
            tab.job_log = gr.Textbox(
                label="Slurm job log (slurm.log)",
                lines=10,
                max_lines=10,
                interactive=False,
                visible=False,
                elem_id="train-job-log",
                autoscroll=True,
            )
    tab.completions = gr.Dataframe(
        pd.DataFrame(columns=COMPLETION_HEADERS),
        label="Sampled answers",
        interactive=False,
        wrap=True,
        visible=False,
        elem_id="train-completions",
        elem_classes=["fs-table"],
        column_widths=["30%", "45%", "25%"],
    )
    tab.samples = gr.Dataframe(
        _samples_frame([], []),
        label="Held-out prompts: before training and now",
        interactive=False,
        wrap=True,
        elem_id="train-samples",
        elem_classes=["fs-table"],
        column_widths=["20%", "40%", "40%"],
    )
    with gr.Accordion("Runs", open=True, elem_id="train-runs"):
        tab.runs_table = gr.Dataframe(
            pd.DataFrame(columns=RUN_HEADERS),
            interactive=False,
            elem_id="train-runs-table",
            elem_classes=["fs-table", "fs-nowrap"],
            wrap=False,
            show_label=False,
        )
        with gr.Row():
            tab.run_pick = gr.Dropdown(
                choices=[],
                allow_custom_value=True,  # an API client may name any run by its id; the backend confines it
                label="Run",
                elem_id="train-run-pick",
                scale=3,
                min_width=240,
                info="Show a past run, or resume a stopped / interrupted one.",
            )
            tab.resume_btn = gr.Button("Resume", elem_id="train-resume", scale=0, min_width=110, interactive=False)
            tab.refresh_btn = gr.Button("Refresh", elem_id="train-refresh", scale=0, min_width=110)
    tab.viewing = gr.State("")
    tab.shown = gr.State(None)
    tab.timer = gr.Timer(TICK_SECONDS)
    return tab


# ----------------------------------------------------------------------------------------------- events
def wire(tab: TrainTab, config: ConfigTab, demo: gr.Blocks, train_tab: Any = None) -> None:
    tab.config = config
    page = [
        tab.viewing,
        tab.shown,
        tab.progress,
        tab.problem,
        tab.plot,
        tab.prefs,
        tab.prefs_plot,
        tab.scores_plot,
        tab.evaluation,
        tab.completions,
        tab.samples,
        tab.log,
        tab.job_log,
        tab.runs_table,
        tab.run_pick,
        tab.start_btn,
        tab.stop_btn,
        tab.resume_btn,
        tab.message,
    ]
    quiet = {"show_progress": "hidden", "concurrency_limit": None}
    # The page's own poll (bench/ui_latency.py measures it); API clients use /status (ui/api.py).
    tab.timer.tick(
        tab.tick, [tab.viewing, tab.shown], page, api_name="page_status", api_visibility="undocumented", **quiet
    )
    demo.load(tab.attach, None, page, api_visibility="undocumented", **quiet)
    demo.load(tab.processes_choice, None, tab.processes, api_visibility="private", show_progress="hidden")
    # What Start would run: said when the tab opens (pending first), shown only for the form it was computed for.
    # Its own queue: a slow estimate (a Hub model's config) never holds up a chat reply or a Check.
    pending = {"queue": False, "show_progress": "hidden", "api_visibility": "private"}
    # One description at a time, whichever change asked for it.
    describing = {
        "inputs_kwargs": config.form,
        "api_visibility": "private",
        "show_progress": "hidden",
        "concurrency_id": "describe-run",
        "concurrency_limit": 1,
    }
    if train_tab is not None:
        train_tab.select(lambda: "⏳ Reading the settings and estimating the memory…", None, tab.plan, **pending).then(
            tab.describe, None, [tab.plan, tab.plan_stamp], **describing
        ).then(tab.show_plan, [tab.plan, tab.plan_stamp], tab.plan, inputs_kwargs=config.form, **pending)
    # Where it runs: the Train tab's choice is the config's runs_on (the Slurm settings are in Configure).
    runs_on = config.fields["runs_on"]
    tab.where.input(lambda value: value, tab.where, runs_on, api_visibility="private", show_progress="hidden").then(
        tab.describe, None, [tab.plan, tab.plan_stamp], **describing
    )
    runs_on.change(lambda value: value, runs_on, tab.where, api_visibility="private", show_progress="hidden")
    tab.script_btn.click(
        tab.show_script,
        None,
        [tab.message, tab.script, tab.script_file, config.fields["output_dir"]],
        inputs_kwargs=config.form,
        api_visibility="private",
        concurrency_limit=None,
    )
    tab.start_btn.click(
        tab.start,
        None,
        [tab.message, tab.viewing, tab.shown, *config.error_outputs, tab.script, tab.script_file],
        inputs_kwargs={**config.form, "processes": tab.processes},
        api_visibility="private",  # API clients use /start (ui/api.py)
        concurrency_limit=None,
    )
    tab.stop_btn.click(tab.stop, None, tab.message, api_visibility="private", concurrency_limit=None)
    tab.resume_btn.click(
        tab.resume,
        tab.run_pick,
        [tab.message, tab.viewing, tab.shown],
        api_visibility="private",
        concurrency_limit=None,
    )
    tab.run_pick.input(tab.select, tab.run_pick, page, api_visibility="undocumented", **quiet)
    tab.refresh_btn.click(tab.select, tab.viewing, page, api_visibility="undocumented", **quiet)
