"""Our overhead on a DPO job against a plain TRL script: the same LoRA DPO job, whole process and in the training loop.

The job: a random-initialised Llama-shaped model (4 layers, hidden 256) with SmolLM2's real tokenizer, prompt /
chosen / rejected rows whose answers are long enough that every sequence is cut at `--seq` tokens, batch 4, tens of
steps, LoRA r=8 on all linear layers, beta 0.1, the sigmoid loss, the same learning rate, schedule, seed and logging
every step; the reference is the base with the adapter off on both sides. Ours is `python -m finetune train --config
run.yaml` with `objective: dpo`; the baseline is this file's `plain` mode, a DPO script as a user writes it with TRL
(`DPOConfig` + `DPOTrainer` + `peft_config`), with gradient checkpointing and bf16 off as in ours. They run
alternately (ours, plain, plain, ours, ...), each in a fresh process, through `bench/overhead.py`'s shared part (its
runs, tables and phases), as that script does for SFT.

    .venv/bin/python bench/overhead_preference.py                   # 12 steps x 3 rounds
    .venv/bin/python bench/overhead_preference.py --steps 3 --repeats 1 --tokenizer tiny --hidden 64 --layers 2 --out ''
    .venv/bin/python bench/overhead_preference.py plain --model DIR --data pairs.jsonl --output-dir out  # the baseline

The last line is the headline: the median over rounds of ours / plain whole-process time (goal <= 1.05) and of
in-loop tokens/s, by wall time and by the processes' CPU time (steadier on a shared machine).
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
    Report,
    build_llama,
    load_tokenizer,
    loadavg,
    parameter_count,
    plain_parser,
    step_timing,
    write_rows,
)
from bench.overhead import (  # noqa: E402
    LEARNING_RATE,
    PROCESS_GOAL,
    alternate,
    common_args,
    print_comparison,
    run_ours,
    run_plain,
)

PY = sys.executable
BETA = 0.1


# ----------------------------------------------------------------------------- the baseline, as a user writes it
def plain_main(argv: list[str]) -> None:
    """A LoRA DPO fine-tune with TRL alone: JSON lines of pairs → conversations → DPOTrainer → save the adapter."""
    args = plain_parser(
        "plain TRL DPO script (the baseline)", "JSON lines with prompt, chosen and rejected", 128, 12
    ).parse_args(argv)

    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model)

    def to_chat(row: dict[str, str]) -> dict[str, list[dict[str, str]]]:
        return {
            "prompt": [{"role": "user", "content": row["prompt"]}],
            "chosen": [{"role": "assistant", "content": row["chosen"]}],
            "rejected": [{"role": "assistant", "content": row["rejected"]}],
        }

    dataset = load_dataset("json", data_files=args.data, split="train")
    dataset = dataset.map(to_chat, remove_columns=dataset.column_names)
    config = DPOConfig(
        output_dir=args.output_dir,
        per_device_train_batch_size=args.batch_size,
        max_steps=args.max_steps,
        learning_rate=LEARNING_RATE,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        logging_steps=1,
        report_to="none",
        seed=42,
        beta=BETA,
        max_length=args.max_seq_length,
        gradient_checkpointing=False,
        bf16=False,
    )
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM")

    timing: dict[str, Any] = {"steps": []}

    trainer = DPOTrainer(
        model=model,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora,
        callbacks=[step_timing(timing)] if args.timing else [],
    )
    trainer.train()
    trainer.save_model(args.output_dir)
    if args.timing:
        timing["saved"] = time.time()
        Path(args.timing).write_text(json.dumps(timing), encoding="utf-8")


# ----------------------------------------------------------------------------- the two sides
def write_pairs(path: Path, n: int, words: int) -> Path:
    """`n` prompt/chosen/rejected rows; both answers are long enough to be cut at the sequence length, and differ."""
    rows = [json.loads(line) for line in write_rows(path, n + 1, words=words).read_text(encoding="utf-8").splitlines()]
    pairs = [
        {"prompt": rows[i]["prompt"], "chosen": rows[i]["completion"], "rejected": rows[i + 1]["completion"]}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(p) + "\n" for p in pairs), encoding="utf-8")
    return path


def plain_command(args: argparse.Namespace, model: Path, data: Path, out: Path, timing: Path) -> list[str]:
    """This file's `plain` mode on the same job."""
    return [
        PY, str(Path(__file__).resolve()), "plain", "--model", str(model), "--data", str(data),
        "--output-dir", str(out), "--max-seq-length", str(args.seq), "--batch-size", str(args.batch),
        "--max-steps", str(args.steps), "--timing", str(timing),
    ]  # fmt: skip


