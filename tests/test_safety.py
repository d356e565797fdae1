"""Safety: a run never destroys what it did not create, faults never wedge anything, resume never ruins
a run, and input is bounded. Each test breaks the way a user (or a failing disk) would."""

from __future__ import annotations

import errno
import hashlib
import shutil
import time
from pathlib import Path

import pytest
import torch

from finetune import cli
from finetune.config import TrainConfig
from finetune.engines import hf_trainer
from finetune.errors import ConfigError, UserError
from finetune.model import loading
from finetune.runs.manager import RunManager
from finetune.runs.rundir import COMPLETE_MARKER, RunDir
from tests.helpers import small_disk, tiny_config


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` with its content hash: equal snapshots mean nothing was touched."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(folder.rglob("*"))
    }


def users_folder(tmp_path: Path) -> Path:
    """A folder of the user's own work that is not a run."""
    folder = tmp_path / "my-project"
    (folder / "notes").mkdir(parents=True)
    (folder / "thesis.tex").write_text("years of work")
    (folder / "notes" / "ideas.md").write_text("more work")
    return folder


def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device", "/runs/x/file")


# --------------------------------------------------------------------------------------------- 1. data loss
def test_a_folder_with_the_users_files_is_refused_before_anything_starts(tiny_model_dir, tmp_path, capsys):
    folder = users_folder(tmp_path)
    before = snapshot(folder)
    code = cli.main(["train", "--set", f"model={tiny_model_dir}", "--set", f"output_dir={folder}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [
        f"error: output_dir: {folder} already has files in it and is not a run; choose a new or empty folder"
    ]
    assert snapshot(folder) == before


def test_output_dir_dot_is_refused_in_a_folder_with_files(tiny_model_dir, tmp_path, monkeypatch, capsys):
    folder = users_folder(tmp_path)
    before = snapshot(folder)
    monkeypatch.chdir(folder)
    code = cli.main(["train", "--set", f"model={tiny_model_dir}", "--set", "output_dir=."])
    assert code == 2 and "already has files in it and is not a run" in capsys.readouterr().err
    assert snapshot(folder) == before


@pytest.mark.parametrize("where", ["is-a-file", "under-a-file"])
def test_an_output_dir_that_is_or_sits_under_a_file_is_refused(tiny_model_dir, tmp_path, where):
    blocker = tmp_path / "report.pdf"
    blocker.write_bytes(b"%PDF")
    target = blocker if where == "is-a-file" else blocker / "run"
    with pytest.raises(ConfigError, match=r"output_dir: .*report.pdf is a file") as info:
        RunManager().start(tiny_config(tiny_model_dir, output_dir=str(target)), background=False)
    assert info.value.field == "output_dir"
    assert blocker.read_bytes() == b"%PDF"


def _tokenizer_breaks(monkeypatch):
    def load_tokenizer(*args, **kwargs):
        raise ValueError("tokenizer.json is truncated")

    monkeypatch.setattr(loading, "load_tokenizer", load_tokenizer)
    return {}


def _data_cannot_load(monkeypatch):
    from finetune import data

    def prepare(*args, **kwargs):
        raise ValueError("the dataset server closed the connection")

    monkeypatch.setattr(data, "prepare", prepare)
    return {}


def _oom_while_loading(monkeypatch):
    def load_model(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 40.00 GiB")

    monkeypatch.setattr(loading, "load_model", load_model)
    return {}


@pytest.mark.parametrize("cause", [_tokenizer_breaks, _data_cannot_load, _oom_while_loading], ids=lambda f: f.__name__)
@pytest.mark.parametrize("folder_state", ["new", "empty"])
def test_a_run_failing_before_its_first_step_removes_only_what_it_wrote(
    tiny_model_dir, tmp_path, monkeypatch, cause, folder_state
):
    parent = users_folder(tmp_path)
    target = parent / "run"
    if folder_state == "empty":
        target.mkdir()
    before = snapshot(parent)
    overrides = cause(monkeypatch)
    state = RunManager().start(tiny_config(tiny_model_dir, output_dir=str(target), **overrides), background=False)
    assert state.status == "failed" and state.error
    # The user's files and a folder the user made stay; a folder the run made goes, with everything it wrote.
    assert snapshot(parent) == before
    assert target.is_dir() == (folder_state == "empty")


def test_targets_that_match_no_layer_are_refused_before_the_folder_is_touched(tiny_model_dir, tmp_path):
    parent = users_folder(tmp_path)
    before = snapshot(parent)
    with pytest.raises(UserError) as info:
        RunManager().start(
            tiny_config(tiny_model_dir, output_dir=str(parent / "run"), lora_target_modules="no_such_layer"),
            background=False,
        )
    assert info.value.field == "lora_target_modules" and "matches no layer" in str(info.value)
    assert snapshot(parent) == before


# --------------------------------------------------------------------------------------------- 3. faults
def test_a_disk_error_while_creating_the_run_refuses_it_and_holds_nothing(tiny_model_dir, tmp_path, monkeypatch):
    manager = RunManager()
    monkeypatch.setattr(RunDir, "write_config", no_space)
    with pytest.raises(UserError, match=r"output_dir: cannot write the run in .*: No space left on device"):
        manager.start(tiny_config(tiny_model_dir, output_dir=str(tmp_path / "a")), background=False)
    assert not manager.is_active() and not manager.stop()
    assert not (tmp_path / "a").exists()
    monkeypatch.undo()
    # The device is free again: the same manager and a second process's lock both get it.
    state = manager.start(tiny_config(tiny_model_dir, max_steps=2, output_dir=str(tmp_path / "b")), background=False)
    assert state.status == "completed"


@pytest.mark.parametrize("when", ["checkpoint", "final-save"])
def test_a_disk_error_during_the_run_fails_it_in_one_plain_line_and_the_app_stays_usable(
    tiny_model_dir, tmp_path, monkeypatch, when
):
    if when == "checkpoint":
        monkeypatch.setattr(RunDir, "seal_checkpoint", no_space)
    else:
        monkeypatch.setattr(hf_trainer, "save_final", no_space)
    manager = RunManager()
    run = tmp_path / "r"
    state = manager.start(tiny_config(tiny_model_dir, output_dir=str(run)), background=False)
    step = 4 if when == "checkpoint" else 8
    assert state.status == "failed"
    assert state.error == f"could not write the run's files at step {step}: No space left on device (/runs/x/file)"
    assert "resume" in state.advice
    assert RunDir(run).read_status()["status"] == "failed"  # never left "running" on disk
    assert not manager.is_active() and manager.stop() is False
    monkeypatch.undo()
    again = manager.start(tiny_config(tiny_model_dir, max_steps=2, output_dir=str(tmp_path / "next")), background=False)
    assert again.status == "completed"


def test_the_cli_ends_a_failed_run_with_one_error_line_and_no_traceback(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(RunDir, "seal_checkpoint", no_space)
    code = cli.main(["train", "--no-progress", "--set", f"model={tiny_model_dir}", "--set", "max_steps=8"])
    out = capsys.readouterr()
    assert code == 1
    assert out.err.strip().splitlines()[-1].startswith("error: could not write the run's files at step")
    assert "Traceback" not in out.err + out.out


def test_a_real_full_disk_at_a_checkpoint_says_so_and_leaves_the_run_failed(tiny_model_dir, tmp_path, capsys):
    """The run's folder on a disk with room for its own small files but not its first checkpoint. torch.save fails
    in its own words ("unexpected pos 73408 vs 73300"); the user reads "No space left on device" in one line, the
    status on disk says failed (not running), and the cut-short checkpoint is gone, giving the space back."""
    config = tmp_path / "run.yaml"
    with small_disk(tmp_path / "disk", free_bytes=150 * 1024) as disk:
        tiny_config(tiny_model_dir, output_dir=str(disk / "run"), max_steps=8, save_steps=4).save(config)
        code = cli.main(["train", "--no-progress", "--config", str(config)])
        err = capsys.readouterr().err
        run = RunDir(disk / "run")
        status = run.read_status()
        assert code == 1 and "Traceback" not in err
        assert (
            err.strip()
            .splitlines()[-1]
            .startswith(f"error: could not write the run's files at step 4: No space left on device ({run.path})")
        ), err[-600:]
        assert status["status"] == "failed" and "No space left on device" in status["error"], status
        assert run.effective_status() == "failed"
        assert not (run.path / "checkpoint-4").exists()


def test_with_no_room_left_at_all_the_status_is_rewritten_in_place(tmp_path):
    """A disk so full that not even a new status.json fits (the atomic way writes a new copy first): the failed
    status still reaches the disk, in the old file's place, and no half-written copy is left beside it."""
    with small_disk(tmp_path / "disk") as disk:
        run = RunDir(disk / "run")
        run.path.mkdir()
        run.write_status({"status": "running", "step": 3, "message": "training " + "." * 200})
        (disk / "filler").write_bytes(b"\0" * shutil.disk_usage(disk).free)
        with pytest.raises(OSError):
            (disk / "one-more").write_bytes(b"\0" * 8192)  # truly full
        failed = {"status": "failed", "step": 3, "error": "could not write the run's files at step 3"}
        run.write_status(failed)
        assert run.read_status() == failed
        assert sorted(p.name for p in run.path.iterdir()) == ["status.json"]


def test_a_torn_checkpoint_without_its_marker_is_never_resumed_from(tiny_model_dir, tmp_path):
    run = RunDir(tmp_path / "r")
    RunManager().start(tiny_config(tiny_model_dir, max_steps=8, output_dir=str(run.path)), background=False)
    assert [p.name for p in run.checkpoints()][-1] == "checkpoint-8"
    assert all((p / COMPLETE_MARKER).is_file() for p in run.checkpoints())
    (run.path / "checkpoint-8" / COMPLETE_MARKER).unlink()  # what a power cut mid-save leaves
    assert run.last_checkpoint().name == "checkpoint-4"


def test_steps_trained_again_after_a_crash_appear_once_in_the_loss_curve(tiny_model_dir, tmp_path):
    run = RunDir(tmp_path / "r")
    manager = RunManager()
    manager.start(tiny_config(tiny_model_dir, max_steps=6, output_dir=str(run.path)), background=False)
    first = {e["step"]: e for e in run.read_events(("log",))}
    # A crash after step 6 whose last complete checkpoint is step 4: steps 5 and 6 are trained again.
    for cp in run.checkpoints():
        if cp.name != "checkpoint-4":
            (cp / COMPLETE_MARKER).unlink()
    run.write_status({**run.read_status(), "status": "running", "pid": 999_999_999})
    state = manager.resume(run.path, background=False)
    assert state.status == "completed"
    logs = run.read_events(("log",))
    steps = [e["step"] for e in logs]
    assert steps == sorted(set(steps)) and steps[-1] == 6
    resumed_at = next(e["time"] for e in run.read_events(("resume",)))
    assert all(e["time"] >= resumed_at for e in logs if e["step"] > 4)
    assert all(e["time"] == first[e["step"]]["time"] for e in logs if e["step"] <= 4)


# --------------------------------------------------------------------------------------------- 4. resume
@pytest.fixture
def completed_run(tiny_model_dir, tmp_path) -> RunDir:
    run = RunDir(tmp_path / "done")
    RunManager().start(tiny_config(tiny_model_dir, max_steps=4, output_dir=str(run.path)), background=False)
    assert run.read_status()["status"] == "completed"
    return run


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"lora_r": 16}, "lora_r"),
        ({"method": "full"}, "method"),
        ({"lora_target_modules": "q_proj"}, "lora_target_modules"),
        ({"model": "HuggingFaceTB/SmolLM2-135M"}, "model"),
        ({"max_steps": 3}, "max_steps"),
        ({"max_steps": 4}, "max_steps"),
    ],
)
def test_resume_with_a_change_the_checkpoint_cannot_take_is_refused_and_changes_nothing(completed_run, change, field):
    before = snapshot(completed_run.path)
    with pytest.raises(ConfigError) as info:
        RunManager().resume(completed_run.path, background=False, overrides=change)
    assert info.value.field == field and str(info.value).startswith(f"{field}: ")
    assert snapshot(completed_run.path) == before


def test_the_cli_refuses_a_bad_resume_with_exit_2(completed_run, capsys):
    before = snapshot(completed_run.path)
    code = cli.main(["train", "--resume", str(completed_run.path), "--set", "lora_r=32"])
    assert code == 2
    assert capsys.readouterr().err.startswith("error: lora_r: cannot change on resume")
    assert snapshot(completed_run.path) == before


def test_a_resume_that_fails_before_a_new_step_leaves_the_finished_run_as_it_was(completed_run, monkeypatch):
    config_before = completed_run.config_path.read_bytes()
    status_before = completed_run.read_status()
    _oom_while_loading(monkeypatch)
    state = RunManager().resume(completed_run.path, background=False, overrides={"max_steps": 8})
    assert state.status == "failed" and state.error.startswith("out of memory")
    assert completed_run.config_path.read_bytes() == config_before
    assert completed_run.read_status() == status_before  # still completed: chat and push keep working


# --------------------------------------------------------------------------------------------- 5. bounded input
def alias_bomb(levels: int = 9) -> str:
    """A few hundred bytes that expand to 9**levels strings once anything walks the value (here: the one list key)."""
    items = ['&a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        prev, cur = chr(96 + i), chr(97 + i)
        items.append(f"&{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "lora_target_modules: [" + ", ".join(items) + "]\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (alias_bomb(), "config: YAML aliases (*name) are not supported"),
        ("[" * 20000, "config: not valid YAML at line 1"),
        ("model: " + "[" * 50, "config: nested too deeply"),
        ("# pad\n" * 20000, "bad.yaml: 117 KB is too large for a run config (at most 64 KB)"),
    ],
    ids=["alias-bomb", "deep-flow", "deep-value", "huge"],
)
def test_hostile_yaml_is_refused_at_once_in_the_cli(tmp_path, capsys, studio_home, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert len(text) < 200_000
    started = time.perf_counter()
    code = cli.main(["train", "--config", str(path)])
    took = time.perf_counter() - started
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert took < 5, f"took {took:.1f}s"  # today's failure mode took minutes; a refusal is milliseconds
    assert not (studio_home / "runs").exists() or not any((studio_home / "runs").iterdir())


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"seed": 2**32}, "seed: 4294967296 is out of range; allowed: 0 to 4294967295"),
        ({"seed": -1}, "seed: -1 is out of range"),
        ({"save_steps": 10**12}, "save_steps: 1000000000000 is out of range; allowed: 1 to 2147483647"),
        ({"model": "x" * 5000}, "model: 5000 characters is too long (at most 4096)"),
        ({"dataset": ["a"] * 3}, "dataset: ['a', 'a', 'a'] is not text"),
        ({"lora_r": "9" * 100}, "lora_r: " + "9" * 57 + "... is out of range; allowed: 1 to 1024"),
        ({"lora_r": "x" * 100}, "lora_r: '" + "x" * 56 + "... is not a whole number"),
    ],
)
def test_out_of_range_and_oversized_fields_get_one_short_line(values, message):
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict(values)
    assert str(info.value).startswith(message), str(info.value)
    assert len(str(info.value)) < 200
