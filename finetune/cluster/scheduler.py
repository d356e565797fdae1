"""The Slurm commands, a run's job record (slurm.json) and a Slurm run's state as the app shows it.

A run submitted to Slurm keeps beside its usual files (finetune/runs/rundir.py):
  slurm.json     {job_id, jobs (every job id of the run, oldest first), script, submitted_at, attempts, nodes,
                 stop_requested_at}: the run's one current job
  slurm.sbatch   the batch script exactly as submitted (finetune/cluster/script.py)
  slurm.log      the job's output (every job and requeue of the run appends to it)

Its state is Slurm's word on the job merged with the run's own status.json (`merge`): a job waiting in the queue is
`pending` with Slurm's reason; a job that ended without the run writing its final status is `interrupted` (resumable)
when a complete checkpoint exists, else `failed` with the last line of its log. It is never `running` once the job is
gone. This module imports nothing of finetune/runs: the run directory and the manager read it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune.atomic import read_json, write_json
from finetune.errors import UserError

JOB_FILE = "slurm.json"
SCRIPT_FILE = "slurm.sbatch"
LOG_FILE = "slurm.log"
INSIDE_JOB_ENV = "FINETUNE_SLURM_RUN"  # set by the batch script: the run directory the job trains
COMMAND_TIMEOUT_S = 30.0
STATE_CACHE_S = 2.0  # the app polls every second; Slurm is asked at most this often per job

QUEUED = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "SUSPENDED", "RESIZING")
RUNNING = ("RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "STOPPED")
ACTIVE_FILE = ("pending", "loading", "running", "stopping")  # finetune/runs/rundir.py's ACTIVE (not imported: below)
FINAL_FILE = ("completed", "stopped", "failed")


@dataclass(frozen=True)
class Job:
    """Slurm's word on one job: its state (PENDING, RUNNING, COMPLETED, ..., GONE when Slurm no longer knows it,
    UNKNOWN when Slurm does not answer), the reason it waits, its nodes."""

    job_id: str
    state: str
    reason: str = ""
    nodes: str = ""

    @property
    def queued(self) -> bool:
        return self.state in QUEUED

    @property
    def running(self) -> bool:
        return self.state in RUNNING

    @property
    def alive(self) -> bool:
        """Queued or running: the run's one job, which a second submit or resume must not duplicate."""
        return self.queued or self.running

    @property
    def ended(self) -> bool:
        return not self.alive and self.state != "UNKNOWN"


# --------------------------------------------------------------------------- the commands
def program(name: str) -> str | None:
    """A Slurm program on PATH (None when missing)."""
    return shutil.which(name)


def require_sbatch() -> None:
    """Refuse when this machine cannot submit to Slurm."""
    if program("sbatch") is None:
        raise UserError("runs_on: slurm, but sbatch is not on PATH here; install Slurm's client commands", "runs_on")


def slurm(args: list[str], timeout: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run one Slurm command; a missing program or a hang is an `OSError` / `subprocess.TimeoutExpired`."""
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def submit_script(script: Path) -> str:
    """`sbatch --parsable SCRIPT`: the new job's id (the script's own #SBATCH lines say everything else)."""
    require_sbatch()
    try:
        result = slurm(["sbatch", "--parsable", str(script)])
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"runs_on: sbatch did not answer: {exc}", "runs_on") from None
    if result.returncode != 0:
        raise UserError(f"runs_on: sbatch refused the job: {_last_line(result.stderr)}", "runs_on")
    return result.stdout.strip().split(";")[0]


_CACHE: dict[str, tuple[float, Job]] = {}
_CACHE_LOCK = threading.Lock()


def job_state(job_id: str, fresh: bool = False) -> Job:
    """The job as Slurm knows it: squeue (every state it still lists), then scontrol, then sacct (accounting, where
    the cluster keeps it); GONE when none of them knows the job, UNKNOWN when Slurm cannot be asked."""
    now = time.monotonic()
    with _CACHE_LOCK:
        cached = _CACHE.get(job_id)
    if cached is not None and not fresh and now - cached[0] < STATE_CACHE_S:
        return cached[1]
    job = _ask(job_id)
    with _CACHE_LOCK:
        _CACHE[job_id] = (now, job)
    return job