# ----------------------------------------------------------------------------- the comparison
def main(argv: list[str] | None = None) -> str | None:
    """Alternate ours and the plain script; print the tables and the headline (returned)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plain"]:
        plain_main(argv[1:])
        return None
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[common_args()])
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per run")
    parser.add_argument("--batch", type=int, default=4, help="pairs per step (each pair is two sequences)")
    parser.add_argument("--seq", type=int, default=128, help="tokens per sequence (every answer is cut at this)")
    parser.add_argument("--out", default=str(RESULTS / "overhead-preference.md"), help="results .md; '' = do not save")
    args = parser.parse_args(argv)

    report = Report("overhead-preference")
    work = Path(tempfile.mkdtemp(prefix="bench-overhead-dpo-"))
    try:
        tokenizer = load_tokenizer(args.tokenizer, work)
        model = build_llama(work / "model", tokenizer, layers=args.layers, hidden=args.hidden)
        data = write_pairs(work / "pairs.jsonl", args.steps * args.batch, words=max(40, args.seq * 2))
        tokens_per_step = args.batch * 2 * args.seq  # chosen + rejected, each cut at --seq
        report.print(
            f"job: DPO (sigmoid, beta {BETA}), LoRA r=8 all-linear, reference = adapter off, on a random "
            f"{args.layers}-layer hidden-{args.hidden} Llama ({parameter_count(model) / 1e6:.1f}M params, vocab "
            f"{len(tokenizer)}, {args.tokenizer} tokenizer), {args.steps * args.batch} pairs, sequences cut at "
            f"{args.seq} tokens, batch {args.batch} pairs, {args.steps} steps, threads per process: "
            f"{args.threads or 'torch default'}"
        )
        report.print(f"load average before: {loadavg()}")
        dpo = {"objective": "dpo", "beta": BETA, "loss_type": "sigmoid"}

        def plain(i: int) -> dict[str, Any]:
            out, timing = work / f"plain-{i}", work / f"plain-{i}.json"
            return run_plain(args, plain_command(args, model, data, out, timing), out, timing)

        ours_runs, plain_runs = alternate(
            args, lambda i: run_ours(args, work, model, data, i, **dpo), plain, tokens_per_step
        )
        ratios = print_comparison(report, ours_runs, plain_runs, args.skip, tokens_per_step)
        wall, tps, cpu, cpu_tps = (ratios[k] for k in ("wall", "tps", "cpu", "cpu_tps"))
        report.print(
            f"\nper-step DPO loss, ours vs plain: largest difference {ratios['loss_diff']:.2e} (LoRA init may differ)"
        )
        report.print(f"load average after: {loadavg()}")
        verdict = "meets" if wall <= PROCESS_GOAL else "MISSES"
        cpu_verdict = "meets" if cpu <= PROCESS_GOAL else "MISSES"
        headline = (
            f"preference overhead (dpo): whole-process wall ours/plain = {wall:.3f}x (goal <= {PROCESS_GOAL}) "
            f"[{verdict}], in-loop tokens/s ours/plain = {tps:.3f}x; by CPU time: process {cpu:.3f}x "
            f"[{cpu_verdict}], in-loop {cpu_tps:.3f}x; median of {args.repeats} rounds"
        )
        return report.finish(args.out, headline)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
