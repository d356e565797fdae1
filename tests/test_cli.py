"""The command line: training from YAML, kill -9 and Ctrl-C with resume, chat with a run, and one clear line for every
kind of bad input. Runs that a test signals are held at a known step (tests/hold.py), never raced."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from finetune.cli import main
from finetune.plan import plan_for
from finetune.runs.rundir import RunDir, list_runs
from tests.helpers import (
    assert_resumed_exactly,
    child_env,
    cli,
    events_size,
    tiny_config,
    wait_for_file,
    write_jsonl,
)

ROOT = Path(__file__).resolve().parents[1]


def held_train(args: list[str], step: int, marker: Path, env_home: Path) -> subprocess.Popen:
    """`python -m finetune <args>` (through tests/hold.py) that holds its run at the end of `step` once it writes
    `marker`, until Ctrl-C or a kill: the test signals a run that is certainly training, at a known step."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.hold", str(step), str(marker), *args],
        env=child_env(env_home),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_train_from_yaml_prints_a_summary_line(tiny_model_dir, tmp_path, studio_home):
    config = tiny_config(tiny_model_dir, max_steps=4)
    config.save(tmp_path / "run.yaml")
    done = cli("train", "--config", str(tmp_path / "run.yaml"), "--set", "lora_r=4", home=studio_home)
    assert done.returncode == 0, done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("completed: step 4/4") and "loss" in last
    run = list_runs(studio_home / "runs")[0]
    assert run.load_config().lora_r == 4  # --set reached the resolved config.yaml


def test_kill_9_then_resume_continues_from_the_last_checkpoint(tiny_model_dir, tmp_path, studio_home):
    """kill -9 at step 7 (checkpoints at 3 and 6), then `train --resume`: the resumed process trains steps 7-10 only,
    the decaying learning rate goes on where it was, and a half-written checkpoint is never used."""
    out = tmp_path / "run"
    config = tiny_config(tiny_model_dir, max_steps=10, save_steps=3, output_dir=str(out), lr_scheduler_type="linear")
    config.save(tmp_path / "run.yaml")
    marker = tmp_path / "held"
    proc = held_train(["train", "--config", str(tmp_path / "run.yaml"), "--no-progress"], 7, marker, studio_home)
    try:
        wait_for_file(marker, proc)
    finally:
        proc.kill()  # SIGKILL: no handler, no checkpoint, no status update
        proc.communicate()
    run = RunDir(out)
    assert run.effective_status() == "interrupted" and run.read_status()["status"] == "running"
    killed_at = run.last_checkpoint()
    assert killed_at is not None and killed_at.name == "checkpoint-6"
    # A checkpoint that was being written when the process died (no trainer_state.json yet) is never used.
    partial = out / "checkpoint-9"
    partial.mkdir()
    (partial / "adapter_model.safetensors").write_bytes(b"\x00" * 10)
    assert run.last_checkpoint() == killed_at

    mark = events_size(out)
    done = cli("train", "--resume", str(out), "--no-progress", home=studio_home)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1].startswith("completed: step 10/10")
    before, after = assert_resumed_exactly(out, mark, checkpoint_step=6, max_steps=10)
    rates = [e["learning_rate"] for e in before + after]
    steps = [e["step"] for e in before + after]
    assert steps == list(range(1, 11)) and rates[0] == pytest.approx(config.learning_rate)
    # Linear decay: the same decrement at every step across the restart (a fresh scheduler would jump back up).
    decrements = [a - b for a, b in zip(rates, rates[1:], strict=False)]
    assert decrements == pytest.approx([config.learning_rate / 10] * 9, rel=1e-6), rates
    assert after[0]["loss"] < 0.5 * before[0]["loss"]  # the resumed weights are the trained ones, not the base
    assert json.loads((out / "status.json").read_text())["status"] == "completed"


