"""A run's event log, `events.jsonl`, read as typed records: the one reader the studio, the UI, the model card and
compare use (`RunDir.append_event` writes the lines; the format on disk is this module's contract).

Each line is one JSON object with a "type" and a "time"; the types a run writes and what each carries:
  status       status, step, error, world_size           the run's status changed
  log          step, loss, learning_rate, grad_norm, epoch, tokens_seen, and what the objective logs beside the loss
               under the event keys its record names (`Objective.metrics`: rewards_margin, kl, reward, ...)
  eval         step, eval_loss
  samples      step, samples [{prompt, answer, reference?}]  the held-out answers at step 0 and at each evaluation
  completions  step, completions [{prompt, completion, rewards {name: score}}]  a run learning from rewards
  checkpoint   step, path
  resume       step, checkpoint                           the run continued from checkpoint-<step>
  objective    objective, beta, loss_type, reference, columns {role: column}, rewards, reward_specs
  dataset      dataset, dataset_sha256 | dataset_revision
  message, traceback   text
  saved        path
A line of another type, or one whose fields do not read, comes back as a plain `Event` (its type, the line as
written in `raw`): readers that look for a kind of event pass over it.

The resume rule, applied here once: a "resume" event at step K drops the earlier step events (log, eval, samples,
checkpoint) past step K. Those steps were trained again after a crash, and the later copy wins, so a loss curve never
shows a step twice. A torn last line (a write still in progress) is skipped.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

# What every "log" line carries beside the objective's own metrics.
LOG_FIELDS = ("type", "time", "step", "loss", "learning_rate", "grad_norm", "epoch", "tokens_seen")


@dataclass(frozen=True, kw_only=True)
class Event:
    """One line of the log: its type, when it was written, and the line as written."""

    type: str
    time: float = 0.0
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True, kw_only=True)
class StatusEvent(Event):
    type: str = "status"
    status: str
    step: int = 0
    error: str | None = None
    world_size: int | None = None


@dataclass(frozen=True, kw_only=True)
class LogEvent(Event):
    """A logged optimizer step."""

    type: str = "log"
    step: int
    loss: float
    learning_rate: float | None = None
    grad_norm: float | None = None
    epoch: float | None = None
    tokens_seen: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # the objective's metrics by event key


@dataclass(frozen=True, kw_only=True)
class EvalEvent(Event):
    type: str = "eval"
    step: int
    eval_loss: float


@dataclass(frozen=True)
class Sample:
    """A held-out prompt, the model's answer, the data's reference answer where it has one, and an image prompt's
    pictures (files, one per `<image>` tag of the prompt)."""

    prompt: str
    answer: str
    reference: str | None = None
    images: tuple[str, ...] = ()

    @property
    def shown_prompt(self) -> str:
        """The prompt as tables show it, with its pictures' file names (`prompt_with_images`)."""
        return prompt_with_images(self.prompt, self.images)


def prompt_with_images(prompt: str, images: tuple[str, ...] | list[str]) -> str:
    """A held-out prompt as the tables show it: each `<image>` tag replaced by its picture's file name in brackets
    (pictures without a tag lead the text)."""
    names = [f"[{str(path).replace(chr(92), '/').rsplit('/', 1)[-1]}]" for path in images]
    pieces = prompt.split("<image>")
    text = pieces[0] + "".join(
        names[i] + (" " + piece.lstrip(" ") if piece[:1] not in ("\n", " ", "") else piece)
        if i < len(names)
        else "<image>" + piece
        for i, piece in enumerate(pieces[1:])
    )
    extra = names[len(pieces) - 1 :]
    return " ".join([*extra, text]) if extra else text


@dataclass(frozen=True, kw_only=True)
class SamplesEvent(Event):
    type: str = "samples"
    step: int
    samples: tuple[Sample, ...] = ()


@dataclass(frozen=True)
class Completion:
    """An answer sampled while learning from rewards, with each reward's score of it."""

    prompt: str
    completion: str
    rewards: dict[str, float | None] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class CompletionsEvent(Event):
    type: str = "completions"
    step: int
    completions: tuple[Completion, ...] = ()


