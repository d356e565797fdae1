"""LoRA and QLoRA throughput and peak memory on a GPU: ours against the plain Trainer + PEFT script.

The model is a random-initialised Llama-shaped ~1.2B model (TinyLlama's shape: 22 layers, hidden 2048, GQA 32/4
heads, with SmolLM2's tokenizer, vocab 49152) saved in bf16; rows are cut at exactly `--seq` tokens, batch `--batch`.
For each method, ours and the plain script run alternately, each in a fresh process:
  ours   a worker process that starts the run as `python -m finetune train` does (RunManager, training thread,
         the same engine), precision bf16; in-loop tokens/s from events.jsonl step timestamps
  plain  bench/plain_trainer.py --bf16 [--method qlora], with its timing callback
  ours-no-liger (with --sides): ours with liger_kernel off, to tell Liger's share from the rest of ours
"ours" runs the default config, liger_kernel auto: Liger's kernels where liger-kernel is installed and the GPU runs
them (the report says whether they were on). Peak memory is `torch.cuda.max_memory_allocated()` in each process (on a
CPU: the process's max RSS). `--shape llama-3.2-1b` is the Liger case: 16 layers, hidden 2048, vocab 128256.

    .venv/bin/python bench/gpu_throughput.py                  # on the GPU machine, a few minutes on an H200
    .venv/bin/python bench/gpu_throughput.py --tiny --out ''  # CPU: tiny model and steps, checks the plumbing
    .venv/bin/python bench/gpu_throughput.py --shape llama-3.2-1b --tokenizer tiny --methods lora \
        --sides ours,ours-no-liger,plain                      # Liger on/off against plain (bench/gpu/run.sh)

The last line is the headline: ours / plain tokens/s and peak memory for LoRA and QLoRA.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    RESULTS,
    ROOT,
    Report,
    build_llama,
    child_env,
    load_tokenizer,
    loadavg,
    median,
    parameter_count,
    set_offline,
    table,
    train_here,
    write_rows,
)

PY = sys.executable
SIDES = ("ours", "ours-no-liger", "plain")
# Named model shapes (layers, hidden, intermediate, heads, kv heads, vocabulary); the default is TinyLlama's.
SHAPES = {"llama-3.2-1b": (16, 2048, 8192, 32, 8, 128256)}


# ----------------------------------------------------------------------------- the worker for ours (own process)
def worker_ours(args: argparse.Namespace) -> None:
    """Train one run as the CLI does (a RunManager and its training thread) and write the figures to --result."""
    set_offline()

    import torch

    from finetune.config import TrainConfig

    out = Path(args.run_dir)
    config = TrainConfig(
        model=args.model, dataset=args.data, eval_split="", max_seq_length=args.seq, packing=False,
        method=args.method, lora_r=8, lora_alpha=16, lora_dropout=0.05, lora_target_modules="all-linear",
        per_device_train_batch_size=args.batch, learning_rate=5e-4, lr_scheduler_type="cosine", warmup_steps=2,
        max_steps=args.steps, logging_steps=1, save_steps=args.steps + 1000, seed=42,
        precision="bf16" if torch.cuda.is_available() else "fp32",
        gradient_checkpointing=args.gradient_checkpointing, output_dir=str(out), liger_kernel=args.liger,
    )  # fmt: skip
    from finetune.plan import plan_for

    liger = plan_for(config).liger
    events, peak = train_here(config, "gpu_throughput")
    steps = [[e["step"], e["time"], e["loss"]] for e in events if e["type"] == "log"]
    figures = {"steps": steps, "peak_memory_bytes": peak, "liger": liger}
    Path(args.result).write_text(json.dumps(figures), encoding="utf-8")


# ----------------------------------------------------------------------------- the driver
def run_side(args: argparse.Namespace, work: Path, side: str, method: str, i: int, model: Path, data: Path) -> dict:
    result = work / f"{side}-{method}-{i}.json"
    out = work / f"{side}-{method}-{i}"
    common = ["--model", str(model), "--data", str(data)]
    if side.startswith("ours"):
        cmd = [
            PY, str(Path(__file__).resolve()), "--worker", "ours", *common, "--run-dir", str(out),
            "--result", str(result), "--method", method, "--seq", str(args.seq), "--batch", str(args.batch),
            "--steps", str(args.steps), "--liger", "off" if side == "ours-no-liger" else "auto",
        ]  # fmt: skip
    else:
        cmd = [
            PY, str(ROOT / "bench" / "plain_trainer.py"), *common, "--output-dir", str(out), "--timing", str(result),
            "--peak-memory", "--method", method, "--max-seq-length", str(args.seq), "--batch-size", str(args.batch),
            "--max-steps", str(args.steps),
        ]  # fmt: skip
        if args.bf16:
            cmd.append("--bf16")
    if args.gradient_checkpointing:
        cmd.append("--gradient-checkpointing")
    t0 = time.time()
    # On a CPU (the tiny check) one OpenMP thread each: spinning thread teams on a shared machine swamp the figures.
    threads = {} if args.bf16 else {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=child_env(**threads), capture_output=True, text=True)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{side} {method} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    figures = json.loads(result.read_text(encoding="utf-8"))
    shutil.rmtree(out, ignore_errors=True)
    steps = figures["steps"]
    first = next(s for s in steps if s[0] >= max(1, args.skip))
    last = steps[-1]
    tps = (last[0] - first[0]) * args.batch * args.seq / (last[1] - first[1])
    peak, liger = figures["peak_memory_bytes"], figures.get("liger")
    return {"tps": tps, "peak": peak, "wall": wall, "loss": steps[-1][2], "liger": liger}


def build_parser() -> argparse.ArgumentParser:
    """The command line (also checked by bench/gpu/run.py --dry-run)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="CPU plumbing check: tiny model, few steps")
    parser.add_argument(
        "--tokenizer",
        choices=("embedded", "tiny"),
        default="embedded",
        help="embedded: SmolLM2's (needs the gguf package); tiny: the tests' 384-token one (use --vocab with it)",
    )
    parser.add_argument("--vocab", type=int, default=0, help="model vocabulary if larger than the tokenizer's")
    parser.add_argument("--methods", default="lora,qlora")
    parser.add_argument(
        "--sides", default="ours,plain", help=f"comma-separated, from {', '.join(SIDES)} (ours and plain needed)"
    )
    parser.add_argument("--shape", choices=("tinyllama", *SHAPES), default="tinyllama", help="named model shape")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--skip", type=int, default=5, help="steps left out of in-loop tokens/s (warm-up)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=5632)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--out", default=str(RESULTS), help="results folder or .md file; '' = do not save")
    # worker mode (internal)
    parser.add_argument("--worker", choices=("ours",), help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--method", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--liger", default="auto", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> str:
    args = build_parser().parse_args(argv)
    if args.worker:
        worker_ours(args)
        return ""

    set_offline()
    import torch

    cuda = torch.cuda.is_available()
    sides = [x.strip() for x in args.sides.split(",") if x.strip()]
    if set(sides) - set(SIDES) or not {"ours", "plain"} <= set(sides):
        raise SystemExit(f"--sides: choose from {', '.join(SIDES)}, with ours and plain")
    if args.shape in SHAPES:
        args.layers, args.hidden, args.intermediate, args.heads, args.kv_heads, args.vocab = SHAPES[args.shape]
    if args.tiny:
        args.steps, args.skip, args.batch, args.seq, args.repeats = min(args.steps, 6), 2, 4, 64, 1
        args.layers, args.hidden, args.intermediate, args.heads, args.kv_heads = 2, 64, 128, 4, 2
        args.tokenizer, args.vocab = "tiny", 0
    elif not cuda:
        print("no GPU here: use --tiny for the CPU plumbing check (the full size is for the lent GPU machine)")
        raise SystemExit(2)
    args.bf16 = cuda
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]

    report = Report("gpu_throughput" if not args.tiny else "gpu_throughput-tiny-cpu")
    work = Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    try:
        tokenizer = load_tokenizer(args.tokenizer, work)
        model = build_llama(
            work / "model", tokenizer, layers=args.layers, hidden=args.hidden, intermediate=args.intermediate,
            heads=args.heads, kv_heads=args.kv_heads, dtype="bfloat16" if cuda else "float32", vocab=args.vocab,
        )  # fmt: skip
        data = write_rows(work / "rows.jsonl", args.steps * args.batch, words=max(40, args.seq * 2))
        device = torch.cuda.get_device_name(0) if cuda else "cpu"
        report.print(
            f"device: {device}; model: random Llama {args.layers} layers, hidden {args.hidden}, "
            f"{parameter_count(model) / 1e6:,.1f}M params, {'bf16' if cuda else 'fp32'}; batch {args.batch} x "
            f"{args.seq} tokens, {args.steps} steps (first {args.skip} not timed), LoRA r=8 all-linear, "
            f"gradient checkpointing {'on' if args.gradient_checkpointing else 'off'}"
        )
        report.print(f"load average before: {loadavg()}")
        results: dict[str, dict[str, list[dict]]] = {m: {s: [] for s in sides} for m in methods}
        for i in range(args.repeats):
            for method in methods:
                for side in sides if i % 2 == 0 else sides[::-1]:
                    r = run_side(args, work, side, method, i, model, data)
                    results[method][side].append(r)
                    print(f"  {method} {side:5s}: {r['tps']:.0f} tok/s, peak {r['peak'] / 2**30:.2f} GiB, "
                          f"wall {r['wall']:.0f}s, last loss {r['loss']:.4f}, Liger {r['liger']}",
                          flush=True)  # fmt: skip
        rows, heads = [], []
        for method in methods:
            o, p = results[method]["ours"], results[method]["plain"]
            tps_o, tps_p = median([r["tps"] for r in o]), median([r["tps"] for r in p])
            mem_o, mem_p = median([r["peak"] for r in o]) / 2**30, median([r["peak"] for r in p]) / 2**30
            rows.append([method, tps_o, tps_p, tps_o / tps_p, mem_o, mem_p, mem_o / mem_p,
                         median([r["wall"] for r in o]), median([r["wall"] for r in p])])  # fmt: skip
            head = f"{method} tok/s {tps_o / tps_p:.3f}x, peak memory {mem_o / mem_p:.3f}x (Liger {o[0]['liger']})"
            if "ours-no-liger" in sides:
                n = results[method]["ours-no-liger"]
                tps_n, mem_n = median([r["tps"] for r in n]), median([r["peak"] for r in n]) / 2**30
                loss_o, loss_n = median([r["loss"] for r in o]), median([r["loss"] for r in n])
                rows.append([f"{method} Liger off", tps_n, tps_p, tps_n / tps_p, mem_n, mem_p, mem_n / mem_p,
                             median([r["wall"] for r in n]), median([r["wall"] for r in p])])  # fmt: skip
                head += (
                    f", Liger off {tps_n / tps_p:.3f}x / {mem_n / mem_p:.3f}x; last loss {loss_o:.4f} vs "
                    f"{loss_n:.4f} off"
                )
            heads.append(head)
        report.print()
        report.print(
            table(
                [
                    "method",
                    "ours tok/s",
                    "plain tok/s",
                    "ratio",
                    "ours peak GiB",
                    "plain peak GiB",
                    "ratio",
                    "ours wall s",
                    "plain wall s",
                ],
                rows,
            )  # fmt: skip
        )
        report.print(f"peak memory: {'torch.cuda.max_memory_allocated()' if cuda else 'process max RSS (CPU)'}")
        report.print(f"load average after: {loadavg()}")
        headline = f"gpu throughput on {device} (ours/plain): " + "; ".join(heads)
        return report.finish(args.out, headline)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
