"""How right is the memory estimate of a vision-language run? Estimate vs the measured peak of live tensors.

For each configuration: a random-initialised tiny SmolVLM (Idefics3: a vision tower on 32-pixel tiles, a Llama
language model) and its processor are built and saved, rows of 64 × 64 pictures are written, and the run is trained
exactly as the engine does (`finetune.engines.common.prepare_run`'s pieces: the processor, `finetune.data.prepare`,
the image collator, `finetune.model.loading.load_model`, `training_arguments`, `Trainer`; 3 optimizer steps) while
`finetune.memory.trace.LiveBytes` counts live tensor storages (every weight, buffer and quantisation constant that
exists before, every storage any op creates). Beside it: `finetune.memory.estimate(plan)`, whose replay on fake
tensors runs the same model with image inputs of the sizes the image processor gives.

    .venv/bin/python bench/memory_accuracy_vlm.py            # CPU, 7 configurations, about a minute
    .venv/bin/python bench/memory_accuracy_vlm.py --out bench/results/memory-accuracy-vlm-cpu.md

Every row is as long as max_seq_length (the estimate's worst case), so the measured batch is the estimated one.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from finetune.plan import plan_for  # noqa: E402 (after the path set-up above)

MiB = 2**20
# A tiny SmolVLM a little wider than the tests' (so the weights are not all of it): language model hidden 128 over 4
# layers, vision tower hidden 64 over 3 layers; 64-pixel images are 4 tiles + 1 global view of 16 tokens each.
TEXT = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4}
VISION = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 2,
    "patch_size": 4,
}


@dataclass
class Case:
    """One configuration: images per row and the run settings (TrainConfig fields)."""

    name: str
    images: int
    settings: dict[str, Any] = field(default_factory=dict)


CASES = [
    Case("lora, frozen tower, 1 image", 1),
    Case("lora, frozen tower, 3 images", 3),
    Case("lora, tower adapted, 1 image", 1, {"freeze_vision_tower": False}),
    Case("qlora, frozen tower, 3 images", 3, {"method": "qlora"}),
    Case("full, frozen tower, 1 image", 1, {"method": "full"}),
    Case("full, trained tower + projector, 1 image", 1, {"method": "full", "freeze_vision_tower": False,
                                                         "freeze_projector": False}),
    Case("full, trained tower + projector, 3 images", 3, {"method": "full", "freeze_vision_tower": False,
                                                          "freeze_projector": False}),
]  # fmt: skip


def write_rows(folder: Path, images: int, rows: int) -> Path:
    """`rows` identical rows of `images` 64 × 64 pictures each (every row the same length: no padding)."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for k in range(images):
        Image.new("RGB", (64, 64), (40 * k, 120, 200)).save(folder / f"p{k}.png")
        files.append(f"p{k}.png")
    parts = [{"type": "image"}] * images + [{"type": "text", "text": "What colour?"}]
    row = {
        "messages": [
            {"role": "user", "content": parts},
            {"role": "assistant", "content": [{"type": "text", "text": "It is blue."}]},
        ],
        "images": files,
    }
    path = folder / "data.jsonl"
    path.write_text((json.dumps(row) + "\n") * rows, encoding="utf-8")
    return path


def train_config(case: Case, model_dir: Path, data: Path, length: int) -> Any:
    """The TrainConfig of a case (3 optimizer steps of 2 rows, no eval, no checkpoints)."""
    from finetune.config import TrainConfig

    values = {
        "model": str(model_dir),
        "dataset": str(data),
        "per_device_train_batch_size": 2,
        "max_steps": 3,
        "save_steps": 1000,
        "eval_split": "",
        "warmup_steps": 0,
        "max_seq_length": length,
        "precision": "fp32",
        **case.settings,
    }
    return TrainConfig(**values)


def row_length(model_dir: Path, data: Path) -> int:
    """Tokens in one of the rows (images included)."""
    from finetune import data as training_data
    from finetune.config import TrainConfig
    from finetune.model import loading

    config = TrainConfig(model=str(model_dir), dataset=str(data), eval_split="", max_seq_length=4096)
    processor = loading.load_processor(plan_for(config))
    return len(training_data.prepare(config, processor).train[0]["input_ids"])


