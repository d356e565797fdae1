"""Starting, stopping and resuming runs: one run at a time per device, in a background thread or in the foreground.

A run directory is created only after the config and its inputs pass the cheap checks. `output_dir` must be new or
empty: a folder holding anything else is refused before anything starts. A run that fails before its first step
removes exactly the files it wrote (and its folder only if it made it), so a failed start never leaves something that
looks like a run, and never touches what it did not create. A resume that fails before training a new step puts the
run's config.yaml and status.json back as they were.
"""

from __future__ import annotations

import fcntl
import gc
import json
import os
import re
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune import paths
from finetune.atomic import write_text
from finetune.config import TrainConfig
from finetune.errors import BusyError, ConfigError, UserError
from finetune.progress import Progress, TrainingState
from finetune.rundir import ACTIVE, RunDir, find_run, list_runs


def distributed_rank() -> tuple[int, int]:
    """(rank, world size) under torchrun / deepspeed launchers; (0, 1) otherwise."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


class DeviceLock:
    """A lock file that one process at a time holds while it trains (the CLI and the app share it)."""

    def __init__(self, root: Path) -> None:
        self.path = root / ".device.lock"
        self._fh: Any = None

    def acquire(self, holder: dict[str, Any]) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fh = open(self.path, "a+", encoding="utf-8")
        except OSError as exc:
            raise UserError(f"runs folder: cannot use {self.path.parent}: {_os_reason(exc)}", "output_dir") from None
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            info = _parse(fh.read())
            fh.close()
            raise BusyError(busy_message(info)) from None
        self._fh = fh
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(json.dumps(holder))
            fh.flush()
        except OSError:
            pass  # a full disk: the lock holds all the same, only the "who" line is missing

    def release(self) -> None:
        if self._fh is not None:
            try:
                self._fh.truncate(0)
            except OSError:
                pass  # the holder line is information only; the lock itself is what matters
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None


def _parse(text: str) -> dict[str, Any]:
    try:
        return json.loads(text)
    except ValueError:
        return {}


def busy_message(info: dict[str, Any]) -> str:
    """'busy: run X, started by Y at Z, is training …' — who holds the device and since when."""
    when = time.strftime("%H:%M:%S", time.localtime(info["started_at"])) if info.get("started_at") else "?"
    who = info.get("owner") or "another process"
    return (
        f"busy: run {info.get('run_id', '?')} started by {who} at {when} is using the device; "
        "stop it or wait for it to finish"
    )


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

    @property
    def fresh(self) -> bool:
        return self.resume_step is None


# Settings a checkpoint is bound to: its weights, optimizer state or format would not fit a change.
RESUME_FIXED = (
    "model",
    "task",
    "num_labels",
    "method",
    "lora_r",
    "lora_alpha",
    "lora_target_modules",
    "quant_type",
    "double_quant",
    "backend",
    "zero_stage",
    "optim",
    "output_dir",
)


class RunManager:
    """Owns the one active run of this process and the runs root."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root else paths.runs_root()
        self._lock = threading.Lock()
        self._active: ActiveRun | None = None
        self._last: TrainingState | None = None
        self._device_lock = DeviceLock(self.root)

    # ----------------------------------------------------------------- queries
    def state(self) -> TrainingState | None:
        """The live state of the active run, or the final state of the last one."""
        with self._lock:
            if self._active is not None:
                return self._active.progress.snapshot()
            return self._last

    def is_active(self) -> bool:
        with self._lock:
            return self._active is not None

    def runs(self) -> list[dict[str, Any]]:
        """Summaries of every run under the root, newest first, with interrupted runs marked so."""
        active = self.state()
        out = []
        for run in list_runs(self.root):
            status = run.read_status()
            effective = run.effective_status()
            if effective in ACTIVE and not (active and active.active and active.run_dir == str(run.path)):
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
        config.validate()
        rank, world = distributed_rank()
        path = self._new_run_path(config, confine, world)
        if rank == 0:
            check_new_run_dir(path)
        preflight(config)
        return path

    def start(
        self, config: TrainConfig, owner: str = "", confine: bool = False, background: bool = True
    ) -> TrainingState:
        """Start a new run. `confine` keeps output_dir under the runs root (the web UI)."""
        run = RunDir(self.check_start(config, confine))
        return self._launch(config, run, owner, resume_from=None, background=background)

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
        return self._launch(config, run, owner, resume_from=checkpoint, background=background, launch=launch)

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
        config: TrainConfig,
        run: RunDir,
        owner: str,
        resume_from: Path | None,
        background: bool,
        launch: Launch | None = None,
    ) -> TrainingState:
        rank, _ = distributed_rank()
        launch = launch or Launch()
        progress = Progress(run, run.name, owner=owner, write_files=rank == 0)
        with self._lock:
            if self._active is not None:
                state = self._active.progress.snapshot()
                raise BusyError(
                    busy_message({"run_id": state.run_id, "owner": state.owner, "started_at": state.started_at})
                )
            if rank == 0:
                holder = {"run_id": run.name, "owner": owner or "the command line", "started_at": time.time()}
                self._device_lock.acquire({**holder, "pid": os.getpid()})
            self._active = ActiveRun(progress, None, config)
        try:
            if rank == 0:
                self._write_start(config, run, progress, resume_from, launch)
        except OSError as exc:  # disk full, permissions, a file where a folder should be: refused, nothing held
            self._undo_start(run, launch)
            with self._lock:
                self._active = None
                self._device_lock.release()
            raise UserError(
                f"output_dir: cannot write the run in {run.path}: {_os_reason(exc)}", "output_dir"
            ) from None
        if not background:
            self._run(config, progress, resume_from, launch)
            return progress.snapshot()
        thread = threading.Thread(
            target=self._run, args=(config, progress, resume_from, launch), name=f"train-{run.name}", daemon=True
        )
        with self._lock:
            self._active = ActiveRun(progress, thread, config)
        thread.start()
        return progress.snapshot()

    @staticmethod
    def _write_start(
        config: TrainConfig, run: RunDir, progress: Progress, resume_from: Path | None, launch: Launch
    ) -> None:
        """The run's first files: its folder (new or empty), config.yaml, status.json, and for a resume the marker
        that tells readers which logged steps are trained again."""
        if launch.fresh:
            launch.made_folder = not run.path.exists()
            run.path.mkdir(parents=True, exist_ok=True)
        run.write_config(config)
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
    def _run(self, config: TrainConfig, progress: Progress, resume_from: Path | None, launch: Launch) -> None:
        from finetune.engines import run_engine

        try:
            final = run_engine(config, progress, resume_from)
            progress.set_status(
                final,
                finished_at=time.time(),
                eta_seconds=0 if final == "completed" else None,
                message=f"run {final} at step {progress.snapshot().step}",
            )
            if progress.write_error is not None:
                raise progress.write_error  # the final status never reached the disk
        except BaseException as exc:  # every failure becomes a status the user can read, never a dead thread
            self._fail(config, progress, exc, launch)
        finally:
            try:
                release_memory()
            finally:
                with self._lock:
                    self._last = progress.snapshot()
                    self._active = None
                    self._device_lock.release()

    def _fail(self, config: TrainConfig, progress: Progress, exc: BaseException, launch: Launch) -> None:
        message, advice = plain_error(exc, config, progress.snapshot().step)
        state = progress.snapshot()
        run = RunDir(progress.run.path)
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
        if nothing_new and progress.write_files:
            # A start that never trained leaves nothing that looks like a run; a resume that never trained leaves
            # the run as it was (a completed run stays completed and publishable).
            if not launch.fresh:
                progress.event("message", text=f"resume failed before a new step: {message}; the run is unchanged")
            self._undo_start(run, launch)

    def stop(self) -> bool:
        """Ask the active run to save a checkpoint and stop; False when nothing runs."""
        with self._lock:
            if self._active is None:
                return False
            self._active.progress.stop_requested.set()
            progress = self._active.progress
        progress.update(message="stop requested: finishing the current step and saving a checkpoint")
        return True

    def wait(self, timeout: float | None = None) -> TrainingState | None:
        """Block until the active run (if any) ends."""
        with self._lock:
            thread = self._active.thread if self._active else None
        if thread is not None:
            thread.join(timeout)
        return self.state()


