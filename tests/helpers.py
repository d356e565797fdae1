"""Helpers shared by the tests: tiny configs, data files, training and reading losses from a run, child processes."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from finetune.config import TrainConfig
from finetune.runs.manager import RunManager
from finetune.runs.rundir import RunDir

ROOT = Path(__file__).resolve().parents[1]


def child_env(home: Path | None = None) -> dict[str, str]:
    """The environment of a child process (`python -m finetune ...`): this repository importable first, and the
    test's studio home when given."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if home:
        env["FINETUNE_STUDIO_HOME"] = str(home)
    return env


def cli(*args: str, home: Path | None = None, timeout: float = 400) -> Any:
    """`python -m finetune ARGS` in a child process, as a user types it (a subprocess.CompletedProcess, text output).
    The timeout is a ceiling for a hung child on a busy 2-core machine (a 2-process launch may build DeepSpeed's op
    once), never a measurement."""
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "finetune", *args],
        capture_output=True,
        text=True,
        env=child_env(home),
        timeout=timeout,
        cwd=ROOT,
    )


def mini_dataset() -> Path:
    """32 short, repetitive pirate answers: a random tiny model learns them within a few steps."""
    import tempfile

    path = Path(tempfile.gettempdir()) / "finetune-tests" / "pirate-mini.jsonl"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = [{"prompt": f"Question {i}?", "completion": "Arr, matey! Yo-ho-ho!"} for i in range(32)]
        write_jsonl(path, rows)
    return path


def tiny_config(model_dir: Path, **overrides: Any) -> TrainConfig:
    """A config that trains the tiny model on tiny data in a few seconds."""
    values: dict[str, Any] = {
        "model": str(model_dir),
        "dataset": str(mini_dataset()),
        "eval_split": "",
        "max_steps": 8,
        "learning_rate": 3e-2,
        "warmup_steps": 0,
        "lr_scheduler_type": "constant",
        "max_seq_length": 64,
        "per_device_train_batch_size": 4,
        "logging_steps": 1,
        "save_steps": 4,
        "eval_steps": 4,
        "lora_r": 8,
    }
    values.update(overrides)
    return TrainConfig.from_dict(values)


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def train(config: TrainConfig) -> RunDir:
    """Train `config` in this process to the end (a completed run, else the test fails with its error)."""
    state = RunManager().start(config, background=False)
    assert state.status == "completed", (state.status, state.error)
    return RunDir(Path(state.run_dir))


def losses(run_dir: str | Path) -> list[tuple[int, float]]:
    """(step, loss) from the run's events."""
    return [(e["step"], e["loss"]) for e in RunDir(Path(run_dir)).read_events(("log",))]


def assert_loss_falls(run_dir: str | Path, k: int = 2) -> tuple[float, float]:
    """The mean of the last k losses is clearly below the mean of the first k."""
    values = [loss for _, loss in losses(run_dir)]
    assert len(values) >= 2 * k, values
    first, last = sum(values[:k]) / k, sum(values[-k:]) / k
    assert last < 0.9 * first, f"loss did not fall: {values}"
    return first, last


# ----------------------------------------------------------------------------- events as written, and resume checks
def events_size(run_dir: str | Path) -> int:
    """Bytes in events.jsonl now: what a later process appends starts at this offset."""
    path = RunDir(Path(run_dir)).events_path
    return path.stat().st_size if path.is_file() else 0


def raw_events(run_dir: str | Path, start: int = 0, end: int | None = None, types: tuple[str, ...] = ("log",)) -> list:
    """Events exactly as written between two byte offsets of events.jsonl, duplicates included (RunDir.read_events
    may tidy them): how a test tells what each process of an interrupted and resumed run logged."""
    data = RunDir(Path(run_dir)).events_path.read_bytes()[start:end]
    events = [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]
    return [e for e in events if e.get("type") in types]


def assert_resumed_exactly(run_dir: str | Path, mark: int, checkpoint_step: int, max_steps: int) -> tuple[list, list]:
    """What only a true continuation gives: the resumed process (events after byte `mark`) logged exactly the steps
    after the checkpoint, once each; every step up to the checkpoint was logged once, before it, by the first process.
    Returns (first process's log events, resumed process's log events)."""
    before, after = raw_events(run_dir, 0, mark), raw_events(run_dir, mark)
    assert [e["step"] for e in after] == list(range(checkpoint_step + 1, max_steps + 1)), [e["step"] for e in after]
    early = [e["step"] for e in before if e["step"] <= checkpoint_step]
    assert early == list(range(1, checkpoint_step + 1)), early  # trained once, with their first timestamps
    return before, after


# ----------------------------------------------------------------------------- holding a run at a known step
def hold_at_step(monkeypatch: Any, step: int) -> threading.Event:
    """Hold the next run of this process at the end of optimizer step `step` until it is asked to stop.

    Returns an event that is set once the run is held: a test then acts on a run that is certainly still active
    (stop, a second start, chat) instead of hoping it has not finished yet. One-shot: later steps and runs pass."""
    from finetune.runs.progress import Progress

    held = threading.Event()
    original = Progress.on_step

    def on_step(self, current, *args, **kwargs):
        original(self, current, *args, **kwargs)
        if current == step and not held.is_set():
            held.set()
            self.stop_requested.wait(HOLD_LIMIT_S)

    monkeypatch.setattr(Progress, "on_step", on_step)
    return held


