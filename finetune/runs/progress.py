"""Live training state: a thread-safe snapshot the UI polls, mirrored to status.json and events.jsonl.

`Progress` is engine-neutral: the Trainer path feeds it from a `TrainerCallback`, the DeepSpeed loop calls it directly.
Stopping is a flag that the engine reads at the end of each step: it saves a checkpoint and ends cleanly.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from finetune.objectives import Objective
from finetune.runs.pids import own_start
from finetune.runs.rundir import ACTIVE, FORMAT, RunDir


@dataclass
class TrainingState:
    """What the UI and the terminal show about a run."""

    run_id: str = ""
    run_dir: str = ""
    status: str = "idle"  # idle | loading | running | stopping | stopped | completed | failed | interrupted
    step: int = 0
    max_steps: int = 0
    epoch: float = 0.0
    loss: float | None = None
    eval_loss: float | None = None
    learning_rate: float | None = None
    tokens_per_second: float | None = None
    tokens_seen: int = 0
    eta_seconds: float | None = None
    memory_bytes: int | None = None
    error: str | None = None
    user_error: bool = False  # the error is bad input the user can fix (not a crash)
    advice: str | None = None
    message: str = ""
    owner: str = ""
    started_at: float | None = None
    updated_at: float | None = None
    finished_at: float | None = None
    pid: int = 0
    pid_started: float | None = None  # the process's start time: a reused pid is not this run's (finetune/runs/pids.py)
    device: str = ""
    format: int = FORMAT  # the run directory's layout version (see rundir.py)
    world_size: int = 1  # processes training this run (a launched group: torchrun / deepspeed ranks)

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    @property
    def fraction(self) -> float:
        return min(1.0, self.step / self.max_steps) if self.max_steps else 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def memory_in_use() -> int:
    """Bytes in use by training: CUDA allocated memory on a GPU, else this process's resident memory."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.memory_allocated())
    return int(_this_process().memory_info().rss)


_PROCESS: Any = None


def _this_process() -> Any:
    global _PROCESS
    if _PROCESS is None:
        import psutil

        _PROCESS = psutil.Process()
    return _PROCESS


class Progress:
    """Thread-safe training state for one run; writes status.json (throttled) and events.jsonl."""

    STATUS_EVERY_S = 0.5

    def __init__(self, run: RunDir, run_id: str, owner: str = "", write_files: bool = True) -> None:
        self.run = run
        self.write_files = write_files  # False on non-zero ranks of a multi-process run
        self.stop_requested = threading.Event()
        self._lock = threading.Lock()
        self._state = TrainingState(
            run_id=run_id,
            run_dir=str(run.path),
            owner=owner,
            pid=os.getpid(),
            pid_started=own_start(),
            world_size=int(os.environ.get("WORLD_SIZE", "1")),  # set by the launcher of a multi-process run
        )
        self._last_write = 0.0
        self._rate_mark: tuple[float, int] | None = None
        # A failed write of status.json / events.jsonl (disk full, permissions): kept, and raised at the next step so
        # the run fails with it in plain words instead of a Stop button or a status page that throws.
        self.write_error: OSError | None = None

    # ----- reading
    def snapshot(self) -> TrainingState:
        with self._lock:
            return dataclasses.replace(self._state)

    # ----- writing
    def update(self, force: bool = False, **changes: Any) -> None:
        """Change fields; status.json follows at most every half second (always on status changes)."""
        with self._lock:
            status_changed = "status" in changes and changes["status"] != self._state.status
            for key, value in changes.items():
                setattr(self._state, key, value)
            self._state.updated_at = time.time()
            due = force or status_changed or time.time() - self._last_write > self.STATUS_EVERY_S
            state = dataclasses.replace(self._state) if due else None
            if due:
                self._last_write = time.time()
        if state is not None and self.write_files:
            # A change of status is flushed to the disk; the half-second progress refreshes are not (their fsync
            # was most of our per-step cost: bench/results/overhead-analysis.md).
            durable = force or status_changed
            self._write(lambda status: self.run.write_status(status, durable=durable), state.to_dict())
            if status_changed:
                self._write(
                    self.run.append_event,
                    {
                        "type": "status",
                        "status": state.status,
                        "step": state.step,
                        "error": state.error,
                        "world_size": state.world_size,
                    },
                )

    def event(self, kind: str, **fields: Any) -> None:
        """Append one event to events.jsonl."""
        if self.write_files:
            self._write(self.run.append_event, {"type": kind, **fields})

    def _write(self, write: Any, payload: dict[str, Any]) -> None:
        try:
            write(payload)
        except OSError as exc:
            self.write_error = self.write_error or exc

    def checkpoint_saved(self, step: int, path: str) -> None:
        """After an engine wrote checkpoint-N: make it durable and mark it complete, then log it."""
        if self.write_files:
            self.run.seal_checkpoint(step)
        self.event("checkpoint", step=step, path=path)

    def message(self, text: str) -> None:
        """A line for the log tail and the events file."""
        self.update(message=text)
        self.event("message", text=text)

    def set_status(self, status: str, **changes: Any) -> None:
        self.update(force=True, status=status, **changes)

    def status_due(self) -> bool:
        """Whether the next update writes status.json (at most every STATUS_EVERY_S): the moment to read values that
        cost something to read (memory, a GPU's token count)."""
        return time.time() - self._last_write > self.STATUS_EVERY_S

    def on_step(self, step: int, max_steps: int, epoch: float, tokens_seen: int | None) -> None:
        """After each optimizer step: step counters, tokens/s, ETA and memory. A failed file write fails the run."""
        if self.write_error is not None:
            raise self.write_error
        now = time.time()
        changes: dict[str, Any] = {"step": step, "max_steps": max_steps, "epoch": epoch}
        if self.status_due():  # read memory only when the status is about to be written
            changes["memory_bytes"] = memory_in_use()
        if tokens_seen is not None:
            changes["tokens_seen"] = tokens_seen
            if self._rate_mark is None:
                self._rate_mark = (now, tokens_seen, step)
            else:
                t0, n0, s0 = self._rate_mark
                if now > t0 and step > s0:
                    changes["tokens_per_second"] = (tokens_seen - n0) / (now - t0)
                    changes["eta_seconds"] = (now - t0) / (step - s0) * max(0, max_steps - step)
        self.update(**changes)

    def on_log(self, step: int, logs: dict[str, Any], objective: Objective | None = None) -> None:
        """Loss / eval loss lines: kept in the state and written to events.jsonl, with what the objective's trainer
        logs beside the loss (a preference run's rewards and KL, ...) under the event keys its record names (the
        UI's contract)."""
        if "loss" in logs:
            self.update(loss=float(logs["loss"]), learning_rate=_float(logs.get("learning_rate")))
            extra = objective.event_metrics(logs) if objective is not None else {}
            self.event(
                "log",
                step=step,
                loss=float(logs["loss"]),
                learning_rate=_float(logs.get("learning_rate")),
                grad_norm=_float(logs.get("grad_norm")),
                epoch=_float(logs.get("epoch")),
                **extra,
                **_tokens(logs),
            )
        if "eval_loss" in logs:
            self.update(eval_loss=float(logs["eval_loss"]))
            self.event("eval", step=step, eval_loss=float(logs["eval_loss"]))


def _tokens(logs: dict[str, Any]) -> dict[str, int]:
    """The real (non-padding) input tokens trained on up to this point, when the engine counted them."""
    value = logs.get("num_input_tokens_seen")
    return {"tokens_seen": int(value)} if isinstance(value, (int, float)) else {}


def _float(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None
