"""Step time of a vision-language LoRA run: ours against a plain TRL `SFTTrainer` script on the same job.

The job: a random-initialised tiny SmolVLM (Idefics3: a vision tower on 32-pixel tiles and a Llama language model,
built in code by `tests/tiny.py`'s `build_smolvlm`; `--shape wide` is the wider one of
bench/memory_accuracy_vlm.py), `bundled:shapes`' 20 training rows (a 64 × 64 picture and a question each), fp32 on
the CPU, batch 4, `--steps` optimizer steps, LoRA r=8 (alpha 16, dropout 0.05) on the language model's linear layers
only with the vision tower and the projector frozen, AdamW (`adamw_torch`), learning rate 5e-4 with cosine decay after
2 warm-up steps, seed 42, the loss on the answers only, a log line every step, no evaluation, no checkpoint before
the end. Ours is `python -m finetune train --config run.yaml` (the app's engine, `finetune/engines/hf_trainer.py`);
the baseline is this file's `plain` mode, a script as a user writes it with TRL 1.16's vision-language API: rows with
an `images` column (decoded by `datasets.Image`), conversational prompt / completion (so TRL's completion-only loss
trains the answers, as ours does), `SFTConfig` + `SFTTrainer` + `peft_config`, with TRL's defaults that differ from
ours set to ours (gradient checkpointing off, bf16 off, `adamw_torch` instead of the fused AdamW, no progress bar).
They run alternately (ours, plain, plain, ours, ...), each in a fresh process with `--threads` CPU threads.

    .venv/bin/python bench/vlm_step_time.py                      # 30 steps x 6 rounds, 3-6 minutes here
    .venv/bin/python bench/vlm_step_time.py --steps 4 --repeats 1 --skip 1 --out ''
    .venv/bin/python bench/vlm_step_time.py plain --model DIR --data train.jsonl --output-dir out   # the baseline

Before timing, both sides' first micro batch is built in this process (ours: `finetune.data.prepare` and its image
collator; TRL's: `DataCollatorForVisionLanguageModeling` on the plain script's rows) and compared: the same token
ids, trained labels and pixel values, and the same trainable parameters. A step's time is the gap between two
consecutive log lines (ours: events.jsonl; plain: a timing callback), after the first `--skip` steps; each run's
figure is its median step, each round's ratio ours / plain, and the headline the median of the rounds' ratios (with
their spread), beside the processes' CPU time per step. What still differs (each timed here on the first micro
batch, in this process): TRL re-renders and re-tokenises every row in its collator (ours tokenises once, before
training) and projects only the answer positions through the LM head (its fused head), with its entropy and accuracy
metrics; ours writes events.jsonl and status.json. Both count the tokens seen (the plain script for `--timing` only).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    RESULTS,
    ROOT,
    Report,
    loadavg,
    median,
    parameter_count,
    plain_parser,
    set_offline,
    step_timing,
    table,
)
from bench.memory_accuracy_vlm import TEXT as WIDE_TEXT  # noqa: E402 (--shape wide: that bench's shapes)
from bench.memory_accuracy_vlm import VISION as WIDE_VISION  # noqa: E402
from bench.overhead import LEARNING_RATE, run_ours, run_plain  # noqa: E402

PY = sys.executable
GOAL = 1.05  # median step time, ours / plain: at most
SHAPES = ROOT / "finetune" / "bundled" / "shapes" / "train.jsonl"
# The language model's linear layers in the Idefics3 layout: what the plain script adapts (ours: `all-linear`, which
# the app narrows to the language model when the vision tower is frozen).
TEXT_LINEARS = (
    r".*\.text_model\.layers\.\d+\.(self_attn|mlp)\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
)


# ----------------------------------------------------------------------------- the baseline, as a user writes it
def plain_rows(data: str | Path) -> Any:
    """The JSON lines as TRL's vision rows: the conversation split into prompt (all but the last message) and
    completion (the answer), and the images as a `datasets.Image` list (decoded to PIL when a row is read)."""
    from datasets import Dataset, Image, Sequence

    folder = Path(data).resolve().parent
    rows = []
    for line in Path(data).read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            rows.append(
                {
                    "prompt": row["messages"][:-1],
                    "completion": row["messages"][-1:],
                    "images": [str(folder / name) for name in row["images"]],
                }
            )
    return Dataset.from_list(rows).cast_column("images", Sequence(Image()))


def plain_lora() -> Any:
    """LoRA on the language model's linear layers (the vision tower and the projector stay frozen)."""
    from peft import LoraConfig

    return LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=TEXT_LINEARS, task_type="CAUSAL_LM")


