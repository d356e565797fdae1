"""GGUF export on the default run: size of the f16 and q8_0 files, and how closely they agree with the merged model.

    python bench/export_gguf.py [--steps 40] [--out bench/results/export_gguf.md]

Trains the default run (embedded SmolLM2-135M-Instruct, bundled pirate data, LoRA; `--steps` shortens it) in a fresh
studio home, exports it as merged and as GGUF (f16, q8_0), reads each GGUF back with transformers and compares the
next-token argmax with the merged model's on text the run never saw; the tokenizer read from the file must encode that
text exactly as the original. Headline: `export gguf: f16 N MB agree P%, q8_0 N MB agree P%, tokenizer identical`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

UNSEEN = (
    "The lighthouse keeper counted the ships that passed each evening and wrote their names in a small blue book. "
    "Some nights the fog was so thick that he could only hear the bells, and he guessed at the names instead."
)


def agreement(merged_dir: Path, gguf: Path, text: str) -> tuple[float, bool]:
    """(share of positions whose next-token argmax matches the merged model's, tokenizer encodes identically)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    original = AutoTokenizer.from_pretrained(str(merged_dir))
    from_file = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    ids = original(text, return_tensors="pt")["input_ids"]
    same_tokens = from_file(text)["input_ids"] == ids[0].tolist()
    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir), dtype=torch.float32).eval()
    read = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    with torch.no_grad():
        a, b = merged(ids).logits.argmax(-1), read(ids).logits.argmax(-1)
    return float((a == b).float().mean()), same_tokens


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="training steps (the default run has 40)")
    parser.add_argument("--out", default="bench/results/export_gguf.md", help="report file ('' for none)")
    args = parser.parse_args(argv)
    home = Path(tempfile.mkdtemp(prefix="bench-export-"))
    os.environ["FINETUNE_STUDIO_HOME"] = str(home)

    from finetune.config import TrainConfig
    from finetune.publish.export import export_run
    from finetune.runs import RunManager

    started = time.time()
    state = RunManager().start(TrainConfig(max_steps=args.steps), background=False)
    assert state.status == "completed", state.error
    trained = time.time() - started
    merged = export_run(state.run_dir, "merged")
    rows, parts = [], []
    for quant in ("f16", "q8_0"):
        t0 = time.time()
        result = export_run(state.run_dir, "gguf", quant)
        took = time.time() - t0
        share, same = agreement(merged.folder, result.main, UNSEEN)
        tokens = "identical" if same else "DIFFERENT"
        rows.append(f"| {quant} | {result.size} | {share:.1%} | {tokens} | {took:.0f} s |")
        parts.append(f"{quant} {result.size} agree {share:.1%}")
        if not same:
            parts.append(f"{quant} tokenizer DIFFERENT")
    headline = (
        f"export gguf: {', '.join(parts)}, tokenizer identical"
        if "DIFFERENT" not in " ".join(parts)
        else (f"export gguf: {', '.join(parts)}")
    )
    report = "\n".join(
        [
            "# GGUF export of the default run",
            "",
            f"Default run (embedded SmolLM2-135M-Instruct, bundled pirate data, LoRA), {args.steps} steps, trained in "
            f"{trained:.0f} s on this machine's CPU; merged export {merged.size}. Agreement: next-token argmax of the "
            "GGUF read back with transformers vs the merged model, on a text the run never saw.",
            "",
            "| quant | file | agreement | tokenizer | export time |",
            "|---|---|---|---|---|",
            *rows,
            "",
            f"`{headline}`",
            "",
        ]
    )
    if args.out:
        Path(args.out).write_text(report, encoding="utf-8")
    print(report)
    print(headline)
    return headline


if __name__ == "__main__":
    main()
