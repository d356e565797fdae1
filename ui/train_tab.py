"""Train tab: start, stop and resume; the progress bar, the live loss plot, held-out answers then and now, the log
tail, and the list of runs.

A `gr.Timer` polls once a second. The tick reads the in-memory training state and, only when something changed
(a new step, status, message or event), the run's event log; otherwise it returns "no change" for every output.
A page reload or a second browser tab finds the running run on load and follows it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from finetune.errors import BusyError, UserError
from finetune.studio import Studio
from ui.config_tab import ConfigTab, form_values, warn
from ui.formatting import (
    RUN_HEADERS,
    log_lines,
    loss_rows,
    one_line,
    plain,
    problem_markdown,
    progress_html,
    run_rows,
    sample_rows,
)

TICK_SECONDS = 1.0
SERIES = ("train", "eval")


def loss_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The plot's data. Every series is present from the start (a blank point where it has none yet): the plot
    fixes its legend on first draw and would not show a series that appears later, such as the first evaluation."""
    have = {r["series"] for r in rows}
    blanks = [
        {"step": rows[0]["step"] if rows else 0, "loss": float("nan"), "series": s} for s in SERIES if s not in have
    ]
    return pd.DataFrame(rows + blanks, columns=["step", "loss", "series"])


EMPTY_LOSS = loss_frame([])


def signed_in_user(request: gr.Request | None) -> str | None:
    """The Hugging Face user signed in with the page's login button (a Space's OAuth session), if any."""
    underlying = getattr(request, "request", None) if request is not None else None
    scope = getattr(underlying, "scope", None)
    session = scope.get("session") if isinstance(scope, dict) else None
    info = session.get("oauth_info") if isinstance(session, dict) else None
    if not isinstance(info, dict) or (info.get("expires_at") or float("inf")) < time.time():
        return None
    name = (info.get("userinfo") or {}).get("preferred_username")
    return str(name) if name else None


def owner_of(request: gr.Request | None) -> str:
    """Who starts a run, as other users are told: the login name (password or Hugging Face sign-in), else the
    browser's address."""
    if request is None:
        return "the web app"
    if getattr(request, "username", None):
        return str(request.username)
    user = signed_in_user(request)
    if user:
        return user
    host = getattr(getattr(request, "client", None), "host", None)
    return f"a browser at {host}" if host else "the web app"