def stop_then_resume(monkeypatch: Any, config: TrainConfig, step: int) -> tuple[list, list]:
    """Start `config`, hold it at `step`, stop it there (one checkpoint, at that step), resume it to the end in the
    foreground; returns `assert_resumed_exactly`'s (first process's, resumed process's) log events."""
    from finetune.runs.manager import RunManager

    manager = RunManager()
    held = hold_at_step(monkeypatch, step)
    manager.start(config)
    assert held.wait(120), manager.state()
    assert manager.stop()
    stopped = manager.wait(120)
    assert stopped.status == "stopped" and stopped.step == step, (stopped.status, stopped.error)
    run = RunDir(Path(stopped.run_dir))
    assert [p.name for p in run.checkpoints()] == [f"checkpoint-{step}"]
    mark = events_size(run.path)
    resumed = manager.resume(run.path, background=False)
    assert resumed.status == "completed" and resumed.step == config.max_steps, (resumed.status, resumed.error)
    return assert_resumed_exactly(run.path, mark, checkpoint_step=step, max_steps=config.max_steps)


HOLD_LIMIT_S = 300  # a held run goes on by itself after this, so a failing test never hangs the suite


def wait_for_file(path: Path, proc: Any, timeout: float = 240) -> None:
    """Wait until `path` exists while `proc` (a subprocess.Popen) runs; fail at once if the process ends first."""
    import subprocess
    import time

    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the process ended with code {proc.returncode} before {path.name} appeared"
        assert time.monotonic() < deadline, f"{path.name} did not appear within {timeout:.0f}s"
        try:
            proc.wait(timeout=0.1)  # returns early if the process ends; checked on the next round
        except subprocess.TimeoutExpired:
            pass


def wait_until_gone(pids: list[int], timeout: float = 60) -> None:
    """Wait until killed processes that are not our children have been reaped (their pids no longer exist)."""
    import os
    import time

    deadline = time.monotonic() + timeout
    for pid in pids:
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            assert time.monotonic() < deadline, f"process {pid} still exists {timeout:.0f}s after it was killed"
            threading.Event().wait(0.05)  # a poll tick: nothing to block on for another process's child


def measured_peak(config: TrainConfig) -> int:
    """Live tensor storages of two real Trainer steps as the engine runs them (the estimator's own counter on real
    tensors: the CPU measurement bench/memory_accuracy.py uses). Padded: rows of max_seq_length tokens. Packed (the
    plan packs): the data's longest rows, one micro batch of them per step, laid out and attended as a run does."""
    import tempfile

    import torch
    from transformers import Trainer, default_data_collator

    from finetune import data
    from finetune.data.stats import data_stats
    from finetune.engines.hf_trainer import training_arguments
    from finetune.memory.trace import LiveBytes
    from finetune.model import loading, packing
    from finetune.plan import plan_for

    plan = plan_for(config, "cpu")
    model = loading.load_model(plan)
    generator = torch.Generator().manual_seed(0)
    collate = default_data_collator
    if plan.packing:
        batch = config.per_device_train_batch_size
        lengths = [min(n, config.max_seq_length) for n in data_stats(config).lengths[-batch:]]
        ids = [torch.randint(3, 300, (n,), generator=generator) for n in lengths]
        collate = data.collator(config, None, packing=True)
        assert packing.enable(model) is None
    else:
        ids = list(torch.randint(3, 300, (4, config.max_seq_length), generator=generator))
    rows = [{"input_ids": r, "attention_mask": torch.ones_like(r), "labels": r.clone()} for r in ids]
    with tempfile.TemporaryDirectory() as out:
        args = training_arguments(plan, Path(out), has_eval=False)
        args.logging_strategy, args.save_strategy = "no", "no"
        trainer = Trainer(model=model, args=args, train_dataset=rows, data_collator=collate)
        peak = LiveBytes().training_peak(trainer)
    return peak


ESTIMATED_CHARS_PER_TOKEN = 4  # finetune.data.stats.CHARS_PER_TOKEN: lengths where the model's tokenizer is offline
TEMPLATE_TOKENS = 4  # finetune.data.stats.TEMPLATE_TOKENS: added per text column in that estimate


def write_token_rows(path: Path, lengths: list[int]) -> Path:
    """Text rows that count `lengths` tokens each where the model's own tokenizer cannot be loaded (a bundled Hub
    model offline, with no embedded tokenizer converted: about 4 characters per token, plus the template's)."""
    words = "the ship sails at dawn and the crew sings of gold "
    rows = []
    for n in lengths:
        chars = ESTIMATED_CHARS_PER_TOKEN * (n - TEMPLATE_TOKENS)
        rows.append({"text": (words * (chars // len(words) + 1))[:chars]})
    return write_jsonl(path, rows)


# ----------------------------------------------------------------------------- real disks that refuse writes
@contextlib.contextmanager
def small_disk(folder: Path, free_bytes: int | None = None, read_only: bool = False) -> Iterator[Path]:
    """A real filesystem at `folder` that refuses writes as a user's disk does: a 4 MB tmpfs, filled so that only
    `free_bytes` are left ("No space left on device" past them), or mounted read-only. Mounting needs root (or
    CAP_SYS_ADMIN); without it the test is skipped, saying so."""
    import shutil
    import subprocess

    import pytest

    folder.mkdir(parents=True, exist_ok=True)
    options = "size=4m" + (",ro" if read_only else "")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.decode(errors='replace')[:200]}")
    try:
        if free_bytes is not None:
            (folder / "filler").write_bytes(b"\0" * max(0, shutil.disk_usage(folder).free - free_bytes))
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@contextlib.contextmanager
def unwritable_folder(folder: Path) -> Iterator[Path]:
    """A folder this process cannot write in: read-only permissions, or for root (whom permissions do not stop) a
    read-only filesystem."""
    import os

    if os.geteuid() == 0:
        with small_disk(folder, read_only=True):
            yield folder
        return
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o555)
    try:
        yield folder
    finally:
        folder.chmod(0o755)