def plain_config(output_dir: str, batch: int, steps: int, seq: int, timing: bool) -> Any:
    """`SFTConfig` for the job: TRL's defaults, with the ones that differ from the app's set to its values."""
    from trl import SFTConfig

    return SFTConfig(
        output_dir=output_dir,
        per_device_train_batch_size=batch,
        max_steps=steps,
        learning_rate=LEARNING_RATE,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        logging_steps=1,
        report_to="none",
        seed=42,
        max_length=seq,
        gradient_checkpointing=False,  # TRL's default is on; the app's is off
        bf16=False,  # TRL's default is on; this job is fp32
        optim="adamw_torch",  # transformers' default is the fused AdamW; the app's is this one
        disable_tqdm=True,  # the app has its own progress, off in this bench (--no-progress)
        # Measurement only (--timing): Trainer counts the real tokens, as ours does.
        include_num_input_tokens_seen="non_padding" if timing else "no",
    )


def plain_main(argv: list[str]) -> None:
    """A LoRA fine-tune of a vision-language model with TRL alone: rows with images → SFTTrainer → save the adapter."""
    args = plain_parser(
        "plain TRL SFT script for a vision-language model (the baseline)",
        "JSON lines with messages and images",
        256,
        30,
    ).parse_args(argv)

    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from trl import SFTTrainer

    processor = AutoProcessor.from_pretrained(args.model)
    model = AutoModelForImageTextToText.from_pretrained(args.model, dtype=torch.float32)
    timing: dict[str, Any] = {"steps": []}

    trainer = SFTTrainer(
        model=model,
        args=plain_config(args.output_dir, args.batch_size, args.max_steps, args.max_seq_length, bool(args.timing)),
        train_dataset=plain_rows(args.data),
        processing_class=processor,
        peft_config=plain_lora(),
        callbacks=[step_timing(timing)] if args.timing else [],
    )
    trainer.train()
    trainer.save_model(args.output_dir)
    if args.timing:
        timing["saved"] = time.time()
        Path(args.timing).write_text(json.dumps(timing), encoding="utf-8")


# ----------------------------------------------------------------------------- the same work on both sides
# Our run.yaml's settings beyond bench/overhead.py's LoRA job (which sets `all-linear`, r, alpha, dropout, the rate,
# schedule, seed, logging every step and no checkpoint before the end).
OURS_JOB = {"precision": "fp32", "packing": False, "freeze_vision_tower": True, "freeze_projector": True}


def check_same_work(args: argparse.Namespace, model: Path, data: Path) -> list[str]:
    """Build both sides' first micro batch and adapter here and compare them; lines for the report (raises when the
    two sides would not do the same work). Timed with the processes' CPU threads (this process's are put back)."""
    set_offline()
    import torch

    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return _same_work(args, model, data)
    finally:
        torch.set_num_threads(threads)


