"""One evaluation of a run: check every input, load the run's model as chat loads it, score it (and the base model on
the same rows), run lm-eval tasks and the judge when asked, and keep the result in the run folder.

Every refusal (bad option, unknown lm-eval task, a judge that does not fit, a run still training without a checkpoint,
data the run cannot read) comes before any model loads, in one line naming its field. The run's trained files are
only read; the result is a new `eval/<timestamp>.json` (finetune/evaluation/store.py).
"""

from __future__ import annotations

import gc
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from finetune.data.kinds import DataKind
from finetune.errors import UserError
from finetune.evaluation import generation, harness, judge, metrics, rows, store
from finetune.objectives import Objective
from finetune.runs.rundir import ACTIVE, RunDir

if TYPE_CHECKING:
    from finetune.plan import RunPlan

FORMAT = 1  # the layout of an evaluation file
MAX_NEW_TOKENS = 1024
TEXT_LIMIT = 1000  # characters of a text option (a data path, a model id, a task name)
TASKS_LIMIT = 32  # lm-eval tasks in one evaluation
Report = Callable[[float, str], None]  # (fraction done, what is happening)


@dataclass
class EvalOptions:
    """What to evaluate and how (the CLI's flags, the Evaluate tab's fields)."""

    data: str = ""  # other data to score (a file, bundled:NAME, a Hub id); default: the run's evaluation split
    split: str = ""  # a split of that data (or of the run's own)
    limit: int | None = None  # score at most this many rows (and examples of each lm-eval task)
    max_new_tokens: int = 64
    base: bool = False  # also score the base model on the same rows
    temperature: float = 0.0  # 0: greedy, the same answers every time
    checkpoint: int | None = None  # a checkpoint's step instead of the final weights
    lm_eval: list[str] = field(default_factory=list)  # lm-evaluation-harness tasks
    include_path: str = ""  # a folder of lm-eval task files
    num_fewshot: int | None = None
    judge: str = ""  # a causal LM that compares base and tuned answers
    predictions: str = ""  # a JSON-lines file: one line per row with each model's output

    def check(self) -> None:
        """Refuse, in one line naming the option, a value out of bounds."""
        for name in ("data", "split", "judge", "include_path", "predictions"):
            value = getattr(self, name)
            if not isinstance(value, str) or len(value) > TEXT_LIMIT:
                raise UserError(f"{name}: give text of at most {TEXT_LIMIT} characters", field=name)
        if not isinstance(self.lm_eval, list) or len(self.lm_eval) > TASKS_LIMIT:
            raise UserError(f"lm_eval: name at most {TASKS_LIMIT} tasks", field="lm_eval")
        if not all(isinstance(t, str) and 0 < len(t) <= TEXT_LIMIT for t in self.lm_eval):
            raise UserError("lm_eval: each task is a name, such as pirate_quiz", field="lm_eval")
        if self.limit is not None and (not isinstance(self.limit, int) or self.limit < 1):
            raise UserError("limit: give a whole number of rows, 1 or more", field="limit")
        if not isinstance(self.max_new_tokens, int) or not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            raise UserError(f"max_new_tokens: use 1 to {MAX_NEW_TOKENS}", field="max_new_tokens")
        if not isinstance(self.temperature, (int, float)) or not 0.0 <= float(self.temperature) <= 2.0:
            raise UserError("temperature: use 0 (greedy) to 2", field="temperature")
        if self.num_fewshot is not None and (not isinstance(self.num_fewshot, int) or self.num_fewshot < 0):
            raise UserError("num_fewshot: give a whole number, 0 or more", field="num_fewshot")
        if self.checkpoint is not None and (not isinstance(self.checkpoint, int) or self.checkpoint < 1):
            raise UserError("checkpoint: give the step of one of the run's checkpoints", field="checkpoint")
        if (self.num_fewshot is not None or self.include_path) and not self.lm_eval:
            raise UserError("lm_eval: --num-fewshot and --include-path apply to lm-eval tasks; name them", "lm_eval")


