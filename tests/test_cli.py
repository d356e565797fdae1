"""The command line: training from YAML, resume after kill -9, and one clear line for every kind of bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from finetune.cli import main
from finetune.rundir import RunDir, list_runs
from tests.helpers import losses, tiny_config, write_jsonl

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, env_home: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if env_home:
        env["FINETUNE_STUDIO_HOME"] = str(env_home)
    return subprocess.run(
        [sys.executable, "-m", "finetune", *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT
    )


def test_train_from_yaml_prints_a_summary_line(tiny_model_dir, tmp_path, studio_home):
    config = tiny_config(tiny_model_dir, max_steps=4)
    config.save(tmp_path / "run.yaml")
    done = cli("train", "--config", str(tmp_path / "run.yaml"), "--set", "lora_r=4", env_home=studio_home)
    assert done.returncode == 0, done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("completed: step 4/4") and "loss" in last
    run = list_runs(studio_home / "runs")[0]
    assert run.load_config().lora_r == 4  # --set reached the resolved config.yaml


def test_kill_9_then_resume_finishes_with_the_same_step_numbering(tiny_model_dir, tmp_path, studio_home):
    out = tmp_path / "run"
    config = tiny_config(tiny_model_dir, max_steps=400, save_steps=5, output_dir=str(out))
    config.save(tmp_path / "run.yaml")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FINETUNE_STUDIO_HOME": str(studio_home)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "finetune", "train", "--config", str(tmp_path / "run.yaml"), "--no-progress"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    run = RunDir(out)
    deadline = time.time() + 120
    while time.time() < deadline and len(run.checkpoints()) < 2:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert run.effective_status() == "interrupted"
    killed_at = run.last_checkpoint()
    # A checkpoint that was being written when the process died (no trainer_state.json yet) is never used.
    partial = out / "checkpoint-99999"
    partial.mkdir()
    (partial / "adapter_model.safetensors").write_bytes(b"\x00" * 10)
    assert run.last_checkpoint() == killed_at

    done = cli("train", "--resume", str(out), "--no-progress", env_home=studio_home)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1].startswith("completed: step 400/400")
    resumed_from = int(killed_at.name.split("-")[1])
    steps = [s for s, _ in losses(out)]
    assert resumed_from + 1 in steps and steps[-1] == 400
    assert json.loads((out / "status.json").read_text())["status"] == "completed"


def bad_cases(tmp: Path, model: Path) -> list[tuple[list[str], str]]:
    """(arguments, expected one-line error) for the command line."""
    (tmp / "unknown.yaml").write_text("lora_rr: 8\n")
    (tmp / "broken.yaml").write_text("model: [unclosed\n")
    (tmp / "list.yaml").write_text("- a\n")
    (tmp / "empty.jsonl").write_text("")
    (tmp / "binary.jsonl").write_bytes(b"\x00\x01\x02\xff")
    write_jsonl(tmp / "cols.jsonl", [{"foo": 1}])
    (tmp / "notmodel").mkdir(exist_ok=True)
    m = f"model={model}"
    return [
        (["train", "--config", str(tmp / "nope.yaml")], "--config: file not found"),
        (["train", "--config", str(tmp / "unknown.yaml")], "lora_rr: unknown config key; did you mean 'lora_r'?"),
        (["train", "--config", str(tmp / "broken.yaml")], "not valid YAML"),
        (["train", "--config", str(tmp / "list.yaml")], "expected a mapping"),
        (["train", "--set", "lora_r"], "--set: expected key=value"),
        (["train", "--set", "max_step=3"], "did you mean 'max_steps'"),
        (["train", "--set", "lora_r=-1"], "lora_r: -1 is out of range"),
        (["train", "--set", "learning_rate=abc"], "learning_rate: 'abc' is not a number"),
        (["train", "--set", "method=dora"], "method: 'dora' is not allowed"),
        (["train", "--set", "zero_stage=2", "--set", "offload_param=cpu"], "offload_param: 'cpu' needs zero_stage: 3"),
        (["train", "--set", f"model={tmp / 'missing-model'}"], "is not a directory"),
        (["train", "--set", f"model={tmp / 'notmodel'}"], "has no config.json"),
        (["train", "--set", m, "--set", f"dataset={tmp / 'none.jsonl'}"], "dataset: file not found"),
        (["train", "--set", m, "--set", f"dataset={tmp / 'empty.jsonl'}"], "is empty"),
        (["train", "--set", m, "--set", f"dataset={tmp / 'binary.jsonl'}"], "is not"),
        (["train", "--set", m, "--set", f"dataset={tmp / 'cols.jsonl'}"], "cannot tell the format"),
        (
            ["train", "--set", m, "--set", "max_seq_length=100000"],
            "max_seq_length: 100000 is beyond this model's limit",
        ),
        (["train", "--set", m, "--set", "report_to=wandb"], "report_to: wandb is not installed"),
        (
            ["train", "--set", m, "--set", "zero_stage=3", "--set", "offload_param=nvme", "--set", "nvme_path=/tmp"],
            "NVMe offload needs a GPU",
        ),
        (["train", "--resume", str(tmp / "no-such-run")], "is not a run directory"),
    ]


def test_bad_input_table_gets_one_line_errors_and_no_run_directory(tiny_model_dir, tmp_path, studio_home, capsys):
    for args, message in bad_cases(tmp_path, tiny_model_dir):
        code = main(args)
        err = capsys.readouterr().err.strip()
        assert code == 2, (args, err)
        assert err.startswith("error: ") and message in err, (args, err)
        assert "\n" not in err and "Traceback" not in err, (args, err)
    assert list_runs(studio_home / "runs") == []  # no half-written run directory anywhere


@pytest.mark.parametrize("args", [["train", "--set", "lora_rr=1"], ["train", "--resume", "/nonexistent/run"]])
def test_the_real_entry_point_exits_non_zero_with_one_line(args, studio_home):
    done = cli(*args, env_home=studio_home, timeout=120)
    assert done.returncode == 2
    lines = [line for line in done.stderr.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in done.stderr