def _same_work(args: argparse.Namespace, model: Path, data: Path) -> list[str]:
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling
    from trl.trainer.utils import add_fused_lm_head

    from finetune import data as training_data
    from finetune.config import TrainConfig
    from finetune.model import loading
    from finetune.plan import plan_for

    config = TrainConfig(
        model=str(model),
        dataset=str(data),
        eval_split="",
        max_seq_length=args.seq,
        per_device_train_batch_size=args.batch,
        lora_target_modules="all-linear",
        **OURS_JOB,
    )
    plan = plan_for(config, "cpu")
    processor = loading.load_processor(plan)
    prepared = training_data.prepare(config, processor)
    collate = training_data.collator(config, processor, kind=prepared.format.kind)
    rows = range(min(args.batch, len(prepared.train)))
    ours = collate([prepared.train[i] for i in rows])

    trl_processor = AutoProcessor.from_pretrained(str(model))
    trl_rows = plain_rows(data)
    trl_collate = DataCollatorForVisionLanguageModeling(trl_processor, max_length=args.seq, completion_only_loss=True)
    theirs = trl_collate([trl_rows[i] for i in rows])

    problems = []
    for key in ("input_ids", "attention_mask", "labels", "pixel_values", "pixel_attention_mask"):
        a, b = ours.get(key), theirs.get(key)
        if a is None or b is None or a.shape != b.shape or not torch.equal(a, b):
            shapes = [None if x is None else tuple(x.shape) for x in (a, b)]
            problems.append(f"{key}: ours {shapes[0]}, plain {shapes[1]}")
    extra = sorted(set(ours) ^ set(theirs))
    if extra:
        problems.append(f"inputs only one side gives: {extra}")

    ours_model = loading.load_model(plan)
    base = AutoModelForImageTextToText.from_pretrained(str(model), dtype=torch.float32)
    add_fused_lm_head(base, outputs=("log_probs", "entropy", "is_top1"))  # as SFTTrainer does (before PEFT)
    plain_model = get_peft_model(base, plain_lora())
    trainable = lambda m: {n for n, p in m.named_parameters() if p.requires_grad}  # noqa: E731
    if trainable(ours_model) != trainable(plain_model):
        problems.append(f"trainable parameters differ: {sorted(trainable(ours_model) ^ trainable(plain_model))[:6]}")
    if problems:
        raise RuntimeError("the two sides would not do the same work:\n  " + "\n  ".join(problems))
    count = sum(p.numel() for p in ours_model.parameters() if p.requires_grad)
    ids, labels = ours["input_ids"], ours["labels"]
    n = len(prepared.train)
    ours_ms = collate_ms(lambda k: collate([prepared.train[(args.batch * k + i) % n] for i in range(args.batch)]))
    trl_ms = collate_ms(lambda k: trl_collate([trl_rows[(args.batch * k + i) % n] for i in range(args.batch)]))
    ours_model.train()
    plain_model.train()
    own_ms = collate_ms(lambda k: ours_model(**ours).loss.backward(), batches=20)
    fused_ms = collate_ms(lambda k: fused_step(plain_model, theirs), batches=20)
    return [
        f"same work, checked on the first micro batch: identical input_ids {tuple(ids.shape)}, labels "
        f"({int((labels != -100).sum())} trained tokens), pixel_values {tuple(ours['pixel_values'].shape)} and "
        f"pixel_attention_mask; identical trainable parameters ({len(trainable(ours_model))} tensors, "
        f"{count / 1e3:.1f}k values, none in the vision tower or the projector)",
        f"a micro batch's rows fetched and collated (this process, median CPU time of 40): ours {ours_ms:.2f} ms "
        f"(rows tokenised before training; images loaded and processed here), TRL's collator {trl_ms:.2f} ms (renders "
        "the chat template, tokenises and processes the images of every row)",
        f"one forward + backward of that micro batch (this process, median CPU time of 20): the model's own loss "
        f"(ours) {own_ms:.2f} ms, TRL's fused LM head with its entropy and accuracy metrics {fused_ms:.2f} ms",
    ]


def fused_step(model: Any, batch: dict[str, Any]) -> None:
    """What `SFTTrainer.compute_loss` does with a micro batch (the loss through its fused LM head, its two metrics
    read on the host), then the backward pass."""
    out = model(**batch, fused_lm_head=True)
    valid = out.label_mask.sum()
    loss = (-out.log_probs).sum() / valid.clamp(min=1)
    (out.entropy.detach().sum() / valid).item()
    (out.is_top1.sum() / valid).item()
    loss.backward()