def test_ctrl_c_stops_cleanly_with_a_checkpoint_and_resume_continues(tiny_model_dir, tmp_path, studio_home):
    """README: "Ctrl-C stops cleanly: the current step finishes, a checkpoint is saved, and --resume continues from
    it". SIGINT to `python -m finetune train` while it trains step 3: exit 0, status stopped, checkpoint-3."""
    out = tmp_path / "run"
    config = tiny_config(tiny_model_dir, max_steps=6, save_steps=100, output_dir=str(out))
    config.save(tmp_path / "run.yaml")
    marker = tmp_path / "held"
    proc = held_train(["train", "--config", str(tmp_path / "run.yaml")], 3, marker, studio_home)
    try:
        wait_for_file(marker, proc)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    assert "stopping after this step (saving a checkpoint)" in stderr
    assert stdout.strip().splitlines()[-1].startswith("stopped: step 3/6 in "), stdout[-500:]
    assert "Traceback" not in stderr
    run = RunDir(out)
    assert run.read_status()["status"] == "stopped" and run.read_status()["step"] == 3
    assert [p.name for p in run.checkpoints()] == ["checkpoint-3"] and not run.has_final_model()

    mark = events_size(out)
    assert main(["train", "--resume", str(out), "--no-progress"]) == 0
    assert_resumed_exactly(out, mark, checkpoint_step=3, max_steps=6)
    assert run.read_status()["status"] == "completed" and run.has_final_model()


def test_chat_answers_a_prompt_with_the_runs_adapter(tiny_model_dir, studio_home):
    """`python -m finetune chat RUN --prompt ...` answers with the tuned adapter (the pirate phrase it learned; the
    random base model answers gibberish) and exits 0."""
    from finetune.runs.manager import RunManager

    state = RunManager().start(tiny_config(tiny_model_dir, max_steps=10), background=False)
    assert state.status == "completed", state.error
    tuned = cli("chat", state.run_dir, "--prompt", "Question 99?", "--max-new-tokens", "12", home=studio_home)
    assert tuned.returncode == 0, tuned.stderr[-2000:]
    assert tuned.stdout.strip().startswith("Arr, matey!"), tuned.stdout
    from finetune.model.inference import generate_answers, load_for_chat

    base_model, tokenizer = load_for_chat(plan_for(tiny_config(tiny_model_dir)))
    base_answer = generate_answers(base_model, tokenizer, ["Question 99?"], max_new_tokens=12)[0]
    assert not base_answer.startswith("Arr"), base_answer  # so the phrase above came from the adapter


def bad_cases(tmp: Path, model: Path) -> list[tuple[list[str], str]]:
    """(arguments, expected one-line error) for the command line."""
    (tmp / "unknown.yaml").write_text("lora_rr: 8\n")
    (tmp / "broken.yaml").write_text("model: [unclosed\n")
    (tmp / "list.yaml").write_text("- a\n")
    (tmp / "nul.yaml").write_bytes(b"lora_r: 8\nmax_steps: 3\x00\n")
    (tmp / "empty.jsonl").write_text("")
    (tmp / "binary.jsonl").write_bytes(b"\x00\x01\x02\xff")
    write_jsonl(tmp / "cols.jsonl", [{"foo": 1}])
    (tmp / "notmodel").mkdir(exist_ok=True)
    m = f"model={model}"
    return [
        (["train", "--config", str(tmp / "nope.yaml")], "--config: file not found"),
        (["train", "--config", str(tmp / "unknown.yaml")], "lora_rr: unknown config key; did you mean 'lora_r'?"),
        (["train", "--config", str(tmp / "broken.yaml")], "config: not valid YAML at line 2"),
        (["train", "--config", str(tmp / "list.yaml")], "config: expected a mapping of key: value"),
        (
            ["train", "--config", str(tmp / "nul.yaml")],
            "config: not valid YAML at character 23: control characters are not allowed (#x0000)",
        ),
        (["chat", "--max-new-tokens", "-1", "--prompt", "hi"], "--max-new-tokens: -1 is out of range; use 1 to 1024"),
        (["train", "--set", "lora_r"], "--set: expected key=value"),
        (["train", "--set", "max_step=3"], "--set: max_step: unknown config key; did you mean 'max_steps'?"),
        (["train", "--set", "lora_r=-1"], "lora_r: -1 is out of range; allowed: 1 to 1024"),
        (["train", "--set", "learning_rate=abc"], "learning_rate: 'abc' is not a number"),
        (["train", "--set", "method=dora"], "method: 'dora' is not allowed"),
        (["train", "--set", "zero_stage=2", "--set", "offload_param=cpu"], "offload_param: 'cpu' needs zero_stage: 3"),
        (["train", "--set", f"model={tmp / 'missing-model'}"], f"model: '{tmp / 'missing-model'}' is not a directory"),
        (["train", "--set", f"model={tmp / 'notmodel'}"], f"model: '{tmp / 'notmodel'}' has no config.json"),
        (["train", "--set", m, "--set", f"dataset={tmp / 'none.jsonl'}"], "dataset: file not found"),
        (["train", "--set", m, "--set", f"dataset={tmp / 'empty.jsonl'}"], "dataset: empty.jsonl is empty"),
        (
            ["train", "--set", m, "--set", f"dataset={tmp / 'binary.jsonl'}"],
            "dataset: binary.jsonl is not text (is it a binary file?)",
        ),
        (
            ["train", "--set", m, "--set", f"dataset={tmp / 'cols.jsonl'}"],
            "dataset: cannot tell the format from columns foo;",
        ),
        (
            ["train", "--set", m, "--set", "max_seq_length=100000"],
            "max_seq_length: 100000 is beyond this model's limit of 512 tokens",
        ),
        (["train", "--set", m, "--set", "report_to=wandb"], "report_to: wandb is not installed"),
        (
            ["train", "--set", m, "--set", "zero_stage=3", "--set", "offload_param=nvme", "--set", "nvme_path=/tmp"],
            "offload_optimizer: NVMe offload needs a GPU",
        ),
        (["train", "--resume", str(tmp / "no-such-run")], f"resume: {tmp / 'no-such-run'} is not a run directory"),
    ]


