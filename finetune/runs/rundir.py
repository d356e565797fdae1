"""The run directory: everything needed to understand, resume, chat with and publish a run.

Layout (the public contract other modules and tools read):
  config.yaml       resolved TrainConfig (never a token)
  plan.json         the run plan it trained with (finetune/plan.py: device, world, precision, dtypes, model class,
                    quantisation, LoRA, DeepSpeed, objective); chat, export and publish load the model by it
  status.json       {status, step, max_steps, epoch, loss, eval_loss, ..., error, started_at, updated_at, pid, owner}
  events.jsonl      one JSON object per line: {"time", "type": "status"|"log"|"eval"|"samples"|"message", ...};
                    finetune/runs/events.py lists the types and reads them (typed, the resume rule applied once:
                    after a crash, a "resume" event at step K drops the earlier step events past step K)
  checkpoint-N/     Trainer / DeepSpeed checkpoints; complete once every file in it is flushed to disk and the marker
                    `checkpoint-N/finetune-complete.json` is written last (older runs: once trainer_state.json parses)
  adapter_config.json + adapter_model.safetensors  (LoRA / QLoRA) or model.safetensors (full), plus the tokenizer
  eval/<YYYYmmdd-HHMMSS>.json  one file per evaluation (python -m finetune eval, the Evaluate tab), never overwritten
                    (finetune/evaluation/store.py); evaluating only reads the files above
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from finetune import objectives
from finetune.atomic import overwrite, read_json, write_json, write_text
from finetune.cluster import scheduler
from finetune.config import TrainConfig
from finetune.errors import UserError
from finetune.objectives import Objective
from finetune.runs import events as event_log
from finetune.runs.events import Event

if TYPE_CHECKING:
    from finetune.plan import RunPlan

ACTIVE = ("pending", "loading", "running", "stopping")
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
COMPLETE_MARKER = "finetune-complete.json"
# status.json's "format": 2 = checkpoints count only with COMPLETE_MARKER (written after everything is on disk).
FORMAT = 2
# What a run writes into its directory before its first step: removed again if it fails there, and nothing else.
_OWN_FILES = ("config.yaml", "plan.json", "status.json", "events.jsonl")
_OWN_FOLDERS = ("initial-adapter",)  # PiSSA / OLoRA's saved start (engines/common.py)


@dataclass(frozen=True)
class RunDir:
    """Paths and small helpers for one run directory."""

    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

    @property
    def status_path(self) -> Path:
        return self.path / "status.json"

    @property
    def events_path(self) -> Path:
        return self.path / "events.jsonl"

    def exists(self) -> bool:
        """True when this looks like a run (it has a config and a status)."""
        return self.config_path.is_file() and self.status_path.is_file()

    def load_config(self) -> TrainConfig:
        """The resolved config the run was started with."""
        return TrainConfig.load(self.config_path)

    def write_config(self, config: TrainConfig) -> None:
        write_text(self.config_path, config.to_yaml())

    @property
    def plan_path(self) -> Path:
        return self.path / "plan.json"

    def write_plan(self, plan: RunPlan) -> None:
        """Record the plan the run trains with, beside its config."""
        write_json(self.plan_path, plan.to_dict())

    def load_plan(self) -> RunPlan:
        """The plan the run trained with (runs from before plan.json: planned again for this machine)."""
        from finetune.plan import RunPlan, plan_for

        config = self.load_config()
        values = read_json(self.plan_path)
        if not isinstance(values, dict):
            return plan_for(config)
        try:
            return RunPlan.from_dict(values, config)
        except (TypeError, ValueError, KeyError):  # hand-edited or from an incompatible version
            message = f"run: {self.name}/plan.json is damaged; it cannot say how the run trained"
            raise UserError(message, "run") from None

    def objective(self) -> Objective:
        """The objective's record the run trains with: the one its plan.json names (a run from before plan.json: its
        config's). What a run's metrics are called and which scores judge it are read from it, never guessed from
        which keys its events carry."""
        recorded = read_json(self.plan_path)
        name = recorded.get("objective") if isinstance(recorded, dict) else None
        if isinstance(name, str) and name in objectives.OBJECTIVES:
            return objectives.OBJECTIVES[name]
        return objectives.of(self.load_config())

    def read_status(self) -> dict[str, Any]:
        return read_json(self.status_path, default={}) or {}

    def write_status(self, status: dict[str, Any], durable: bool = True) -> None:
        """Replace status.json atomically; on a full disk, where no new copy fits, rewrite it in place instead (the
        old file's blocks hold the new one): a run that fails for want of space must still say so."""
        with STATUS_WRITES:
            self._write_status(status, durable)

    def _write_status(self, status: dict[str, Any], durable: bool) -> None:
        try:
            write_json(self.status_path, status, durable=durable)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not self.status_path.is_file():
                raise
            overwrite(self.status_path, json.dumps(status, indent=2, default=str) + "\n")

    def append_event(self, event: dict[str, Any]) -> None:
        """Append one event line; a single write() of a short line keeps lines whole for readers."""
        line = json.dumps({"time": round(time.time(), 3), **event}, default=str) + "\n"
        with _EVENT_LOCK, open(self.events_path, "a", encoding="utf-8") as fh:
            fh.write(line)

    def events(self) -> list[Event]:
        """The run's events, typed and in order, steps trained again after a resume appearing once
        (`finetune.runs.events.read`: the one reader of the log)."""
        return event_log.read(self.events_path)

    def read_events(self, types: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        """The events (optionally of some types) as written, one dict per line: what `events()` reads, for tools and
        tests that want the lines themselves."""
        return [e.raw for e in self.events() if types is None or e.type in types]

    def checkpoints(self) -> list[Path]:
        """Complete checkpoints, oldest first (see the module docstring for what complete means)."""
        marker_needed = self.read_status().get("format", 1) >= FORMAT
        found = []
        for child in self.path.iterdir() if self.path.is_dir() else []:
            match = _CHECKPOINT.match(child.name)
            if not match or not child.is_dir() or read_json(child / "trainer_state.json") is None:
                continue
            if marker_needed and read_json(child / COMPLETE_MARKER) is None:
                continue  # torn by a crash or a power cut before everything reached the disk
            found.append((int(match.group(1)), child))
        return [p for _, p in sorted(found)]

    def remove_torn_checkpoints(self) -> None:
        """Delete checkpoint folders this run began but never completed (no completion marker): a save cut short by
        a full disk. They are never resumed from; removing them gives the space back."""
        if self.read_status().get("format", 1) < FORMAT:
            return  # an older run's checkpoints carry no marker: none of them can be told torn
        for child in self.path.iterdir() if self.path.is_dir() else []:
            if _CHECKPOINT.match(child.name) and child.is_dir() and not (child / COMPLETE_MARKER).is_file():
                shutil.rmtree(child, ignore_errors=True)

    def seal_checkpoint(self, step: int) -> None:
        """Make checkpoint-N durable, then mark it complete: fsync every file and folder in it, write the marker."""
        folder = self.path / f"checkpoint-{step}"
        for sub, _, files in os.walk(folder):
            for name in files:
                fsync_path(Path(sub) / name)
            fsync_path(Path(sub))
        write_json(folder / COMPLETE_MARKER, {"step": step, "sealed_at": round(time.time(), 3)})
        fsync_path(folder)
        fsync_path(self.path)

    def remove_own_files(self, remove_folder: bool) -> None:
        """Undo a run that failed before its first step: delete what it wrote, and its folder only if it made it."""
        for name in _OWN_FILES:
            (self.path / name).unlink(missing_ok=True)
        for child in list(self.path.iterdir()) if self.path.is_dir() else []:
            if (_CHECKPOINT.match(child.name) or child.name in _OWN_FOLDERS) and child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
            elif child.name.startswith(tuple(f".{n}." for n in _OWN_FILES)) and child.name.endswith(".tmp"):
                child.unlink(missing_ok=True)  # an atomic write cut short
        if remove_folder:
            try:
                self.path.rmdir()  # only if empty: anything else in it is not ours to delete
            except OSError:
                pass

    def last_checkpoint(self) -> Path | None:
        cps = self.checkpoints()
        return cps[-1] if cps else None

    def has_final_model(self) -> bool:
        """True when the final adapter or full model has been saved."""
        return (self.path / "adapter_model.safetensors").is_file() or (self.path / "model.safetensors").is_file()

    def effective_status(self) -> str:
        """The status, with 'interrupted' for a run whose process died while it was active (a Slurm run: as
        `cluster_view` says)."""
        status = self.read_status()
        view = self.cluster_view(status)
        if view is not None:
            return view.get("status", "unknown")
        state = status.get("status", "unknown")
        if state in ACTIVE and not _pid_alive(status.get("pid"), status.get("pid_started")):
            return "interrupted"
        return state

    def cluster_view(self, status: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """For a run submitted to Slurm: status.json merged with Slurm's word on its job (finetune/cluster/scheduler.py:
        pending with the reason, interrupted or failed once the job is gone); None for any other run."""
        if not (self.path / scheduler.JOB_FILE).is_file():
            return None
        status = self.read_status() if status is None else status
        checkpoint = self.last_checkpoint()
        return scheduler.run_view(self.path, status, checkpoint.name if checkpoint else None)


_EVENT_LOCK = threading.Lock()
# Every status.json write of this process goes through it: a thread that holds it while the process ends makes its own
# write the last one (a rank whose supervisor vanished: finetune/runs/process_group.py).
STATUS_WRITES = threading.RLock()


def fsync_path(path: Path) -> None:
    """Flush a file or folder to the disk (a folder: so a rename or new entry in it survives a power cut)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _pid_alive(pid: Any, started: Any = None) -> bool:
    """True while the run's recorded process (pid and start time: finetune/runs/pids.py) still runs. For this very
    process it is True: whether a live manager here still owns the run is for the run manager to check."""
    from finetune.runs.pids import same_process

    return same_process(pid, started)


def find_run(value: str | Path, root: Path, field: str = "run", confine: bool = False) -> RunDir:
    """The one rule for finding a run: a run directory's path, or a run's name under `root`.

    `confine` (the web app, its API): only a plain name of a run directly under `root`; paths and `..` are refused
    with the same line as a missing run, so the answer never tells what exists elsewhere on the machine."""
    text = str(value).strip() if isinstance(value, (str, Path)) else ""
    missing = UserError(f"{field}: {text[:200]} is not a run directory (no config.yaml and status.json)", field)
    if not text or "\0" in text or len(text) > 4096:
        raise missing
    try:
        if confine:
            path = (root / text).resolve()
            if "/" in text or path.parent != root.resolve():
                raise missing
        else:
            path = Path(text).expanduser()
            if not RunDir(path).exists() and not path.is_absolute():
                path = root / text
        run = RunDir(path)
        if not run.exists():
            raise missing
    except (OSError, ValueError):
        raise missing from None
    return run


FINISHED = ("completed", "stopped")  # a run with a final adapter or model that can be published or exported


def find_finished_run(value: str | Path, root: Path, action: str) -> RunDir:
    """A run (found by `find_run`) that finished with its final adapter or model; `action` ("publish", "export")
    names what the user was doing in the refusal."""
    run = find_run(value, root, field="run_dir")
    state = run.effective_status()
    if state not in FINISHED:
        raise UserError(f"run_dir: {run.name} is {state}, not finished; {action} it once training has completed")
    if not run.has_final_model():
        raise UserError(
            f"run_dir: {run.name} has no final adapter or model (adapter_model.safetensors or model.safetensors)",
            "run_dir",
        )
    return run


def list_runs(root: Path) -> list[RunDir]:
    """Run directories under `root`, newest first."""
    try:
        children = list(root.iterdir()) if root.is_dir() else []
    except OSError:  # an unreadable runs folder lists nothing rather than breaking every page that lists runs
        return []
    # A link that leads out of the runs folder is not listed: every other door (find_run) refuses it too.
    inside = root.resolve()
    runs = [RunDir(p) for p in children if p.is_dir() and not p.name.startswith(".") and p.resolve().parent == inside]
    return sorted((r for r in runs if r.exists()), key=_modified, reverse=True)


def _modified(run: RunDir) -> float:
    try:
        return run.status_path.stat().st_mtime
    except OSError:  # removed between the listing and now
        return 0.0
