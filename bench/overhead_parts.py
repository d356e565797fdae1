"""Where does our training loop lose time against the plain script? Each candidate switched on alone, in one process.

The overhead job (LoRA r=8 all-linear on a random 4-layer, hidden-256 Llama, fp32 on the CPU; by default the tiny
tokenizer's 384-token vocabulary and batch 4 x 64 tokens, about 0.1 s a step on an idle core, so that per-step costs of
milliseconds show; `--vocab 49152 --batch 8 --seq 128` is bench/overhead.py's 1.3 s step), trained by `Trainer` in
variants that add one of our per-step costs at a time:

  base         Trainer + PEFT, logging every 10 steps, no token counting (the issue's plain script)
  log1         + logging_steps 1 (the loss and grad-norm .item() and an on_log round every step)
  log1+tokens  + include_num_input_tokens_seen="non_padding" (ours: a gather and .item() every micro batch)
  ours         + our ProgressCallback and Progress (finetune.engines.hf_trainer): memory polling, status.json every
               0.5 s (atomic write + fsync), one events.jsonl line per log; step-0 samples off (timed separately)
  ours-nofsync ours, with status.json written without fsync
  ours-nopoll  ours, with the memory poll (psutil) replaced by a constant
  ours-thread  ours, trained in a background thread while the main thread waits as the CLI does (wait(0.2))
  ours-fused   ours with the fused AdamW (`adamw_torch_fused`, Trainer's default; ours maps adamw_torch to the
               foreach one)
  engine       the engine as it is now (finetune.engines.hf_trainer): StudioTrainer and the training arguments' per-step
               choices (on a GPU: no NaN/Inf filter, tokens counted on the device and read on the status cadence,
               the loss logged at most once a second), our ProgressCallback and Progress, AdamW foreach
  proposed     the changes proposed in bench/results/overhead-analysis.md, simulated here: ours-fused, plus the loss
               logged on a time cadence (at most once per LOG_EVERY_S, first and last step always; Trainer averages
               the window), no NaN/Inf filter (a per-micro-batch host sync), tokens counted on the CPU in the collator
               instead of include_num_input_tokens_seen, status.json without fsync

Variants run in rotated order each round (fresh model each time), with the same batches; a round's figure for a
variant is its median step time over the steps after `--skip`, divided by the base's in the same round (this
machine is shared and noisy: ratios of alternated runs hold better than absolute times). Then the fixed costs:
one call of each per-step piece (microseconds), the step-0 sample answers and the final save.

    .venv/bin/python bench/overhead_parts.py                    # 5 rounds x 7 variants, a few minutes here
    .venv/bin/python bench/overhead_parts.py --rounds 1 --steps 6 --out ''
    python bench/overhead_parts.py --device cuda             # a GPU: the 1.07B shape, bf16, 8 x 512

The last line is the headline: each variant's step time relative to the base (median over rounds).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import threading
import time
import timeit
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import RESULTS, Report, build_llama, load_tokenizer, loadavg, set_offline, table  # noqa: E402

VARIANTS = [
    "base", "log1", "log1+tokens", "ours", "ours-nofsync", "ours-nopoll", "ours-thread", "ours-fused", "engine",
    "proposed",
]  # fmt: skip
LOG_EVERY_S = 1.0  # the proposed time cadence of the loss log
GPU_SHAPE = {"layers": 22, "hidden": 2048, "intermediate": 5632, "heads": 32, "kv_heads": 4, "vocab": 49152}


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per variant and round")
    parser.add_argument("--skip", type=int, default=5, help="first steps left out (warm-up)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument(
        "--vocab", type=int, default=384, help="model vocabulary (384: the tiny tokenizer's; 49152: SmolLM2's)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: see bench/results/cpu-threads.md)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="cuda: bf16, and the GPU shape unless given"
    )
    parser.add_argument("--intermediate", type=int, default=0, help="MLP width (default 4 x hidden)")
    parser.add_argument("--heads", type=int, default=0)
    parser.add_argument("--kv-heads", type=int, default=0)
    parser.add_argument("--out", default=str(RESULTS / "overhead-parts.md"), help="results .md ('' = none)")
    return parser


class StepTimes:
    """When each optimizer step ended: wall time and this process's CPU time (all threads)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.cpu: list[float] = []