def collate_ms(collate: Any, batches: int = 40) -> float:
    """Median CPU milliseconds of `collate(k)` over `batches` calls (also used for forward + backward)."""
    times = []
    for k in range(batches):
        t0 = time.process_time()
        collate(k)
        times.append(time.process_time() - t0)
    return median(times) * 1e3


# ----------------------------------------------------------------------------- timing
def plain_command(args: argparse.Namespace, model: Path, data: Path, out: Path, timing: Path) -> list[str]:
    """This file's `plain` mode on the same job."""
    return [
        PY, str(Path(__file__).resolve()), "plain", "--model", str(model), "--data", str(data),
        "--output-dir", str(out), "--max-seq-length", str(args.seq), "--batch-size", str(args.batch),
        "--max-steps", str(args.steps), "--timing", str(timing),
    ]  # fmt: skip


def step_times(run: dict[str, Any], skip: int) -> list[float]:
    """Seconds between consecutive logged steps, after step `skip` (each step logs once)."""
    steps = [s for s in run["steps"] if s[0] >= max(1, skip)]
    return [b[1] - a[1] for a, b in zip(steps, steps[1:], strict=False)]


def cpu_per_step(run: dict[str, Any], skip: int) -> float:
    """The process's CPU seconds per step over the same window (all its threads)."""
    steps = [s for s in run["steps"] if s[0] >= max(1, skip)]
    first, last = steps[0], steps[-1]
    proc = run["proc"]
    return (proc.cpu_at(last[1]) - proc.cpu_at(first[1])) / (last[0] - first[0])


