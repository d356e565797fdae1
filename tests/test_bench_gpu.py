"""The one GPU script's plumbing, on a CPU: every step's command parses, a failing or hanging step is recorded while
the others still run, the summary is written (and copied to $OUT), and the carried wheels are shrunk, checked and
picked right. Nothing here needs a GPU or times anything; the real steps run on the lent GPU machine."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gpu import run, wheels  # noqa: E402

PY = sys.executable


# ----------------------------------------------------------------------------- the runner


@pytest.mark.parametrize("cpu", [False, True], ids=["gpu-steps", "cpu-steps"])
def test_every_step_command_parses(tmp_path, cpu):
    plan = run.steps(cpu, tmp_path)
    names = ["env", "pytest-gpu", "memory-totals", "throughput", "packing", "deepspeed", "overhead-parts"]
    assert [s.name for s in plan] == names
    assert any("test_gpu.py" in a for a in plan[1].argv)  # the files that carry the gpu mark
    outcomes = run.run_all(plan, tmp_path, deadline=60, dry_run=True)
    assert [o.status for o in outcomes] == ["parses"] * len(names), [o.headline for o in outcomes]
    for step in plan[2:]:
        assert all(str(tmp_path) in a for a in step.argv if a.endswith(".md")), step.argv  # results go where asked


def test_the_one_call_holds_every_check_issue_13_asks_for(tmp_path):
    """pytest -m gpu (with the Liger test), memory totals with expandable segments before/after, throughput against
    plain with Liger on and off on the 128k-vocabulary 1B shape, DeepSpeed; and it fits the 8-minute call."""
    from bench import gpu_throughput
    from bench.gpu import memory_totals

    plan = {s.name: s for s in run.steps(False, tmp_path)}
    assert any("test_liger.py" in a for a in plan["pytest-gpu"].argv)
    throughput = plan["throughput"].argv
    assert throughput[throughput.index("--sides") + 1] == "ours,ours-no-liger,plain"
    shape = throughput[throughput.index("--shape") + 1]
    assert gpu_throughput.SHAPES[shape][-1] == 128256  # Llama 3's vocabulary: where the fused loss matters
    cases = memory_totals.GPU_CASES
    expandable = [c for c in cases if c.env.get("PYTORCH_CUDA_ALLOC_CONF") == memory_totals.EXPANDABLE]
    assert expandable and any(c.settings == expandable[0].settings and not c.env for c in cases)  # before / after
    assert run.DEADLINE_S <= 480 - 20  # the wheel install and the copy-back fit in the call's 8 minutes too


def test_the_gpu_only_package_travels_as_a_wheel():
    pins = dict(line.split("==") for line in (ROOT / "requirements-gpu.txt").read_text().splitlines() if "==" in line)
    assert pins == {"liger-kernel": "0.8.5"}
    assert {"liger-kernel", "trl"} <= set(wheels.PINNED)  # installed there when the machine lacks that version
    assert "requirements-gpu.txt" in (ROOT / "bench" / "gpu" / "wheels.sh").read_text()


def test_a_bad_argument_is_caught_by_the_dry_run(tmp_path):
    step = run.steps(False, tmp_path)[2]
    step.argv.append("--no-such-flag")
    outcome = run.run_all([step], tmp_path, deadline=60, dry_run=True)[0]
    assert outcome.status == "failed" and "--no-such-flag" in outcome.headline


def py_step(name: str, code: str, budget: float = 30, minimum: float = 0) -> run.Step:
    return run.Step(name, [PY, "-c", code], budget=budget, minimum=minimum)


def test_failures_and_timeouts_are_recorded_and_the_rest_still_run(tmp_path):
    grandchild = tmp_path / "grandchild.pid"
    hang = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(grandchild)!r}, 'w').write(str(p.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(60)\n"
    )
    plan = [
        py_step("first", "print('first: 1.00x')"),
        py_step("broken", "import sys; print('about to fail'); sys.exit(3)"),
        py_step("hangs", hang, budget=3),
        py_step("after", "print('after: still ran')"),
        py_step("too-late", "print('never')", minimum=10_000),
    ]
    started = time.time()
    outcomes = run.run_all(plan, tmp_path, deadline=120)
    assert time.time() - started < 30
    assert [o.status for o in outcomes] == ["ok", "failed", "timed out", "ok", "skipped"]
    assert outcomes[0].headline == "first: 1.00x" and outcomes[1].returncode == 3
    assert outcomes[2].headline.startswith("timed out after 3s") and outcomes[3].headline == "after: still ran"
    pid = int(grandchild.read_text())
    deadline = time.monotonic() + 30  # an orphan is reaped by init a moment after its kill
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(pid)  # the timed-out step's own children were ended with it
    summary = (tmp_path / "summary.md").read_text(encoding="utf-8")
    assert "| broken | failed |" in summary and "| too-late | skipped |" in summary
    data = json.loads((tmp_path / "summary.json").read_text(encoding="utf-8"))
    assert [s["status"] for s in data["steps"]] == ["ok", "failed", "timed out", "ok", "skipped"]
    assert "about to fail" in (tmp_path / "logs" / "broken.log").read_text(encoding="utf-8")


def running(pid: int) -> bool:
    """The process exists and is not a zombie waiting for a parent to reap it."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_deadline_caps_a_step(tmp_path):
    outcome = run.run_all([py_step("slow", "import time; time.sleep(30)", budget=60)], tmp_path, deadline=2)[0]
    assert outcome.status == "timed out" and outcome.seconds < 15


