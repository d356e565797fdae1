"""A launched group's processes and the run's status agree: no rank outlives its supervisor, a stopped run resumes
at once, and a pid counts as the run's only with the start time recorded beside it.

The cheap cases run the real supervisor (`python -m finetune.runs.process_group`) over a small Python "launcher"; one
test
runs a real 2-process torchrun group (gloo, the tiny model): stop, resume at once, then `kill -9` of its supervisor."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from finetune.cli import main
from finetune.errors import BusyError, UserError
from finetune.runs import launch
from finetune.runs.device_lock import DeviceLock
from finetune.runs.manager import RunManager
from finetune.runs.pids import own_start, same_process
from finetune.runs.process_group import (
    STOP_FILE,
    group_alive,
    group_processes,
    holder_alive,
    read_group,
    request_stop,
)
from finetune.runs.rundir import COMPLETE_MARKER, RunDir
from tests.helpers import child_env, cli, tiny_config
from tests.test_launch_group import status, wait_for

AN_HOUR = 3600.0


def run_with_checkpoint(root: Path, tiny_model_dir: Path, name: str, **status_fields) -> RunDir:
    """A run directory with a complete checkpoint at step 2 and the given status (one process, launched)."""
    run = RunDir(root / name)
    (run.path / "checkpoint-2").mkdir(parents=True)
    (run.path / "checkpoint-2" / "trainer_state.json").write_text("{}")
    (run.path / "checkpoint-2" / COMPLETE_MARKER).write_text("{}")
    run.write_config(tiny_config(tiny_model_dir))
    run.write_status({"status": "running", "step": 2, "max_steps": 8, "format": 2, "world_size": 1, **status_fields})
    return run


def supervised(run: RunDir, launcher_script: str, home: Path) -> subprocess.Popen:
    """The real supervisor over `launcher_script` (a Python program standing in for torchrun and its ranks)."""
    record = {"command": [sys.executable, "-c", launcher_script], "launcher": "torchrun", "nproc": 1, "gpus": []}
    (run.path / "launch.json").write_text(json.dumps(record))
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "finetune.runs.process_group", str(run.path)],
        env=child_env(home),
        start_new_session=True,
    )
    run.write_status({**run.read_status(), "status": "pending", "pid": supervisor.pid})  # as `launch` does
    return supervisor


# --------------------------------------------------------------------------- a pid is a pid and a start time
def test_a_reused_pid_neither_blocks_resume_nor_takes_a_stop(tiny_model_dir, studio_home, monkeypatch, capsys):
    """The run's recorded processes have this test's pid: with this process's start time the run is running; with
    a start time an hour earlier (a reboot gave the pid to another process) it is interrupted: `stop` says so and
    writes no flag, the app lists it as resumable, and `launch --resume` goes ahead."""
    root = studio_home / "runs"
    me, started = os.getpid(), own_start()
    for name, when in (("live", started), ("reused", started - AN_HOUR)):
        run = run_with_checkpoint(root, tiny_model_dir, name, pid=me, pid_started=when)
        group = {"launcher": "torchrun", "nproc": 1, "gpus": [], "supervisor_pid": me, "supervisor_started": when}
        (run.path / "launch.json").write_text(json.dumps({**group, "rank_pids": [me], "rank_started": [when]}))

    assert main(["launch", "--resume", "live"]) == 2
    assert "error: --resume: live is still running; stop it first" in capsys.readouterr().err

    assert main(["stop", "reused"]) == 2
    assert capsys.readouterr().err.strip() == "error: run_dir: reused is not running (it is interrupted)"
    assert not (root / "reused" / STOP_FILE).exists()
    listed = {r["run_id"]: r for r in RunManager(root).runs()}
    assert listed["reused"]["status"] == "interrupted" and listed["reused"]["resumable"]
    assert listed["live"]["status"] == "interrupted"  # ours by pid, but no thread of this process trains it
    started_groups = []
    monkeypatch.setattr(launch, "_start_group", lambda run, *args, **kwargs: started_groups.append(run) or run)
    assert main(["launch", "--resume", "reused"]) == 0, capsys.readouterr().err
    assert [run.name for run in started_groups] == ["reused"]


# --------------------------------------------------------------------------- stop, then resume at once
LINGERING_GROUP = """
import json, os, time
from pathlib import Path
run = Path(os.environ["FINETUNE_GROUP_RUN"])
status = json.loads((run / "status.json").read_text())
(run / "status.json").write_text(json.dumps({**status, "status": "running", "pid": os.getpid()}))
while not (run / "stop-requested").exists():
    time.sleep(0.05)