def quartiles(values: list[float]) -> tuple[float, float]:
    """The 25th and 75th percentiles."""
    import statistics

    if len(values) < 2:
        return (values[0], values[0]) if values else (float("nan"), float("nan"))
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def main(argv: list[str] | None = None) -> str | None:
    """Alternate ours and the plain TRL script; print the tables and the headline (returned)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plain"]:
        plain_main(argv[1:])
        return None
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeats",
        type=int,
        default=6,
        help="rounds; each runs ours and the plain script once (even: each goes first as often)",
    )
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per run")
    parser.add_argument("--skip", type=int, default=3, help="steps left out of the step times (warm-up)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256, help="max_seq_length (rows are shorter: nothing is cut)")
    parser.add_argument("--shape", choices=("tests", "wide"), default="tests", help="the tiny SmolVLM's shapes")
    parser.add_argument("--threads", type=int, default=1, help="OMP/MKL threads per process (0 = torch's default)")
    parser.add_argument("--env", action="append", metavar="KEY=VALUE", help="extra environment for both processes")
    parser.add_argument("--out", default=str(RESULTS / "vlm-step-time-cpu.md"), help="results .md; '' = do not save")
    args = parser.parse_args(argv)

    set_offline()
    import importlib.metadata as md

    from tests.tiny import build_smolvlm

    report = Report("vlm-step-time-cpu")
    work = Path(tempfile.mkdtemp(prefix="bench-vlm-step-"))
    try:
        wide = args.shape == "wide"
        model = build_smolvlm(work / "model", text=WIDE_TEXT if wide else None, vision=WIDE_VISION if wide else None)
        data = SHAPES
        report.print(
            f"job: LoRA r=8 on the language model of a random tiny SmolVLM ({args.shape} shapes, "
            f"{parameter_count(model) / 1e6:.2f}M params), vision tower and projector frozen, fp32 on the CPU, "
            f"bundled:shapes (20 rows, one 64 x 64 picture each), batch {args.batch}, max_seq_length {args.seq}, "
            f"{args.steps} steps, step times after step {args.skip}, threads per process: "
            f"{args.threads or 'torch default'}, plain side: TRL {md.version('trl')}"
            + (f", env {' '.join(args.env)}" if args.env else "")
        )
        report.print(
            "measured: each run's median time per optimizer step (the gap between consecutive per-step log lines, "
            "wall clock, after the warm-up steps), ours / plain per round; and the process's CPU time per step over "
            "the same steps (all its threads; steadier than wall time on a shared machine)"
        )
        for line in check_same_work(args, model, data):
            report.print(line)
        report.print(f"load average before: {loadavg()}")

        runs: dict[str, list[dict[str, Any]]] = {"ours": [], "plain": []}
        for i in range(args.repeats):
            for which in ("ours", "plain") if i % 2 == 0 else ("plain", "ours"):
                if which == "ours":
                    run = run_ours(args, work, model, data, i, **OURS_JOB)
                else:
                    out, timing = work / f"plain-{i}", work / f"plain-{i}.json"
                    run = run_plain(args, plain_command(args, model, data, out, timing), out, timing)
                    run["tokens_seen"] = json.loads(timing.read_text(encoding="utf-8")).get("tokens_seen")
                runs[which].append(run)
                print(
                    f"  round {i + 1} {which:5s}: median step {median(step_times(run, args.skip)) * 1e3:.1f} ms, "
                    f"wall {run['wall']:.1f}s, load {loadavg()[0]}",
                    flush=True,
                )

        rows, ratios, cpu_ratios = [], [], []
        for i, (o, p) in enumerate(zip(runs["ours"], runs["plain"], strict=True)):
            mo, mp = median(step_times(o, args.skip)), median(step_times(p, args.skip))
            co, cp = cpu_per_step(o, args.skip), cpu_per_step(p, args.skip)
            ratios.append(mo / mp)
            cpu_ratios.append(co / cp)
            rows.append([i + 1, mo * 1e3, mp * 1e3, mo / mp, co * 1e3, cp * 1e3, co / cp])
        report.print()
        report.print(
            table(
                [
                    "round",
                    "ours ms/step",
                    "plain ms/step",
                    "ratio",
                    "ours CPU ms/step",
                    "plain CPU ms/step",
                    "CPU ratio",
                ],
                rows,
            )
        )
        pooled = {k: [t for r in v for t in step_times(r, args.skip)] for k, v in runs.items()}
        report.print()
        for k, v in pooled.items():
            q1, q3 = quartiles(v)
            report.print(
                f"{k:5s}: all {len(v)} step times pooled: median {median(v) * 1e3:.1f} ms, quartiles "
                f"{q1 * 1e3:.1f}-{q3 * 1e3:.1f} ms, min {min(v) * 1e3:.1f}, max {max(v) * 1e3:.1f}"
            )
        seen = {k: [r.get("tokens_seen") for r in v] for k, v in runs.items()}
        report.print(f"tokens seen per run (non-padding): ours {seen['ours']}, plain {seen['plain']}")
        loss_diff = max(
            abs(a[2] - b[2])
            for o, p in zip(runs["ours"], runs["plain"], strict=True)
            for a, b in zip(o["steps"], p["steps"], strict=False)
        )
        report.print(
            f"per-step loss, ours vs plain: largest difference {loss_diff:.2e} (same batches in the same order and the "
            "same LoRA start give the same losses)"
        )
        report.print(f"load average after: {loadavg()}")
        ratio, cpu_ratio = median(ratios), median(cpu_ratios)
        verdict = "meets" if ratio <= GOAL else "MISSES"
        cpu_verdict = "meets" if cpu_ratio <= GOAL else "MISSES"
        headline = (
            f"vlm step time ours/plain TRL: {ratio:.3f}x (goal <= {GOAL}) [{verdict}], rounds {min(ratios):.3f}-"
            f"{max(ratios):.3f}x; by CPU time {cpu_ratio:.3f}x [{cpu_verdict}], rounds {min(cpu_ratios):.3f}-"
            f"{max(cpu_ratios):.3f}x; median of {args.repeats} rounds' ratios; all steps' median ours "
            f"{median(pooled['ours']) * 1e3:.1f} ms, plain {median(pooled['plain']) * 1e3:.1f} ms"
        )
        return report.finish(args.out, headline)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
