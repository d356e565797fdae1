"""Our overhead against a plain Trainer + PEFT script: the same LoRA job, whole process and in the training loop.

The job: a random-initialised Llama-shaped model (4 layers, hidden 256) with SmolLM2's real tokenizer (vocab 49152),
prompt/completion rows long enough that every row is cut at exactly 128 tokens (so both sides see identical rows
and identical batch shapes; no packing), batch 8, tens of steps, LoRA r=8 on all linear layers, the same learning
rate, schedule, seed and logging every step. Ours is `python -m finetune train --config run.yaml`; the baseline is
`bench/plain_trainer.py`. They run alternately (ours, plain, plain, ours, ...), each in a fresh process.

    .venv/bin/python bench/overhead.py                       # 20 steps x 3 rounds, about 6 minutes here
    .venv/bin/python bench/overhead.py --steps 4 --repeats 1 --tokenizer tiny --hidden 64 --layers 2 --out ''

Figures per run: whole-process wall time (spawn → exit); in-loop tokens/s from the per-step log timestamps
(ours: events.jsonl "log" lines; plain: a timing callback), skipping the first `--skip` steps; and a phase breakdown:
start-up (imports, data, model) → step-0 sample answers (ours only) → first step → loop → after the loop (save, exit).
The ratios are medians of the per-round ratios (ours / plain in the same round). The last line is the headline.
bench/overhead_preference.py runs the same comparison (this file's shared part) on a DPO job.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    RESULTS,
    ROOT,
    Measured,
    Report,
    build_llama,
    child_env,
    load_tokenizer,
    loadavg,
    median,
    parameter_count,
    table,
    write_rows,
)

PY = sys.executable
PROCESS_GOAL = 1.05  # whole-process time, ours / plain: at most
LOOP_GOAL = 0.99  # in-loop tokens/s, ours / plain: at least
LEARNING_RATE = 5e-4


# ----------------------------------------------------------------------------- shared with bench/overhead_preference.py
def common_args() -> argparse.ArgumentParser:
    """The flags of both overhead benches (each adds its job's --steps, --batch, --seq and --out)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--repeats", type=int, default=3, help="rounds; each runs ours and the plain script once")
    parser.add_argument("--skip", type=int, default=2, help="steps left out of in-loop tokens/s (warm-up)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--tokenizer", choices=("embedded", "tiny"), default="embedded")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="OMP/MKL threads for both processes (0 = torch's default). 1 by default: on a shared, oversubscribed "
        "machine OpenMP teams spin and stall, and more so on the main thread (the plain script) than on a worker "
        "thread (ours trains in one), which would measure the scheduler instead of our code",
    )
    parser.add_argument(
        "--env", action="append", metavar="KEY=VALUE", help="extra environment for both processes (repeatable)"
    )
    return parser