def make_trainer(variant: str, model_dir: Path, rows: list[dict], args: argparse.Namespace, work: Path) -> tuple:
    """(trainer, step times, run folder) for a variant."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments, default_data_collator
    from transformers.trainer_callback import PrinterCallback

    torch.manual_seed(0)
    cuda = args.device == "cuda"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16 if cuda else torch.float32)
    model = get_peft_model(
        model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM")
    )
    out = Path(tempfile.mkdtemp(prefix=f"{variant}-", dir=work))
    targs = TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=args.batch, max_steps=args.steps, learning_rate=5e-4,
        lr_scheduler_type="cosine", warmup_steps=2, logging_steps=10 if variant == "base" else 1,
        logging_first_step=variant != "base", save_strategy="no", report_to=[], use_cpu=not cuda, bf16=cuda,
        disable_tqdm=True,
        optim="adamw_torch" if variant == "engine" or variant.startswith("ours") and variant != "ours-fused" else
        "adamw_torch_fused", logging_nan_inf_filter=variant != "proposed" and not (variant == "engine" and cuda),
        include_num_input_tokens_seen="no" if variant in ("base", "log1", "proposed") else "non_padding",
        dataloader_num_workers=0, remove_unused_columns=False, seed=42,
    )  # fmt: skip
    times = StepTimes()

    class Timing(TrainerCallback):
        def on_step_end(self, a: Any, state: Any, control: Any, **kw: Any) -> None:
            times.times.append(time.perf_counter())
            times.cpu.append(time.process_time())

    callbacks: list[Any] = [Timing()]
    collate: Any = default_data_collator
    if variant.startswith("ours") or variant == "proposed":
        callbacks.append(our_callback(out, args.device))
    if variant == "proposed":
        callbacks.append(Cadence())
        collate = CountingCollator(default_data_collator)
    if variant == "engine":
        from finetune.engines.hf_trainer import StudioTrainer

        trainer = StudioTrainer(model=model, args=targs, train_dataset=rows, data_collator=collate, callbacks=callbacks)
        trainer.add_callback(our_callback(out, args.device, trainer.tokens_seen if cuda else None))
    else:
        trainer = Trainer(model=model, args=targs, train_dataset=rows, data_collator=collate, callbacks=callbacks)
    trainer.remove_callback(PrinterCallback)  # neither side prints log dicts (ours replaces them with its own)
    return trainer, times, out


def Cadence() -> Any:  # noqa: N802 - a TrainerCallback made on demand (transformers is imported lazily)
    """Log the loss at most once per LOG_EVERY_S (and always at the first and last step): the proposed throttle."""
    from transformers import TrainerCallback

    class _Cadence(TrainerCallback):
        last = 0.0

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if not control.should_log or state.global_step in (1, state.max_steps):
                return
            now = time.monotonic()
            if now - self.last < LOG_EVERY_S:
                control.should_log = False  # the loss keeps summing on the device; the next log averages the window
            else:
                self.last = now

    return _Cadence()


class CountingCollator:
    """The collator, counting non-padding tokens on the CPU (no device sync): the proposed token count."""

    def __init__(self, collate: Any) -> None:
        self.collate, self.tokens = collate, 0

    def __call__(self, rows: list[dict]) -> dict:
        batch = self.collate(rows)
        mask = batch.get("attention_mask")
        self.tokens += int(mask.sum()) if mask is not None else int(batch["input_ids"].numel())
        return batch


def our_callback(run_dir: Path, device: str, tokens_seen: Any = None) -> Any:
    """Our engine's ProgressCallback on a Progress for `run_dir` (no sample prompts: they are timed apart)."""
    from types import SimpleNamespace

    from finetune.engines.common import Prepared
    from finetune.engines.hf_trainer import ProgressCallback
    from finetune.runs.progress import Progress
    from finetune.runs.rundir import RunDir

    progress = Progress(RunDir(run_dir), run_id=run_dir.name)
    # Read per step: `prompts` (empty: no samples) and the plan's device (a GPU logs on a time cadence); the rest
    # stays None, whatever fields Prepared grows.
    values: dict[str, Any] = {f.name: None for f in dataclasses.fields(Prepared)}
    plan = SimpleNamespace(device=device, world_size=1)
    prepared = Prepared(**{**values, "prompts": [], "precision": "fp32", "plan": plan})
    return ProgressCallback(progress, prepared, tokens_seen=tokens_seen)


