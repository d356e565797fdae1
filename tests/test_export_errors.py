"""Export when the disk, the limits or the path say no: one `error:` line naming the cause, nothing under the final
name, no hidden `.export-*` folder left behind, and the ones a killed export left removed by the next export.

One really trained tiny LoRA run (a cached copy) is exported with `python -m finetune export` in this process, as
the CLI runs it; the file-size limit needs its own process (`ulimit -f`)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from finetune.cli import main
from finetune.publish.export import STAGE_OWNER
from finetune.runs.pids import own_start
from tests.helpers import small_disk, unwritable_folder
from tests.run_fixtures import build_run

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_smollm_dir) -> Path:
    """On the tiny Llama with SmolLM2's tokenizer: a GGUF export of it is one llama.cpp knows (not refused first)."""
    return build_run(tmp_path_factory.mktemp("export-errors") / "run-a", tiny_smollm_dir)


def export(capsys, *args: str) -> tuple[int, list[str]]:
    """`python -m finetune export ARGS` in this process: (exit code, its `error:` lines)."""
    code = main(["export", *args])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, [line for line in err.splitlines() if line.startswith("error:")]


def hidden(folder: Path) -> list[str]:
    """Hidden export folders (`.export-*`) in `folder`."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".export-"))


def test_a_full_disk_says_so_and_leaves_nothing(run, tmp_path, capsys):
    with small_disk(tmp_path / "disk", free_bytes=100 * 1024) as disk:
        for fmt in ("merged", "gguf"):
            code, errors = export(capsys, str(run), "--format", fmt, "--out", str(disk / fmt))
            assert code == 2 and errors == [
                f"error: out: cannot write the export in {disk}: No space left on device; nothing was written"
            ], errors
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]  # no partial export, no hidden stage


def test_a_file_size_limit_says_so_and_leaves_nothing(run, tmp_path):
    """`ulimit -f 100` (100 KB a file) in the exporting process: the merged weights (about 13 MB) go past it."""
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "finetune", "export", str(run), "--out", str(out / "merged")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (100 * 1024, resource.RLIM_INFINITY)),
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and errors == [
        f"error: out: cannot write the export in {out}: File too large; nothing was written"
    ], done.stderr[-2000:]
    assert list(out.iterdir()) == []


def test_an_unwritable_out_says_so(run, tmp_path, capsys):
    with unwritable_folder(tmp_path / "locked") as locked:
        code, errors = export(capsys, str(run), "--out", str(locked / "merged"))
        assert code == 2 and len(errors) == 1, errors
        assert errors[0].startswith(f"error: out: cannot write the export in {locked}: "), errors
        assert errors[0].endswith(
            ("Read-only file system; nothing was written", "Permission denied; nothing was written")
        )
        assert list(locked.iterdir()) == []


def test_an_out_through_dot_dot_or_a_symbolic_link_is_refused_naming_where_it_leads(run, tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    code, errors = export(capsys, str(run), "--out", str(tmp_path / "a" / ".." / "merged"))
    assert code == 2 and errors == [
        f"error: out: {tmp_path}/a/../merged goes through '..'; give the folder's own path ({tmp_path / 'merged'})"
    ], errors
    code, errors = export(capsys, str(run), "--out", str(tmp_path / "link" / "merged"))
    assert code == 2 and errors == [
        f"error: out: {tmp_path}/link/merged goes through a symbolic link; give the folder's real path "
        f"({tmp_path / 'elsewhere' / 'merged'})"
    ], errors
    assert not (tmp_path / "merged").exists() and list((tmp_path / "elsewhere").iterdir()) == []


def test_damaged_weights_are_refused_naming_the_file_before_any_work(tiny_model_dir, tmp_path, capsys):
    for name, keep in (("header-cut", 1000), ("data-cut", -100)):
        copy = build_run(tmp_path / "runs" / name, tiny_model_dir)
        adapter = copy / "adapter_model.safetensors"
        size = adapter.stat().st_size
        os.truncate(adapter, keep if keep > 0 else size + keep)
        code, errors = export(capsys, str(copy), "--out", str(tmp_path / f"{name}-out"))
        assert code == 2 and len(errors) == 1, errors
        assert errors[0].startswith(f"error: run_dir: {name}/adapter_model.safetensors cannot be read ("), errors
        assert "the file is damaged or cut short" in errors[0]
        assert not (tmp_path / f"{name}-out").exists() and hidden(tmp_path) == []


def test_hidden_folders_of_killed_exports_are_removed_and_nothing_else(run, tmp_path, capsys):
    """What an export killed mid-way leaves (a `.export-*` folder whose owner has ended) goes at the next export
    into the same folder; one being written by a live export stays, and so does a folder that is not an export's."""
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    owners = {
        ".export-killed": {"pid": int(ended.stdout), "started": 1.0},
        ".export-running": {"pid": os.getpid(), "started": own_start()},
    }
    for name, owner in owners.items():
        (tmp_path / name / "merged").mkdir(parents=True)
        (tmp_path / name / STAGE_OWNER).write_text(json.dumps(owner))
    (tmp_path / ".export-users-notes").mkdir()
    (tmp_path / ".export-users-notes" / "notes.txt").write_text("mine")
    code, _ = export(capsys, str(run), "--out", str(tmp_path / "merged"))
    assert code == 0 and (tmp_path / "merged" / "config.json").is_file()
    assert hidden(tmp_path) == [".export-running", ".export-users-notes"]
    assert (tmp_path / ".export-users-notes" / "notes.txt").read_text() == "mine"