def measure(config: Any) -> int:
    """Train 3 optimizer steps as the engine does; the peak of live tensor bytes."""
    from bench.memory_accuracy import engine_trainer
    from finetune import data
    from finetune.memory.trace import LiveBytes
    from finetune.model import loading

    plan = plan_for(config, "cpu")
    processor = loading.load_processor(plan)
    prepared = data.prepare(config, processor)
    model = loading.load_model(plan)
    with tempfile.TemporaryDirectory() as out:
        collate = data.collator(config, processor, kind=prepared.format.kind)
        trainer = engine_trainer(plan, model, prepared.train, collate, Path(out))
        peak = LiveBytes().training_peak(trainer)
        trainer.model = trainer.model_wrapped = trainer.optimizer = trainer.lr_scheduler = None
    del model, trainer
    gc.collect()
    return peak


def run_case(case: Case, where: Path, model_dir: Path) -> dict[str, Any]:
    """Estimate, measure, compare one configuration."""
    from finetune import memory

    data = write_rows(where / f"data-{case.images}", case.images, rows=6)
    config = train_config(case, model_dir, data, row_length(model_dir, data))
    t0 = time.perf_counter()
    est = memory.estimate(plan_for(config, "cpu"))
    est_s = time.perf_counter() - t0
    measured = measure(config)
    note = next(n for n in est.notes if n.startswith("images"))
    return {
        "name": case.name,
        "estimate": est.tensor_bytes,
        "measured": measured,
        "method": est.method,
        "est_s": est_s,
        "tokens": config.max_seq_length,
        "note": note,
    }


def pct(estimate: float, measured: float) -> float:
    """Signed error of an estimate in percent of the measurement (negative = under-prediction)."""
    return 100.0 * (estimate - measured) / measured


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of estimate vs measured."""
    lines = [
        "| configuration | row tokens | measured MiB | estimate MiB | error | estimate's images |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['tokens']} | {r['measured'] / MiB:,.2f} | {r['estimate'] / MiB:,.2f} "
            f"| {pct(r['estimate'], r['measured']):+.2f}% | {r['note'].removeprefix('images: ')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the configurations, print the table and the headline."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run configurations whose name contains this text")
    parser.add_argument("--out", default="", help="also write the markdown table to this file")
    args = parser.parse_args(argv)
    import torch

    from tests.tiny import build_smolvlm

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    rows = []
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        model_dir = build_smolvlm(where / "model", text=TEXT, vision=VISION)
        for case in [c for c in CASES if args.only in c.name]:
            r = run_case(case, where, model_dir)
            rows.append(r)
            print(
                f"{r['name']:<44} measured {r['measured'] / MiB:8.2f} MiB  ours {r['estimate'] / MiB:8.2f} MiB "
                f"({pct(r['estimate'], r['measured']):+6.2f}%, {r['method']}, {r['est_s']:.2f}s)",
                flush=True,
            )
    errors = [pct(r["estimate"], r["measured"]) for r in rows]
    worst = max(errors, key=abs)
    ok = all(abs(e) <= 3 for e in errors)
    headline = (
        f"HEADLINE: median {statistics.median(errors):+.2f}%, worst {worst:+.2f}% over {len(rows)} vision-language "
        f"configurations ({'meets' if ok else 'MISSES'} ±3%)"
    )
    print(headline)
    if args.out:
        python = os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(str(ROOT)) else "python"
        command = f"{python} bench/memory_accuracy_vlm.py " + " ".join(argv if argv is not None else sys.argv[1:])
        text = (
            "# Memory estimate vs measured peak: vision-language models (CPU)\n\n"
            f"{time.strftime('%Y-%m-%d')}, {platform.processor() or 'cpu'} ({os.cpu_count()} CPUs, load "
            f"{os.getloadavg()[0]:.1f}), {time.time() - started:.0f} s: `{command.strip()}`\n\n"
            "A tiny random SmolVLM (Idefics3 layout; language model hidden 128 × 4 layers, vision tower hidden 64 × "
            "3 layers on 32-pixel tiles, 16 tokens a tile), fp32, batch 2, 3 optimizer steps; the measured peak is "
            "of live tensor storages (`finetune.memory.trace.LiveBytes`), the estimate is `finetune.memory.estimate` "
            "(its replay on fake tensors with the image inputs).\n\n"
            f"{table(rows)}\n\n{headline}\n"
        )
        Path(args.out).write_text(text, encoding="utf-8")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
