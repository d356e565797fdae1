"""Runs the project launches itself as a detached group of 2 processes on the CPU (gloo): `python -m finetune launch`
(--follow), `stop`, `launch --resume`, a rank killed mid-run, the app finding a launched run from its files, and one
line for every bad launch flag. Each launch is a real torchrun group training the tiny model for a few steps."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from finetune.atomic import read_json
from finetune.cli import main
from finetune.runs.device_lock import DeviceLock
from finetune.runs.process_group import STOP_FILE, group_alive, read_group
from finetune.runs.rundir import RunDir
from tests.helpers import child_env, cli, events_size, raw_events, tiny_config

ROOT = Path(__file__).resolve().parents[1]
GROUP_TIMEOUT_S = 400  # a 2-process start on a busy 2-core machine (DeepSpeed may JIT-build its op once)


def wait_for(condition, what: str, timeout: float = GROUP_TIMEOUT_S) -> float:
    """Poll `condition()` until true; returns the seconds it took."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout, f"timed out waiting for {what}"
        time.sleep(0.2)
    return time.monotonic() - start


def status(run: Path) -> dict:
    return RunDir(run).read_status()


def assert_group_gone(run: Path) -> None:
    """Every process of the group has ended and the device is free again."""
    record = read_group(run)
    assert not group_alive(run), record
    assert len(record["rank_pids"]) == 2
    lock = DeviceLock(run.parent)
    lock.acquire({"run_id": "next"})  # free: the next run may start (BusyError otherwise)
    lock.release()


# --------------------------------------------------------------------------- refusals (the flag table: test_cli.py)
def test_resume_refuses_a_running_or_finished_run_and_stop_refuses_an_idle_one(tiny_model_dir, studio_home, capsys):
    runs = studio_home / "runs"
    for name, state in (("running", "running"), ("done", "completed")):
        run = RunDir(runs / name)
        run.path.mkdir(parents=True)
        run.write_config(tiny_config(tiny_model_dir))
        run.write_status({"status": state, "pid": os.getpid(), "step": 2})  # this live process "runs" it
        (run.path / "checkpoint-2").mkdir()
    assert main(["launch", "--resume", str(runs / "running")]) == 2
    assert "error: --resume: running is still running" in capsys.readouterr().err
    assert main(["launch", "--resume", "done"]) == 2
    assert "error: --resume: done already completed" in capsys.readouterr().err
    assert main(["stop", "done"]) == 2
    assert "error: run_dir: done is not running (it is completed)" in capsys.readouterr().err
    assert not (runs / "done" / STOP_FILE).exists()


# --------------------------------------------------------------------------- the supervisor, with stand-in ranks
STAND_IN_RANK = """
import json, os, sys, time
from pathlib import Path
run = Path(os.environ["FINETUNE_GROUP_RUN"])
status = {"status": "running", "step": 3, "pid": os.getpid(), "world_size": 2, "message": "training"}
(run / "status.json").write_text(json.dumps(status))
while not (run / "stop-requested").exists():
    if (run / "die").exists():
        print("error: rank 1: RuntimeError: boom", file=sys.stderr)
        sys.exit(1)
    time.sleep(0.05)
(run / "status.json").write_text(json.dumps({**status, "status": "stopped"}))
"""


def supervised_stand_in(tiny_model_dir: Path, home: Path) -> tuple[Path, subprocess.Popen]:
    """A run under the real supervisor whose "launcher" is one small Python process acting as the ranks: it trains
    until the stop flag appears (then says stopped), or fails with a rank's error line when asked to."""
    run = RunDir(home / "runs" / "stand-in")
    run.path.mkdir(parents=True)
    run.write_config(tiny_config(tiny_model_dir))
    run.write_status({"status": "pending"})
    (run.path / "launch.json").write_text(json.dumps({"command": [sys.executable, "-c", STAND_IN_RANK], "nproc": 2}))
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "finetune.runs.process_group", str(run.path)],
        env=child_env(home),
        start_new_session=True,
    )
    run.write_status({"status": "pending", "pid": supervisor.pid})  # as `launch` does right after the spawn
    wait_for(lambda: run.read_status().get("status") == "running", "the stand-in to run", timeout=60)
    return run.path, supervisor