class Patched:
    """Swap attributes for the duration of a variant."""

    def __init__(self, changes: list[tuple[Any, str, Any]]) -> None:
        self.changes, self.saved = changes, []

    def __enter__(self) -> Patched:
        for obj, name, value in self.changes:
            self.saved.append((obj, name, getattr(obj, name)))
            setattr(obj, name, value)
        return self

    def __exit__(self, *exc: Any) -> None:
        for obj, name, value in reversed(self.saved):
            setattr(obj, name, value)


def patches(variant: str) -> list[tuple[Any, str, Any]]:
    """What a variant switches off."""
    import finetune.atomic as atomic
    import finetune.runs.progress as progress

    if variant in ("ours-nofsync", "proposed"):
        return [(atomic.os, "fsync", lambda fd: None)]
    if variant == "ours-nopoll":
        return [(progress, "memory_in_use", lambda: 0)]
    return []


def run_variant(
    variant: str, model_dir: Path, rows: list[dict], args: argparse.Namespace, work: Path, timers: Timers | None = None
) -> tuple[float, float]:
    """Median (wall, CPU) seconds per optimizer step of one variant (steps after `skip`)."""
    trainer, times, _ = make_trainer(variant, model_dir, rows, args, work)
    with Patched(patches(variant) + (timers.patches() if timers else [])):
        if variant == "ours-thread":
            done = threading.Event()
            worker = threading.Thread(target=lambda: (trainer.train(), done.set()), daemon=True)
            worker.start()
            while not done.wait(0.2):  # the CLI's follow loop: manager.wait(0.2)
                pass
            worker.join()
        else:
            trainer.train()
    gaps = [b - a for a, b in zip(times.times, times.times[1:], strict=False)][args.skip :]
    cpu = [b - a for a, b in zip(times.cpu, times.cpu[1:], strict=False)][args.skip :]
    if timers is not None:
        timers.steps, timers.step_s = len(times.times), times.times[-1] - times.times[0]
    return statistics.median(gaps), statistics.median(cpu)


