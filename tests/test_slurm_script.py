"""Slurm without a cluster: the batch script rendered from a config, the settings refused in one line, the state a run
shows for each thing Slurm can say about its job, and Stop's two steps (against stand-in Slurm commands on PATH).
The tests on a real cluster are in tests/test_slurm.py."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from finetune.cluster import scheduler, slurm
from finetune.cluster.scheduler import Job, merge
from finetune.cluster.script import job_plan, render
from finetune.config import TrainConfig
from finetune.errors import ConfigError, UserError


def config(**values) -> TrainConfig:
    return TrainConfig.from_dict({"runs_on": "slurm", **values})


# --------------------------------------------------------------------------- the batch script
def test_the_script_asks_slurm_for_the_nodes_gpus_limit_and_a_warning_and_starts_one_torchrun_per_node(tmp_path):
    c = config(nodes=2, gpus_per_node=8, slurm_partition="gpu", slurm_time="04:00:00", slurm_account="proj",
               slurm_extra="--qos=high; #SBATCH --constraint=a100")  # fmt: skip
    run = tmp_path / "runs" / "my-run"
    script = render(job_plan(c), run, workdir=tmp_path)
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    sbatch = [line for line in lines if line.startswith("#SBATCH ")]
    assert sbatch == [
        "#SBATCH --job-name=finetune-my-run",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --time=04:00:00",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=proj",
        "#SBATCH --signal=B:USR1@180",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        f"#SBATCH --output={run}/slurm.log",
        f"#SBATCH --chdir={tmp_path}",
        "#SBATCH --qos=high",
        "#SBATCH --constraint=a100",
    ]
    assert "16 ranks" in lines[1]
    # Stop and the warning raise the run's stop flag; the rendezvous is the allocation's first node.
    assert "trap '" in script and '"$RUN/stop-requested"' in script and "USR1" in script
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in script
    assert '--node_rank "$SLURM_NODEID"' in script and "--nproc_per_node 8" in script
    assert '-m finetune train "$MODE" "$RUN"' in script and "slurm-job-start" in script


def test_a_cpu_job_asks_no_gpus_and_leaves_out_what_is_not_set(tmp_path):
    script = render(job_plan(config(nodes=1, gpus_per_node=0)), tmp_path / "r")
    assert "--gpus-per-node" not in script and "--partition" not in script and "--time" not in script
    assert "--nproc_per_node 1" in script


@pytest.mark.parametrize(
    ("values", "line"),
    [
        ({"slurm_time": "4h"}, "slurm_time: '4h' is not a Slurm time limit; use HH:MM:SS, D-HH:MM:SS or minutes"),
        ({"slurm_extra": "rm -rf /"}, "slurm_extra: 'rm -rf /' is not an sbatch option"),
        ({"slurm_extra": "--comment=$(id)"}, "slurm_extra: '--comment=$(id)' is not an sbatch option"),
        ({"nodes": 0}, "nodes"),
        ({"gpus_per_node": -1}, "gpus_per_node"),
        ({"runs_on": "kubernetes"}, "runs_on"),
    ],
)
def test_bad_slurm_settings_are_refused_naming_the_field(values, line):
    with pytest.raises(ConfigError) as caught:
        config(**values)
    assert str(caught.value).startswith(line)
    assert caught.value.field == line.split(":")[0]


def test_time_limits_slurm_takes_are_accepted():
    for value in ("30", "30:00", "04:00:00", "2-00", "2-12:30", "1-00:00:00"):
        assert config(slurm_time=value).slurm_time == value


def test_gpus_are_read_from_sinfo_gres():
    assert [slurm.gpus_in(g) for g in ("(null)", "gpu:8", "gpu:a100:4(S:0-1)", "gpu:2,shard:4", "")] == [0, 8, 4, 2, 0]


def test_without_sbatch_on_path_submitting_is_refused_before_anything_is_written(tmp_path, monkeypatch, studio_home):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(UserError) as caught:
        slurm.submit(config(), studio_home / "runs")
    assert str(caught.value).startswith("runs_on: slurm, but sbatch is not on PATH here")
    assert not (studio_home / "runs").exists()


def test_submit_refuses_a_config_that_runs_on_this_machine(studio_home):
    with pytest.raises(UserError, match="^runs_on: this_machine; set runs_on: slurm"):
        slurm.submit(TrainConfig(), studio_home / "runs")


# --------------------------------------------------------------------------- the state shown
RUNNING_FILE = {"status": "running", "step": 4, "message": "training"}


@pytest.mark.parametrize(
    ("status", "job", "checkpoint", "expected"),
    [
        # Waiting in the queue: pending with Slurm's reason, whatever a previous attempt wrote.
        ({"status": "pending"}, Job("7", "PENDING", "Resources"), None, ("pending", "waits in the queue (Resources)")),
        (RUNNING_FILE, Job("7", "PENDING", "BeginTime"), "checkpoint-4", ("pending", "requeued; Slurm job 7 waits")),
        # Started, the ranks not yet reporting: loading; then the run's own word.
        ({"status": "pending"}, Job("7", "RUNNING", nodes="n[1-2]"), None, ("loading", "is running on n[1-2]")),
        (RUNNING_FILE, Job("7", "RUNNING"), None, ("running", "training")),
        ({"status": "completed"}, Job("7", "COMPLETING"), None, ("completed", "")),
        # Ended: the run's final word stands; without one, never running.
        ({"status": "stopped"}, Job("7", "COMPLETED"), "checkpoint-2", ("stopped", "")),
        (RUNNING_FILE, Job("7", "CANCELLED"), "checkpoint-4", ("interrupted", "interrupted, resumable")),
        (RUNNING_FILE, Job("7", "NODE_FAIL"), None, ("failed", "")),
        ({"status": "pending"}, Job("7", "GONE"), None, ("failed", "")),
        (RUNNING_FILE, Job("7", "UNKNOWN", "squeue did not answer"), None, ("unknown", "Slurm does not answer")),
    ],
)
def test_a_slurm_runs_state_merges_the_jobs_with_the_runs_files(status, job, checkpoint, expected):
    shown = merge(status, job, checkpoint, "error: rank 1: ImportError: no module named x")
    assert shown["status"] == expected[0]
    assert expected[1] in shown.get("message", "")


def test_a_job_that_ended_early_says_why_from_its_log_or_its_checkpoint():
    failed = merge({"status": "loading"}, Job("9", "FAILED"), None, "error: config: not valid YAML at line 1")
    assert failed["error"] == "Slurm job 9 ended (FAILED): error: config: not valid YAML at line 1"
    cut = merge(RUNNING_FILE, Job("9", "TIMEOUT"), "checkpoint-4", "")
    assert cut["error"] == "Slurm job 9 ended (TIMEOUT) before the run finished; Resume continues from checkpoint-4"
    queued = merge({"status": "pending"}, Job("9", "CANCELLED"), None, "", cancelled_queued=True)
    assert queued["status"] == "stopped"


def test_the_log_line_is_the_last_error_else_the_last_line(tmp_path):
    (tmp_path / "slurm.log").write_text("job 3 on n1\nerror: rank 0: boom\ntorchrun ended\n\n")
    assert scheduler.log_line(tmp_path) == "error: rank 0: boom"
    (tmp_path / "slurm.log").write_text("job 3 on n1\nsrun: Job step aborted\n")
    assert scheduler.log_line(tmp_path) == "srun: Job step aborted"


# --------------------------------------------------------------------------- Stop, against stand-in Slurm commands
def _stand_in(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def job_with_stand_ins(tmp_path, monkeypatch, job: str, squeue_line: str) -> tuple:
    """A run folder recording Slurm job `job`, with stand-in squeue (answering `squeue_line`) and scancel (recording
    its arguments) first on PATH: (run folder, the file of scancel calls)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    _stand_in(bin_dir, "squeue", f"echo '{squeue_line}'")
    _stand_in(bin_dir, "scancel", f'echo "$@" >> {calls}')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    run = tmp_path / "run"
    run.mkdir()
    scheduler.update_job(run, job_id=job, jobs=[job])
    return run, calls


