"""Every GPU check in one call: run each step with its own time limit under one deadline, record each
step's outcome, and write bench/results/gpu/summary.md (+ .json, + one log per step). A failing or timed-out step is
recorded and the next one still runs. Started by bench/gpu/run.sh (which first installs the carried wheels).

    python bench/gpu/run.py                   # the GPU machine: pytest -m gpu, memory totals, throughput, DeepSpeed
    python bench/gpu/run.py --cpu             # a CPU: the same steps in their tiny modes (minutes here)
    python bench/gpu/run.py --dry-run         # check that every step's command parses; write the summary
    python bench/gpu/run.py --only memory-totals --deadline 300

Steps, most important first (a step starts only if the deadline leaves it its minimum):
  env            versions, the GPU, nvidia-smi
  pytest-gpu     pytest -m gpu on the test files that carry the mark
  memory-totals  bench/gpu/memory_totals.py: tensor_bytes vs max_memory_allocated, total_bytes vs device use
  throughput     bench/gpu_throughput.py: ours (Liger auto) and ours with Liger off vs the plain Trainer + PEFT script,
                 LoRA on the Liger case (Llama-3.2-1B shape, vocabulary 128256): tokens/s, peak, last loss
  packing        bench/packing.py: packing on (torch's varlen flash attention) / off against the plain padded script,
                 Liger on and off, mixed-length rows on the same 1B shape; flex attention (and flash-attn 2 when
                 installed) against padded in one process: real tokens/s, peak, loss gap
  deepspeed      bench/deepspeed_gpu.py: ZeRO-2 / ZeRO-3, with and without CPU offload, one GPU
  overhead-parts bench/overhead_parts.py --device cuda: our per-step pieces switched on one at a time (if time is left;
                 else a second call: bash bench/gpu/run.sh --only overhead-parts)
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_RESULTS = ROOT / "bench" / "results" / "gpu"
DEADLINE_S = 450  # the whole call may take 8 minutes: this leaves the wheel install and the copy-back their time
DEADLINE = "{deadline}"  # in a step's argv: replaced by its time limit less REPORT_MARGIN_S when it starts
REPORT_MARGIN_S = 15  # what a step keeps to write its report after its last measurement

ENV_SNIPPET = r"""
import importlib.metadata as md, json, os, platform, shutil, subprocess, sys
info = {"python": platform.python_version(), "executable": sys.executable}
for name in ("torch", "transformers", "peft", "accelerate", "bitsandbytes", "deepspeed", "datasets", "tokenizers",
             "huggingface_hub", "pydantic", "safetensors", "trl", "liger-kernel", "triton"):
    try:
        info[name] = md.version(name)
    except md.PackageNotFoundError:
        info[name] = "missing"
import torch
info["cuda"] = torch.version.cuda
info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
if shutil.which("nvidia-smi"):
    q = ["nvidia-smi", "--query-gpu=name,memory.used,memory.total,driver_version", "--format=csv,noheader"]
    info["nvidia-smi"] = subprocess.run(q, capture_output=True, text=True).stdout.strip()