class Timers:
    """Wall time spent inside each candidate piece of a run (wrapped functions; inclusive of what they call)."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.steps, self.step_s = 0, 0.0

    def wrap(self, name: str, fn: Any) -> Any:
        """`fn`, timed under `name`."""

        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - t0
                self.calls[name] = self.calls.get(name, 0) + 1

        return timed

    def patches(self) -> list[tuple[Any, str, Any]]:
        """The pieces: Trainer's logging round and token count, our callback's hooks and their file writes."""
        import transformers

        import finetune.engines.hf_trainer as hf
        import finetune.runs.progress as progress
        from finetune.runs.rundir import RunDir

        t = transformers.Trainer
        pieces = [
            (t, "_maybe_log_save_evaluate", "Trainer logging round (loss/grad-norm .item(), on_log callbacks)"),
            (t, "_track_num_input_tokens", "Trainer token count (include_num_input_tokens_seen)"),
            (hf.ProgressCallback, "on_step_end", "our on_step_end (Progress.on_step)"),
            (hf.ProgressCallback, "on_log", "our on_log (Progress.on_log)"),
            (progress, "memory_in_use", "- memory poll (psutil)"),
            (RunDir, "write_status", "- status.json write (atomic + fsync)"),
            (RunDir, "append_event", "- events.jsonl line"),
        ]
        return [(obj, attr, self.wrap(label, getattr(obj, attr))) for obj, attr, label in pieces]

    def rows(self) -> list[list[Any]]:
        """[piece, calls, ms per step, share of the mean step time]."""
        per_step = self.step_s / max(1, self.steps - 1)
        return [
            [name, self.calls[name], 1000 * total / self.steps, f"{100 * total / self.steps / per_step:.2f}%"]
            for name, total in self.wall.items()
        ]


def micro_costs(work: Path) -> list[list[Any]]:
    """Microseconds per call of each per-step piece of ours, and how often it runs."""
    import finetune.atomic as atomic
    from finetune.runs.progress import Progress, memory_in_use
    from finetune.runs.rundir import RunDir

    run = RunDir(work / "micro")
    run.path.mkdir(parents=True, exist_ok=True)
    progress = Progress(run, run_id="micro")
    status = progress.snapshot().to_dict()
    step = iter(range(10**9))

    def us(fn: Any, n: int) -> float:
        return 1e6 * min(timeit.repeat(fn, number=n, repeat=3)) / n

    rows = [
        ["memory_in_use() (psutil RSS)", us(memory_in_use, 2000), "every step"],
        ["Progress.on_step, no status write due", us(lambda: progress.on_step(next(step), 10**9, 0.0, 1), 2000), ""],
        ["status.json write (atomic, fsync)", us(lambda: run.write_status(status), 50), "every 0.5 s"],
    ]
    with Patched([(atomic.os, "fsync", lambda fd: None)]):
        rows.append(["status.json write without fsync", us(lambda: run.write_status(status), 200), ""])
    rows.append(
        [
            "events.jsonl line (on_log)",
            us(lambda: progress.on_log(1, {"loss": 1.0, "learning_rate": 1e-4, "grad_norm": 0.5}), 500),
            "every log",
        ]
    )
    return rows


def fixed_costs(model_dir: Path, work: Path, device: str) -> list[list[Any]]:
    """Seconds of the step-0 sample answers and of the final save (ours: adapter + tokenizer; plain: adapter)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from finetune.model.inference import generate_answers

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_dir).to(device), LoraConfig(r=8, target_modules="all-linear")
    )
    prompts = ["Question 1: tell me a sea story.", "Question 2: tell me a sea story.", "Question 3: a sea story?"]
    t0 = time.perf_counter()
    generate_answers(model, tok, prompts)
    samples = time.perf_counter() - t0
    t0 = time.perf_counter()
    model.save_pretrained(work / "save-adapter")
    adapter = time.perf_counter() - t0
    t0 = time.perf_counter()
    tok.save_pretrained(work / "save-adapter")
    tokenizer = time.perf_counter() - t0
    return [
        ["step-0 sample answers (3 prompts x 40 new tokens)", samples, "once (ours only)"],
        ["save the adapter", adapter, "once (both)"],
        ["save the tokenizer", tokenizer, "once (ours only)"],
    ]