@dataclass(frozen=True, kw_only=True)
class CheckpointEvent(Event):
    type: str = "checkpoint"
    step: int
    path: str = ""


@dataclass(frozen=True, kw_only=True)
class ResumeEvent(Event):
    type: str = "resume"
    step: int
    checkpoint: str = ""


@dataclass(frozen=True, kw_only=True)
class ObjectiveEvent(Event):
    """What a run with an objective of its own compares and reads, as it started training."""

    type: str = "objective"
    objective: str
    beta: float | None = None
    loss_type: str | None = None
    reference: str | None = None
    columns: dict[str, str] = field(default_factory=dict)  # data role -> the column it was read from
    rewards: tuple[str, ...] = ()
    reward_specs: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class DatasetEvent(Event):
    """What identifies the data a run trained on: a file's sha256 or a Hub dataset's revision."""

    type: str = "dataset"
    dataset: str
    sha256: str | None = None
    revision: str | None = None


@dataclass(frozen=True, kw_only=True)
class MessageEvent(Event):
    type: str = "message"
    text: str


@dataclass(frozen=True, kw_only=True)
class TracebackEvent(Event):
    type: str = "traceback"
    text: str


@dataclass(frozen=True, kw_only=True)
class SavedEvent(Event):
    type: str = "saved"
    path: str = ""


E = TypeVar("E", bound=Event)
_STEP_EVENTS = (LogEvent, EvalEvent, SamplesEvent, CheckpointEvent)  # what a resume's steps trained again replace


def read(path: Path) -> list[Event]:
    """Every event of the log at `path` in order, typed, with the resume rule applied ([] when there is no log)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError:
        return []
    out: list[Event] = []
    for line in text.splitlines():
        try:
            values = json.loads(line)
        except ValueError:
            continue  # a torn line
        if not isinstance(values, dict):
            continue
        event = parse(values)
        if isinstance(event, ResumeEvent):
            out = [e for e in out if not (isinstance(e, _STEP_EVENTS) and e.step > event.step)]
        out.append(event)
    return out


def of_type(events: Iterable[Event], kind: type[E]) -> list[E]:
    """The events of one kind, in order."""
    return [e for e in events if isinstance(e, kind)]


def latest(events: Iterable[Event], kind: type[E]) -> E | None:
    """The newest event of one kind, or None."""
    found = of_type(events, kind)
    return found[-1] if found else None


def parse(values: dict[str, Any]) -> Event:
    """One line's object as its typed record (a plain `Event` for an unknown type or fields that do not read)."""
    kind = str(values.get("type") or "")
    reader = _READERS.get(kind)
    if kind == "log" and "loss" not in values and "eval_loss" in values:
        reader = _eval  # older runs logged the evaluation loss in a "log" line
    common = {"type": kind, "time": _number(values.get("time")) or 0.0, "raw": values}
    if reader is not None:
        try:
            return reader(values, common)
        except (TypeError, ValueError, KeyError):
            pass
    return Event(**common)


# ------------------------------------------------------------------------------------------- one reader per type
def _status(v: dict[str, Any], common: dict[str, Any]) -> Event:
    error = v.get("error")
    world = v.get("world_size")
    return StatusEvent(
        **common,
        status=_text(v["status"]),
        step=_step(v.get("step", 0)),
        error=None if error is None else str(error),
        world_size=world if isinstance(world, int) and not isinstance(world, bool) else None,
    )


def _log(v: dict[str, Any], common: dict[str, Any]) -> Event:
    tokens = _number(v.get("tokens_seen"))
    metrics = {k: float(x) for k, x in v.items() if k not in LOG_FIELDS and _number(x) is not None}
    return LogEvent(
        **common,
        step=_step(v["step"]),
        loss=_required(v["loss"]),
        learning_rate=_number(v.get("learning_rate")),
        grad_norm=_number(v.get("grad_norm")),
        epoch=_number(v.get("epoch")),
        tokens_seen=None if tokens is None else int(tokens),
        metrics=metrics,
    )