@dataclass
class TrainTab:
    studio: Studio
    config: ConfigTab | None = None
    start_btn: Any = None
    stop_btn: Any = None
    resume_btn: Any = None
    message: Any = None
    progress: Any = None
    problem: Any = None
    plot: Any = None
    samples: Any = None
    log: Any = None
    runs_table: Any = None
    run_pick: Any = None
    refresh_btn: Any = None
    timer: Any = None
    viewing: Any = None
    shown: Any = None

    # ----- reading a run
    def run_state(self, run_id: str) -> dict[str, Any] | None:
        """The live state when `run_id` is this process's current/last run, else its status file summary."""
        state = self.studio.state()
        if state is not None and state.run_id == run_id:
            return state.to_dict()
        for run in self.studio.runs():
            if run["run_id"] == run_id:
                return run
        return None

    def events(self, run_id: str) -> list[dict[str, Any]]:
        try:
            return self.studio.events(run_id)
        except UserError:
            return []

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
        return (*((state.run_id, state.status) if state is not None else ("", "")), _mtime(self.studio.manager.root))

    # ----- handlers
    def render(self, run_id: str) -> list:
        """[progress, problem, plot, samples, log] for one run (or the empty page)."""
        if not run_id:
            return [progress_html(None), "", EMPTY_LOSS, _samples_frame([], []), ""]
        state = self.run_state(run_id)
        events = self.events(run_id)
        rows = loss_rows(events)
        headers, samples = sample_rows(events, active=(state or {}).get("status") in ("pending", "loading", "running"))
        return [
            progress_html(state or {"run_id": run_id, "status": "unknown"}),
            problem_markdown(state),
            loss_frame(rows),
            _samples_frame(headers, samples),
            log_lines(events),
        ]

    def runs_outputs(self, selected: str | None = None) -> list:
        """[runs table, run choice]."""
        runs = self.studio.runs()
        ids = [r["run_id"] for r in runs]
        value = selected if selected in ids else (ids[0] if ids else None)
        return [
            pd.DataFrame(run_rows(runs), columns=RUN_HEADERS),
            gr.update(choices=[(_run_label(r), r["run_id"]) for r in runs], value=value),
        ]

    def buttons(self) -> list:
        state = self.studio.state()
        active = bool(state and state.active)
        return [gr.update(interactive=not active), gr.update(interactive=active)]

    def tick(self, viewing: str, shown: tuple | list | None) -> list:
        """Called by the timer: outputs [viewing, shown, progress, problem, plot, samples, log, runs table, run choice,
        start button, stop button]; "no change" for whatever did not change."""
        state = self.studio.state()
        if not viewing and state is not None and state.active:
            viewing = state.run_id  # someone started a run while this page showed none: follow it
        key, runs_key = self.key(viewing), self.runs_key()
        old_key, old_runs_key = (tuple(shown[0]), tuple(shown[1])) if shown else ((), ())
        skip = gr.skip()
        page = self.render(viewing) if key != old_key else [skip] * 5
        runs = self.runs_outputs(viewing) + self.buttons() if runs_key != old_runs_key else [skip] * 4
        return [viewing, [list(key), list(runs_key)], *page, *runs]

    def attach(self) -> list:
        """On page load: follow the running run, else show the newest run; same outputs as `tick`."""
        state = self.studio.state()
        if state is not None and state.active:
            viewing = state.run_id
        else:
            runs = self.studio.runs()
            viewing = runs[0]["run_id"] if runs else ""
        return self.tick(viewing, None)

    def select(self, run_id: str | None) -> list:
        """Show another run: same outputs as `tick`, redrawn."""
        return self.tick(run_id or "", None)

    def start(self, request: gr.Request, *values: Any) -> list:
        """Start a run from the Configure form: [message, viewing, shown, *Configure error outputs]."""
        form = form_values(values)
        _, problems = self.studio.check(form)
        if problems:
            first = next(iter(problems.values()))
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            return [
                f"⚠ Not started: {plain(first)}{more}. Fix it in the Configure tab.",
                gr.skip(),
                gr.skip(),
                *self.config.problem_updates(problems),
            ]
        try:
            state = self.studio.start(form, owner=owner_of(request))
        except BusyError as exc:
            warn(str(exc))
            return [f"⚠ {plain(exc)}", gr.skip(), gr.skip(), *self.config.problem_updates({})]
        except UserError as exc:
            field = getattr(exc, "field", None)
            problem = {field: str(exc)} if field in self.config.fields else {}
            return [f"⚠ Not started: {plain(exc)}", gr.skip(), gr.skip(), *self.config.problem_updates(problem)]
        except Exception as exc:  # never a traceback in the page
            return [f"⚠ Not started: {plain(one_line(exc))}", gr.skip(), gr.skip(), *self.config.problem_updates({})]
        message = (
            f"▶ Started run `{state.run_id}` at {time.strftime('%H:%M:%S')}. The model loads first (a few seconds), "
            "then the loss plot fills in."
        )
        return [message, state.run_id, None, *self.config.problem_updates({})]

    def stop(self) -> str:
        if self.studio.stop():
            return "■ Stopping: the current step finishes and a checkpoint is saved, so you can resume later."
        return "Nothing is running."

    def resume(self, request: gr.Request, run_id: str | None) -> list:
        """[message, viewing, shown]."""
        if not run_id:
            return ["Pick a run under *Runs* first.", gr.skip(), gr.skip()]
        try:
            state = self.studio.resume(run_id, owner=owner_of(request))
        except UserError as exc:
            warn(str(exc))
            return [f"⚠ {plain(exc)}", gr.skip(), gr.skip()]
        except Exception as exc:
            return [f"⚠ Not resumed: {plain(one_line(exc))}", gr.skip(), gr.skip()]
        return [f"▶ Resuming `{state.run_id}` from its last checkpoint.", state.run_id, None]