def env(args: argparse.Namespace) -> dict[str, str]:
    extra = {"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)} if args.threads else {}
    for item in args.env or []:
        key, _, value = item.partition("=")
        extra[key] = value
    return child_env(**extra)


def ours_config(args: argparse.Namespace, model: Path, data: Path, out: Path, **job: Any) -> str:
    """Our run.yaml: the LoRA job both sides train, plus the job's own settings (`job`: the objective's)."""
    values = {
        "model": str(model),
        "dataset": str(data),
        "eval_split": "",
        "max_seq_length": args.seq,
        "method": "lora",
        "lora_r": 8,
        "lora_alpha": 16,
        "lora_dropout": 0.05,
        "lora_target_modules": "all-linear",
        "per_device_train_batch_size": args.batch,
        "gradient_accumulation_steps": 1,
        "learning_rate": LEARNING_RATE,
        "lr_scheduler_type": "cosine",
        "warmup_steps": 2,
        "max_steps": args.steps,
        "logging_steps": 1,
        "save_steps": args.steps + 1000,  # no intermediate checkpoint: the plain script saves none either
        "seed": 42,
        "output_dir": str(out),
        **job,
    }
    import yaml

    return yaml.safe_dump(values, sort_keys=False)


def run_ours(args: argparse.Namespace, work: Path, model: Path, data: Path, i: int, **job: Any) -> dict[str, Any]:
    """`python -m finetune train` on the job, timed from its process and its events.jsonl."""
    out = work / f"ours-{i}"
    cfg = work / f"ours-{i}.yaml"
    cfg.write_text(ours_config(args, model, data, out, **job), encoding="utf-8")
    cmd = [PY, "-m", "finetune", "train", "--config", str(cfg), "--no-progress"]
    proc = Measured(cmd, env(args))
    t0, t1 = proc.t0, proc.t1
    if proc.returncode != 0:
        raise RuntimeError(f"ours failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    events = [json.loads(line) for line in (out / "events.jsonl").read_text(encoding="utf-8").splitlines()]
    status = json.loads((out / "status.json").read_text(encoding="utf-8"))
    steps = [(e["step"], e["time"], e["loss"]) for e in events if e["type"] == "log"]
    when = {}
    for e in events:
        if e["type"] == "status":
            when.setdefault(e["status"], e["time"])
        elif e["type"] in ("samples", "saved"):
            when.setdefault(e["type"], e["time"])
    train_begin = when["running"]
    loop_begin = when.get("samples", train_begin)  # the step-0 sample answers come before the first step
    shutil.rmtree(out, ignore_errors=True)
    return {
        "wall": t1 - t0,
        "t0": t0,
        "train_begin": train_begin,
        "loop_begin": loop_begin,
        "steps": steps,
        "train_end": when.get("completed", steps[-1][1]),
        "saved": when.get("saved"),
        "exit": t1,
        "tokens_seen": status.get("tokens_seen"),
        "proc": proc,
    }


def run_plain(args: argparse.Namespace, cmd: list[str], out: Path, timing: Path) -> dict[str, Any]:
    """The plain script's command `cmd` (writing its model to `out` and its step times to `timing`), timed."""
    proc = Measured(cmd, env(args))
    t0, t1 = proc.t0, proc.t1
    if proc.returncode != 0:
        raise RuntimeError(f"plain failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    t = json.loads(timing.read_text(encoding="utf-8"))
    shutil.rmtree(out, ignore_errors=True)
    return {
        "wall": t1 - t0,
        "t0": t0,
        "train_begin": t["train_begin"],
        "loop_begin": t["train_begin"],
        "steps": [tuple(s) for s in t["steps"]],
        "train_end": t["train_end"],
        "saved": t["saved"],
        "exit": t1,
        "tokens_seen": None,
        "proc": proc,
    }


def loop_tps(run: dict[str, Any], skip: int, tokens_per_step: int, cpu: bool = False) -> float:
    """Tokens per second (of wall time, or of the process's CPU time) from the end of step `skip` to the last."""
    steps = run["steps"]
    first = next(s for s in steps if s[0] >= max(1, skip))
    last = steps[-1]
    if cpu:
        seconds = run["proc"].cpu_at(last[1]) - run["proc"].cpu_at(first[1])
    else:
        seconds = last[1] - first[1]
    return (last[0] - first[0]) * tokens_per_step / seconds


def phases(run: dict[str, Any], cpu: bool = False) -> dict[str, float]:
    """Seconds per phase: wall time, or the process's CPU time in that window."""
    steps = run["steps"]
    proc = run["proc"]
    at = proc.cpu_at if cpu else (lambda t: t)
    marks = [run["t0"], run["train_begin"], run["loop_begin"], steps[0][1], steps[-1][1], run["exit"]]
    values = [at(m) for m in marks]
    if cpu:
        values[0], values[-1] = 0.0, proc.cpu
    names = ["start-up (to train begin)", "step-0 samples", "first step", "steps 2..N", "after loop (save, exit)"]
    out = {name: b - a for name, a, b in zip(names, values, values[1:], strict=False)}
    out["whole process"] = values[-1] - values[0]
    return out


def alternate(
    args: argparse.Namespace, ours: Callable[[int], dict], plain: Callable[[int], dict], tokens_per_step: int
) -> tuple[list[dict], list[dict]]:
    """`--repeats` rounds of ours and plain (round i), alternating which goes first; one line per run."""
    ours_runs, plain_runs = [], []
    for i in range(args.repeats):
        for which in ("ours", "plain") if i % 2 == 0 else ("plain", "ours"):
            runs, run = (ours_runs, ours) if which == "ours" else (plain_runs, plain)
            runs.append(run(i))
            r = runs[-1]
            print(
                f"  round {i + 1} {which:5s}: wall {r['wall']:.1f}s, in-loop "
                f"{loop_tps(r, args.skip, tokens_per_step):.0f} tok/s, load {loadavg()[0]}",
                flush=True,
            )
    return ours_runs, plain_runs


def print_comparison(
    report: Report, ours_runs: list[dict], plain_runs: list[dict], skip: int, tokens_per_step: int
) -> dict[str, float]:
    """Print the per-round wall and CPU tables and the phase medians; returns the medians of the per-round ratios
    (wall, tps, cpu, cpu_tps) and the largest per-step loss difference (loss_diff)."""
    rows_out, cpu_rows = [], []
    for i, (o, p) in enumerate(zip(ours_runs, plain_runs, strict=True)):
        to, tp = loop_tps(o, skip, tokens_per_step), loop_tps(p, skip, tokens_per_step)
        rows_out.append([i + 1, o["wall"], p["wall"], o["wall"] / p["wall"], to, tp, to / tp])
        co, cp = loop_tps(o, skip, tokens_per_step, True), loop_tps(p, skip, tokens_per_step, True)
        oc, pc = o["proc"].cpu, p["proc"].cpu
        cpu_rows.append([i + 1, oc, pc, oc / pc, co, cp, co / cp])
    report.print()
    report.print("wall clock:")
    report.print(
        table(
            ["round", "ours wall s", "plain wall s", "wall ratio", "ours tok/s", "plain tok/s", "tok/s ratio"],
            rows_out,
        )
    )
    report.print()
    report.print("CPU time of each process (all its threads; steadier than wall time on a shared machine):")
    report.print(
        table(
            ["round", "ours CPU s", "plain CPU s", "CPU ratio", "ours tok/CPU-s", "plain tok/CPU-s", "ratio"],
            cpu_rows,
        )
    )
    for cpu in (False, True):
        po = [phases(r, cpu) for r in ours_runs]
        pp = [phases(r, cpu) for r in plain_runs]
        rows = [[k, median([x[k] for x in po]), median([x[k] for x in pp])] for k in po[0]]
        report.print()
        report.print(f"phase medians ({'CPU' if cpu else 'wall'} seconds):")
        report.print(table(["phase", "ours", "plain", "ours - plain"], [[k, a, b, a - b] for k, a, b in rows]))
    loss_diff = max(
        abs(a[2] - b[2])
        for o, p in zip(ours_runs, plain_runs, strict=True)
        for a, b in zip(o["steps"], p["steps"], strict=False)
    )
    return {
        "wall": median([r[3] for r in rows_out]),
        "tps": median([r[6] for r in rows_out]),
        "cpu": median([r[3] for r in cpu_rows]),
        "cpu_tps": median([r[6] for r in cpu_rows]),
        "loss_diff": loss_diff,
    }


# ----------------------------------------------------------------------------- the SFT job
def plain_command(args: argparse.Namespace, model: Path, data: Path, out: Path, timing: Path) -> list[str]:
    """bench/plain_trainer.py on the same job."""
    return [
        PY, str(ROOT / "bench" / "plain_trainer.py"),
        "--model", str(model), "--data", str(data), "--output-dir", str(out),
        "--max-seq-length", str(args.seq), "--batch-size", str(args.batch), "--max-steps", str(args.steps),
        "--timing", str(timing),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[common_args()])
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per run")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128, help="tokens per row (every row is cut at this length)")
    parser.add_argument("--out", default=str(RESULTS), help="results folder or .md file; '' = do not save")
    args = parser.parse_args(argv)

    report = Report("overhead")
    work = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    try:
        tokenizer = load_tokenizer(args.tokenizer, work)
        model = build_llama(work / "model", tokenizer, layers=args.layers, hidden=args.hidden)
        rows = args.steps * args.batch
        data = write_rows(work / "rows.jsonl", rows, words=max(40, args.seq * 2))
        tokens_per_step = args.batch * args.seq
        report.print(
            f"job: LoRA r=8 all-linear on a random {args.layers}-layer hidden-{args.hidden} Llama "
            f"({parameter_count(model) / 1e6:.1f}M params, vocab {len(tokenizer)}, {args.tokenizer} tokenizer), "
            f"{rows} rows x {args.seq} tokens, batch {args.batch}, {args.steps} steps, no packing, "
            f"threads per process: {args.threads or 'torch default'}"
            + (f", env {' '.join(args.env)}" if args.env else "")
        )
        report.print(f"load average before: {loadavg()}")

        def plain(i: int) -> dict[str, Any]:
            out, timing = work / f"plain-{i}", work / f"plain-{i}.json"
            return run_plain(args, plain_command(args, model, data, out, timing), out, timing)

        ours_runs, plain_runs = alternate(
            args, lambda i: run_ours(args, work, model, data, i, packing=False), plain, tokens_per_step
        )
        # The same rows: ours counts the non-padding tokens it saw; every row must be exactly args.seq tokens.
        seen = ours_runs[0]["tokens_seen"]
        if seen is not None and seen != args.steps * tokens_per_step:
            report.print(f"WARNING: ours saw {seen} tokens, expected {args.steps * tokens_per_step}")
        ratios = print_comparison(report, ours_runs, plain_runs, args.skip, tokens_per_step)
        wall_ratio, tps_ratio, cpu_ratio, cpu_tps_ratio = (ratios[k] for k in ("wall", "tps", "cpu", "cpu_tps"))
        report.print()
        report.print(
            f"per-step loss, ours vs plain: largest difference {ratios['loss_diff']:.2e} "
            "(same rows, order and seed; LoRA init may differ)"
        )
        report.print(f"load average after: {loadavg()}")
        # The goals; judged on wall time and, steadier on a shared machine, on CPU time.
        wall_ok = "meets" if wall_ratio <= PROCESS_GOAL and tps_ratio >= LOOP_GOAL else "MISSES"
        cpu_ok = "meets" if cpu_ratio <= PROCESS_GOAL and cpu_tps_ratio >= LOOP_GOAL else "MISSES"
        headline = (
            f"overhead: whole-process wall ours/plain = {wall_ratio:.3f}x (goal <= {PROCESS_GOAL}), in-loop tokens/s "
            f"ours/plain = {tps_ratio:.3f}x (goal >= {LOOP_GOAL}) [{wall_ok}; median of {args.repeats} rounds]; "
            f"by CPU time: process {cpu_ratio:.3f}x, in-loop {cpu_tps_ratio:.3f}x [{cpu_ok}]"
        )
        return report.finish(args.out, headline)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
