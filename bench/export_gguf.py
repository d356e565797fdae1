"""The default run's exports measured in real llama.cpp: sizes, agreement with the merged model, tokenization, greedy
answers, the LoRA GGUF over the base, and the prompt an Ollama Modelfile builds.

    python bench/export_gguf.py [--steps 40] [--out bench/results/export_gguf.md]
    python bench/export_gguf.py --run HOME/runs/RUN_ID     # measure a finished default run instead of training one

Trains the default run (embedded SmolLM2-135M-Instruct, bundled pirate data, LoRA; `--steps` shortens it) in a fresh
studio home and exports it merged, as f16 and q8_0 GGUF and as a LoRA GGUF (`tests/llama_cpp_support.py`, the code the
tests use). llama-cpp-python loads each file; on text the run never saw, the share of positions whose top-1 next token
matches the merged model's in transformers is its agreement; the hard strings must tokenize as the trained tokenizer
does; greedy answers to 5 chat prompts are compared token for token. The Ollama path renders the Modelfile as Ollama
does and answers that prompt in llama.cpp; the same prompts without the Modelfile's SYSTEM show what the old Modelfile
sent. Headline: `export gguf in llama.cpp: f16 P% (A/5 answers), q8_0 P%, lora P%, tokenization T/N, ollama A/5`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _size(path: Path) -> str:
    from finetune.publish.export import human_size

    return human_size(path.stat().st_size)


def _steps(run: Path) -> int:
    """The steps a finished run trained (its status)."""
    import json

    return int(json.loads((run / "status.json").read_text(encoding="utf-8"))["step"])


def _trained(exports: object) -> str:
    seconds = exports.seconds  # type: ignore[attr-defined]
    return f"training {seconds['train']:.0f} s" if "train" in seconds else "the run was trained before, with --run"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="training steps (the default run has 40)")
    parser.add_argument("--out", default="bench/results/export_gguf.md", help="report file ('' for none)")
    parser.add_argument("--run", default="", help="a finished default run in its studio home (HOME/runs/RUN_ID)")
    args = parser.parse_args(argv)

    from tests import llama_cpp_support as llama

    if not llama.available():
        raise SystemExit(f"export_gguf: {llama.SKIP_REASON}")
    started = time.time()
    if args.run:
        exports = llama.export_all(Path(args.run).absolute())
        args.steps = _steps(exports.run)
    else:
        home = Path(tempfile.mkdtemp(prefix="bench-export-"))
        print(f"studio home: {home}", file=sys.stderr, flush=True)
        # No step-0 sample answers: they do not change the trained weights and take minutes on a loaded CPU.
        exports = llama.default_run_exports(home, samples=False, max_steps=args.steps)
    figures = llama.measure(exports)
    n, hard = len(llama.CHAT_PROMPTS), figures["hard_strings"]
    tokenized = hard - len(figures["tokenization_differs"])
    rows = [
        f"| f16 GGUF | {_size(exports.f16)} | {figures['f16_agreement']:.1%} | {figures['f16_same_answers']}/{n} |",
        f"| q8_0 GGUF | {_size(exports.q8_0)} | {figures['q8_0_agreement']:.1%} | |",
        f"| base f16 GGUF + LoRA GGUF | {_size(exports.lora)} (adapter) | {figures['lora_agreement']:.1%} "
        f"| {figures['lora_same_answers']}/{n} |",
        f"| base f16 GGUF alone (no adapter) | {_size(exports.base_gguf)} | {figures['base_agreement']:.1%} | |",
    ]
    answers = [
        f"| {prompt} | {merged!r} | {ollama!r} | {old!r} |"
        for prompt, merged, ollama, old in zip(
            llama.CHAT_PROMPTS,
            figures["answers"],
            figures["ollama_answers"],
            figures["answers_without_system"],
            strict=True,
        )
    ]
    headline = (
        f"export gguf in llama.cpp: f16 {figures['f16_agreement']:.1%} ({figures['f16_same_answers']}/{n} answers), "
        f"q8_0 {figures['q8_0_agreement']:.1%}, lora {figures['lora_agreement']:.1%} "
        f"({figures['lora_same_answers']}/{n}), tokenization {tokenized}/{hard}, "
        f"ollama {figures['ollama_same_answers']}/{n}"
    )
    report = "\n".join(
        [
            "# The default run's exports in llama.cpp",
            "",
            f"Default run (embedded SmolLM2-135M-Instruct, bundled pirate data, LoRA), {args.steps} steps; "
            f"{'exports' if args.run else 'training, exports'} and measuring took {time.time() - started:.0f} s on "
            "this machine's CPU "
            f"({_trained(exports)}). llama-cpp-python {llama.llama_cpp.__version__} (CPU).",
            "",
            f"Agreement: top-1 next token of llama.cpp vs the merged model in transformers at {figures['positions']} "
            f"positions of a text the run never saw. Answers: greedy, {llama.ANSWER_TOKENS} tokens at most, to {n} "
            "chat prompts, identical token for token.",
            "",
            "| file | size | agreement | greedy answers identical |",
            "|---|---|---|---|",
            *rows,
            "",
            f"Tokenization: {tokenized} of {hard} hard strings (emoji, code, CJK, RTL, specials) tokenized by "
            "llama.cpp exactly as the trained tokenizer does.",
            "",
            "Ollama: the Modelfile's TEMPLATE and SYSTEM rendered as Ollama renders them "
            f"{'give' if figures['ollama_prompt_is_the_training_prompt'] else 'do NOT give'} the training prompt; "
            f"llama.cpp (f16) answers that prompt as the merged model answers the training prompt for "
            f"{figures['ollama_same_answers']}/{n} prompts. Without the SYSTEM line (the old Modelfile) the prompt "
            "lacks SmolLM2's default system prompt, which every training example carried:",
            "",
            "| prompt | merged model (training prompt) | llama.cpp, Modelfile prompt | llama.cpp, without SYSTEM |",
            "|---|---|---|---|",
            *answers,
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