def test_bad_input_table_gets_one_line_errors_and_no_run_directory(tiny_model_dir, tmp_path, studio_home, capsys):
    for args, message in bad_cases(tmp_path, tiny_model_dir):
        code = main(args)
        err = capsys.readouterr().err.strip()
        assert code == 2, (args, err)
        assert err.startswith("error: ") and message in err, (args, err)
        assert "\n" not in err and "Traceback" not in err, (args, err)
    assert list_runs(studio_home / "runs") == []  # no half-written run directory anywhere


def launch_bad_cases(tmp: Path) -> list[tuple[list[str], str]]:
    """(arguments, expected one-line error) for `launch` and `stop` (a CPU machine: no GPUs)."""
    cores = os.cpu_count() or 1
    return [
        (["launch", "--nproc", str(cores + 1)], f"--nproc: {cores + 1} processes on a CPU with {cores} cores"),
        (["launch", "--nproc", "0"], "--nproc: 0 must be a whole number ≥ 1"),
        (["launch", "--nproc", "2", "--gpus", "0,1"], "--gpus: 0,1: this machine has no GPU"),
        (["launch", "--nproc", "2", "--launcher", "mpirun"], "--launcher: 'mpirun' is not a launcher"),
        (["launch", "--nproc", "2", "--set", "lora_r=-1"], "lora_r: -1 is out of range"),
        (["launch", "--resume", str(tmp / "no-such-run")], f"resume: {tmp / 'no-such-run'} is not a run directory"),
        (["launch", "--nodes", "2", "--nproc", "1"], "--master-addr: give this machine's address"),
        (["stop", str(tmp / "no-such-run")], f"run_dir: {tmp / 'no-such-run'} is not a run directory"),
    ]


def test_bad_launch_flags_get_one_line_errors_and_start_nothing(tiny_model_dir, tmp_path, studio_home, capsys):
    config = tiny_config(tiny_model_dir)
    config.save(tmp_path / "run.yaml")
    for args, message in launch_bad_cases(tmp_path):
        if args[0] == "launch" and "--resume" not in args:
            args = [*args, "--config", str(tmp_path / "run.yaml")]
        code = main(args)
        err = capsys.readouterr().err.strip()
        assert code == 2, (args, err)
        assert err.startswith("error: ") and message in err, (args, err)
        assert "\n" not in err and "Traceback" not in err, (args, err)
    assert list_runs(studio_home / "runs") == []  # nothing launched, no run directory


@pytest.mark.parametrize("args", [["train", "--set", "lora_rr=1"], ["train", "--resume", "/nonexistent/run"]])
def test_the_real_entry_point_exits_non_zero_with_one_line(args, studio_home):
    done = cli(*args, home=studio_home, timeout=120)
    assert done.returncode == 2
    lines = [line for line in done.stderr.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in done.stderr