@dataclass
class Weights:
    """Which of the run's weights are evaluated."""

    path: Path
    name: str  # "final" or "checkpoint-N"
    step: int
    note: str = ""


@dataclass
class Outputs:
    """What one model produced on the rows."""

    answers: list[str] | None = None
    nll: list[tuple[float, int]] | None = None  # the scored answers (SFT: the reference; preference: chosen)
    rejected_nll: list[tuple[float, int]] | None = None
    predicted: list[int] | None = None
    label_nll: list[float] | None = None


@dataclass
class Inputs:
    """Everything an evaluation checked before any model loads."""

    run: RunDir
    plan: RunPlan  # the run's own (plan.json): how its model loads, and its objective's record
    weights: Weights
    selection: rows.Selection
    tokenizer: Any
    tasks: Any = None  # harness.Tasks when lm-eval tasks were named
    fit: Any = None  # judge.JudgeFit when a judge was named
    predictions: Path | None = None
    label_names: list[str] = field(default_factory=list)

    @property
    def config(self) -> Any:
        return self.plan.config

    @property
    def objective(self) -> Objective:
        return self.plan.objective


def evaluate_run(run: RunDir, options: EvalOptions, progress: Report | None = None) -> tuple[dict[str, Any], Path]:
    """Evaluate a run; (the result, the eval/ file it was written to)."""
    inputs = check_inputs(run, options)
    with_base = options.base or inputs.fit is not None
    steps = Steps(_units(inputs.selection, inputs.objective, options, inputs.tasks, with_base), progress)
    started = time.time()
    tuned, base, harness_results = score_models(inputs, options, steps, with_base)
    result = assemble(inputs, options, tuned, base, with_base)
    if harness_results:
        result["lm_eval"] = {"tasks": inputs.tasks.names, "num_fewshot": options.num_fewshot, **harness_results}
    if inputs.fit is not None and base is not None and base.answers is not None and tuned.answers is not None:
        judged = _judge(inputs, tuned, base, steps)
        result.update(judge=judged)
        result["tuned"]["judge_win_rate"] = judged["judge_win_rate"]
        result["notes"].append(f"judge {judged['model']}: {judged['note']}")
    result["seconds"] = round(time.time() - started, 1)
    if inputs.predictions is not None:
        write_predictions(inputs.predictions, inputs.selection, tuned, base, inputs.label_names)
    path = store.save(run.path, result)
    steps.done()
    return result, path


def check_inputs(run: RunDir, options: EvalOptions) -> Inputs:
    """Every refusal an evaluation can make, before any model loads: options, weights, tasks, judge, data."""
    from finetune.model import loading
    from finetune.model.inference import label_names

    options.check()
    plan = run.load_plan()
    config, answers = plan.config, not plan.is_classifier
    weights = pick_weights(run, options.checkpoint)
    if not answers and (options.judge or options.lm_eval):
        key = "judge" if options.judge else "lm_eval"
        raise UserError(f"{key}: applies to runs that answer in text; a classification run answers with labels", key)
    if plan.vision is not None and options.lm_eval:
        raise UserError(
            "lm_eval: the harness's tasks are text tasks for a text model; a vision-language run is evaluated on "
            "image rows (its evaluation split, or --data FILE)",
            field="lm_eval",
        )
    tasks = harness.check_tasks(options.lm_eval, options.include_path) if options.lm_eval else None
    fit = judge.check_fits(judge.plan_of(options.judge, plan)) if options.judge else None
    predictions = _predictions_path(options.predictions, run)
    # A vision-language run answers through its processor (its tokenizer and image processor), as chat loads it.
    tokenizer = loading.load_processor(plan) if plan.vision is not None else loading.load_tokenizer(config)
    names = label_names(run.path, config) if not answers else []
    selection = rows.select(config, tokenizer, options.data, options.split, options.limit, names)
    if fit is not None and not any(row.prompt for row in selection.rows):
        raise UserError("judge: the data has no prompts to answer (plain text); choose data with prompts", "judge")
    return Inputs(run, plan, weights, selection, tokenizer, tasks, fit, predictions, names)


