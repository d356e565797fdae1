"""Faults and concurrency: failures become plain statuses, memory is released, the next run works, one run at a time."""

from __future__ import annotations

import gc
import threading
import weakref
from pathlib import Path

import pytest
import torch
from transformers import Trainer

from finetune.errors import BusyError, UserError
from finetune.model import loading
from finetune.runs.manager import RunManager
from finetune.runs.rundir import RunDir
from finetune.studio import Studio
from tests.helpers import assert_resumed_exactly, events_size, hold_at_step, raw_events, tiny_config


def fail_at_step(monkeypatch, step: int, error: BaseException) -> list:
    """Make the Trainer's step raise `error` on its `step`-th call; returns weak references to loaded models."""
    calls = {"n": 0}
    original = Trainer.training_step
    loaded: list = []
    original_load = loading.load_model

    def training_step(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == step:
            raise error
        return original(self, *args, **kwargs)

    def load_model(*args, **kwargs):
        model = original_load(*args, **kwargs)
        loaded.append(weakref.ref(model))
        return model

    monkeypatch.setattr(Trainer, "training_step", training_step)
    monkeypatch.setattr(loading, "load_model", load_model)
    return loaded


@pytest.mark.parametrize(
    ("error", "expected", "has_advice"),
    [
        (RuntimeError("boom in the step"), "training failed at step 3: RuntimeError: boom in the step", False),
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"), "out of memory at step 3", True),
    ],
    ids=["exception", "oom"],
)
def test_a_failing_step_marks_the_run_failed_releases_the_model_and_the_next_run_works(
    tiny_model_dir, monkeypatch, error, expected, has_advice
):
    loaded = fail_at_step(monkeypatch, 4, error)
    manager = RunManager()
    config = tiny_config(tiny_model_dir, max_steps=10, save_steps=2, lr_scheduler_type="linear")
    torch.manual_seed(config.seed)  # the adapter's initialisation is not seeded by the run (tests/README.md)
    state = manager.start(config, background=False)
    assert state.status == "failed" and state.error.startswith(expected), state.error
    assert "\n" not in state.error
    assert bool(state.advice) is has_advice
    run = RunDir(Path(state.run_dir))
    assert run.read_status()["status"] == "failed" and run.last_checkpoint() is not None  # kept: it can resume
    gc.collect()
    assert all(ref() is None for ref in loaded), "the failed run's model is still referenced"

    monkeypatch.undo()
    torch.manual_seed(config.seed)
    again = manager.start(config, background=False)  # the next run works: the same config, uninterrupted
    assert again.status == "completed"
    expected = {e["step"]: e for e in raw_events(again.run_dir)}

    mark = events_size(run.path)
    resumed = manager.resume(run.path, background=False)  # and the failed run resumes from its checkpoint
    assert resumed.status == "completed" and resumed.step == 10
    _, after = assert_resumed_exactly(run.path, mark, checkpoint_step=2, max_steps=10)
    for event in after:  # the optimizer and the decaying learning rate go on as if nothing had happened
        want = expected[event["step"]]
        assert event["learning_rate"] == pytest.approx(want["learning_rate"], rel=1e-9), (event, want)
        assert event["loss"] == pytest.approx(want["loss"], rel=1e-4), (event, want)


def test_a_failure_before_the_first_step_leaves_no_run_directory(tiny_model_dir, monkeypatch):
    fail_at_step(monkeypatch, 1, RuntimeError("dies at once"))
    manager = RunManager()
    state = manager.start(tiny_config(tiny_model_dir), background=False)
    assert state.status == "failed" and "dies at once" in state.error
    assert not Path(state.run_dir).exists() and manager.runs() == []


def test_two_clients_starting_at_the_same_moment_exactly_one_starts(tiny_model_dir, monkeypatch):
    manager = RunManager()
    held = hold_at_step(monkeypatch, 1)  # the run that starts stays active until stopped
    barrier = threading.Barrier(2)
    results: list[str] = []

    def client(name: str) -> None:
        barrier.wait()
        try:
            manager.start(tiny_config(tiny_model_dir, max_steps=3), owner=name)
            results.append("started")
        except BusyError as exc:
            results.append(str(exc))

    threads = [threading.Thread(target=client, args=(n,)) for n in ("alice", "bob")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert held.wait(120), manager.state()
    manager.stop()
    assert manager.wait(120).status == "stopped"
    assert sorted(r == "started" for r in results) == [False, True]
    assert next(r for r in results if r != "started").startswith("busy: run ")


def test_status_and_chat_keep_working_while_a_run_trains(tiny_model_dir, monkeypatch):
    from finetune.model.inference import GenerationSettings

    studio = Studio()
    values = tiny_config(tiny_model_dir, max_steps=3).to_dict()
    held = hold_at_step(monkeypatch, 1)
    studio.start(values, owner="alice")
    try:
        assert held.wait(120), studio.state()
        assert studio.state().status == "running" and studio.state().step == 1
        reply = list(
            studio.chat(
                "base", [{"role": "user", "content": "hi"}], GenerationSettings(max_new_tokens=5), base_values=values
            )
        )
        assert reply and isinstance(reply[-1], str) and reply[-1].strip()
        assert studio.state().active and studio.state().status == "running"  # chatting did not stop the run
    finally:
        studio.stop()
        studio.manager.wait(120)
    assert studio.state().status == "stopped" and studio.state().step == 1


def test_after_a_restart_an_interrupted_run_is_listed_as_such_and_resumes(tiny_model_dir):
    manager = RunManager()
    state = manager.start(tiny_config(tiny_model_dir, max_steps=8, save_steps=4), background=False)
    run = RunDir(Path(state.run_dir))
    # Make it look like the app died mid-run: status says running, written by a process that no longer exists.
    status = run.read_status()
    run.write_status({**status, "status": "running", "step": 4, "max_steps": 12, "pid": 2**22 + 12345})
    (run.path / "adapter_model.safetensors").unlink()
    restarted = RunManager()
    listed = {r["run_id"]: r for r in restarted.runs()}[run.name]
    assert listed["status"] == "interrupted" and listed["resumable"]
    mark = events_size(run.path)
    resumed = restarted.resume(run.path, background=False, overrides={"max_steps": 12})
    assert resumed.status == "completed" and resumed.step == 12
    before, after = assert_resumed_exactly(run.path, mark, checkpoint_step=8, max_steps=12)
    assert after[0]["loss"] < 0.5 * before[0]["loss"]  # it goes on from the trained weights, not the base


def test_run_names_from_the_ui_are_confined_to_the_runs_root(tiny_model_dir):
    from finetune.errors import ConfigError

    studio = Studio()
    for bad in ("../escape", "/etc/passwd", "a/../../b", "~root", ".hidden"):
        with pytest.raises(ConfigError, match="output_dir: .* must be a plain run name"):
            studio.start(tiny_config(tiny_model_dir, output_dir=bad).to_dict())
    with pytest.raises(UserError, match=r"^run: '\.\./\.\./etc' is not a run in ") as caught:
        studio.events("../../etc")
    assert caught.value.field == "run"