def plain_error(exc: BaseException, config: TrainConfig, step: int) -> tuple[str, str | None]:
    """A one-line message for the user and, for out-of-memory, the estimator's advice."""
    if isinstance(exc, UserError):
        return str(exc), None
    if isinstance(exc, OSError) and exc.errno is not None:
        return (
            f"could not write the run's files at step {step}: {_os_reason(exc)}",
            "Free disk space or fix the folder's permissions, then resume: training continues from the last "
            "complete checkpoint.",
        )
    if is_out_of_memory(exc):
        try:
            from finetune.memory import advice_text

            advice = advice_text(config)
        except Exception:  # the advice is a help, never a second failure
            advice = "Try gradient_checkpointing: true, a smaller per_device_train_batch_size, or method: qlora."
        return f"out of memory at step {step}: the run needs more memory than the device has", advice
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted by the user (Ctrl-C)", None
    first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    return f"training failed at step {step}: {type(exc).__name__}{': ' + first if first else ''}", None


def is_out_of_memory(exc: BaseException) -> bool:
    """torch's OOM error, or an allocator message that says the same."""
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    except ImportError:
        pass
    return isinstance(exc, (MemoryError, RuntimeError)) and "out of memory" in str(exc).lower()


def release_memory() -> None:
    """Give memory back after a run so the next one in this process starts clean."""
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def preflight(config: TrainConfig) -> None:
    """Cheap checks before a run directory exists: the model and data can be found, the options suit the machine."""
    from finetune import data, models
    from finetune.config import EMBEDDED_MODEL
    from finetune.data import FILE_TYPES

    if config.model == EMBEDDED_MODEL:
        models.embedded_gguf_path()
    else:
        models.resolve_model_path(config.model)
    path = Path(config.dataset).expanduser()
    if config.dataset.startswith("bundled:") or path.suffix.lower() in FILE_TYPES or path.exists():
        # Local data is small enough to read now: a bad file is refused before any run directory exists.
        train_raw, _ = data.load_raw(config)
        data.detect_format(list(train_raw.column_names), config)
    if config.model != EMBEDDED_MODEL or models.embedded_cache_dir().is_dir():
        from finetune.engines.common import check_sequence_length

        check_sequence_length(config)
        models.check_model(config)  # the task's head and the LoRA targets, from the model's config alone
    if config.report_to not in ("none",):
        import importlib.util

        if importlib.util.find_spec(config.report_to) is None:
            raise ConfigError(f"report_to: {config.report_to} is not installed; use none or install it", "report_to")
    gpu_only(config)


