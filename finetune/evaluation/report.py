"""An evaluation as a person reads it: rows of a table (metric, base, tuned, change), points for a chart, a one-line
summary for the run list, and the whole report as plain text for the terminal. Pure functions of the stored result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from finetune.evaluation.metrics import METRICS
from finetune.objectives import Objective
from finetune.runs.events import prompt_with_images

# Scores on a 0-1 scale: the chart draws these (a loss or a perplexity on the same axis would flatten them).
SHARES = ("exact_match", "rouge_l", "number_match", "accuracy", "macro_f1", "reward_accuracy", "judge_win_rate")


@dataclass(frozen=True)
class EvalView:
    """One evaluation as the app shows it (what `Studio.evaluate` and `Studio.evaluation` return)."""

    result: dict[str, Any]  # the stored evaluation (eval/<timestamp>.json)
    file: str  # its file name under the run's eval/ folder
    table: list[list[str]] = field(default_factory=list)  # [metric, base, tuned, change] as the tables show them
    chart: list[dict[str, Any]] = field(default_factory=list)  # chart_rows
    answers: list[list[str]] = field(default_factory=list)  # answer_table
    summary: str = ""

    @property
    def flags(self) -> list[str]:
        return list(self.result.get("flags") or [])

    @property
    def notes(self) -> list[str]:
        return list(self.result.get("notes") or [])

    @property
    def confusion(self) -> list[list[str]]:
        """A classifier's confusion matrix as table rows (header first), [] for other runs."""
        return confusion_table(self.result) if self.result.get("confusion") else []

    @property
    def judge(self) -> str:
        """The judge's result in one sentence ("" without a judge)."""
        verdict = self.result.get("judge")
        return f"judge {verdict['model']}: {judge_text(verdict)}" if verdict else ""


def view(result: dict[str, Any], file: str, objective: Objective) -> EvalView:
    """The app's view of a stored evaluation of a run that trains with `objective`."""
    table = [[r["metric"], number(r["base"]), number(r["tuned"]), change(r["change"])] for r in metric_rows(result)]
    return EvalView(result, file, table, chart_rows(result), answer_table(result), summary(result, objective))


def label(name: str) -> str:
    """A score's name as tables show it."""
    return METRICS[name].label if name in METRICS else name.replace("_", " ")


def metric_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """[{metric, key, base, tuned, change}] for every score of the tuned model (base and change None without base);
    lm-eval tasks follow as "TASK METRIC" rows."""
    tuned, base = result.get("tuned") or {}, result.get("base") or {}
    out = [_row(label(name), name, base.get(name), value) for name, value in tuned.items()]
    harness = result.get("lm_eval") or {}
    for task, values in (harness.get("tuned") or {}).items():
        before = (harness.get("base") or {}).get(task, {})
        for name, value in values.items():
            if not name.endswith("_stderr"):
                out.append(_row(f"lm-eval {task} {name}", f"{task}:{name}", before.get(name), value))
    return out


def _row(shown: str, key: str, base: float | None, tuned: float) -> dict[str, Any]:
    return {"metric": shown, "key": key, "base": base, "tuned": tuned, "change": None if base is None else tuned - base}


def chart_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """{metric, value, model} points of the 0-1 scores (lm-eval accuracies included), base next to tuned."""
    points = []
    for row in metric_rows(result):
        name = row["key"].split(":")[-1]
        if name not in SHARES and not name.startswith("acc"):
            continue
        for model in ("base", "tuned"):
            if row[model] is not None:
                points.append({"metric": row["metric"], "value": float(row[model]), "model": model})
    return points


def summary(result: dict[str, Any] | None, objective: Objective) -> str:
    """A run's latest evaluation in a few words: the headline score of the run's objective (its record's `headline`),
    against the base when known, and a warning."""
    if not result:
        return ""
    tuned, base = result.get("tuned") or {}, result.get("base") or {}
    name = next((n for n in objective.headline if n in tuned), None)
    if name is None:
        return "evaluated"
    text = f"{label(name)} {number(tuned[name])}"
    if name in base:
        text += f" (base {number(base[name])})"
    if result.get("flags"):
        text = "⚠ " + text
    return text