(run / "status.json").write_text(json.dumps({**status, "status": "stopped", "pid": os.getpid()}))
deadline = time.monotonic() + 300  # never forever, whatever the test does
while not (run / "release").exists() and time.monotonic() < deadline:  # the ranks leaving their group: it takes a while
    time.sleep(0.05)
"""


def test_resume_right_after_a_stop_waits_for_the_processes_then_goes_ahead(tiny_model_dir, studio_home, monkeypatch):
    """The status says stopped while the group's processes still end. A resume then waits for them (not "still
    running; stop it first") and starts the group once they are gone; one that waits past its bound says why."""
    run = run_with_checkpoint(studio_home / "runs", tiny_model_dir, "long")
    supervisor = supervised(run, LINGERING_GROUP, studio_home)
    try:
        check_resume_waits(run, monkeypatch)
    finally:  # the stand-in group ends, whatever happened
        request_stop(run.path)
        (run.path / "release").write_text("")
    assert supervisor.wait(timeout=60) == 0


def check_resume_waits(run: RunDir, monkeypatch) -> None:
    wait_for(lambda: run.read_status().get("status") == "running", "the stand-in to run", timeout=60)
    request_stop(run.path)
    wait_for(lambda: run.read_status().get("status") == "stopped", "stopped", timeout=60)
    assert group_alive(run.path)

    monkeypatch.setattr(launch, "GROUP_END_WAIT_S", 1.0)
    with pytest.raises(UserError, match=r"^--resume: long is stopped but its processes have not ended after 1 s"):
        launch.resume_group(run.path)

    monkeypatch.setattr(launch, "GROUP_END_WAIT_S", 120.0)
    waiting, seen_alive_at_start = threading.Event(), []
    wait_for_end = launch._wait_for_group_end

    def observed_wait(run_dir):
        waiting.set()
        wait_for_end(run_dir)

    monkeypatch.setattr(launch, "_wait_for_group_end", observed_wait)
    monkeypatch.setattr(launch, "_start_group", lambda r, *a, **k: seen_alive_at_start.append(group_alive(r.path)) or r)
    outcome: list = []
    resume = threading.Thread(target=lambda: outcome.append(launch.resume_group(run.path)))
    resume.start()
    assert waiting.wait(60) and group_alive(run.path)  # the resume is waiting, the group still there
    (run.path / "release").write_text("")
    resume.join(60)
    assert [r.name for r in outcome] == ["long"] and seen_alive_at_start == [False]


# --------------------------------------------------------------------------- a launcher that dies leaves no rank
ORPHANING_LAUNCHER = """
import json, os, subprocess, sys, time
from pathlib import Path
import psutil
run = Path(os.environ["FINETUNE_GROUP_RUN"])
while "launcher_pid" not in json.loads((run / "launch.json").read_text()):  # the supervisor's record first
    time.sleep(0.02)
rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
record = json.loads((run / "launch.json").read_text())
record.update(rank_pids=[rank.pid], rank_started=[psutil.Process(rank.pid).create_time()])
(run / "launch.json").write_text(json.dumps(record))
status = json.loads((run / "status.json").read_text())
(run / "status.json").write_text(json.dumps({**status, "status": "running", "pid": rank.pid}))
sys.exit(1)  # the launcher dies, its rank trains on
"""


def test_ranks_a_dead_launcher_left_behind_are_ended_before_the_device_is_free(tiny_model_dir, studio_home):
    run = run_with_checkpoint(studio_home / "runs", tiny_model_dir, "orphaned")
    supervisor = supervised(run, ORPHANING_LAUNCHER, studio_home)
    assert supervisor.wait(timeout=120) == 0
    rank, started = read_group(run.path)["rank_pids"][0], read_group(run.path)["rank_started"][0]
    try:
        assert not same_process(rank, started) and not group_alive(run.path)
    finally:
        if same_process(rank, started):  # a failing test leaves no sleeper behind
            os.kill(rank, signal.SIGKILL)
    final = run.read_status()
    assert final["status"] == "failed" and "exit code 1" in final["error"], final