def main(argv: list[str] | None = None) -> str:
    """Run the variants in alternated rounds; print the tables and the headline."""
    args = build_parser().parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    set_offline()
    import torch

    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    elif not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA GPU here")
    else:  # the GPU shape, unless the command line set the shape
        defaults = build_parser().parse_args([])
        for key, value in {**GPU_SHAPE, "batch": 8, "seq": 512, "steps": 14, "skip": 4, "rounds": 2}.items():
            if getattr(args, key) == getattr(defaults, key):
                setattr(args, key, value)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if "base" not in variants:
        variants.insert(0, "base")
    report = Report("overhead-parts")
    with tempfile.TemporaryDirectory(prefix="bench-parts-") as tmp:
        work = Path(tmp)
        tokenizer = load_tokenizer("tiny", work)
        with torch.device(args.device):  # a 1B random init is quick on the GPU, slow on its CPUs
            model_dir = build_llama(
                work / "model", tokenizer, layers=args.layers, hidden=args.hidden, vocab=args.vocab,
                intermediate=args.intermediate or None, heads=args.heads or None, kv_heads=args.kv_heads or None,
                dtype="bfloat16" if args.device == "cuda" else "float32",
            )  # fmt: skip
        g = torch.Generator().manual_seed(0)
        rows = []
        for _ in range(args.batch * args.steps):
            ids = torch.randint(3, len(tokenizer), (args.seq,), generator=g)
            rows.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()})
        report.print(
            f"job: LoRA r=8 all-linear, random Llama {args.layers} layers hidden {args.hidden} vocab {args.vocab}, "
            f"batch {args.batch} x {args.seq}, {args.steps} steps (first {args.skip} not timed), "
            + ("bf16 on " + torch.cuda.get_device_name(0) if args.device == "cuda" else "fp32 on the CPU")
            + f", {args.threads} torch thread(s); {args.rounds} rounds, variants in rotated order"
        )
        report.print(f"load average before: {loadavg()}")
        timers = Timers()
        run_variant("ours", model_dir, rows, args, work, timers)
        report.print()
        report.print("where ours spends a step: wall time inside each piece, one run of 'ours' (inclusive: an indented")
        report.print("piece is inside the one above it; the share is of the mean step time of that run):")
        report.print(table(["piece", "calls", "ms per step", "share of step"], timers.rows()))
        per: dict[str, list[float]] = {v: [] for v in variants}
        ratios: dict[str, list[float]] = {v: [] for v in variants}
        cpu_ratios: dict[str, list[float]] = {v: [] for v in variants}
        for r in range(args.rounds):
            order = variants[r % len(variants) :] + variants[: r % len(variants)]
            got = {v: run_variant(v, model_dir, rows, args, work) for v in order}
            for v in variants:
                per[v].append(got[v][0])
                ratios[v].append(got[v][0] / got["base"][0])
                cpu_ratios[v].append(got[v][1] / got["base"][1])
            print(f"  round {r + 1}: " + ", ".join(f"{v} {1000 * got[v][0]:.1f} ms" for v in variants), flush=True)
        report.print()
        report.print("step time, alternated variants (median over a run's timed steps; ratio = variant / base in the")
        report.print("same round, median over rounds; CPU: this process's CPU time per step, all threads):")
        head = ["variant", "median ms/step", "wall ratio", "wall min", "wall max", "CPU ratio", "CPU min", "CPU max"]
        body = [
            [v, 1000 * statistics.median(per[v]), statistics.median(ratios[v]), min(ratios[v]), max(ratios[v]),
             statistics.median(cpu_ratios[v]), min(cpu_ratios[v]), max(cpu_ratios[v])]
            for v in variants
        ]  # fmt: skip
        report.print(table(head, body))
        report.print()
        report.print("one call of each per-step piece of ours (best of 3 repeats):")
        report.print(table(["piece", "µs per call", "how often"], micro_costs(work)))
        report.print()
        report.print("fixed costs (seconds, once per run):")
        report.print(table(["piece", "seconds", "who pays"], fixed_costs(model_dir, work, args.device)))
        report.print(f"load average after: {loadavg()}")
    headline = "overhead parts (wall / CPU step time vs base, median of rounds): " + ", ".join(
        f"{v} {statistics.median(ratios[v]):.3f}x / {statistics.median(cpu_ratios[v]):.3f}x"
        for v in variants
        if v != "base"
    )
    return report.finish(args.out, headline)


if __name__ == "__main__":
    main()