def number(value: float | None) -> str:
    """A score as tables show it: 3 decimals, or 4 significant digits for large values."""
    if value is None:
        return "–"
    return f"{value:.4g}" if abs(value) >= 10 else f"{value:.3f}"


def change(value: float | None) -> str:
    return "" if value is None else f"{value:+.3f}" if abs(value) < 10 else f"{value:+.4g}"


def render_text(result: dict[str, Any], path: Any = None) -> str:
    """The whole evaluation for the terminal: what was scored, the table, warnings, notes, the judge, where it is."""
    data = result.get("data") or {}
    lines = [
        f"{result.get('run')} ({result.get('weights')}, step {result.get('step')}), goal {result.get('goal')}: "
        f"{result.get('rows')} rows of {data.get('source')}",
        "",
    ]
    if result.get("base"):
        table = [["metric", "base", "tuned", "change"]]
        table += [
            [r["metric"], number(r["base"]), number(r["tuned"]), change(r["change"])] for r in metric_rows(result)
        ]
    else:
        table = [["metric", "tuned"]] + [[r["metric"], number(r["tuned"])] for r in metric_rows(result)]
    lines += text_table(table)
    if result.get("judge"):
        lines += ["", f"judge {result['judge']['model']}: {judge_text(result['judge'])}"]
    if result.get("confusion"):
        lines += ["", "confusion matrix (rows: true label, columns: predicted)", *text_table(confusion_table(result))]
    lines += answer_lines(result)
    for flag in result.get("flags") or []:
        lines.append(f"warning: {flag}")
    for note in result.get("notes") or []:
        lines.append(f"note: {note}")
    if path is not None:
        lines.append(f"saved: {path}")
    return "\n".join(lines)


ANSWERS_SHOWN = 5  # rows whose answers the terminal report prints (--predictions FILE writes every row)


def answer_lines(result: dict[str, Any]) -> list[str]:
    """The first rows' prompts (an image row's with its pictures' file names), references and each model's answer."""
    answers = result.get("answers") or []
    if not answers:
        return []
    lines = ["", f"answers (the first {min(len(answers), ANSWERS_SHOWN)} of {len(answers)} rows):"]
    for row in answers[:ANSWERS_SHOWN]:
        lines.append(f"  prompt: {_one_line(prompt_with_images(row.get('prompt') or '', row.get('images') or []))}")
        for who in ("reference", "base", "tuned"):
            if row.get(who) is not None:
                lines.append(f"    {who}: {_one_line(row[who])}")
    return lines


def _one_line(text: str, limit: int = 160) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def confusion_table(result: dict[str, Any]) -> list[list[str]]:
    """A classifier's confusion matrix as table rows: a header of predicted labels, then each true label's counts."""
    confusion = result.get("confusion") or {}
    labels = [str(name) for name in confusion.get("labels") or []]
    matrix = confusion.get("tuned") or []
    rows = [[label, *[str(n) for n in counts]] for label, counts in zip(labels, matrix, strict=True)]
    return [["true \\ predicted", *labels], *rows]


def judge_text(verdict: dict[str, Any]) -> str:
    """The judge's result in one sentence: wins, ties, losses, the win rate with its interval, how often the two
    answer orders agreed."""
    low, high = verdict["interval"]
    return (
        f"the tuned answer won {verdict['wins']}, tied {verdict['ties']} and lost {verdict['losses']} of "
        f"{verdict['prompts']} prompts (both answer orders); win rate {verdict['judge_win_rate']:.2f}, 95% interval "
        f"{low:.2f}-{high:.2f}; the two orders agreed on {verdict['consistent']:.0%}"
    )


def text_table(table: list[list[str]]) -> list[str]:
    """Rows of cells as aligned lines: the first column left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return ["  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)) for r in table]


def answer_table(result: dict[str, Any], limit: int = 20) -> list[list[str]]:
    """[prompt, reference, base answer, tuned answer] rows (the first `limit`); an image row's prompt names its
    pictures' files where its `<image>` tags stand."""
    return [
        [
            prompt_with_images(a.get("prompt") or "", a.get("images") or []),
            a.get("reference") or "",
            a.get("base", ""),
            a.get("tuned", ""),
        ]
        for a in (result.get("answers") or [])[:limit]
    ]
