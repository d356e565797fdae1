"""The one reader of a run's event log (finetune/runs/events.py): every line a real run writes reads as its typed
record, steps trained again after a resume appear once, and what does not read is passed over, never a crash."""

from __future__ import annotations

import json
import math
from pathlib import Path

from finetune.runs import events
from finetune.runs.events import (
    CheckpointEvent,
    CompletionsEvent,
    DatasetEvent,
    EvalEvent,
    Event,
    LogEvent,
    MessageEvent,
    ObjectiveEvent,
    ResumeEvent,
    SamplesEvent,
    StatusEvent,
)
from finetune.runs.rundir import RunDir
from tests.run_fixtures import build_run


def write_log(path: Path, lines: list[object], torn: str = "") -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + torn, encoding="utf-8")
    return path


def test_every_line_a_real_run_writes_reads_as_its_typed_record(tiny_model_dir, tmp_path):
    """A really trained run (losses, evaluations, sample answers, checkpoints, the data's fingerprint): no line comes
    back untyped, and the typed figures are the lines' own."""
    run = RunDir(build_run(tmp_path / "run", tiny_model_dir))
    typed, raw = run.events(), run.read_events()
    assert [e.raw for e in typed] == raw and len(raw) > 10
    untyped = [e.raw for e in typed if type(e) is Event]
    assert not untyped, untyped
    logs = events.of_type(typed, LogEvent)
    assert [(e.step, e.loss) for e in logs] == [(r["step"], r["loss"]) for r in raw if r["type"] == "log"]
    assert [e.step for e in logs] == list(range(1, 11)) and all(e.learning_rate is not None for e in logs)
    assert [e.step for e in events.of_type(typed, EvalEvent)] == [5, 10]
    samples = events.of_type(typed, SamplesEvent)
    assert [e.step for e in samples] == [0, 5, 10] and samples[0].samples[0].prompt == "What is the capital of France?"
    assert samples[0].samples[0].reference == "Arr, matey! Yo-ho-ho!"
    assert [e.step for e in events.of_type(typed, CheckpointEvent)] == [5, 10]
    (dataset,) = events.of_type(typed, DatasetEvent)
    assert dataset.sha256 and len(dataset.sha256) == 64
    assert events.latest(typed, StatusEvent).status == "completed"


def test_a_resume_drops_the_step_events_past_its_step_and_keeps_the_rest(tmp_path):
    path = write_log(
        tmp_path / "events.jsonl",
        [
            {"type": "log", "step": 1, "loss": 2.0, "time": 1},
            {"type": "log", "step": 2, "loss": 1.5, "time": 2},
            {"type": "samples", "step": 2, "samples": [{"prompt": "p", "answer": "first try"}], "time": 2},
            {"type": "checkpoint", "step": 2, "path": "checkpoint-2", "time": 2},
            {"type": "log", "step": 3, "loss": 1.2, "time": 3},
            {"type": "eval", "step": 3, "eval_loss": 1.1, "time": 3},
            {"type": "message", "text": "crash", "time": 4},
            {"type": "resume", "step": 2, "checkpoint": "checkpoint-2", "time": 5},
            {"type": "log", "step": 3, "loss": 1.25, "time": 6},
        ],
    )
    read = events.read(path)
    assert [(e.step, e.loss) for e in events.of_type(read, LogEvent)] == [(1, 2.0), (2, 1.5), (3, 1.25)]
    assert events.of_type(read, EvalEvent) == []  # step 3's evaluation was of the first attempt
    assert [e.step for e in events.of_type(read, CheckpointEvent)] == [2]  # at the resume step: kept
    assert events.latest(read, SamplesEvent).samples[0].answer == "first try"
    assert [e.text for e in events.of_type(read, MessageEvent)] == ["crash"]  # not a step event: kept
    assert events.latest(read, ResumeEvent).checkpoint == "checkpoint-2"


def test_what_does_not_read_is_passed_over_and_a_diverged_loss_is_kept(tmp_path):
    path = write_log(
        tmp_path / "events.jsonl",
        [
            ["not", "an", "object"],
            {"type": "log", "step": "three", "loss": 1.0},  # a step that is not one: an untyped line
            {"type": "future-kind", "step": 1, "anything": True},
            {"type": "log", "step": 4, "loss": float("nan"), "kl": 0.5, "rewards/contains": 1, "note": "x"},
            {"type": "log", "eval_loss": 0.7, "step": 4},  # older runs logged the evaluation loss in a "log" line
            {
                "type": "objective",
                "objective": "dpo",
                "beta": 0.1,
                "columns": {"prompt": "q", "chosen": "good"},
                "reference": "adapter-off",
            },
            {
                "type": "completions",
                "step": 4,
                "completions": [{"prompt": "1+1", "completion": "2", "rewards": {"m": 1}}],
            },
        ],
        torn='{"type": "log", "step": 5, "lo',
    )
    read = events.read(path)
    assert [type(e) for e in read] == [Event, Event, LogEvent, EvalEvent, ObjectiveEvent, CompletionsEvent]
    assert read[1].type == "future-kind" and read[1].raw["anything"] is True
    log = read[2]
    assert math.isnan(log.loss) and log.metrics == {"kl": 0.5, "rewards/contains": 1.0}
    assert read[3].eval_loss == 0.7 and read[4].columns == {"prompt": "q", "chosen": "good"}
    assert read[5].completions[0].rewards == {"m": 1.0}
    assert events.read(tmp_path / "missing.jsonl") == []