def test_run_sh_dry_run_writes_and_copies_the_summary(tmp_path):
    results, out = tmp_path / "results", tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": PY}
    done = subprocess.run(
        ["bash", "bench/gpu/run.sh", "--dry-run", "--results", str(results)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(run.steps(False, results))} parses" in done.stdout  # every step, whichever are added
    assert (results / "summary.md").is_file() and (out / "results" / "summary.md").is_file()


# ----------------------------------------------------------------------------- the carried wheels


def make_wheel(folder: Path, name: str, version: str, files: dict[str, bytes], requires: list[str] = ()) -> Path:
    """A minimal wheel with METADATA, RECORD (with hashes) and the given files."""
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    contents = {**files, f"{info}/METADATA": meta.encode(), f"{info}/WHEEL": b"Wheel-Version: 1.0\n"}
    record = []
    for path, data in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, data in contents.items():
            z.writestr(path, data)
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel


def test_bitsandbytes_is_shrunk_to_the_cpu_and_cuda130_libraries(tmp_path):
    libs = {f"bitsandbytes/libbitsandbytes_{k}.so": os.urandom(2000) for k in ("cpu", "cuda121", "cuda130", "cuda128")}
    make_wheel(tmp_path, "bitsandbytes", "0.50.2", {"bitsandbytes/__init__.py": b"", **libs})
    total, problems = wheels.check(tmp_path, limit_mib=60)
    assert any("cuda121" in p for p in problems)
    path = wheels.shrink_bnb(tmp_path)
    with zipfile.ZipFile(path) as z:
        kept = sorted(n for n in z.namelist() if n.endswith(".so"))
    assert kept == ["bitsandbytes/libbitsandbytes_cpu.so", "bitsandbytes/libbitsandbytes_cuda130.so"]
    assert wheels.check(tmp_path, limit_mib=60)[1] == []  # RECORD matches, nothing extra
    assert any("over" in p for p in wheels.check(tmp_path, limit_mib=0.001)[1])


def test_pick_installs_pinned_packages_and_only_the_dependencies_the_machine_lacks(tmp_path, monkeypatch):
    make_wheel(tmp_path, "transformers", "5.24.0", {}, ["tokenizers<0.24,>=0.23.1", "numpy>=1.17", "typer"])
    make_wheel(tmp_path, "tokenizers", "0.23.3", {})
    make_wheel(tmp_path, "peft", "0.21.2", {})
    make_wheel(tmp_path, "numpy", "9.0.0", {})  # carried, but the machine's numpy satisfies the requirement
    machine = {"transformers": "5.17.0", "tokenizers": "0.22.1", "numpy": "2.3.0", "peft": "0.21.2"}
    monkeypatch.setattr(wheels, "installed_version", lambda n: machine.get(wheels.canonical(n)))
    notes: list[str] = []

    class Out:
        def write(self, text: str) -> None:
            notes.append(text)

    picked = [p.name.split("-")[0] for p in wheels.pick(tmp_path, out=Out())]
    assert picked == ["tokenizers", "transformers"]  # peft is already the pinned version; numpy is fine
    assert any("typer" in n for n in notes)  # reported, not fatal


# ----------------------------------------------------------------------------- the memory totals' report


def test_memory_totals_headline_judges_the_totals():
    from bench.gpu import memory_totals as mt

    row = {"name": "a", "class": "steady", "tensor": 10 * mt.GiB, "allocated": 10.05 * mt.GiB, "reserved": 11 * mt.GiB}
    ok = {**row, "total": 13 * mt.GiB, "total_calibrated": 13 * mt.GiB, "used": 12.5 * mt.GiB, "context": 1.3 * mt.GiB}
    under = {**ok, "name": "b", "used": 13.5 * mt.GiB}
    failed = {"name": "c", "error": "exit 1: out of memory"}
    text = mt.headline([ok, failed], "H200", True, "ctx")
    assert "[meets]" in text and "most over +4.0%" in text and "1 failed" in text and "-0.50%" in text
    assert "[MISSES]" in mt.headline([ok, under], "H200", True, "ctx")
    rows = mt.report_rows([ok, failed], True)
    assert len(rows[0]) == len(mt.HEADERS) == len(rows[1]) and rows[1][1].startswith("failed")