def forget(job_id: str) -> None:
    """Drop a cached answer (after this process changed the job: cancel, signal)."""
    with _CACHE_LOCK:
        _CACHE.pop(job_id, None)


def _ask(job_id: str) -> Job:
    if program("squeue") is None:
        return Job(job_id, "UNKNOWN", "squeue is not on PATH here")
    try:
        result = slurm(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T|%r|%N"])
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Job(job_id, "UNKNOWN", f"squeue did not answer ({exc})")
    if result.returncode == 0 and result.stdout.strip():
        state, reason, nodes = (result.stdout.strip().splitlines()[0].split("|") + ["", ""])[:3]
        return Job(job_id, state.strip(), "" if reason in ("None", "(null)") else reason, nodes)
    if result.returncode != 0 and "invalid job id" not in result.stderr.lower():
        return Job(job_id, "UNKNOWN", f"squeue: {_last_line(result.stderr)}")
    return _ask_scontrol(job_id) or _ask_sacct(job_id) or Job(job_id, "GONE")


def _ask_scontrol(job_id: str) -> Job | None:
    try:
        result = slurm(["scontrol", "show", "job", "-o", job_id])
    except (OSError, subprocess.TimeoutExpired):
        return None
    fields = dict(item.split("=", 1) for item in result.stdout.split() if "=" in item)
    if result.returncode != 0 or "JobState" not in fields:
        return None
    reason = fields.get("Reason", "")
    return Job(job_id, fields["JobState"], "" if reason == "None" else reason, fields.get("NodeList", ""))


def _ask_sacct(job_id: str) -> Job | None:
    if program("sacct") is None:
        return None
    try:
        result = slurm(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,NodeList"])
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    if result.returncode != 0 or not lines:
        return None
    state, _, nodes = lines[-1].partition("|")
    return Job(job_id, state.split()[0] if state.split() else "GONE", "", nodes)


def signal_batch(job_id: str, name: str = "USR1") -> None:
    """`scancel --signal=NAME --batch JOB`: the batch script traps it (a stop that checkpoints)."""
    _scancel(["--signal", name, "--batch", job_id])


def cancel(job_id: str) -> None:
    """`scancel JOB`: every step and the batch script end now."""
    _scancel([job_id])


def _scancel(args: list[str]) -> None:
    try:
        result = slurm(["scancel", *args])
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"run: scancel did not answer: {exc}", "run") from None
    forget(args[-1])
    if result.returncode != 0:
        raise UserError(f"run: scancel refused: {_last_line(result.stderr)}", "run")


# --------------------------------------------------------------------------- the run's record
def read_job(run_path: Path) -> dict[str, Any]:
    """slurm.json of a run ({} for a run that never went to Slurm)."""
    value = read_json(Path(run_path) / JOB_FILE, default={})
    return value if isinstance(value, dict) else {}


def update_job(run_path: Path, **changes: Any) -> dict[str, Any]:
    """Rewrite slurm.json with `changes` (atomic); returns the new record."""
    record = {**read_job(run_path), **changes}
    write_json(Path(run_path) / JOB_FILE, record)
    return record


def is_slurm_run(run_path: Path) -> bool:
    """True for a run submitted to Slurm."""
    return bool(read_job(run_path).get("job_id"))


def current_job(run_path: Path) -> Job | None:
    """The run's current job as Slurm knows it (None for a run that never went to Slurm)."""
    record = read_job(run_path)
    return job_state(str(record["job_id"])) if record.get("job_id") else None


def log_line(run_path: Path) -> str:
    """The line of the job's log that says why it ended: the last error line, else the last line."""
    path = Path(run_path) / LOG_FILE
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - 64_000))
            lines = [line.strip() for line in fh.read().decode("utf-8", errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or [""])[-1][:400]


def stop_run(run_path: Path) -> str:
    """The app's Stop for a Slurm run. The first asks the batch script for a checkpoint (USR1: every rank finishes
    its step, saves, ends stopped); a job still waiting is cancelled, having nothing to save; a second Stop cancels at
    once. Returns what was done, in words."""
    record = read_job(run_path)
    job = job_state(str(record.get("job_id") or ""), fresh=True) if record.get("job_id") else None
    if job is None or not job.alive:
        raise UserError(f"run: {Path(run_path).name} has no Slurm job running; nothing to stop", "run")
    if job.queued:
        cancel(job.job_id)
        update_job(run_path, stop_requested_at=time.time(), cancelled_queued=job.job_id)
        return f"Slurm job {job.job_id} was waiting in the queue; it is cancelled"
    if record.get("stop_requested_at") and record.get("stop_job") == job.job_id:
        cancel(job.job_id)
        update_job(run_path, cancelled_at=time.time())
        return f"Slurm job {job.job_id} cancelled now (second Stop)"
    signal_batch(job.job_id)
    update_job(run_path, stop_requested_at=time.time(), stop_job=job.job_id)
    return f"Slurm job {job.job_id}: every rank finishes its step and saves a checkpoint (Stop again cancels at once)"


# --------------------------------------------------------------------------- the state shown
def merge(
    status: dict[str, Any], job: Job, checkpoint: str | None, last_line: str, cancelled_queued: bool = False
) -> dict[str, Any]:
    """What to show for a Slurm run: status.json's fields, with `status`, `message` and `error` from Slurm's word on
    `job` where the run's own files cannot know (pure: the rules, tested in tests/test_slurm_script.py).

    `checkpoint`: the newest complete checkpoint's name (None when there is none); `last_line`: of the job's log;
    `cancelled_queued`: Stop cancelled this job while it waited in the queue."""
    shown = dict(status)
    state = status.get("status", "unknown")
    where = f" on {job.nodes}" if job.nodes else ""
    if job.state == "UNKNOWN":
        if state in ACTIVE_FILE:
            shown.update(status="unknown", message=f"Slurm does not answer about job {job.job_id}: {job.reason}")
        return shown
    if job.queued:
        reason = f" ({job.reason})" if job.reason else ""
        again = "requeued; " if status.get("step") else ""
        shown.update(status="pending", message=f"{again}Slurm job {job.job_id} waits in the queue{reason}")
        return shown
    if job.running:
        if state in FINAL_FILE:
            return shown  # the run wrote its end; the job is finishing
        if state not in ACTIVE_FILE or state == "pending":
            shown.update(status="loading", message=f"Slurm job {job.job_id} is {job.state.lower()}{where}; starting")
        return shown
    # The job ended (or Slurm no longer knows it).
    if state in FINAL_FILE:
        return shown
    if cancelled_queued:
        shown.update(status="stopped", message=f"Slurm job {job.job_id} was cancelled before it started")
        return shown
    ended = f"Slurm job {job.job_id} ended ({job.state})" if job.state != "GONE" else f"Slurm job {job.job_id} ended"
    if checkpoint:
        shown.update(
            status="interrupted",
            error=f"{ended} before the run finished; Resume continues from {checkpoint}",
            message="interrupted, resumable",
        )
    else:
        shown.update(status="failed", error=f"{ended}: {last_line}" if last_line else f"{ended} before training")
    return shown


def _last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no message"


def run_view(run_path: Path, status: dict[str, Any], checkpoint: str | None) -> dict[str, Any] | None:
    """`merge` for a run directory (None for a run that never went to Slurm, and inside the job itself, where the
    run's own files and processes are the truth)."""
    record = read_job(run_path)
    if not record.get("job_id") or os.environ.get(INSIDE_JOB_ENV):
        return None
    job = job_state(str(record["job_id"]))
    line = log_line(run_path) if job.ended else ""
    return merge(status, job, checkpoint, line, cancelled_queued=record.get("cancelled_queued") == job.job_id)
