"""The fit verdict on a real GPU: the estimate's tensor_bytes and total_bytes against runs of the project's CLI.

Per configuration, one fresh process runs `python -m finetune train` (finetune.cli.main, in-process) while:
  - a thread polls torch.cuda.mem_get_info() every few milliseconds once the run has made its CUDA context: the
    device memory in use, as nvidia-smi shows it (the whole run: load, step-0 samples, steps, save);
  - Trainer.train is wrapped to mark where training starts: the torch.cuda peak counters are reset there, so
    max_memory_allocated / max_memory_reserved cover the training steps (model loading has its own figures).
The parent never touches CUDA: it estimates each configuration (`finetune.memory.estimate(plan_for(config, "cuda"))`,
a replay on fake tensors) and measures the context with `finetune.memory.measured_cuda_overhead()`. It compares
  tensor_bytes with max_memory_allocated (the training steps), and
  total_bytes with the device-use peak (the whole run): never under, at most 15% over.

    python bench/gpu/memory_totals.py                 # GPU: 1B and 3B Llama shapes, LoRA / QLoRA, ~3 min (H200)
    python bench/gpu/memory_totals.py --tiny --out '' # CPU: the plumbing on a tiny model (RSS stands in)

The last printed line is the headline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import RESULTS, Report, child_env, table, write_rows  # noqa: E402

GiB, MiB = 2**30, 2**20
OVER_LIMIT = 0.15  # the total may be at most 15% above the device use
EXPANDABLE = "expandable_segments:True"


@dataclass
class Case:
    """One run: an architecture, the TrainConfig fields that differ, and extra environment for the run's process."""

    name: str
    arch: str
    settings: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)


# The worst case of the issue first (3B QLoRA, seq 2048, batch 4, checkpointing: 24.2 GiB used), then the same with
# expandable segments (does it cut the allocator's reserve? the estimate does not count on it until measured), then a
# run of each other allocator class: 16-bit LoRA without checkpointing (steady), with checkpointing, QLoRA without.
CKPT = {"gradient_checkpointing": True}
GPU_CASES = [
    Case("3b qlora s2048 b4 ckpt", "llama-3b", {"method": "qlora", "max_seq_length": 2048, **CKPT}),
    Case(
        "3b qlora s2048 b4 ckpt expandable",
        "llama-3b",
        {"method": "qlora", "max_seq_length": 2048, **CKPT},
        {"PYTORCH_CUDA_ALLOC_CONF": EXPANDABLE},
    ),
    Case("1b lora s512 b4", "llama-1b", {"method": "lora", "max_seq_length": 512}),
    Case("1b lora s1024 b4 ckpt", "llama-1b", {"method": "lora", "max_seq_length": 1024, **CKPT}),
    Case("1b qlora s512 b4", "llama-1b", {"method": "qlora", "max_seq_length": 512}),
]
TINY_CASES = [Case("tiny lora s64 b4", "tiny", {"method": "lora", "max_seq_length": 64})]
MIN_SECONDS = {"llama-3b": 60, "llama-1b": 30}  # a case starts only with this much time left (an H200: ~45 s, ~25 s)


