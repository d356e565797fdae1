"""Peak memory and step time of ZeRO-2 / ZeRO-3, with and without CPU offload, on a random-initialised ~1B
Llama-shaped model built from a config (nothing is downloaded), through the app's own DeepSpeed code path.

    .venv/bin/python bench/deepspeed_gpu.py            # on a GPU: 4 configurations, 1.1B parameters, ~5 minutes;
                                                       # writes bench/results/deepspeed_gpu.md and .json
    .venv/bin/python bench/deepspeed_gpu.py --tiny     # on a CPU: the same code on a 2-layer model (does it run?)

What is measured, per configuration, each in a fresh process (`--one NAME`) so that peaks and DeepSpeed's
process-wide state never leak from one configuration into the next:
  - the model: LlamaForCausalLM(LlamaConfig(TinyLlama-1.1B shape)) with random weights, full fine-tuning, bf16;
  - the DeepSpeed config: `finetune.engines.deepspeed_config.deepspeed_config(plan_for(TrainConfig(...)))`, the
  generator the app uses, and the one-process world of `finetune.engines.world.distributed_world(device)`;
  - the loop: `loss = engine(input_ids=ids, labels=ids).loss; engine.backward(loss); engine.step()` on one fixed
    batch of random tokens (so the loss must fall: a check that the optimizer really steps);
  - figures: GPU memory allocated after `deepspeed.initialize`, peak allocated and peak reserved over the steps
    (torch.cuda.max_memory_*), peak host RSS of the process, median step time after `--warmup` steps, tokens/s.
On a CPU (`--tiny`) the GPU columns are empty and the host RSS is the only memory figure.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))

# What varies between configurations: exactly the TrainConfig fields a user sets.
CONFIGS: dict[str, dict[str, Any]] = {
    "zero2": {"zero_stage": 2},
    "zero2+offload_opt": {"zero_stage": 2, "offload_optimizer": "cpu"},
    "zero3": {"zero_stage": 3},
    "zero3+offload_opt+param": {"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"},
}
# TinyLlama-1.1B's shape (1.10B parameters); the tiny shape is the tests' model.
SHAPES: dict[str, dict[str, int]] = {
    "1b": {"hidden": 2048, "intermediate": 5632, "layers": 22, "heads": 32, "kv_heads": 4, "vocab": 32000},
    "small": {"hidden": 1024, "intermediate": 2816, "layers": 16, "heads": 16, "kv_heads": 4, "vocab": 32000},
    "tiny": {"hidden": 64, "intermediate": 128, "layers": 2, "heads": 4, "kv_heads": 2, "vocab": 384},
}
RESULT_TAG = "RESULT "
GIB = 1024**3


def build_parser() -> argparse.ArgumentParser:
    """The command line (also checked by bench/gpu/run.py --dry-run)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="2-layer model, short batches: proves the script on a CPU")
    parser.add_argument(
        "--shape", choices=[s for s in SHAPES if s != "tiny"], default="1b", help="model shape (1b: 1.1B; small: 0.25B)"
    )
    parser.add_argument(
        "--torch-adam",
        action="store_true",
        help="step torch's AdamW instead of DeepSpeed's compiled Adam (no minutes-long JIT build of its ops)",
    )
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of: " + ", ".join(CONFIGS))
    parser.add_argument("--batch", type=int, help="micro batch (default 4; tiny 2)")
    parser.add_argument("--seq", type=int, help="sequence length (default 1024; tiny 32)")
    parser.add_argument("--steps", type=int, help="measured steps (default 6; tiny 3)")
    parser.add_argument("--warmup", type=int, default=2, help="steps before measuring (default 2)")
    parser.add_argument("--lr", type=float, help="learning rate (default 1e-4; tiny 1e-3)")
    parser.add_argument("--activation-checkpointing", action="store_true", help="recompute activations in backward")
    parser.add_argument("--timeout", type=int, default=420, help="seconds per configuration (default 420)")
    parser.add_argument(
        "--deadline", type=float, default=0, help="seconds for all configurations; later ones are skipped (0 = none)"
    )
    parser.add_argument(
        "--out",
        help="results path (.md; a .json is written beside it); default bench/results/deepspeed_gpu.md, "
        "none with --tiny; '' to write nothing",
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one configuration in this process
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.shape = "tiny" if args.tiny else args.shape
    args.batch = args.batch or (2 if args.tiny else 4)
    args.seq = args.seq or (32 if args.tiny else 1024)
    args.steps = args.steps or (3 if args.tiny else 6)
    args.lr = args.lr or (1e-3 if args.tiny else 1e-4)
    unknown = [name for name in args.configs.split(",") if name not in CONFIGS]
    if unknown:
        parser.error(f"--configs: unknown {', '.join(unknown)}; choose from {', '.join(CONFIGS)}")
    return args


# ----------------------------------------------------------------------------- one configuration (child process)
def measure(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Build the model, initialise DeepSpeed from the generated config, train `warmup + steps` steps, measure."""
    import deepspeed
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from finetune.config import TrainConfig
    from finetune.engines.deepspeed_config import deepspeed_config, use_torch_adam
    from finetune.engines.world import distributed_world
    from finetune.plan import plan_for

    cuda = torch.cuda.is_available()
    shape = SHAPES[args.shape]
    config = TrainConfig(
        model="bench:random-llama",  # built below from a LlamaConfig; never loaded
        dataset="bench:random-tokens",
        backend="deepspeed",
        method="full",
        precision="bf16" if cuda else "fp32",
        per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=1,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_steps=args.warmup + args.steps,
        gradient_checkpointing=args.activation_checkpointing,
        **CONFIGS[name],
    )
    plan = plan_for(config, device="cuda" if cuda else "cpu")  # world size: the launcher's WORLD_SIZE
    with distributed_world(plan.device) as world:
        torch.manual_seed(0)
        model = LlamaForCausalLM(
            LlamaConfig(
                vocab_size=shape["vocab"],
                hidden_size=shape["hidden"],
                intermediate_size=shape["intermediate"],
                num_hidden_layers=shape["layers"],
                num_attention_heads=shape["heads"],
                num_key_value_heads=shape["kv_heads"],
                max_position_embeddings=max(2048, args.seq),
                tie_word_embeddings=False,
            )
        )
        parameters = sum(p.numel() for p in model.parameters())
        if args.activation_checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        torch_adam = True if args.torch_adam else None
        ds = deepspeed_config(plan, total_steps=config.max_steps, hidden_size=shape["hidden"], torch_adam=torch_adam)
        engine, optimizer, _, _ = deepspeed.initialize(
            model=model, config=ds, model_parameters=[p for p in model.parameters() if p.requires_grad]
        )
        del model
        if cuda:
            torch.cuda.synchronize()
            after_init = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        generator = torch.Generator().manual_seed(1)
        ids = torch.randint(shape["vocab"], (args.batch, args.seq), generator=generator).to(engine.device)
        times, losses = [], []
        engine.train()
        for step in range(args.warmup + args.steps):
            start = time.perf_counter()
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
            if cuda:
                torch.cuda.synchronize()
            losses.append(float(loss))
            if step >= args.warmup:
                times.append(time.perf_counter() - start)
        inner = getattr(optimizer, "optimizer", optimizer)
        result = {
            "config": name,
            "settings": CONFIGS[name],
            "parameters": parameters,
            "world_size": world.size,
            "precision": config.precision,
            "optimizer": type(inner).__name__,
            "torch_adam": bool(args.torch_adam) or use_torch_adam(plan),
            "gpu_after_init_gib": after_init / GIB if cuda else None,
            "gpu_peak_allocated_gib": torch.cuda.max_memory_allocated() / GIB if cuda else None,
            "gpu_peak_reserved_gib": torch.cuda.max_memory_reserved() / GIB if cuda else None,
            "host_peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB,
            "step_s": statistics.median(times),
            "tokens_per_s": args.batch * args.seq * world.size / statistics.median(times),
            "loss_first": losses[0],
            "loss_last": losses[-1],
            "loss_falls": losses[-1] < losses[0],
            "ds_config": ds,
        }
        engine.destroy()
        return result


# ----------------------------------------------------------------------------- the driver (parent process)
def run_one(name: str, args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, str(Path(__file__).resolve()), *argv, "--one", name]
    started = time.time()
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"config": name, "error": f"timed out after {args.timeout}s"}
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            result = json.loads(line[len(RESULT_TAG) :])
            result["process_s"] = time.time() - started
            return result
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
    if "out of memory" in done.stderr.lower():
        tail = "out of memory"
    return {"config": name, "error": f"exit {done.returncode}: {tail}"}


def machine() -> dict[str, Any]:
    import importlib.metadata as md

    info: dict[str, Any] = {
        "date": _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "versions": {},
    }
    for name in ("torch", "deepspeed", "transformers", "accelerate"):
        try:
            info["versions"][name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    try:
        import torch

        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        if info["gpu"]:
            info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / GIB, 1)
    except Exception:  # the record is a help, never a failure
        info["gpu"] = None
    return info


def table(results: list[dict[str, Any]]) -> str:
    headers = [
        "config",
        "optimizer",
        "GPU after init GiB",
        "GPU peak alloc GiB",
        "GPU peak reserved GiB",
        "host peak RSS GiB",
        "step s",
        "tokens/s",
        "loss first→last",
    ]

    def gib(value: Any) -> str:
        return "-" if value is None else f"{value:.2f}"

    rows = []
    for r in results:
        if "error" in r:
            rows.append([r["config"], f"failed: {r['error']}"] + [""] * (len(headers) - 2))
            continue
        rows.append(
            [
                r["config"],
                r["optimizer"],
                gib(r["gpu_after_init_gib"]),
                gib(r["gpu_peak_allocated_gib"]),
                gib(r["gpu_peak_reserved_gib"]),
                gib(r["host_peak_rss_gib"]),
                f"{r['step_s']:.3f}",
                f"{r['tokens_per_s']:.0f}",
                f"{r['loss_first']:.3f}→{r['loss_last']:.3f}",
            ]
        )
    widths = [max(len(h), *(len(str(row[i])) for row in rows)) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *(line(r) for r in rows)])


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.one:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        print(RESULT_TAG + json.dumps(measure(args.one, args)), flush=True)
        return 0

    info = machine()
    shape = SHAPES[args.shape]
    print(
        f"DeepSpeed memory bench: {args.shape} Llama (hidden {shape['hidden']}, {shape['layers']} layers), full "
        f"fine-tuning, batch {args.batch} × {args.seq}, {args.warmup} + {args.steps} steps, "
        f"{'activation checkpointing, ' if args.activation_checkpointing else ''}"
        f"on {info.get('gpu') or 'CPU'}",
        flush=True,
    )
    results = []
    started = time.time()
    for name in args.configs.split(","):
        left = args.deadline - (time.time() - started) if args.deadline else float("inf")
        if left < 15:
            results.append({"config": name, "error": "skipped: out of time"})
            print(f"  {name}: skipped: out of time", flush=True)
            continue
        args.timeout = int(min(args.timeout, left))
        result = run_one(name, args, argv)
        results.append(result)
        status = (
            result.get("error")
            or (
                f"peak GPU {result['gpu_peak_allocated_gib']:.2f} GiB"
                if result.get("gpu_peak_allocated_gib") is not None
                else f"host RSS {result['host_peak_rss_gib']:.2f} GiB"
            )
            + f", {result.get('step_s', 0):.3f} s/step"
        )
        print(f"  {name}: {status}", flush=True)
    text = table(results)
    print(text)
    failures = [r for r in results if "error" in r or not r.get("loss_falls")]

    out = args.out if args.out is not None else ("" if args.tiny else str(RESULTS / "deepspeed_gpu.md"))
    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        params = next((r["parameters"] for r in results if "parameters" in r), 0)
        body = [
            "# DeepSpeed ZeRO memory on one GPU",
            "",
            f"- date: {info['date']}; host {info['host']}; GPU: {info.get('gpu') or 'none'}"
            + (f" ({info['gpu_memory_gib']} GiB)" if info.get("gpu_memory_gib") else "")
            + f"; CPUs {info['cpus']}",
            f"- versions: {', '.join(f'{k} {v}' for k, v in info['versions'].items())}",
            f"- model: random-initialised Llama, {_count(params)} parameters ({args.shape} shape), "
            f"full fine-tuning, {results[0].get('precision', '?')}, micro batch {args.batch} × {args.seq} tokens, "
            "one process",
            f"- command: `.venv/bin/python bench/deepspeed_gpu.py {' '.join(argv)}`".rstrip(),
            "",
            text,
            "",
        ]
        path.write_text("\n".join(body), encoding="utf-8")
        path.with_suffix(".json").write_text(json.dumps({"machine": info, "results": results}, indent=2) + "\n")
        print(f"written: {path} and {path.with_suffix('.json')}")
    print(headline(results, info.get("gpu") or "CPU"), flush=True)
    return 1 if failures else 0


def headline(results: list[dict[str, Any]], where: str) -> str:
    """The last line: per configuration its peak memory and step time, or why it failed; how many losses fell."""
    parts = []
    for r in results:
        if "error" in r:
            parts.append(f"{r['config']} failed ({r['error'][:80]})")
            continue
        peak = r.get("gpu_peak_allocated_gib")
        memory = f"peak {peak:.2f} GiB" if peak is not None else f"host RSS {r['host_peak_rss_gib']:.2f} GiB"
        parts.append(f"{r['config']} {memory}, {r['step_s']:.3f} s/step")
    falls = sum(bool(r.get("loss_falls")) for r in results)
    return f"deepspeed on {where}: " + "; ".join(parts) + f"; loss fell in {falls} of {len(results)}"


if __name__ == "__main__":
    sys.exit(main())
