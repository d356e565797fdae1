"""Starting, stopping and resuming runs: one run at a time per device, in a background thread or in the foreground;
a group launched by `launch` (finetune/runs/process_group.py) is followed, stopped and found again through its files.

A run directory is created only after the config and its inputs pass the cheap checks. `output_dir` must be new or
empty: a folder holding anything else is refused before anything starts. A run that fails before its first step
removes exactly the files it wrote (and its folder only if it made it), so a failed start never leaves something that
looks like a run, and never touches what it did not create. A resume that fails before training a new step puts the
run's config.yaml and status.json back as they were.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from finetune import paths
from finetune.atomic import write_text
from finetune.cluster import scheduler
from finetune.config import TrainConfig
from finetune.errors import BusyError, ConfigError, UserError, os_reason
from finetune.plan import RunPlan, plan_for
from finetune.runs.device_lock import DeviceLock, busy_message, distributed_rank
from finetune.runs.failures import DISK_FULL, disk_error, plain_error, release_memory
from finetune.runs.preflight import (
    check_new_run_dir,
    check_resume_overrides,
    checkpoint_step,
    confined_path,
    model_ready,
    preflight,
    unique_run_path,
)
from finetune.runs.process_group import (
    GROUP_ENV,
    GroupProgress,
    group_alive,
    holder_alive,
    reap_supervisors,
    request_stop,
)
from finetune.runs.progress import Progress, TrainingState
from finetune.runs.rundir import ACTIVE, RunDir, find_run, list_runs

# Names other modules import from here (the CLI, the app's facade, tests).
__all__ = ["DeviceLock", "RunManager", "distributed_rank", "unique_run_path"]


@dataclass
class ActiveRun:
    progress: Progress
    thread: threading.Thread | None
    config: TrainConfig


@dataclass
class Launch:
    """What a failure must undo: the files of a new run, or the previous state of a resumed one."""

    made_folder: bool = False  # this run created its directory (so it may remove it)
    resume_step: int | None = None  # the checkpoint step a resume continues from
    previous_config: str | None = None  # config.yaml and status.json before a resume touched them
    previous_status: dict[str, Any] | None = None
    launched: bool = False  # a rank of a group `launch` started: its directory and status were made by the launcher

    @property
    def fresh(self) -> bool:
        return self.resume_step is None


class RunManager:
    """Owns the one active run of this process and the runs root."""

    def __init__(self, root: Path | None = None, find_groups: bool = True, process_ends_with_run: bool = False) -> None:
        """`find_groups`: also report a launched group found on this machine (the app); `train` follows only its own
        run (a rank of a group must never wait on the group it belongs to). `process_ends_with_run`: the process
        exits after its one run (the CLI), so memory is not collected for a next run (a full gc costs ~0.3 CPU-s)."""
        self.root = Path(root) if root else paths.runs_root()
        self.find_groups = find_groups
        self.process_ends_with_run = process_ends_with_run
        self._lock = threading.Lock()
        self._active: ActiveRun | None = None
        self._last: TrainingState | None = None
        self._device_lock = DeviceLock(self.root, still_busy=holder_alive)
        self._group: RunDir | None = None  # the launched group this manager started or found, followed by its files
        self.last_stop = ""  # what the last Stop of a Slurm run did, in words

    # ----------------------------------------------------------------- queries
    def state(self) -> TrainingState | None:
        """The live state of the active run (in this process, or a launched group), or the final state of the last."""
        with self._lock:
            if self._active is not None:
                return self._active.progress.snapshot()
        group = self.group()
        if group is not None:
            return state_from_files(group)
        with self._lock:
            return self._last

    def is_active(self) -> bool:
        """True while a run of this process, or a launched group on this machine, is training."""
        with self._lock:
            if self._active is not None:
                return True
        group = self.group()
        if group is not None and scheduler.is_slurm_run(group.path):
            return state_from_files(group).active
        return group is not None and group_alive(group.path)

    def group(self) -> RunDir | None:
        """The launched group running on this machine (found from the device lock's holder, so an app that
        restarted finds it again), else the last one this manager followed; None when there is neither."""
        if not self.find_groups or os.environ.get(GROUP_ENV):
            return self._group  # a rank of a group, or `train`: only what it was asked to follow
        reap_supervisors()
        holder = self._device_lock.holder()
        if holder.get("group") and holder.get("run_dir") and group_alive(Path(holder["run_dir"])):
            found = RunDir(Path(holder["run_dir"]))
            if found.exists():
                self._group = found
        return self._group

    def device_holder(self) -> dict[str, Any]:
        """Who holds the device lock, as its file says ({} when free): run_id, owner, started_at, pid."""
        return self._device_lock.holder()

    def follow_group(self, run: RunDir) -> None:
        """Report this launched run as the current one (state, stop, wait) until another run starts."""
        self._group = run

    def runs(self) -> list[dict[str, Any]]:
        """Summaries of every run under the root, newest first, with interrupted runs marked so."""
        active = self.state()
        out = []
        for run in list_runs(self.root):
            status = run.read_status()
            view = run.cluster_view(status)  # a Slurm run: what Slurm and its files say together
            if view is not None:
                status, effective = view, view.get("status", "unknown")
            else:
                effective = run.effective_status()
            ours = active and active.active and active.run_dir == str(run.path)
            if effective in ACTIVE and view is None and not ours:
                effective = "interrupted"  # ours by pid, but no thread of this process runs it (app restarted)
            out.append(
                {
                    **status,
                    "run_id": run.name,
                    "run_dir": str(run.path),
                    "status": effective,
                    "resumable": effective in ("stopped", "interrupted", "failed") and bool(run.last_checkpoint()),
                }
            )
        return out

    # ----------------------------------------------------------------- starting
    def check_start(self, config: TrainConfig, confine: bool = False) -> Path:
        """Every check `start` makes before anything is written (Check in the app gives the same verdict);
        returns the run directory it would use."""
        return self._checked(config, confine)[0]

    def _checked(self, config: TrainConfig, confine: bool) -> tuple[Path, RunPlan]:
        """config -> plan -> preflight(plan): the run directory a new run would use and the plan it runs, made
        once here for this machine and world, checked, handed down and recorded."""
        config.validate()
        rank, world = distributed_rank()
        path = self._new_run_path(config, confine, world)
        if rank == 0:
            check_new_run_dir(path)
        model_ready(config)  # the plan reads the model's family from its config.json
        plan = plan_for(config)
        preflight(plan)
        return path, plan

    def start(
        self, config: TrainConfig, owner: str = "", confine: bool = False, background: bool = True
    ) -> TrainingState:
        """Start a new run. `confine` keeps output_dir under the runs root (the web UI)."""
        path, plan = self._checked(config, confine)
        return self._launch(plan, RunDir(path), owner, resume_from=None, background=background)

    def resume(
        self, run_dir: str | Path, owner: str = "", background: bool = True, overrides: dict[str, Any] | None = None
    ) -> TrainingState:
        """Continue a stopped, interrupted or failed run from its last complete checkpoint, same step numbering.

        Everything is checked before the run is touched: an override the checkpoint cannot take is refused."""
        run = self._find_run(run_dir)
        saved = run.load_config()
        config = saved.replace(**overrides) if overrides else saved
        checkpoint = run.last_checkpoint()
        if checkpoint is None:
            raise UserError(f"resume: {run.name} has no complete checkpoint yet; start a new run instead", "resume")
        status = run.read_status()
        rank, _ = distributed_rank()  # other ranks read the files rank 0 is already rewriting for this resume
        if rank == 0 and run.effective_status() in ACTIVE and status.get("pid") != os.getpid():
            raise BusyError(f"resume: {run.name} is still running (process {status.get('pid')}); stop it first")
        if status.get("status") == "completed" and not overrides:
            raise UserError(f"resume: {run.name} already completed; raise max_steps to train further", "resume")
        step = checkpoint_step(checkpoint)
        check_resume_overrides(saved, config, step)
        launch = Launch(resume_step=step, previous_config=_read_text(run.config_path), previous_status=status)
        plan = plan_for(config)  # the plan of this machine and world (a resume may run elsewhere than the start)
        return self._launch(plan, run, owner, resume_from=checkpoint, background=background, launch=launch)

    def join_launched(self, run_dir: str | Path, owner: str = "", background: bool = True) -> TrainingState:
        """A rank of a group that `launch` started: train the run the launcher prepared (its config, its folder)."""
        run = RunDir(Path(run_dir).resolve())
        if not run.exists():
            raise UserError(f"--launched: {run_dir} is not a run directory prepared by launch", "launched")
        owner = owner or run.read_status().get("owner", "")
        plan = plan_for(run.load_config())  # the launcher checked the config; this rank plans for its own world
        return self._launch(plan, run, owner, resume_from=None, background=background, launch=Launch(launched=True))

    def _find_run(self, run_dir: str | Path) -> RunDir:
        return find_run(run_dir, self.root, field="resume")

    def _new_run_path(self, config: TrainConfig, confine: bool, world: int) -> Path:
        if config.output_dir:
            path = Path(config.output_dir).expanduser()
            if confine:
                path = confined_path(self.root, config.output_dir)
            return path.resolve()
        if world > 1:
            job = os.environ.get("TORCHELASTIC_RUN_ID", "")
            if not job or job == "none":
                raise ConfigError("output_dir: set it when running under a multi-process launcher", "output_dir")
            return self.root / f"run-{job}"
        return unique_run_path(self.root, config)

    def _launch(
        self,
        plan: RunPlan,
        run: RunDir,
        owner: str,
        resume_from: Path | None,
        background: bool,
        launch: Launch | None = None,
    ) -> TrainingState:
        rank, world = distributed_rank()
        launch = launch or Launch()
        config = plan.config
        # Several ranks agree at every step on whether to stop (the stop flag file of a launched run included).
        group_locked = bool(os.environ.get(GROUP_ENV))  # the supervisor of a launched group holds the device lock
        # A launched group or a Slurm job of one process reads the stop flag file too (its Stop writes it).
        progress_class = GroupProgress if world > 1 or group_locked else Progress
        progress = progress_class(run, run.name, owner=owner, write_files=rank == 0)
        with self._lock:
            if self._active is not None:
                state = self._active.progress.snapshot()
                raise BusyError(
                    busy_message({"run_id": state.run_id, "owner": state.owner, "started_at": state.started_at})
                )
            if rank == 0 and not group_locked:
                holder = {"run_id": run.name, "owner": owner or "the command line", "started_at": time.time()}
                self._device_lock.acquire({**holder, "pid": os.getpid()})
            self._active = ActiveRun(progress, None, config)
            self._group = None  # from now on this run, not a group followed before, is the current one
        try:
            if rank == 0:
                self._write_start(plan, run, progress, resume_from, launch)
        except OSError as exc:  # disk full, permissions, a file where a folder should be: refused, nothing held
            self._undo_start(run, launch)
            with self._lock:
                self._active = None
                self._device_lock.release()  # a no-op when this process did not take it
            raise UserError(f"output_dir: cannot write the run in {run.path}: {os_reason(exc)}", "output_dir") from None
        if not background:
            self._run(plan, progress, resume_from, launch)
            return progress.snapshot()
        thread = threading.Thread(
            target=self._run, args=(plan, progress, resume_from, launch), name=f"train-{run.name}", daemon=True
        )
        with self._lock:
            self._active = ActiveRun(progress, thread, config)
        thread.start()
        return progress.snapshot()

    @staticmethod
    def _write_start(plan: RunPlan, run: RunDir, progress: Progress, resume_from: Path | None, launch: Launch) -> None:
        """The run's first files: its folder (new or empty), config.yaml and the plan beside it (a resume records the
        plan of this machine), status.json, and for a resume the marker that tells readers which logged steps are
        trained again."""
        config = plan.config
        if launch.fresh:
            launch.made_folder = not run.path.exists()
            run.path.mkdir(parents=True, exist_ok=True)
        run.write_config(config)
        run.write_plan(plan)
        if resume_from is not None:
            run.append_event({"type": "resume", "step": launch.resume_step, "checkpoint": resume_from.name})
        progress.set_status(
            "loading",
            started_at=time.time(),
            max_steps=config.max_steps,
            message="resuming from " + resume_from.name if resume_from else "starting",
        )
        if progress.write_error is not None:
            raise progress.write_error

    @staticmethod
    def _undo_start(run: RunDir, launch: Launch) -> None:
        """Leave the disk as it was before this launch (best effort: the disk may be what failed)."""
        try:
            if launch.fresh:
                run.remove_own_files(remove_folder=launch.made_folder)
                return
            if launch.previous_config is not None:
                write_text(run.config_path, launch.previous_config)
            if launch.previous_status is not None:
                run.write_status(launch.previous_status)
        except OSError:
            pass

    # ----------------------------------------------------------------- the run itself
    def _run(self, plan: RunPlan, progress: Progress, resume_from: Path | None, launch: Launch) -> None:
        from finetune.engines import run_engine

        try:
            final = run_engine(plan, progress, resume_from)
            progress.set_status(
                final,
                finished_at=time.time(),
                eta_seconds=0 if final == "completed" else None,
                message=f"run {final} at step {progress.snapshot().step}",
            )
            if progress.write_error is not None:
                raise progress.write_error  # the final status never reached the disk
        except BaseException as exc:  # every failure becomes a status the user can read, never a dead thread
            self._fail(plan, progress, exc, launch)
        finally:
            try:
                if not self.process_ends_with_run:
                    release_memory()
            finally:
                with self._lock:
                    self._last = progress.snapshot()
                    self._active = None
                    self._device_lock.release()

    def _fail(self, plan: RunPlan, progress: Progress, exc: BaseException, launch: Launch) -> None:
        run = RunDir(progress.run.path)
        plan = _as_recorded(run, plan)  # the engine records what it changed at run time (packing vetoed)
        disk = disk_error(exc, run.path)
        if disk is not None and disk.errno in DISK_FULL and progress.write_files:
            run.remove_torn_checkpoints()  # the save that filled the disk: room again for the status that says so
        message, advice = plain_error(disk or exc, plan, progress.snapshot().step)
        state = progress.snapshot()
        if launch.fresh:
            nothing_new = state.step == 0 and not _safe(run.checkpoints, [])
        else:
            nothing_new = state.step <= (launch.resume_step or 0)
        progress.event("traceback", text="".join(traceback.format_exception(exc))[-8000:])
        # The traceback's frames hold the model, optimizer and batches: drop them so the memory can be freed.
        traceback.clear_frames(exc.__traceback__)
        exc.__traceback__ = None
        progress.set_status(
            "failed", error=message, advice=advice, finished_at=time.time(), user_error=isinstance(exc, UserError)
        )
        if nothing_new and progress.write_files and not launch.launched:
            # A start that never trained leaves nothing that looks like a run; a resume that never trained leaves
            # the run as it was (a completed run stays completed and publishable).
            if not launch.fresh:
                progress.event("message", text=f"resume failed before a new step: {message}; the run is unchanged")
            self._undo_start(run, launch)

    def stop(self) -> bool:
        """Ask the active run (this process's, or a launched group through its stop flag) to save a checkpoint and
        stop; False when nothing runs."""
        with self._lock:
            progress = self._active.progress if self._active is not None else None
            if progress is not None:
                progress.stop_requested.set()
        if progress is None:
            group = self.group()
            if group is not None and scheduler.is_slurm_run(group.path):
                if not state_from_files(group).active:
                    return False
                self.stop_slurm(group)
                return True
            if group is None or not group_alive(group.path):
                return False
            request_stop(group.path)
            return True
        progress.update(message="stop requested: finishing the current step and saving a checkpoint")
        return True

    def stop_slurm(self, run: RunDir) -> str:
        """Stop a run submitted to Slurm (finetune/cluster/scheduler.py: USR1 to its batch script first, a cancel the
        second time); returns what was done, in words, also kept as `last_stop`."""
        self.last_stop = scheduler.stop_run(run.path)
        return self.last_stop

    def wait(self, timeout: float | None = None) -> TrainingState | None:
        """Block until the active run (if any) ends, or `timeout` seconds pass."""
        with self._lock:
            thread = self._active.thread if self._active else None
        if thread is not None:
            thread.join(timeout)
            return self.state()
        group = self.group()
        deadline = None if timeout is None else time.monotonic() + timeout
        while group is not None and (group_alive(group.path) or self.is_active()):
            if deadline is not None and time.monotonic() >= deadline:
                break
            time.sleep(0.1 if deadline is None else min(0.1, max(0.0, deadline - time.monotonic())))
        return self.state()


def state_from_files(run: RunDir) -> TrainingState:
    """A run's state as its status.json tells it (a launched group, or a run of another process)."""
    known = {f.name for f in fields(TrainingState)}
    status = run.read_status()
    view = run.cluster_view(status)
    if view is not None:  # a Slurm run: its job's word merged with its files
        state = TrainingState(**{k: v for k, v in view.items() if k in known})
        state.run_id, state.run_dir = run.name, str(run.path)
        return state
    state = TrainingState(**{k: v for k, v in status.items() if k in known})
    state.run_id, state.run_dir = run.name, str(run.path)
    effective = run.effective_status()
    if state.status in ACTIVE and not group_alive(run.path):
        effective = "interrupted" if effective in ACTIVE else effective  # every process of it is gone
    state.status = effective
    return state


def _as_recorded(run: RunDir, plan: RunPlan) -> RunPlan:
    """The plan the run recorded in plan.json (what ran), else the one it started with."""
    try:
        return run.load_plan()
    except (UserError, OSError):
        return plan


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def _safe(call: Any, default: Any) -> Any:
    try:
        return call()
    except OSError:
        return default