def _eval(v: dict[str, Any], common: dict[str, Any]) -> Event:
    return EvalEvent(**common, step=_step(v["step"]), eval_loss=_required(v["eval_loss"]))


def _samples(v: dict[str, Any], common: dict[str, Any]) -> Event:
    items = v.get("samples") or []
    if not isinstance(items, list):
        raise ValueError("samples is not a list")
    samples = tuple(
        Sample(
            prompt=str(s.get("prompt", "")),
            answer=str(s.get("answer", "")),
            reference=None if s.get("reference") is None else str(s["reference"]),
            images=tuple(str(i) for i in s.get("images") or () if isinstance(i, str)),
        )
        for s in items
        if isinstance(s, dict)
    )
    return SamplesEvent(**common, step=_step(v["step"]), samples=samples)


def _completions(v: dict[str, Any], common: dict[str, Any]) -> Event:
    items = v.get("completions") or []
    if not isinstance(items, list):
        raise ValueError("completions is not a list")
    completions = tuple(
        Completion(
            prompt=str(c.get("prompt", "")),
            completion=str(c.get("completion", "")),
            rewards={str(k): _number(x) for k, x in (c.get("rewards") or {}).items()},
        )
        for c in items
        if isinstance(c, dict)
    )
    return CompletionsEvent(**common, step=_step(v["step"]), completions=completions)


def _checkpoint(v: dict[str, Any], common: dict[str, Any]) -> Event:
    return CheckpointEvent(**common, step=_step(v["step"]), path=str(v.get("path") or ""))


def _resume(v: dict[str, Any], common: dict[str, Any]) -> Event:
    return ResumeEvent(**common, step=_step(v["step"]), checkpoint=str(v.get("checkpoint") or ""))


def _objective(v: dict[str, Any], common: dict[str, Any]) -> Event:
    columns = v.get("columns") or {}
    return ObjectiveEvent(
        **common,
        objective=_text(v["objective"]),
        beta=_number(v.get("beta")),
        loss_type=None if v.get("loss_type") is None else _text(v["loss_type"]),
        reference=None if v.get("reference") is None else _text(v["reference"]),
        columns={str(k): str(c) for k, c in columns.items()} if isinstance(columns, dict) else {},
        rewards=tuple(str(r) for r in v.get("rewards") or ()),
        reward_specs=tuple(str(r) for r in v.get("reward_specs") or ()),
    )


def _dataset(v: dict[str, Any], common: dict[str, Any]) -> Event:
    sha, revision = v.get("dataset_sha256"), v.get("dataset_revision")
    return DatasetEvent(
        **common,
        dataset=_text(v["dataset"]),
        sha256=str(sha) if sha else None,
        revision=str(revision) if revision else None,
    )


def _message(v: dict[str, Any], common: dict[str, Any]) -> Event:
    return MessageEvent(**common, text=str(v.get("text") or ""))


def _traceback(v: dict[str, Any], common: dict[str, Any]) -> Event:
    return TracebackEvent(**common, text=str(v.get("text") or ""))


def _saved(v: dict[str, Any], common: dict[str, Any]) -> Event:
    return SavedEvent(**common, path=str(v.get("path") or ""))


_READERS: dict[str, Callable[[dict[str, Any], dict[str, Any]], Event]] = {
    "status": _status,
    "log": _log,
    "eval": _eval,
    "samples": _samples,
    "completions": _completions,
    "checkpoint": _checkpoint,
    "resume": _resume,
    "objective": _objective,
    "dataset": _dataset,
    "message": _message,
    "traceback": _traceback,
    "saved": _saved,
}


def _number(value: Any) -> float | None:
    """A number as a float (NaN and infinities too: a diverged loss is shown as it was logged); None for anything
    else (booleans, text, null)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _required(value: Any) -> float:
    number = _number(value)
    if number is None:
        raise ValueError(f"{value!r} is not a number")
    return number


def _step(value: Any) -> int:
    """A step: a whole number (a float with no fraction reads as one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
        raise ValueError(f"{value!r} is not a step")
    return int(value)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not text")
    return value