def score_models(
    inputs: Inputs, options: EvalOptions, steps: Steps, with_base: bool
) -> tuple[Outputs, Outputs | None, dict[str, Any]]:
    """(the tuned model's outputs, the base's or None, {"tuned": lm-eval results, "base": ...}). The base is the
    tuned model with its adapter off (LoRA, QLoRA), or the starting weights loaded once the tuned model is gone."""
    objective, tokenizer, tasks = inputs.objective, inputs.tokenizer, inputs.tasks
    harness_results: dict[str, Any] = {}

    def run_all(model: Any, who: str, answers: bool) -> Outputs:
        family = inputs.plan.vision.family if inputs.plan.vision is not None else ""
        out = score(
            model,
            tokenizer,
            inputs.selection,
            objective,
            inputs.config.max_seq_length,
            options,
            steps,
            who,
            answers,
            family,
        )
        if tasks is not None and (who == "tuned" or options.base):
            harness_results[who] = _lm_eval(model, tokenizer, tasks, options, steps, who)
        return out

    model = _load(inputs.plan, inputs.run, inputs.weights)
    tuned = run_all(model, "tuned", answers=True)
    base = None
    if not objective.is_classifier and (with_base or objective.eval_rewards):  # rewards are relative to the base
        if hasattr(model, "disable_adapter"):
            with model.disable_adapter():
                base = run_all(model, "base", answers=with_base)
        else:
            model = None
            _release()
            model, _ = _load_base(inputs.plan)
            base = run_all(model, "base", answers=with_base)
    model = None
    _release()
    return tuned, base, harness_results


def _judge(inputs: Inputs, tuned: Outputs, base: Outputs, steps: Steps) -> dict[str, Any]:
    """The judge's verdicts on every prompted row (both orders)."""
    prompted = [i for i, row in enumerate(inputs.selection.rows) if row.prompt]
    return judge.judge(
        inputs.fit,
        [_question(inputs.selection.rows[i]) for i in prompted],
        [base.answers[i] for i in prompted],
        [tuned.answers[i] for i in prompted],
        steps.stage("judging (both orders)", len(prompted)),
    )


def pick_weights(run: RunDir, checkpoint: int | None) -> Weights:
    """The final weights of a finished run, a named checkpoint, or the newest checkpoint of a run still training
    (or stopped); a one-line refusal when there is none."""
    status = run.effective_status()
    complete = {int(p.name.split("-")[-1]): p for p in run.checkpoints()}
    if checkpoint is not None:
        if checkpoint not in complete:
            have = ", ".join(str(s) for s in sorted(complete)) or "none yet"
            raise UserError(
                f"checkpoint: {checkpoint} is not a checkpoint of {run.name} (checkpoints: {have})", field="checkpoint"
            )
        return Weights(complete[checkpoint], f"checkpoint-{checkpoint}", checkpoint)
    if run.has_final_model() and status not in ACTIVE:
        return Weights(run.path, "final", int(run.read_status().get("step") or 0))
    if not complete:
        raise UserError(
            f"run: {run.name} is {status} and has no checkpoint yet; evaluate it once it has saved one "
            "(every save_steps) or has finished",
            field="run",
        )
    step = max(complete)
    doing = "is still training" if status in ACTIVE else f"is {status}"
    return Weights(
        complete[step], f"checkpoint-{step}", step, f"{run.name} {doing}: its checkpoint at step {step} was evaluated"
    )


class Steps:
    """The evaluation's progress, as a fraction of all rows to run through every pass, and what runs now."""

    def __init__(self, total: int, report: Report | None) -> None:
        self.total, self.done_units, self.report = max(1, total), 0, report

    def stage(self, text: str, count: int) -> Callable[[int], None]:
        """A tick for one pass over `count` units: reports "text done/count" as it goes."""
        seen = {"n": 0}
        self._say(f"{text} 0/{count}")

        def tick(n: int) -> None:
            seen["n"] += n
            self.done_units += n
            self._say(f"{text} {seen['n']}/{count}")

        return tick

    def done(self) -> None:
        self.done_units = self.total
        self._say("done")

    def _say(self, text: str) -> None:
        if self.report is not None:
            self.report(min(1.0, self.done_units / self.total), text)