def test_the_first_stop_signals_the_batch_script_and_the_second_cancels(tmp_path, monkeypatch):
    run, calls = job_with_stand_ins(tmp_path, monkeypatch, "42", "RUNNING|None|node[1-2]")
    assert "every rank finishes its step" in scheduler.stop_run(run)
    assert "cancelled now (second Stop)" in scheduler.stop_run(run)
    assert calls.read_text().splitlines() == ["--signal USR1 --batch 42", "42"]


def test_stop_cancels_a_job_still_waiting_and_refuses_a_run_without_a_job(tmp_path, monkeypatch):
    run, calls = job_with_stand_ins(tmp_path, monkeypatch, "43", "PENDING|Priority|")
    assert "waiting in the queue; it is cancelled" in scheduler.stop_run(run)
    assert calls.read_text().splitlines() == ["43"]
    with pytest.raises(UserError, match="^run: other has no Slurm job running"):
        scheduler.stop_run(tmp_path / "other")


# --------------------------------------------------------------------------- the command line
def test_submit_print_shows_the_script_and_submits_nothing(capsys, studio_home):
    from finetune.cli import main

    assert main(["submit", "--slurm", "--nodes", "2", "--gpus-per-node", "4", "--time", "01:00:00", "--print"]) == 0
    script = capsys.readouterr().out
    assert script.startswith("#!/bin/bash\n")
    assert "#SBATCH --nodes=2\n" in script and "#SBATCH --gpus-per-node=4\n" in script
    assert "#SBATCH --time=01:00:00\n" in script
    assert not (studio_home / "runs").exists()
    assert main(["submit", "--nodes", "2", "--print"]) == 2
    assert "error: --slurm: say where it runs" in capsys.readouterr().err
