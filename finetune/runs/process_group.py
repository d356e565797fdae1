"""A multi-process run the project launched itself: its files, its stop flag, what each rank does, and the supervisor.

    launch (finetune/runs/launch.py)  ->  supervisor (this module, `python -m finetune.runs.process_group RUN_DIR`)
                                      a new session that survives the terminal; holds the device lock for the group
                                      ->  torchrun / deepspeed launcher (a session of its own)
                                           ->  N ranks: `python -m finetune train --launched RUN_DIR` (or --resume)

Files in the run directory, besides the usual ones (rundir.py):
  launch.json      {launcher, nproc, gpus, command, started_at, supervisor_pid, launcher_pid, rank_pids, and the start
                   time of each of those processes: a pid counts as the run's only with it (finetune/runs/pids.py)}
  launch.log       the launcher's and ranks' own output (where a rank's error line is found)
  stop-requested   the stop flag: `stop`, Ctrl-C on `--follow`, SIGTERM to the group and the app's Stop write it; every
                   rank looks for it at the end of each optimizer step and the ranks agree (an all-reduce), so they
                   all finish the same step, save one checkpoint and end

When the launcher exits, the supervisor makes sure the run never stays `running`: if the ranks died without a final
status it writes `failed` with the first failing rank's error in one line. No process of a group outlives it: the
launcher dies with the supervisor (the kernel's parent-death signal), every rank watches the supervisor and ends
within a second of it (`watch_supervisor`: a supervisor killed with -9), the supervisor kills ranks its launcher left
behind, and while any of them lives the device stays busy (`holder_alive`, which the device lock consults).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from finetune.atomic import read_json, write_json, write_text
from finetune.runs.pids import own_start, same_process, started_at
from finetune.runs.progress import Progress
from finetune.runs.rundir import ACTIVE, STATUS_WRITES, RunDir

STOP_FILE = "stop-requested"
GROUP_FILE = "launch.json"
LOG_FILE = "launch.log"
GROUP_ENV = "FINETUNE_GROUP_RUN"  # set in every rank's environment by the supervisor: the run directory
SUPERVISOR_ENV = "FINETUNE_GROUP_SUPERVISOR"  # and this: "PID:START_TIME" of the supervisor, which every rank watches
WATCH_EVERY_S = 0.5  # how often a rank looks for its supervisor
# A collective that waits longer than this fails instead of hanging (gloo's default is 30 minutes). Long enough
# for the slowest rank to load its model; a dead rank is caught sooner by the launcher.
COLLECTIVE_TIMEOUT_S = 300


# --------------------------------------------------------------------------- the group's files
def stop_path(run_path: Path) -> Path:
    """The stop flag of a launched run."""
    return Path(run_path) / STOP_FILE


# Supervisors this process started: polled so that a finished one is reaped (never left a zombie that looks alive).
_SUPERVISORS: list[subprocess.Popen] = []


def keep_supervisor(proc: subprocess.Popen) -> None:
    """Remember a supervisor this process started, so `reap_supervisors` collects its exit status."""
    _SUPERVISORS.append(proc)


def reap_supervisors() -> None:
    """Collect the exit status of supervisors this process started that have ended."""
    _SUPERVISORS[:] = [proc for proc in _SUPERVISORS if proc.poll() is None]


def request_stop(run_path: Path) -> None:
    """Ask every rank of a launched run to finish its step, save a checkpoint and end."""
    write_text(stop_path(run_path), json.dumps({"requested_at": time.time()}) + "\n")


def read_group(run_path: Path) -> dict[str, Any]:
    """launch.json of a launched run ({} for a run trained in one process)."""
    return read_json(Path(run_path) / GROUP_FILE, default={}) or {}


def update_group(run_path: Path, **changes: Any) -> None:
    """Rewrite launch.json with `changes` (atomic)."""
    write_json(Path(run_path) / GROUP_FILE, {**read_group(run_path), **changes})


def group_processes(run_path: Path) -> list[tuple[Any, Any]]:
    """(pid, start time) of every process launch.json records for the run: supervisor, launcher, ranks."""
    record = read_group(run_path)
    return [
        (record.get("supervisor_pid"), record.get("supervisor_started")),
        (record.get("launcher_pid"), record.get("launcher_started")),
        *_ranks(record),
    ]


def _ranks(record: dict[str, Any]) -> list[tuple[Any, Any]]:
    pids = record.get("rank_pids") or []
    return list(zip(pids, record.get("rank_started") or [None] * len(pids), strict=False))


def group_alive(run_path: Path) -> bool:
    """True while the supervisor, the launcher or any rank of a launched run still runs (a pid counts only with the
    start time recorded beside it: a reused pid is another process)."""
    return any(same_process(pid, started) for pid, started in group_processes(run_path))


def holder_alive(holder: dict[str, Any]) -> bool:
    """For the device lock: True when the previous holder was a launched group some process of which still runs.
    Its supervisor may be gone (killed with -9) and the lock with it, while its ranks still train."""
    return bool(holder.get("group") and holder.get("run_dir")) and group_alive(Path(holder["run_dir"]))


# --------------------------------------------------------------------------- inside each rank
def joined() -> bool:
    """True in a rank of a multi-process run (any launcher)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def join_group(uses_deepspeed: bool) -> None:
    """Set up this rank's process group with a bounded collective timeout before an engine does it with the
    libraries' default (30 minutes on gloo), and let rank 0 record every rank's pid in launch.json."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    timeout = collective_timeout()
    if uses_deepspeed:  # DeepSpeed keeps its own handle on the group: let it make the group so it has one
        import deepspeed

        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False, timeout=timeout)
    else:
        dist.init_process_group(backend, timeout=timeout)
    ranks: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, (os.getpid(), own_start()))
    run = os.environ.get(GROUP_ENV)
    if run and dist.get_rank() == 0 and (Path(run) / GROUP_FILE).is_file():
        pids, started = [pid for pid, _ in ranks], [when for _, when in ranks]
        update_group(Path(run), rank_pids=pids, rank_started=started, world_size=len(pids))


def collective_timeout() -> timedelta:
    """COLLECTIVE_TIMEOUT_S, or FINETUNE_COLLECTIVE_TIMEOUT_S from the environment."""
    return timedelta(seconds=int(os.environ.get("FINETUNE_COLLECTIVE_TIMEOUT_S", COLLECTIVE_TIMEOUT_S)))


def leave_group() -> None:
    """Tear the process group down at the end (a launcher may abort at exit otherwise)."""
    import contextlib

    import torch.distributed as dist

    if dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def watch_supervisor() -> None:
    """In a rank of a launched group: end this process within a second of its supervisor's end. A supervisor killed
    with -9 takes the device lock with it and can no longer settle the run, so its ranks must not train on beside
    whatever starts next; rank 0 first marks the run failed in one line (it resumes from its last checkpoint)."""
    pid_text, _, started_text = os.environ.get(SUPERVISOR_ENV, "").partition(":")
    if not pid_text.isdigit():
        return  # not started by a supervisor (torchrun typed by hand)
    pid = int(pid_text)
    started = float(started_text) if started_text else None

    def settle() -> None:
        if os.environ.get("RANK", "0") != "0":
            os.kill(os.getpid(), signal.SIGKILL)
        with STATUS_WRITES:  # held to the end: no status write of the training thread can come after ours
            if os.environ.get(GROUP_ENV):
                _mark_abandoned(RunDir(Path(os.environ[GROUP_ENV])), pid)
            os.kill(os.getpid(), signal.SIGKILL)

    def watch() -> None:
        while same_process(pid, started):
            time.sleep(WATCH_EVERY_S)
        settle()

    def at_exit() -> None:
        # Rank 0 may end between two looks of the watcher: another rank that saw the supervisor's end first broke
        # the collective, and rank 0's own failure line ("gloo ... Connection closed") would be the last word.
        if not same_process(pid, started):
            settle()

    atexit.register(at_exit)
    threading.Thread(target=watch, name="supervisor-watch", daemon=True).start()


def _mark_abandoned(run: RunDir, supervisor: int) -> None:
    """The run's status after its supervisor vanished: failed, saying so (best effort: the ranks end regardless).
    A failure rank 0 wrote a moment before is replaced: another rank that ended first broke its collective."""
    with contextlib.suppress(OSError):
        status = run.read_status()
        if status.get("status") not in (*ACTIVE, "failed"):
            return  # trained and saved: the supervisor's end changes nothing
        error = f"the launch supervisor (pid {supervisor}) ended unexpectedly; every process of the run was ended"
        now = time.time()
        run.write_status({**status, "status": "failed", "error": error, "finished_at": now, "updated_at": now})
        run.append_event({"type": "status", "status": "failed", "step": status.get("step", 0), "error": error})


def agree_any(flag: bool) -> bool:
    """True on every rank when any rank's flag is set (the flag as is without a process group)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return flag
    import torch

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    value = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