def test_sigterm_to_the_group_and_stop_both_raise_the_stop_flag(tiny_model_dir, studio_home):
    run, supervisor = supervised_stand_in(tiny_model_dir, studio_home)
    os.killpg(supervisor.pid, signal.SIGTERM)  # what `kill -TERM -PGID` (or a session manager) sends
    assert supervisor.wait(timeout=60) == 0
    assert status(run)["status"] == "stopped" and not (run / STOP_FILE).exists()  # the flag is gone for a resume

    (run / "die").unlink(missing_ok=True)
    shutil.rmtree(run)
    run, supervisor = supervised_stand_in(tiny_model_dir, studio_home)
    done = cli("stop", run.name, home=studio_home, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("stop requested: stand-in saves a checkpoint"), done
    assert supervisor.wait(timeout=60) == 0
    assert status(run)["status"] == "stopped"


FOLLOW = (
    "import sys; from pathlib import Path; from finetune.cli.launch import follow_group; "
    "from finetune.runs.rundir import RunDir; sys.exit(follow_group(RunDir(Path(sys.argv[1]))))"
)


def test_ctrl_c_while_following_stops_the_run_and_the_follower_ends_with_its_summary(tiny_model_dir, studio_home):
    """What `launch --follow` does after printing the run directory, attached to a supervised run."""
    run, supervisor = supervised_stand_in(tiny_model_dir, studio_home)
    follower = subprocess.Popen(
        [sys.executable, "-c", FOLLOW, str(run)],
        env=child_env(studio_home),
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    first = follower.stdout.readline()  # printed from inside the follow loop: Ctrl-C is handled from here on
    assert first.strip() == "[running] training", first
    follower.send_signal(signal.SIGINT)
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, err[-2000:]
    assert "stopping after this step (saving a checkpoint)" in err
    assert out.strip().splitlines()[-1].startswith("stopped: step 3"), out
    assert supervisor.wait(timeout=60) == 0 and status(run)["status"] == "stopped"


def test_a_rank_that_fails_is_named_in_the_runs_one_line_error(tiny_model_dir, studio_home):
    run, supervisor = supervised_stand_in(tiny_model_dir, studio_home)
    (run / "die").write_text("")
    assert supervisor.wait(timeout=60) == 0
    final = status(run)
    assert final["status"] == "failed" and final["error"] == "rank 1: RuntimeError: boom", final
    assert RunDir(run).read_events(("status",))[-1]["error"] == "rank 1: RuntimeError: boom"


# --------------------------------------------------------------------------- real groups
def test_zero2_trainer_launched_and_followed_to_the_end(tiny_model_dir, tmp_path, studio_home):
    """ZeRO-2 through the Trainer, 2 ranks: `launch --follow` prints the run directory, follows with train's
    progress and ends with the summary line; rank 0 alone wrote the run, which records world_size 2 and the
    DeepSpeed config as the Trainer filled it in."""
    config = tiny_config(tiny_model_dir, zero_stage=2, max_steps=4, save_steps=2, per_device_train_batch_size=2)
    config.save(tmp_path / "run.yaml")
    done = cli("launch", "--config", str(tmp_path / "run.yaml"), "--nproc", "2", "--follow", home=studio_home)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    run = Path(lines[0])
    assert run.parent == studio_home / "runs"
    assert lines[-1].startswith("completed: step 4/4") and str(run) in lines[-1], lines[-1]
    final = status(run)
    assert final["status"] == "completed" and final["world_size"] == 2
    assert RunDir(run).has_final_model()
    assert {e["world_size"] for e in RunDir(run).read_events(("status",))} == {2}
    ds = read_json(run / "ds_config.json")
    assert ds["zero_optimization"]["stage"] == 2 and ds["train_batch_size"] == 2 * 2  # "auto" resolved: 2 × 1 × 2
    assert [e["step"] for e in raw_events(run)] == [1, 2, 3, 4]  # one log line per step: rank 0 alone writes
    assert_group_gone(run)


def test_zero3_engine_stopped_then_resumed_with_the_same_processes(tiny_model_dir, tmp_path, studio_home, capsys):
    """ZeRO-3 through the engine loop, 2 ranks, detached: the app (a fresh Studio, as after a restart) finds it
    running from its files, a second run is refused, the app's Stop ends it with a checkpoint from both ranks, and
    `launch --resume --follow` continues from there with 2 processes, training only the steps after it."""
    from finetune.studio import Studio

    config = tiny_config(
        tiny_model_dir,
        backend="deepspeed",
        zero_stage=3,
        max_steps=60,
        save_steps=100,
        per_device_train_batch_size=2,
        lora_dropout=0.0,
    )
    config.save(tmp_path / "run.yaml")
    started = cli("launch", "--config", str(tmp_path / "run.yaml"), "--nproc", "2", home=studio_home, timeout=60)
    assert started.returncode == 0, started.stderr[-3000:]
    run = Path(started.stdout.strip().splitlines()[-1])
    try:
        wait_for(lambda: status(run).get("step", 0) >= 2, "step 2")
        app = Studio(runs_root=studio_home / "runs")
        seen = app.state()
        assert seen is not None and seen.status == "running" and seen.world_size == 2 and seen.step >= 2, seen
        assert [r.status for r in app.runs() if r.run_id == run.name] == ["running"]
        assert main(["train", "--config", str(tmp_path / "run.yaml")]) == 2  # one run per machine covers the group
        assert capsys.readouterr().err.startswith(f"error: busy: run {run.name} started by the command line")
    finally:
        assert app.stop()  # the app's Stop: the same flag as `python -m finetune stop`
    wait_for(lambda: not group_alive(run), "the group to end")
    final = status(run)
    assert final["status"] == "stopped" and 2 <= final["step"] < 60, final
    step = final["step"]
    checkpoint = RunDir(run).last_checkpoint()
    assert checkpoint is not None and checkpoint.name == f"checkpoint-{step}"
    assert sorted(p.name for p in checkpoint.glob("rng_state_*.pth")) == ["rng_state_0.pth", "rng_state_1.pth"]
    assert len(list(checkpoint.glob("*zero_pp_rank_*_optim_states.pt"))) == 2
    assert not (run / STOP_FILE).exists()
    assert_group_gone(run)

    mark = events_size(run)
    resumed = cli("launch", "--resume", str(run), "--set", f"max_steps={step + 2}", "--follow", home=studio_home)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    final = status(run)
    assert final["status"] == "completed" and final["step"] == step + 2 and final["world_size"] == 2
    assert [e["step"] for e in raw_events(run, mark)] == [step + 1, step + 2]
    assert read_group(run)["nproc"] == 2
    assert RunDir(run).has_final_model()


def test_a_rank_killed_mid_run_fails_the_run_in_one_line_within_seconds(tiny_model_dir, studio_home):
    """Started from the app (Studio.start with 2 processes); rank 1 killed: the other goes down and the run says
    which rank died, in one line, seconds later."""
    from finetune.studio import Studio

    config = tiny_config(
        tiny_model_dir, backend="deepspeed", zero_stage=2, max_steps=200, save_steps=100, per_device_train_batch_size=2
    )
    app = Studio(runs_root=studio_home / "runs")
    assert app.max_processes() == min(4, os.cpu_count() or 1)
    state = app.start(config.to_dict(), processes=2)
    assert state.status == "pending" and state.world_size == 2, state
    run = Path(state.run_dir)
    assert run.parent == studio_home / "runs"
    wait_for(lambda: status(run).get("step", 0) >= 1, "step 1")
    assert app.state().status == "running" and app.state().world_size == 2
    samples = RunDir(run).read_events(("samples",))  # ZeRO-2 on 2 processes: rank 0 answers, as one process does
    assert samples and samples[0]["step"] == 0 and samples[0]["samples"][0]["answer"] is not None
    rank_pids = read_group(run)["rank_pids"]
    os.kill(rank_pids[1], signal.SIGKILL)
    took = wait_for(lambda: not group_alive(run), "the group to end", timeout=120)
    final = status(run)
    assert final["status"] == "failed", final
    assert final["error"] == f"rank 1 (pid {rank_pids[1]}) was killed by SIGKILL", final["error"]
    assert took < 60, f"the other rank took {took:.0f}s to go down"
    print(f"rank 1 killed: the group was down and the run marked failed {took:.1f}s later")
    assert_group_gone(run)
    assert app.state().status == "failed" and not app.manager.is_active()


def test_two_machines_node_0_is_launched_and_the_printed_command_joins_it(tiny_model_dir, tmp_path, studio_home):
    """`launch --nodes 2` runs node 0 here, detached, and prints what the other machine runs. The "other machine" is a
    second torchrun on this host with NODE_RANK=1 (one process per node, gloo over 127.0.0.1): the run trains on
    both and rank 0 (node 0) writes it, with world_size 2."""
    import shlex

    from finetune.engines.world import free_port

    config = tiny_config(tiny_model_dir, max_steps=3, save_steps=3, per_device_train_batch_size=2)
    config.save(tmp_path / "run.yaml")
    node0 = cli(
        "launch",
        "--config",
        str(tmp_path / "run.yaml"),
        "--nodes",
        "2",
        "--nproc",
        "1",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        home=studio_home,
        timeout=60,
    )
    assert node0.returncode == 0, node0.stderr[-3000:]
    heading, command, run_dir = node0.stdout.strip().splitlines()[-3:]
    run = Path(run_dir)
    assert heading.startswith("# run this on each other machine (NODE_RANK 1..1)")
    assert command.startswith("torchrun --nnodes 2 --node_rank $NODE_RANK --master_addr 127.0.0.1")
    assert f"--set output_dir={run}" in command
    argv = shlex.split(command.replace("$NODE_RANK", "1"))
    argv[0] = str(Path(sys.executable).parent / "torchrun")
    node1 = subprocess.run(
        [*argv, "--no-progress"], env=child_env(studio_home), cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert node1.returncode == 0, node1.stderr[-3000:]
    wait_for(lambda: not group_alive(run), "node 0 to end", timeout=120)
    final = status(run)
    assert final["status"] == "completed" and final["step"] == 3 and final["world_size"] == 2, final
    assert RunDir(run).has_final_model()


@pytest.mark.gpu
def test_gpus_pins_the_ranks_to_the_chosen_gpu_and_refuses_one_that_does_not_exist(
    tiny_model_dir, tmp_path, studio_home, capsys
):
    import torch

    config = tiny_config(tiny_model_dir, max_steps=2, save_steps=2)
    config.save(tmp_path / "run.yaml")
    count = torch.cuda.device_count()
    assert main(["launch", "--config", str(tmp_path / "run.yaml"), "--gpus", str(count)]) == 2
    assert capsys.readouterr().err.startswith(f"error: --gpus: GPU {count} does not exist")
    last = str(count - 1)
    done = cli("launch", "--config", str(tmp_path / "run.yaml"), "--gpus", last, "--follow", home=studio_home)
    assert done.returncode == 0, done.stderr[-3000:]
    run = Path(done.stdout.strip().splitlines()[0])
    assert read_group(run)["cuda_visible_devices"] == last
    final = status(run)
    assert final["status"] == "completed" and final["device"] == torch.cuda.get_device_name(count - 1), final


def test_the_killed_rank_is_named_even_when_the_other_aborts_first():
    """torchrun's report after rank 1 was SIGKILLed and rank 0 aborted in its collective (seen under load): the run's
    line names the killed rank, not the one whose collective failed because of it."""
    from finetune.runs.process_group import diagnose

    log = (
        "error: rank 0: training failed at step 29: RuntimeError: [gloo] Read error: Connection reset by peer\n"
        "E1130 23:52:01.868000 13954 api.py:1002] failed (exitcode: -6) local_rank: 0 (pid: 13959) of binary: python\n"
        "Failures:\n"
        "  rank      : 1 (local_rank: 1)\n"
        "  exitcode  : -9 (pid: 13960)  (SIGKILL)\n"
        "Root Cause (first observed failure):\n"
        "  rank      : 0 (local_rank: 0)\n"
        "  exitcode  : -6 (pid: 13959)  (SIGABRT)\n"
    )
    assert diagnose(log, 1) == {"rank": 1, "message": "rank 1 (pid 13960) was killed by SIGKILL"}
