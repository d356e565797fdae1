"""Write the bundled `mixed-lengths` set: chat rows whose lengths spread like real chat data, for the packing bench.

Run: python scripts/make_mixed_lengths.py  (writes finetune/bundled/mixed-lengths/{train,validation}.jsonl)

Real instruction and chat sets hold many short exchanges and a long tail of long ones (a pasted document to summarise,
a long explanation): row lengths are roughly log-normal. Here each row's length in words is drawn from a log-normal
with a median of about 90 words (about 120 SmolLM2 tokens), cut to 24..1450 words (about 30..1900 tokens), so about
half the rows are under 120 tokens, one in ten is over 450 and a few are over 1000. Three kinds of rows: a short
question with a short answer, a question with a long explanation, and a long log pasted into the prompt with a short
summary.
The text is made up from a small vocabulary of the sea (deterministic, seed 7); what a bench needs is its lengths.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "finetune" / "bundled" / "mixed-lengths"
TRAIN_ROWS, VALIDATION_ROWS = 300, 30
MEDIAN_WORDS, SIGMA, MIN_WORDS, MAX_WORDS = 90, 1.0, 24, 1450

SUBJECTS = ["the captain", "the crew", "the first mate", "the lookout", "the cook", "the navigator", "the ship",
            "the old sailor", "the harbour master", "the young deckhand", "the storm", "the tide"]  # fmt: skip
VERBS = ["sighted", "charted", "repaired", "loaded", "steered toward", "waited for", "signalled", "counted",
         "mended", "followed", "hoisted", "lowered", "spoke of", "wrote about"]  # fmt: skip
OBJECTS = ["the northern reef", "a broken mast", "three barrels of water", "the main sail", "a distant island",
           "the lighthouse", "a school of fish", "the rising wind", "the cargo of spices", "an unknown flag",
           "the anchor chain", "a map of the coast", "the evening stars", "the leaking hull"]  # fmt: skip
ENDINGS = ["before dawn", "after the storm", "in the fog", "at noon", "without a word", "with great care",
           "as the bell rang", "while the gulls circled", "near the harbour", "for the second time"]  # fmt: skip
TOPICS = ["how to read the tide tables", "why a ship needs ballast", "how sailors find north without a compass",
          "what to do when the wind drops", "how a sail is mended", "how to store water on a long voyage",
          "why the night watch matters", "how knots are tied and tested"]  # fmt: skip


def sentence(rng: random.Random) -> str:
    """One made-up sentence of 7-9 words."""
    text = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(ENDINGS)}."
    return text[0].upper() + text[1:]


def passage(rng: random.Random, words: int) -> str:
    """Sentences until about `words` words."""
    out: list[str] = []
    count = 0
    while count < words:
        s = sentence(rng)
        out.append(s)
        count += len(s.split())
    return " ".join(out)


def row(rng: random.Random, words: int) -> dict[str, str]:
    """A prompt/completion row of about `words` words: short Q&A, a long explanation, or a long log to summarise."""
    kind = rng.random()
    if words < 60 or kind < 0.4:
        question = f"In one or two lines: {rng.choice(TOPICS)}?"
        return {"prompt": question, "completion": passage(rng, max(8, words - len(question.split())))}
    if kind < 0.75:
        question = f"Explain {rng.choice(TOPICS)}, step by step."
        return {"prompt": question, "completion": passage(rng, words - len(question.split()))}
    summary = max(12, words // 10)
    log = passage(rng, words - summary)
    return {"prompt": f"Here is the ship's log:\n{log}\nSummarise it briefly.", "completion": passage(rng, summary)}


def lengths(rng: random.Random, n: int) -> list[int]:
    """Row lengths in words: log-normal around MEDIAN_WORDS, cut to MIN_WORDS..MAX_WORDS."""
    mu = math.log(MEDIAN_WORDS)
    return [min(MAX_WORDS, max(MIN_WORDS, int(rng.lognormvariate(mu, SIGMA)))) for _ in range(n)]


def main() -> None:
    rng = random.Random(7)
    OUT.mkdir(parents=True, exist_ok=True)
    for name, n in (("train", TRAIN_ROWS), ("validation", VALIDATION_ROWS)):
        rows = [row(rng, words) for words in lengths(rng, n)]
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        (OUT / f"{name}.jsonl").write_text(text, encoding="utf-8")
        print(f"wrote {OUT / name}.jsonl: {n} rows, {len(text) // 1024} KB")


if __name__ == "__main__":
    main()