def check_new_run_dir(path: Path) -> None:
    """A new run's folder must be new or empty, and creatable: anything else is refused before a byte is written."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing != path and not existing.is_dir():
        raise ConfigError(
            f"output_dir: {existing} is a file, so {path} cannot be a folder; choose another", "output_dir"
        )
    if existing == path:
        if not path.is_dir():
            raise ConfigError(f"output_dir: {path} is a file, not a folder; choose a new folder", "output_dir")
        if RunDir(path).exists():
            raise ConfigError(f"output_dir: {path} already holds a run; resume it or choose another", "output_dir")
        try:
            has_files = any(path.iterdir())
        except OSError as exc:
            raise ConfigError(f"output_dir: cannot read {path}: {_os_reason(exc)}", "output_dir") from None
        if has_files:
            raise ConfigError(
                f"output_dir: {path} already has files in it and is not a run; choose a new or empty folder",
                "output_dir",
            )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"output_dir: cannot write in {existing}: permission denied", "output_dir")


def checkpoint_step(checkpoint: Path) -> int:
    """The optimizer step a checkpoint folder (checkpoint-N) was saved at."""
    return int(checkpoint.name.rsplit("-", 1)[-1])


def check_resume_overrides(saved: TrainConfig, wanted: TrainConfig, step: int) -> None:
    """Refuse resume settings the checkpoint cannot take, before the run is touched."""
    for name in RESUME_FIXED:
        before, after = getattr(saved, name), getattr(wanted, name)
        if before != after:
            raise ConfigError(
                f"{name}: cannot change on resume (the checkpoint was trained with {before!r}, asked {after!r}); "
                "start a new run for that",
                name,
            )
    if wanted.max_steps != -1 and wanted.max_steps <= step:
        raise ConfigError(
            f"max_steps: {wanted.max_steps} is not beyond the checkpoint's step {step}; give a larger number "
            "to train further",
            "max_steps",
        )


def _os_reason(exc: OSError) -> str:
    """'No space left on device (/path)': an OS error in plain words, without errno numbers or a traceback."""
    reason = exc.strerror or type(exc).__name__
    return f"{reason} ({exc.filename})" if exc.filename else reason


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


def gpu_only(config: TrainConfig) -> None:
    """Options that only make sense with a GPU are refused on a CPU machine with a clear reason."""
    import torch

    if torch.cuda.is_available():
        return
    if "nvme" in (config.offload_optimizer, config.offload_param):
        raise ConfigError("offload_optimizer: NVMe offload needs a GPU; this machine has none", "offload_optimizer")


def confined_path(root: Path, value: str) -> Path:
    """A run directory chosen in the UI: a plain name under the runs root (no absolute paths, no `..`)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", value) or ".." in value:
        raise ConfigError(
            f"output_dir: {value!r} must be a plain run name (letters, digits, . _ -) inside the runs folder",
            field="output_dir",
        )
    return root / value


def unique_run_path(root: Path, config: TrainConfig) -> Path:
    """A new run folder named after the time, the model and the method."""
    model = re.sub(r"[^A-Za-z0-9]+", "-", Path(config.model.split(":")[-1]).name).strip("-").lower()[:40] or "model"
    base = f"{time.strftime('%Y%m%d-%H%M%S')}-{model}-{config.method}"
    path, n = root / base, 1
    while path.exists():
        n += 1
        path = root / f"{base}-{n}"
    return path