# --------------------------------------------------------------------------- a real group
def test_a_stopped_group_resumes_at_once_and_kill_9_of_its_supervisor_takes_the_ranks_down(
    tiny_model_dir, tmp_path, studio_home, capsys
):
    """Two torchrun ranks (DDP on gloo). `stop`, and `launch --resume` as soon as the status says stopped: it goes
    ahead. Then the resumed group's supervisor is killed with -9 while its ranks are frozen (SIGSTOP): the app still
    shows the run training and a second run is refused. Let go, the ranks end within seconds, the run says why in
    one line, and the device is free."""
    root = studio_home / "runs"
    config = tiny_config(tiny_model_dir, max_steps=500, save_steps=2, per_device_train_batch_size=2)
    config.save(tmp_path / "run.yaml")
    started = cli("launch", "--config", str(tmp_path / "run.yaml"), "--nproc", "2", home=studio_home, timeout=120)
    assert started.returncode == 0, started.stderr[-3000:]
    run = Path(started.stdout.strip().splitlines()[-1])
    try:
        stop_resume_and_kill_the_supervisor(run, root, tmp_path / "run.yaml", studio_home, capsys)
    finally:  # a failing test leaves no group training on
        for pid, started_at in group_processes(run):
            if same_process(pid, started_at):
                os.kill(pid, signal.SIGKILL)


def stop_resume_and_kill_the_supervisor(run: Path, root: Path, config_file: Path, home: Path, capsys) -> None:
    from finetune.studio import Studio

    wait_for(lambda: status(run).get("step", 0) >= 3 and RunDir(run).last_checkpoint() is not None, "step 3")
    assert cli("stop", str(run), home=home, timeout=120).returncode == 0
    wait_for(lambda: status(run).get("status") == "stopped", "the stopped status")
    # Rank 0 writes "stopped" before its process, the launcher and the supervisor end: seconds, never none.
    assert group_alive(run), "the group had ended before the resume: nothing was tested"
    resumed = cli("launch", "--resume", str(run), home=home)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    stopped_at = status(run)["step"]
    wait_for(lambda: status(run).get("step", 0) > stopped_at and read_group(run).get("rank_started"), "the resume")
    record = read_group(run)
    ranks = record["rank_pids"]
    for pid in ranks:
        os.kill(pid, signal.SIGSTOP)
    os.kill(record["supervisor_pid"], signal.SIGKILL)
    wait_for(lambda: not same_process(record["supervisor_pid"], record["supervisor_started"]), "the supervisor's end")
    app = Studio(runs_root=root)
    try:
        assert group_alive(run) and app.manager.is_active() and app.state().status == "running", app.state()
        assert main(["train", "--config", str(config_file)]) == 2  # never beside the live ranks
        assert capsys.readouterr().err.startswith(f"error: busy: run {run.name} started by the command line")
    finally:
        for pid in ranks:
            os.kill(pid, signal.SIGCONT)
    took = wait_for(lambda: not group_alive(run), "the ranks to end", timeout=120)
    with capsys.disabled():
        print(f"supervisor killed with -9: its ranks were gone {took:.1f}s after they were let go")
    assert took < 30, f"the ranks outlived their supervisor by {took:.0f}s"
    final = status(run)
    assert final["status"] == "failed", final
    assert final["error"].startswith(f"the launch supervisor (pid {record['supervisor_pid']}) ended unexpectedly")
    lock = DeviceLock(root, still_busy=holder_alive)
    lock.acquire({"run_id": "next"})  # free again: BusyError otherwise
    lock.release()
    assert [r.resumable for r in app.runs() if r.run_id == run.name] == [True]
    assert not app.manager.is_active()


def test_the_device_lock_stays_busy_while_a_previous_groups_process_lives(tiny_model_dir, studio_home):
    """The lock file names a launched group whose supervisor is gone but one of whose processes still runs."""
    root = studio_home / "runs"
    run = run_with_checkpoint(root, tiny_model_dir, "orphan-holder")
    (run.path / "launch.json").write_text(json.dumps({"rank_pids": [os.getpid()], "rank_started": [own_start()]}))
    holder = {"run_id": run.name, "owner": "the command line", "started_at": time.time(), "group": True}
    (root / ".device.lock").write_text(json.dumps({**holder, "run_dir": str(run.path)}))
    with pytest.raises(BusyError, match=f"^busy: run {run.name} started by the command line"):
        DeviceLock(root, still_busy=holder_alive).acquire({"run_id": "next"})
    (run.path / "launch.json").write_text(json.dumps({"rank_pids": [os.getpid()], "rank_started": [1.0]}))
    lock = DeviceLock(root, still_busy=holder_alive)
    lock.acquire({"run_id": "next"})  # that pid is another process now: free
    lock.release()