def _units(selection: rows.Selection, objective: Objective, options: EvalOptions, tasks: Any, with_base: bool) -> int:
    """Rows through every pass the evaluation will make (lm-eval counts one unit per task and model)."""
    answers = not objective.is_classifier
    scored = sum(1 for r in selection.rows if r.scored) + sum(1 for r in selection.rows if r.rejected)
    prompted = sum(1 for r in selection.rows if r.prompt) if answers else 0
    total = scored + prompted + (0 if answers else len(selection.rows))
    if answers and (with_base or objective.eval_rewards):
        total += scored + (prompted if with_base else 0)
    if tasks is not None:
        total += len(tasks.names) * (2 if options.base else 1)
    return total + (prompted if options.judge else 0)


def score(
    model: Any,
    tokenizer: Any,
    selection: rows.Selection,
    objective: Objective,
    max_length: int,
    options: EvalOptions,
    steps: Steps,
    who: str,
    answers: bool,
    family: str = "",
) -> Outputs:
    """Every pass the objective's scores need over the rows, for one model (`family`: a vision-language plan's, for
    the layout of its image rows)."""
    out = Outputs()
    if objective.is_classifier:
        tick = steps.stage(f"{who}: labelling", len(selection.rows))
        out.predicted, out.label_nll = generation.labels(model, tokenizer, selection.rows, max_length, tick)
        return out
    scored = [row.scored for row in selection.rows if row.scored]
    if scored:
        tick = steps.stage(f"{who}: scoring the reference answers", len(scored))
        encoded = [row.encoded for row in selection.rows if row.scored and row.encoded is not None]
        if encoded:  # image rows: their pictures go through the model with them
            out.nll = generation.image_answer_nll(model, tokenizer, encoded, family, tick)
        else:
            out.nll = generation.answer_nll(model, tokenizer, scored, max_length, tick)
    rejected = [row.rejected for row in selection.rows if row.rejected]
    if rejected:
        tick = steps.stage(f"{who}: scoring the rejected answers", len(rejected))
        out.rejected_nll = generation.answer_nll(model, tokenizer, rejected, max_length, tick)
    prompted = [row for row in selection.rows if row.prompt]
    if answers and prompted:
        tick = steps.stage(f"{who}: answering", len(prompted))
        produced = iter(
            generation.answers(model, tokenizer, prompted, options.max_new_tokens, options.temperature, tick)
        )
        out.answers = [next(produced) if row.prompt else "" for row in selection.rows]
    return out


def _lm_eval(model: Any, tokenizer: Any, tasks: Any, options: EvalOptions, steps: Steps, who: str) -> dict:
    """One model's lm-eval results (one progress unit per task)."""
    tick = steps.stage(f"{who}: lm-eval {', '.join(tasks.names)}", len(tasks.names))
    out = harness.run_tasks(model, tokenizer, tasks, options.num_fewshot, options.limit)
    tick(len(tasks.names))
    return out