def build_parser() -> argparse.ArgumentParser:
    """The command line (also checked by bench/gpu/run.py --dry-run)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="CPU plumbing check: a tiny model, one configuration")
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per run")
    parser.add_argument("--deadline", type=float, default=0, help="seconds; start no case after this (0 = none)")
    parser.add_argument("--work", default="", help="folder for models and runs (default: a temporary one)")
    parser.add_argument("--interval", type=float, default=0.005, help="seconds between device-memory polls")
    parser.add_argument("--out", default=str(RESULTS / "gpu" / "memory_totals.md"), help="report .md ('' = none)")
    parser.add_argument("--build", help=argparse.SUPPRESS)  # internal: build a random model of this arch
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one config (YAML) and measure
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--estimate", help=argparse.SUPPRESS)  # internal: estimate these configs (comma-separated)
    parser.add_argument("--cuda", action="store_true", help=argparse.SUPPRESS)
    return parser


# ----------------------------------------------------------------------------- the child processes


def arch_config(arch: str) -> Any:
    """bench/memory_accuracy.py's GPU shapes, or a tiny Llama for the CPU check (ids match tests/tiny's tokenizer)."""
    from transformers import LlamaConfig

    if arch == "tiny":
        return LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=384, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=2,
        )  # fmt: skip
    from bench.memory_accuracy import arch_config as shapes

    return shapes(arch)


def build_model(arch: str, path: Path) -> None:
    """A random-initialised model (bf16, built on the GPU when there is one) with the tests' tiny tokenizer.

    The tokenizer is tiny (no download; the GPU machine has no gguf for the embedded one); its ids fit any vocabulary,
    so the logits keep the architecture's full size."""
    import torch
    from transformers import AutoModelForCausalLM

    from tests.tiny import build_tokenizer

    cuda = torch.cuda.is_available()
    torch.manual_seed(0)
    with torch.device("cuda" if cuda else "cpu"):
        model = AutoModelForCausalLM.from_config(arch_config(arch), dtype=torch.bfloat16 if cuda else torch.float32)
    model.save_pretrained(path)
    build_tokenizer(path)


class Poller:
    """Peak device memory in use (total - free of mem_get_info; on a CPU the process's RSS), overall and since mark."""

    def __init__(self, cuda: bool, interval: float) -> None:
        self.cuda, self.interval = cuda, interval
        self.peak = self.peak_since_mark = 0
        self.samples = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def used(self) -> int:
        """Bytes in use now."""
        if self.cuda:
            free, total = __import__("torch").cuda.mem_get_info()
            return int(total - free)
        with open("/proc/self/statm", encoding="utf-8") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self) -> None:
        import torch

        while not self._done.is_set():
            # Wait for the run's own CUDA context: polling earlier would create it here, before the run sets up.
            if not self.cuda or torch.cuda.is_initialized():
                used = self.used()
                self.samples += 1
                self.peak, self.peak_since_mark = max(self.peak, used), max(self.peak_since_mark, used)
            self._done.wait(self.interval)

    def mark(self) -> None:
        """Start the 'since mark' peak from now."""
        self.peak_since_mark = 0

    def stop(self) -> None:
        """Stop polling."""
        self._done.set()
        self._thread.join()


