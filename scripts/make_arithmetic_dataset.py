"""Write the bundled `arithmetic` set: small sums and products with their answers, for learning from rewards (GRPO)
with the number_match reward (the last number of the answer equals the `answer` column).

Run: python scripts/make_arithmetic_dataset.py  (writes finetune/bundled/arithmetic/{train,test}.jsonl, heldout.json)
Deterministic. `test` holds problems that appear in no training row: held-out accuracy before and after a run
(bench/grpo_arithmetic.py) is measured on it. There is no `validation` split: a GRPO evaluation samples every answer
several times, which a CPU demo cannot afford.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "finetune" / "bundled" / "arithmetic"
TRAIN_ROWS = 400
TEST_ROWS = 50
HELDOUT_ROWS = 3
SUFFIX = "Answer with the number only."


def problems() -> list[tuple[str, int]]:
    """Every problem: sums of two numbers from 1 to 30, products of two numbers from 2 to 12 (each order once)."""
    sums = [(f"What is {a} + {b}?", a + b) for a in range(1, 31) for b in range(a, 31)]
    products = [(f"What is {a} × {b}?", a * b) for a in range(2, 13) for b in range(a, 13)]
    return sums + products


def row(question: str, answer: int) -> dict[str, str]:
    return {"prompt": f"{question} {SUFFIX}", "answer": str(answer)}


def main() -> None:
    pool = problems()
    random.Random(7).shuffle(pool)
    test, train = pool[:TEST_ROWS], pool[TEST_ROWS : TEST_ROWS + TRAIN_ROWS]
    OUT.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("test", test)):
        with open(OUT / f"{name}.jsonl", "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(row(q, a), ensure_ascii=False) + "\n" for q, a in rows)
    heldout = [row(q, a)["prompt"] for q, a in test[:HELDOUT_ROWS]]
    (OUT / "heldout.json").write_text(json.dumps(heldout, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(train)} training and {len(test)} test problems to {OUT}")


if __name__ == "__main__":
    main()