def assemble(
    inputs: Inputs, options: EvalOptions, tuned: Outputs, base: Outputs | None, with_base: bool
) -> dict[str, Any]:
    """The evaluation as it is stored: {"rows", "tuned", "base", ...} (docs/evaluate.md describes it)."""
    run, objective, weights, selection = inputs.run, inputs.objective, inputs.weights, inputs.selection
    answers = not objective.is_classifier
    notes = [weights.note] if weights.note else []
    notes += selection.notes
    if answers and selection.rows and not selection.has_references and selection.kind != DataKind.TEXT:
        notes.append("no reference answers: the answers are shown side by side, without scores")
    result: dict[str, Any] = {
        "format": FORMAT,
        "time": time.time(),
        "run": run.name,
        "weights": weights.name,
        "step": weights.step,
        "goal": objective.name,
        "data": {"source": selection.source, "kind": selection.kind},
        "rows": len(selection.rows),
        "settings": {k: v for k, v in asdict(options).items() if k not in ("predictions",)},
        "tuned": scores(objective, selection, tuned),
        "notes": notes,
    }
    if base is not None:
        base_scores = scores(objective, selection, base)
        # Without --base a preference run still scores its reference (the base) for the rewards: the chosen answers'
        # likelihood is then known for both, and a drop of it is flagged all the same.
        result["base" if with_base else "reference"] = base_scores
        result["flags"] = metrics.flags(result["tuned"], base_scores, objective)
        if objective.eval_rewards:
            result["tuned"].update(rewards(selection, tuned, base, inputs.plan.beta))
    elif with_base and not answers:
        notes.append("no base scores: the base model has no trained classification head (its labels would be chance)")
    if not answers and tuned.predicted is not None:
        truth = [row.label for row in selection.rows]
        _, matrix = metrics.classification_scores(truth, tuned.predicted, selection.label_names)
        result["confusion"] = {"labels": selection.label_names, "tuned": matrix}
    if answers:
        result["answers"] = answer_rows(selection, tuned, base)
    for who in ("tuned", "base"):
        if who in result:
            result[who] = _ordered(objective, result[who])
    return result


def scores(objective: Objective, selection: rows.Selection, out: Outputs) -> dict[str, float]:
    """One model's scores on the rows (every score of the objective that the data allows)."""
    if objective.is_classifier:
        truth = [row.label for row in selection.rows]
        found, _ = metrics.classification_scores(truth, out.predicted or [], selection.label_names)
        loss = sum(out.label_nll or []) / len(out.label_nll) if out.label_nll else None
        return {**({"loss": loss, "perplexity": math.exp(loss)} if loss is not None else {}), **found}
    scored = [row for row in selection.rows if row.scored]
    # kto rows marked bad are not answers to learn: the loss is the likelihood of the good ones
    found = metrics.loss_scores([n for n, row in zip(out.nll or [], scored, strict=False) if row.good is not False])
    if out.answers is not None:
        prompted = [i for i, row in enumerate(selection.rows) if row.prompt]
        found.update(
            metrics.answer_scores([out.answers[i] for i in prompted], [selection.rows[i].reference for i in prompted])
        )
    return {name: value for name, value in found.items() if name in objective.eval_metrics}


def rewards(selection: rows.Selection, tuned: Outputs, base: Outputs, beta: float) -> dict[str, float]:
    """reward_accuracy and reward_margin of the tuned model relative to the base (the reference)."""
    logp = [-n for n, _ in tuned.nll or []]
    ref = [-n for n, _ in base.nll or []]
    if tuned.rejected_nll is not None and base.rejected_nll is not None:
        rejected = [-n for n, _ in tuned.rejected_nll]
        ref_rejected = [-n for n, _ in base.rejected_nll]
        return metrics.reward_scores(logp, ref, rejected, ref_rejected, beta)
    good = [bool(row.good) for row in selection.rows if row.scored]
    return metrics.unpaired_reward_scores(logp, ref, good, beta)


def answer_rows(selection: rows.Selection, tuned: Outputs, base: Outputs | None) -> list[dict[str, Any]]:
    """Each prompted row with its reference and each model's answer (what Compare and the tables show)."""
    out = []
    for i, row in enumerate(selection.rows):
        if not row.prompt:
            continue
        entry = {
            "prompt": _question(row),
            "reference": row.reference,
            "tuned": tuned.answers[i] if tuned.answers else "",
        }
        if base is not None and base.answers is not None:
            entry["base"] = base.answers[i]
        if row.images:
            entry["images"] = _image_files(row)
        out.append(entry)
    return out