def run_one(config_path: str, result_path: str, interval: float) -> int:
    """Run `python -m finetune train --config` in this process while measuring; write the figures as JSON."""
    import torch
    import transformers

    from finetune import cli

    cuda = torch.cuda.is_available()
    poller = Poller(cuda, interval)
    figures: dict[str, Any] = {"cuda": cuda, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
    original = transformers.Trainer.train

    def train(self: Any, *args: Any, **kwargs: Any) -> Any:
        if cuda:
            torch.cuda.synchronize()
            figures["load_allocated"] = torch.cuda.max_memory_allocated()
            figures["load_reserved"] = torch.cuda.max_memory_reserved()
            torch.cuda.reset_peak_memory_stats()
        figures["load_used"] = poller.peak
        poller.mark()
        return original(self, *args, **kwargs)

    transformers.Trainer.train = train
    started = time.time()
    code = cli.main(["train", "--config", config_path, "--no-progress"])
    figures["seconds"] = time.time() - started
    if cuda:
        torch.cuda.synchronize()
        figures["allocated"] = torch.cuda.max_memory_allocated()
        figures["reserved"] = torch.cuda.max_memory_reserved()
        free, total = torch.cuda.mem_get_info()
        figures["context"] = int(total - free - torch.cuda.memory_reserved())  # context + kernels (+ non-allocator)
        figures["device"] = torch.cuda.get_device_name(0)
        figures["device_total"] = int(total)
    poller.stop()
    figures.update(used=poller.peak, train_used=poller.peak_since_mark, samples=poller.samples, returncode=code)
    Path(result_path).write_text(json.dumps(figures), encoding="utf-8")
    return code


# ----------------------------------------------------------------------------- the parent


def case_config(case: Case, model: Path, data: Path, out: Path, args: argparse.Namespace, cuda: bool) -> Any:
    """The TrainConfig of a case: `steps` optimizer steps, no eval, no checkpoint, every row full length."""
    from finetune.config import TrainConfig

    values: dict[str, Any] = {
        "model": str(model), "dataset": str(data), "eval_split": "", "packing": False,
        "per_device_train_batch_size": args.batch, "gradient_accumulation_steps": 1, "max_steps": args.steps,
        "logging_steps": 1, "save_steps": args.steps + 1000, "warmup_steps": 0,
        "precision": "bf16" if cuda else "fp32", "output_dir": str(out),
    }  # fmt: skip
    values.update(case.settings)
    return TrainConfig(**values)


def child(args_list: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """Run this script as a child process."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *args_list]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=max(1.0, timeout))


def pct(value: float, reference: float) -> float:
    """Signed difference in percent of the reference."""
    return 100.0 * (value - reference) / reference if reference else float("nan")


def prepare_case(case: Case, args: argparse.Namespace, work: Path, cuda: bool, remaining: float) -> Path | str:
    """Build the case's model if needed and write its config: the config's path, or why it could not be."""
    model = work / f"model-{case.arch}"
    if not (model / "config.json").is_file():
        built = child(["--build", case.arch, "--work", str(model)], child_env(), remaining)
        if built.returncode != 0:
            return "building the model failed: " + _tail(built.stderr)
    seq = case.settings["max_seq_length"]
    data = write_rows(work / f"rows-{seq}.jsonl", 32, words=seq)
    run_dir = work / f"run-{case.name.replace(' ', '-')}"
    config_path = work / f"{run_dir.name}.yaml"
    case_config(case, model, data, run_dir, args, cuda).save(config_path)
    return config_path


def estimate_all(configs: list[Path], work: Path, cuda: bool, timeout: float) -> dict[str, Any]:
    """Estimates of every config, and this machine's measured context, from one child process.

    A child, so that whatever the estimator touches (bitsandbytes may create a CUDA context when it loads) is gone
    before a run is measured: the device-use poll sees the whole device, other processes included."""
    result = work / "estimates.json"
    env = child_env(FINETUNE_MEASURE_CUDA_CONTEXT="1" if cuda else "0")
    args = ["--estimate", ",".join(str(c) for c in configs), "--result", str(result)]
    done = child(args + (["--cuda"] if cuda else []), env, timeout)
    if done.returncode != 0 or not result.is_file():
        raise RuntimeError("estimating failed: " + _tail(done.stderr))
    return json.loads(result.read_text(encoding="utf-8"))


def estimate_child(configs: str, result_path: str, cuda: bool) -> None:
    """In the estimate child: estimate each config (a replay on fake tensors) and measure the CUDA context."""
    import torch

    from finetune import memory
    from finetune.config import TrainConfig
    from finetune.plan import plan_for

    out: dict[str, Any] = {"estimates": {}}
    for path in configs.split(","):
        t0 = time.time()
        est = memory.estimate(plan_for(TrainConfig.load(path), "cuda" if cuda else "cpu"))
        out["estimates"][path] = {
            "class": est.allocator_class or "-",
            "tensor": est.tensor_bytes,
            "allocator": est.overheads.get("allocator", 0),
            "total": est.total_bytes,
            "overheads": est.overheads,
            "est_s": time.time() - t0,
        }
    # Did estimating create a CUDA context? (It would hold device memory in the app's process.)
    out["cuda_initialized_by_estimates"] = bool(cuda and torch.cuda.is_initialized())
    out["measured"] = memory.measured_cuda_overhead() if cuda else None
    Path(result_path).write_text(json.dumps(out), encoding="utf-8")


def run_case(case: Case, config_path: Path, est: dict[str, Any], args: argparse.Namespace, remaining: float) -> dict:
    """Run the case's child (the CLI, measured) and put its figures beside the estimate."""
    from finetune import memory

    result = config_path.with_suffix(".json")
    env = child_env(FINETUNE_MEASURE_CUDA_CONTEXT="0", **case.env)
    done = child(["--one", str(config_path), "--result", str(result), "--interval", str(args.interval)], env, remaining)
    if done.returncode != 0 or not result.is_file():
        reason = "out of memory" if "out of memory" in (done.stderr + done.stdout).lower() else _tail(done.stderr)
        return {"name": case.name, "error": f"exit {done.returncode}: {reason}", "total": est["total"]}
    got = json.loads(result.read_text(encoding="utf-8"))
    calibrated = est["tensor"] + est["allocator"] + memory.CUDA_CONTEXT + memory.CUDA_KERNELS
    return {"name": case.name, **est, "total_calibrated": calibrated, **got}


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def report_rows(rows: list[dict[str, Any]], cuda: bool) -> list[list[Any]]:
    """Table rows: estimate vs measurement per case."""
    out = []
    for r in rows:
        if "error" in r:
            out.append([r["name"], f"failed: {r['error']}", *[""] * (len(HEADERS) - 2)])
            continue
        alloc = r.get("allocated")
        out.append(
            [
                r["name"],
                r["class"],
                r["tensor"] / GiB,
                alloc / GiB if alloc else "-",
                f"{pct(r['tensor'], alloc):+.1f}%" if alloc else "-",
                r["reserved"] / GiB if cuda else "-",
                f"{pct(r['reserved'], alloc):+.1f}%" if alloc else "-",
                r["total"] / GiB,
                r["total_calibrated"] / GiB if cuda else "-",
                r["used"] / GiB,
                f"{pct(r['total'], r['used']):+.1f}%",
                f"{r['context'] / MiB:.0f}" if cuda else "-",
            ]
        )
    return out


HEADERS = [
    "case", "class", "est tensors GiB", "max allocated GiB", "tensor err", "max reserved GiB", "reserved over alloc",
    "est total GiB", "est total (calibrated) GiB", "device peak GiB", "total err", "used - reserved MiB",
]  # fmt: skip


def headline(rows: list[dict[str, Any]], device: str, cuda: bool, context: str) -> str:
    """One line: how far the totals are from the device use (goal: never under, at most 15% over) and the tensors."""
    ok = [r for r in rows if "error" not in r]
    failed = len(rows) - len(ok)
    if not ok:
        return f"memory totals on {device}: no configuration measured ({failed} failed)"
    totals = [pct(r["total"], r["used"]) for r in ok]
    verdict = "meets" if min(totals) >= 0 and max(totals) <= 100 * OVER_LIMIT else "MISSES"
    if not cuda:
        verdict = "plumbing only: RSS is not a device total"
    text = (
        f"memory totals on {device}: total vs device peak most under {min(totals):+.1f}%, most over "
        f"{max(totals):+.1f}% over {len(ok)} runs (goal: >= 0%, <= +15%) [{verdict}]"
    )
    tensors = [pct(r["tensor"], r["allocated"]) for r in ok if r.get("allocated")]
    if tensors:
        text += f"; tensors vs max_memory_allocated median {statistics.median(tensors):+.2f}%, "
        text += f"worst {max(tensors, key=abs):+.2f}%"
    if failed:
        text += f"; {failed} failed"
    return text + f"; {context}"


def main(argv: list[str] | None = None) -> str:
    """Measure the cases, print the table and the headline (the last line)."""
    args = build_parser().parse_args(argv)
    if args.build:
        build_model(args.build, Path(args.work))
        return ""
    if args.one:
        raise SystemExit(run_one(args.one, args.result, args.interval))
    if args.estimate:
        estimate_child(args.estimate, args.result, args.cuda)
        return ""
    started = time.time()
    from bench.common import set_offline

    set_offline()
    import torch

    from finetune import memory

    cuda = torch.version.cuda is not None and torch.cuda.is_available()  # no CUDA context in this process
    if not cuda and not args.tiny:
        print("no CUDA GPU here: use --tiny for the CPU plumbing check", file=sys.stderr)
        raise SystemExit(2)
    cases = TINY_CASES if args.tiny else GPU_CASES
    wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [w for w in wanted if w not in {c.name for c in cases}]
    if unknown:
        raise SystemExit(f"--cases: unknown {', '.join(unknown)}; choose from {', '.join(c.name for c in cases)}")
    cases = [c for c in cases if not wanted or c.name in wanted]
    report = Report("memory_totals")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-memtotals-"))
    work.mkdir(parents=True, exist_ok=True)

    def left() -> float:
        return args.deadline - (time.time() - started) if args.deadline else 3600.0

    rows: list[dict[str, Any]] = []
    prepared: dict[str, Path] = {}
    for case in cases:  # the models first (one build per architecture), then every estimate in one child
        got = prepare_case(case, args, work, cuda, left()) if left() > MIN_SECONDS.get(case.arch, 20) else "skipped"
        if isinstance(got, Path):
            prepared[case.name] = got
        else:
            rows.append({"name": case.name, "error": got if got != "skipped" else "skipped: out of time"})
    estimates = estimate_all(sorted(set(prepared.values())), work, cuda, left()) if prepared else {"estimates": {}}
    measured = estimates.get("measured")
    calibrated = (memory.CUDA_CONTEXT + memory.CUDA_KERNELS) / MiB
    context = (
        f"estimator context+kernels: measured here {sum(measured.values()) / MiB:.0f} MiB (calibrated {calibrated:.0f})"
        if measured
        else f"estimator context+kernels: calibrated {calibrated:.0f} MiB"
        + (" (the measurement here failed)" if cuda else "")
    )
    if estimates.get("cuda_initialized_by_estimates"):
        context += "; NOTE: estimating created a CUDA context in the estimating process"
    device = "cpu"
    for case in cases:
        if case.name not in prepared:
            continue
        if left() < MIN_SECONDS.get(case.arch, 20):
            rows.append({"name": case.name, "error": "skipped: out of time"})
            continue
        try:
            est = estimates["estimates"][str(prepared[case.name])]
            r = run_case(case, prepared[case.name], est, args, left())
        except subprocess.TimeoutExpired:
            r = {"name": case.name, "error": "timed out"}
        rows.append(r)
        device = r.get("device", device)
        if "error" in r:
            report.print(f"  {case.name}: {r['error']}")
        else:
            report.print(
                f"  {case.name}: est total {r['total'] / GiB:.2f} GiB vs device peak {r['used'] / GiB:.2f} GiB "
                f"({pct(r['total'], r['used']):+.1f}%), run {r['seconds']:.0f}s"
            )
    report.print()
    report.print(table(HEADERS, report_rows(rows, cuda)))
    report.print(
        "device peak: total - free of torch.cuda.mem_get_info polled every "
        f"{args.interval * 1000:.0f} ms over the whole run (load, samples, steps, save); max allocated / reserved: "
        "torch.cuda peaks over the training steps; used - reserved: after the run (context + kernels)"
        if cuda
        else "device peak: the run's process RSS (CPU plumbing check; not comparable with the estimate)"
    )
    for r in rows:
        if "error" not in r and r.get("alloc_conf"):
            report.print(f"  {r['name']}: ran with PYTORCH_CUDA_ALLOC_CONF={r['alloc_conf']}")
    report.print(
        "est total (calibrated): the same estimate with the calibrated context "
        f"({(memory.CUDA_CONTEXT + memory.CUDA_KERNELS) / MiB:.0f} MiB) instead of this machine's"
    )
    text = headline(rows, device, cuda, context)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=2, default=str), encoding="utf-8")
    return report.finish(args.out, text)


if __name__ == "__main__":
    main()