def _mtime(path: Path) -> float:
    try:
        return Path(path).stat().st_mtime
    except OSError:
        return 0.0


def _samples_frame(headers: list[str], rows: list[list[str]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=headers or ["Held-out prompt", "Answer before training", "Answer now"])


def _run_label(run: dict[str, Any]) -> str:
    return f"{run['run_id']} · {run.get('status', '?')}"


# ----------------------------------------------------------------------------------------------- layout
def build(studio: Studio) -> TrainTab:
    tab = TrainTab(studio)
    gr.Markdown(
        "Train with the settings from *Configure*. The plot shows the training loss falling (and the evaluation "
        "loss, if your data has an evaluation split). Below it, the same held-out questions are answered by the "
        "model before training and now, so you can see the tuning take hold."
    )
    with gr.Row():
        tab.start_btn = gr.Button("Start training", variant="primary", elem_id="train-start", scale=0, min_width=170)
        tab.stop_btn = gr.Button(
            "Stop", variant="stop", elem_id="train-stop", scale=0, min_width=100, interactive=False
        )
        tab.message = gr.Markdown("", elem_id="train-message")
    tab.progress = gr.HTML(progress_html(None), elem_id="train-progress")
    tab.problem = gr.Markdown("", elem_id="train-problem", elem_classes=["fs-problem"])
    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
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
        with gr.Column(scale=2):
            tab.log = gr.Textbox(
                label="Log (latest)", lines=14, max_lines=14, interactive=False, elem_id="train-log", autoscroll=True
            )
    tab.samples = gr.Dataframe(
        _samples_frame([], []),
        label="Held-out prompts: before training and now",
        interactive=False,
        wrap=True,
        elem_id="train-samples",
        column_widths=["20%", "40%", "40%"],
    )
    with gr.Accordion("Runs", open=True, elem_id="train-runs"):
        tab.runs_table = gr.Dataframe(
            pd.DataFrame(columns=RUN_HEADERS),
            interactive=False,
            elem_id="train-runs-table",
            wrap=True,
            show_label=False,
        )
        with gr.Row():
            tab.run_pick = gr.Dropdown(
                choices=[],
                allow_custom_value=True,  # an API client may name any run by its id; the backend confines it
                label="Run",
                elem_id="train-run-pick",
                scale=3,
                info="Show a past run, or resume a stopped / interrupted one.",
            )
            tab.resume_btn = gr.Button("Resume", elem_id="train-resume", scale=0, min_width=110)
            tab.refresh_btn = gr.Button("Refresh", elem_id="train-refresh", scale=0, min_width=110)
    tab.viewing = gr.State("")
    tab.shown = gr.State(None)
    tab.timer = gr.Timer(TICK_SECONDS)
    return tab


# ----------------------------------------------------------------------------------------------- events
def wire(tab: TrainTab, config: ConfigTab, demo: gr.Blocks) -> None:
    tab.config = config
    page = [
        tab.viewing,
        tab.shown,
        tab.progress,
        tab.problem,
        tab.plot,
        tab.samples,
        tab.log,
        tab.runs_table,
        tab.run_pick,
        tab.start_btn,
        tab.stop_btn,
    ]
    quiet = {"show_progress": "hidden", "concurrency_limit": None}
    tab.timer.tick(tab.tick, [tab.viewing, tab.shown], page, api_name="status", **quiet)
    demo.load(tab.attach, None, page, api_visibility="undocumented", **quiet)
    tab.start_btn.click(
        tab.start,
        config.inputs,
        [tab.message, tab.viewing, tab.shown, *config.error_outputs],
        api_name="start",
        concurrency_limit=None,
    )
    tab.stop_btn.click(tab.stop, None, tab.message, api_name="stop", concurrency_limit=None)
    tab.resume_btn.click(
        tab.resume, tab.run_pick, [tab.message, tab.viewing, tab.shown], api_name="resume", concurrency_limit=None
    )
    tab.run_pick.input(tab.select, tab.run_pick, page, api_visibility="undocumented", **quiet)
    tab.refresh_btn.click(tab.select, tab.viewing, page, api_visibility="undocumented", **quiet)