def write_predictions(
    path: Path, selection: rows.Selection, tuned: Outputs, base: Outputs | None, names: list[str]
) -> None:
    """One JSON line per row: the prompt, the reference and each model's output (answer, label, log-likelihoods)."""
    from finetune.atomic import write_text

    scored = iter(range(len(selection.rows)))
    positions = {i: next(scored) for i, row in enumerate(selection.rows) if row.scored}
    lines = []
    for i, row in enumerate(selection.rows):
        line: dict[str, Any] = {"prompt": _question(row) if row.prompt else None, "reference": row.reference}
        if row.images:
            line["images"] = _image_files(row)
        if row.label is not None:
            line.update(text=row.text, text_pair=row.text_pair or None, label=names[row.label])
        if row.good is not None:
            line["good"] = row.good
        for who, out in (("tuned", tuned), ("base", base)):
            if out is None:
                continue
            line.update(_row_outputs(who, out, i, positions.get(i), names))
        lines.append(json.dumps(line, ensure_ascii=False))
    write_text(path, "\n".join(lines) + "\n")


def _row_outputs(who: str, out: Outputs, i: int, position: int | None, names: list[str]) -> dict[str, Any]:
    """One model's outputs for row `i` (`position`: the row's index among the scored rows)."""
    line: dict[str, Any] = {}
    if out.answers is not None:
        line[who] = out.answers[i]
    if out.predicted is not None:
        line[f"{who}_label"] = names[out.predicted[i]]
        line[f"{who}_label_nll"] = out.label_nll[i] if out.label_nll else None
    if out.nll is not None and position is not None:
        line[f"{who}_nll"], line["tokens"] = out.nll[position]
    if out.rejected_nll is not None and position is not None:
        line[f"{who}_rejected_nll"], line["rejected_tokens"] = out.rejected_nll[position]
    return line


def _image_files(row: rows.EvalRow) -> list[str]:
    """A row's pictures as results name them: each file's path (a Hub data set's in-memory image by its own path, or
    "(image)")."""
    return [
        p if isinstance(p, str) else str((p.get("path") if isinstance(p, dict) else "") or "(image)")
        for p in row.images
    ]


def _question(row: rows.EvalRow) -> str:
    """The prompt as a person reads it: its last user message."""
    users = [m["content"] for m in row.prompt or [] if m.get("role") == "user"]
    return users[-1] if users else ""


def _ordered(objective: Objective, found: dict[str, float]) -> dict[str, float]:
    """The scores in the objective's order (extra ones, such as the judge's, after)."""
    first = {name: found[name] for name in objective.eval_metrics if name in found}
    return {**first, **{k: v for k, v in found.items() if k not in first}}


def _predictions_path(value: str, run: RunDir) -> Path | None:
    """Where --predictions writes: a new or replaceable file outside the run's trained files."""
    if not value:
        return None
    path = Path(value).expanduser().resolve()
    inside = run.path.resolve()
    if inside in path.parents and store.FOLDER not in path.relative_to(inside).parts[:1]:
        raise UserError(
            "predictions: a file inside the run folder would mix with its trained files; write it "
            f"elsewhere (or under {run.name}/{store.FOLDER}/)",
            field="predictions",
        )
    if path.is_dir() or not path.parent.is_dir():
        raise UserError(f"predictions: {value} must be a file in an existing folder", field="predictions")
    return path


def _load(plan: RunPlan, run: RunDir, weights: Weights) -> Any:
    """The run's model at `weights`, as chat (or classify) loads it with the run's own plan."""
    from finetune.model.inference import load_classifier, load_for_chat

    if plan.is_classifier:
        return load_classifier(plan, run.path, weights.path)[0]
    return load_for_chat(plan, run.path, weights.path)[0]


def _load_base(plan: RunPlan) -> tuple[Any, Any]:
    """The starting weights, as the run's plan loaded them (a full fine-tune's base, once the tuned model is gone)."""
    from finetune.model.inference import load_for_chat

    return load_for_chat(plan)


def _release() -> None:
    """Give the memory of models just dropped back before the next one loads."""
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass
