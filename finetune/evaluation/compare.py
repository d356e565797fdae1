"""Runs side by side: their loss curves overlaid, the scores of each run's latest evaluation, and their answers to
the same held-out prompts (the evaluations' answers; without an evaluation, the answers sampled at the run's last
evaluation step during training)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from finetune.errors import UserError
from finetune.evaluation import report, store
from finetune.runs.events import LogEvent, SamplesEvent, latest, of_type, prompt_with_images
from finetune.runs.rundir import RunDir


@dataclass
class Comparison:
    """What the Compare view and `python -m finetune compare` show."""

    runs: list[str]
    metrics: list[dict[str, Any]]  # {"metric": label, RUN: value or None, ...}
    curves: list[dict[str, Any]]  # {"step", "loss", "run"}: each run's training loss
    answers: list[dict[str, Any]]  # {"prompt": text, RUN: answer, ...}
    notes: list[str] = field(default_factory=list)

    @property
    def table(self) -> list[list[str]]:
        """The scores as the tables show them: [metric, RUN's value, ...]."""
        return [[row["metric"], *[_cell(row.get(name)) for name in self.runs]] for row in self.metrics]


def compare_runs(runs: list[RunDir]) -> Comparison:
    """Two or more runs side by side (a one-line refusal for fewer, or for one named twice)."""
    names = [run.name for run in runs]
    if len(runs) < 2:
        raise UserError("runs: pick two or more runs to compare", field="runs")
    if len(set(names)) < len(names):
        raise UserError("runs: a run is named twice; pick different runs", field="runs")
    latest = {run.name: store.latest(run.path) for run in runs}
    notes = [
        f"{name} has no evaluation yet (Evaluate, or python -m finetune eval {name} --base)"
        for name, r in latest.items()
        if not r
    ]
    sources = {r["data"]["source"] for r in latest.values() if r and r.get("data")}
    if len(sources) > 1:
        notes.append(f"the evaluations scored different data ({'; '.join(sorted(sources))}): compare with care")
    answers = _answers(runs, latest)
    if not answers:
        notes.append("no prompt was answered by every run (they were evaluated and trained on different data)")
    return Comparison(
        runs=names,
        metrics=_metrics(latest),
        curves=[point for run in runs for point in _curve(run)],
        answers=answers,
        notes=notes,
    )


def _metrics(latest: dict[str, dict | None]) -> list[dict[str, Any]]:
    """One row per score any run has, its value for each run (None where a run lacks it)."""
    rows: dict[str, dict[str, Any]] = {}
    for name, result in latest.items():
        for row in report.metric_rows(result) if result else []:
            rows.setdefault(row["key"], {"metric": row["metric"]})[name] = row["tuned"]
    table = [{"metric": row["metric"], **{name: row.get(name) for name in latest}} for row in rows.values()]
    evaluated = {"metric": "evaluated on", **{n: (r or {}).get("data", {}).get("source") for n, r in latest.items()}}
    return [*table, evaluated] if table else table


def _curve(run: RunDir) -> list[dict[str, Any]]:
    return [{"step": e.step, "loss": e.loss, "run": run.name} for e in of_type(run.events(), LogEvent)]


def _answers(runs: list[RunDir], latest: dict[str, dict | None]) -> list[dict[str, Any]]:
    """Answers of every run to the prompts all of them answered: in their latest evaluations, else in the sample
    answers each logged at its last evaluation step while training."""
    for source in (lambda run: _evaluated_answers(latest[run.name]), _sampled_answers):
        answers = {run.name: source(run) for run in runs}
        order = list(next(iter(answers.values())))
        common = [p for p in order if all(p in given for given in answers.values())]
        if common:
            return [{"prompt": p, **{name: given[p] for name, given in answers.items()}} for p in common]
    return []


def _evaluated_answers(result: dict | None) -> dict[str, str]:
    # An image row's prompt names its pictures: one question asked of several pictures is several prompts.
    answers = (result or {}).get("answers") or []
    return {prompt_with_images(a["prompt"], a.get("images") or []): a.get("tuned", "") for a in answers}


def _sampled_answers(run: RunDir) -> dict[str, str]:
    last = latest(run.events(), SamplesEvent)
    return {s.shown_prompt: s.answer for s in last.samples if s.prompt} if last is not None else {}


def render_text(comparison: Comparison) -> str:
    """The comparison for the terminal: scores side by side, then the notes."""
    head = ["metric", *comparison.runs]
    body = comparison.table or [["(no evaluations)", *[""] * len(comparison.runs)]]
    lines = report.text_table([head, *body])
    for row in comparison.answers[:5]:
        lines += ["", f"prompt: {row['prompt']}"] + [f"  {name}: {row[name]}" for name in comparison.runs]
    lines += [f"note: {note}" for note in comparison.notes]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return report.number(float(value))
    return "–" if value is None else str(value)