info["PYTORCH_CUDA_ALLOC_CONF"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
print(json.dumps(info, indent=1))
print(f"env: torch {info['torch']} (CUDA {info['cuda']}), transformers {info['transformers']}, peft {info['peft']}, "
      f"bitsandbytes {info['bitsandbytes']}, deepspeed {info['deepspeed']}, liger-kernel {info['liger-kernel']}, "
      f"triton {info['triton']}; GPU {info['gpu']}")
"""


@dataclass
class Step:
    """One check: a command, the most seconds it may take, and the least it needs to be worth starting."""

    name: str
    argv: list[str]
    budget: float
    minimum: float = 20.0
    script: str = ""  # a bench script whose build_parser() must accept argv[2:] (checked by --dry-run)
    outputs: list[str] = field(default_factory=list)  # result files it writes


@dataclass
class Outcome:
    """What happened to a step."""

    name: str
    status: str  # ok | failed | timed out | skipped | parses (dry run)
    seconds: float = 0.0
    returncode: int | None = None
    headline: str = ""
    command: str = ""
    log: str = ""


def gpu_test_files() -> list[str]:
    """Test files that carry the gpu mark (pytest -m gpu over all files would import the UI's gradio there)."""
    marks = ("pytest.mark.gpu", "pytestmark = pytest.mark.gpu")
    files = sorted((ROOT / "tests").glob("test_*.py"))
    return [str(p.relative_to(ROOT)) for p in files if any(m in p.read_text(encoding="utf-8") for m in marks)]


def steps(cpu: bool, results: Path) -> list[Step]:
    """The checks, in order; `cpu`: their tiny modes, which run on a CPU."""
    py = sys.executable
    out = str(results)
    tests = gpu_test_files()
    memory = ["--tiny"] if cpu else []
    liger = ["--methods", "lora", "--sides", "ours,ours-no-liger,plain"]
    throughput = (
        ["--tiny", *liger, "--steps", "3"]
        if cpu
        else ["--shape", "llama-3.2-1b", "--tokenizer", "tiny", *liger, "--steps", "20", "--skip", "5", "--repeats=1"]
    )  # the Liger case: a 1.2B Llama with a 128k vocabulary (the tests' tokenizer; its ids fit any vocabulary)
    deepspeed = (
        ["--tiny", "--configs", "zero2", "--steps", "2", "--warmup", "1", "--timeout", "120"]
        if cpu
        else ["--shape", "small", "--seq", "512", "--warmup", "1", "--steps", "3", "--torch-adam", "--timeout", "45"]
    )
    packing = (
        ["--model", "tiny", "--steps", "3", "--repeats", "1", "--seq", "512", "--kernels", "--kernel-batches", "2",
         "--kernel-reps", "1"]
        if cpu
        else ["--model", "llama-3.2-1b", "--tokenizer", "tiny", "--sides", "packed,padded,plain,packed-no-liger",
              "--steps", "8", "--skip", "3", "--repeats", "1", "--batch", "8", "--seq", "2048",
              "--gradient-checkpointing", "off", "--kernels", "--kernel-batches", "4", "--kernel-reps", "2"]
    )  # fmt: skip  # packed (torch's varlen flash) vs padded vs plain, Liger on and off; flex / fa2 kernels
    cpu_parts = ["--rounds", "1", "--steps", "6", "--skip", "2", "--variants", "base,ours,engine"]
    parts = cpu_parts if cpu else ["--device", "cuda"]
    return [
        Step("env", [py, "-c", ENV_SNIPPET], budget=40, minimum=5),
        Step("pytest-gpu", [py, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", *tests], budget=100),
        Step(
            "memory-totals",
            [py, "bench/gpu/memory_totals.py", *memory, "--deadline", DEADLINE, "--out", f"{out}/memory_totals.md"],
            budget=180,
            minimum=60,
            script="bench/gpu/memory_totals.py",
            outputs=["memory_totals.md", "memory_totals.json"],
        ),
        Step(
            "throughput",
            [py, "bench/gpu_throughput.py", *throughput, "--out", f"{out}/gpu_throughput.md"],
            budget=150,
            minimum=60,
            script="bench/gpu_throughput.py",
            outputs=["gpu_throughput.md"],
        ),
        Step(
            "packing",
            [py, "bench/packing.py", *packing, "--out", f"{out}/packing-{'cpu' if cpu else 'gpu'}.md"],
            budget=170,
            minimum=80,
            script="bench/packing.py",
            outputs=[f"packing-{'cpu' if cpu else 'gpu'}.md"],
        ),
        Step(
            "deepspeed",
            [py, "bench/deepspeed_gpu.py", *deepspeed, "--deadline", DEADLINE, "--out", f"{out}/deepspeed_gpu.md"],
            budget=200,
            minimum=45,
            script="bench/deepspeed_gpu.py",
            outputs=["deepspeed_gpu.md", "deepspeed_gpu.json"],
        ),
        Step(  # last: it runs when the others leave time, else alone: run.sh --only overhead-parts
            "overhead-parts",
            [py, "bench/overhead_parts.py", *parts, "--out", f"{out}/overhead-parts{'-cpu' if cpu else '-gpu'}.md"],
            budget=150,
            minimum=90 if not cpu else 30,
            script="bench/overhead_parts.py",
            outputs=["overhead-parts-gpu.md"],
        ),
    ]


# ----------------------------------------------------------------------------- running


def check_parses(step: Step) -> None:
    """Raise if the step's script is missing or its parser refuses the step's arguments (no import of torch)."""
    if step.argv[1:2] == ["-c"]:
        compile(step.argv[2], step.name, "exec")
        return
    if step.argv[1:3] == ["-m", "pytest"]:
        files = [a for a in step.argv[3:] if a.endswith(".py")]
        if not files:
            raise ValueError("no test file carries the gpu mark")
        missing = [f for f in files if not (ROOT / f).is_file()]
        if missing:
            raise FileNotFoundError(", ".join(missing))
        return
    path = ROOT / step.script
    spec = importlib.util.spec_from_file_location(f"_bench_{step.name.replace('-', '_')}", path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(step.script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the module runs
    spec.loader.exec_module(module)
    try:
        module.build_parser().parse_args([a.replace(DEADLINE, "100") for a in step.argv[2:]])
    except SystemExit as exc:
        raise ValueError(f"{step.script} refuses {' '.join(step.argv[2:])}") from exc


def run_step(step: Step, timeout: float, logs: Path, env: dict[str, str]) -> Outcome:
    """Run one step in its own process group; kill the group at the timeout. Output goes to logs/NAME.log."""
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{step.name}.log"
    argv = [a.replace(DEADLINE, f"{max(1.0, timeout - REPORT_MARGIN_S):.0f}") for a in step.argv]
    command = " ".join(argv if argv[1:2] != ["-c"] else [*argv[:2], "<snippet>"])
    started = time.time()
    with open(log, "w", encoding="utf-8") as fh:
        fh.write(f"$ {command}\n\n")
        fh.flush()
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        try:
            code = proc.wait(timeout=max(1.0, timeout))
            status = "ok" if code == 0 else "failed"
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            code, status = None, "timed out"
    seconds = time.time() - started
    text = log.read_text(encoding="utf-8", errors="replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    headline = lines[-1][:400] if len(lines) > 1 else ""
    if status == "timed out":
        headline = f"timed out after {timeout:.0f}s; last line: {headline}"
    return Outcome(step.name, status, round(seconds, 1), code, headline, command, str(log))


def _kill_group(proc: subprocess.Popen) -> None:
    """End the step's process group (the step and the processes it started), then reap the step."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=5)
            break
        except subprocess.TimeoutExpired:
            continue


def run_all(
    plan: list[Step], results: Path, deadline: float, dry_run: bool = False, env: dict[str, str] | None = None
) -> list[Outcome]:
    """Run (or, dry, check) the steps in order within `deadline` seconds; write the summary after each step."""
    started = time.time()
    env = dict(env or os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), str(ROOT)) if p)
    outcomes: list[Outcome] = []
    for step in plan:
        left = deadline - (time.time() - started)
        if dry_run:
            try:
                check_parses(step)
                outcomes.append(Outcome(step.name, "parses", command=" ".join(step.argv[:2] + step.argv[2:][:12])))
            except Exception as exc:  # noqa: BLE001 - recorded, and the other steps are still checked
                outcomes.append(Outcome(step.name, "failed", headline=f"{type(exc).__name__}: {exc}"))
        elif left < step.minimum:
            outcomes.append(Outcome(step.name, "skipped", headline=f"out of time ({left:.0f}s left)"))
        else:
            outcomes.append(run_step(step, min(step.budget, left), results / "logs", env))
        write_summary(outcomes, results, time.time() - started, deadline, dry_run)
        print(f"[{time.time() - started:5.0f}s] {outcomes[-1].name}: {outcomes[-1].status}  {outcomes[-1].headline}")
    return outcomes


def write_summary(outcomes: list[Outcome], results: Path, elapsed: float, deadline: float, dry_run: bool) -> Path:
    """summary.md (a table of steps and their headlines) and summary.json."""
    results.mkdir(parents=True, exist_ok=True)
    when = _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    lines = [
        "# GPU checks" + (" (dry run: commands parse)" if dry_run else ""),
        "",
        f"- date: {when}; elapsed {elapsed:.0f}s of a {deadline:.0f}s deadline; python {sys.version.split()[0]}",
        f"- command: `python bench/gpu/run.py {' '.join(sys.argv[1:])}` (started by bench/gpu/run.sh)"
        + " (each step's output: logs/STEP.log; its figures: the step's own .md)",
        "",
        "| step | status | seconds | headline |",
        "|---|---|---|---|",
    ]
    for o in outcomes:
        lines.append(f"| {o.name} | {o.status} | {o.seconds:.0f} | {o.headline.replace('|', '/')} |")
    path = results / "summary.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    steps_data = [asdict(o) for o in outcomes]
    data = {"date": when, "elapsed_s": round(elapsed, 1), "deadline_s": deadline, "steps": steps_data}
    (results / "summary.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="the tiny CPU modes of every step")
    parser.add_argument("--dry-run", action="store_true", help="only check that every step's command parses")
    parser.add_argument("--only", default="", help="comma-separated step names")
    parser.add_argument("--deadline", type=float, default=DEADLINE_S, help="seconds for all steps together")
    parser.add_argument("--results", default="", help="results folder (default bench/results/gpu; --cpu: gpu-cpu)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the steps; exit 0 when every step that ran passed (or parsed)."""
    args = build_parser().parse_args(argv)
    default = DEFAULT_RESULTS.with_name("gpu-cpu") if args.cpu else DEFAULT_RESULTS
    results = Path(args.results) if args.results else default
    plan = steps(args.cpu, results)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = set(names) - {s.name for s in plan}
        if unknown:
            print(f"--only: unknown {', '.join(sorted(unknown))}; steps: {', '.join(s.name for s in plan)}")
            return 2
        plan = [s for s in plan if s.name in names]
    outcomes = run_all(plan, results, args.deadline, dry_run=args.dry_run)
    counts = {s: sum(o.status == s for o in outcomes) for s in dict.fromkeys(o.status for o in outcomes)}
    print(f"gpu checks: {', '.join(f'{n} {s}' for s, n in counts.items())}; summary: {results / 'summary.md'}")
    return 1 if counts.get("failed") or counts.get("timed out") else 0


if __name__ == "__main__":
    sys.exit(main())