class GroupProgress(Progress):
    """`Progress` for one rank of several: at the end of every optimizer step the ranks agree whether to stop
    (the stop flag file, or a stop asked in this process), so all of them stop after the same step."""

    def on_step(self, step: int, max_steps: int, epoch: float, tokens_seen: int | None) -> None:
        """Progress as usual, then the stop agreement (one tiny all-reduce per step)."""
        super().on_step(step, max_steps, epoch, tokens_seen)
        local = self.stop_requested.is_set() or stop_path(self.run.path).exists()
        if agree_any(local) and not self.stop_requested.is_set():
            self.stop_requested.set()
            self.update(message="stop requested: finishing the current step and saving a checkpoint")


# --------------------------------------------------------------------------- the supervisor
def supervise(run_path: Path, lock_fd: int | None = None) -> int:
    """Run the launcher command of launch.json, wait for it, and settle the run's final status. `lock_fd`: the
    device lock inherited from `launch`, held until the end (then its holder line is cleared, as a release does)."""
    run = RunDir(Path(run_path))
    record = read_group(run.path)
    started = own_start()
    env = {**os.environ, GROUP_ENV: str(run.path), SUPERVISOR_ENV: f"{os.getpid()}:{started if started else ''}"}
    if record.get("cuda_visible_devices"):
        env["CUDA_VISIBLE_DEVICES"] = record["cuda_visible_devices"]
    signal.signal(signal.SIGTERM, lambda *_: request_stop(run.path))  # SIGTERM to the group = Stop
    signal.signal(signal.SIGINT, lambda *_: request_stop(run.path))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the terminal that launched it may close
    _wait_for_own_pid(run)
    with open(run.path / LOG_FILE, "ab") as log:
        # A session of its own: a signal to our group reaches us (and becomes a stop), not the ranks directly.
        # The launcher dies with us (a supervisor killed with -9); the ranks watch us themselves (watch_supervisor).
        child = subprocess.Popen(
            record["command"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent(os.getpid()),
        )
        update_group(
            run.path,
            supervisor_pid=os.getpid(),
            supervisor_started=started,
            launcher_pid=child.pid,
            launcher_started=started_at(child.pid),
        )
        while True:
            try:
                code = child.wait()
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for clarity
                continue
    end_leftover_ranks(run.path)
    settle(run, code)
    stop_path(run.path).unlink(missing_ok=True)
    if lock_fd is not None:
        with contextlib.suppress(OSError):
            os.ftruncate(lock_fd, 0)
    return 0


def _die_with_parent(parent: int) -> Any:
    """A `preexec_fn` that has the kernel kill the child with SIGKILL when `parent` ends (Linux; elsewhere None)."""
    import ctypes
    import ctypes.util

    try:
        prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def set_death_signal() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() != parent:  # the parent ended before the request was in place
            os._exit(1)

    return set_death_signal


def end_leftover_ranks(run_path: Path, timeout: float = 30.0) -> None:
    """After the launcher ended: kill any rank it left behind (a launcher killed with -9 orphans its ranks), so the
    device is only released once no process of the run trains."""
    left = [(pid, when) for pid, when in _ranks(read_group(run_path)) if same_process(pid, when)]
    for pid, _ in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any(same_process(pid, when) for pid, when in left) and time.monotonic() < deadline:
        time.sleep(0.05)


def _wait_for_own_pid(run: RunDir, timeout: float = 10.0) -> None:
    """`launch` records this supervisor's pid in the pending status right after spawning it. Start no rank before
    that write is done, so it can never overwrite a status a rank has written since (running, or even completed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = run.read_status()
        if status.get("status") != "pending" or status.get("pid") == os.getpid():
            return
        time.sleep(0.02)
    status = run.read_status()
    if status.get("status") == "pending":  # the launcher died before writing: record it here
        run.write_status({**status, "pid": os.getpid(), "pid_started": own_start()})


def settle(run: RunDir, code: int) -> None:
    """After the launcher ended: a run whose ranks died is marked failed with the first failing rank's error."""
    status = run.read_status()
    state = status.get("status")
    if code == 0 and state not in ACTIVE:
        return
    failure = diagnose(_log_tail(run.path / LOG_FILE), code)
    if state in ("completed", "stopped"):
        return  # trained and saved; a launcher that aborts at exit changes nothing about the result
    if state == "failed" and failure.get("rank") in (None, 0):
        return  # rank 0 wrote its own error, and no other rank failed first
    error = failure["message"]
    now = time.time()
    run.write_status({**status, "status": "failed", "error": error, "finished_at": now, "updated_at": now})
    run.append_event({"type": "status", "status": "failed", "step": status.get("step", 0), "error": error})


_ERROR_LINE = re.compile(r"^error: rank (\d+): (.+)$", re.MULTILINE)
# torchrun's failure report: "  rank      : 1 (local_rank: 1)", then "  exitcode  : -9 (pid: 13960)" on the next
# line. Anchored at a line start: a log line's "local_rank: 0 (pid: …)" must not pair with a later rank's exit code.
_FAILURE = re.compile(r"^\s*rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)", re.MULTILINE)
_DS_EXIT = re.compile(r"process (\d+) exits with return code = (-?\d+)")


def diagnose(log: str, code: int) -> dict[str, Any]:
    """{"rank", "message"}: which rank failed first and why, in one line, from the launcher's output."""
    errors = {int(rank): text.strip() for rank, text in reversed(_ERROR_LINE.findall(log))}
    failures = [(int(r), int(c), int(p)) for r, c, p in _FAILURE.findall(log)]
    # A rank killed by a signal neither the launcher (SIGTERM ends the others) nor the rank itself sent is the cause;
    # otherwise a rank that reported an error, otherwise the launcher's own first failure.
    # SIGABRT is what a rank does to itself when a collective fails because another rank died: a consequence too.
    killed = [f for f in failures if f[1] < 0 and -f[1] not in (signal.SIGTERM, signal.SIGABRT)]
    if killed:
        rank, exit_code, pid = killed[0]
        return {"rank": rank, "message": f"rank {rank} (pid {pid}) was killed by {_signal_name(-exit_code)}"}
    reported = [f for f in failures if f[0] in errors]
    if reported or errors:
        rank = reported[0][0] if reported else min(errors)
        return {"rank": rank, "message": f"rank {rank}: {errors[rank]}"}
    if failures:
        rank, exit_code, pid = failures[0]
        return {"rank": rank, "message": f"rank {rank} (pid {pid}) ended with exit code {exit_code}"}
    ds = _DS_EXIT.findall(log)
    if ds:
        pid, exit_code = ds[0]
        how = _signal_name(-int(exit_code)) if int(exit_code) < 0 else f"exit code {exit_code}"
        return {"rank": None, "message": f"a rank (pid {pid}) ended with {how}; see launch.log"}
    return {"rank": None, "message": f"the processes ended with exit code {code} before the run finished"}


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _log_tail(path: Path, limit: int = 200_000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - limit))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def main(argv: list[str]) -> int:
    """`python -m finetune.runs.process_group RUN_DIR [LOCK_FD]`: the supervisor (started by `launch`, never by hand)."""
    return supervise(Path(argv[0]), int(argv[1]) if len(argv) > 1 else None)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
