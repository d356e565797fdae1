"""Held-out accuracy before and after learning from rewards: the embedded SmolLM2 on `bundled:arithmetic` with the
number_match reward (GRPO), measured by greedy decoding on the set's `test` split (problems never in training).

    .venv/bin/python bench/grpo_arithmetic.py                      # 30 steps, LoRA, docs/objectives.md's figures
    .venv/bin/python bench/grpo_arithmetic.py --steps 2 --test 4 --out ''   # a quick look

The run itself is the project's own (`RunManager().start`: the same engine, plan and files as the app and the CLI);
accuracy is the share of test problems whose greedy answer's last number equals the answer
(`finetune.objectives.answers`, the function the number_match reward scores with). The last line is the headline.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import RESULTS, loadavg  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "finetune" / "bundled" / "arithmetic"


def test_rows(limit: int) -> list[dict[str, str]]:
    rows = [json.loads(line) for line in (DATA / "test.jsonl").read_text(encoding="utf-8").splitlines() if line]
    return rows[:limit]


def accuracy(plan: Any, run_path: Path | None, rows: list[dict[str, str]], max_new_tokens: int) -> tuple[float, list]:
    """Greedy answers of the base (run_path None) or a run's adapter, and the share number_match scores 1."""
    from finetune.model.inference import generate_answers, load_for_chat
    from finetune.objectives.answers import number_match

    model, tokenizer = load_for_chat(plan, run_path)
    answers: list[str] = []
    for start in range(0, len(rows), 10):
        batch = [row["prompt"] for row in rows[start : start + 10]]
        answers += generate_answers(model, tokenizer, batch, max_new_tokens=max_new_tokens)
    scores = [number_match(answer, row["answer"]) for answer, row in zip(answers, rows, strict=True)]
    return sum(scores) / len(scores), list(zip(rows, answers, scores, strict=True))


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--test", type=int, default=50, help="test problems to score (at most 50)")
    parser.add_argument("--method", default="lora")
    parser.add_argument("--learning-rate", type=float, default=5e-4, help="the form's default for LoRA")
    parser.add_argument("--completion", type=int, default=32, help="max_completion_length")
    parser.add_argument("--batch", type=int, default=8, help="completions per step (num_generations 4 each)")
    parser.add_argument("--out", default=str(RESULTS / "grpo-arithmetic.md"))
    args = parser.parse_args(argv)

    from finetune.config import TrainConfig
    from finetune.plan import plan_for
    from finetune.runs.manager import RunManager
    from finetune.runs.rundir import RunDir

    config = TrainConfig(
        objective="grpo", dataset="bundled:arithmetic", rewards="number_match", method=args.method,
        max_steps=args.steps, per_device_train_batch_size=args.batch, max_completion_length=args.completion,
        learning_rate=args.learning_rate, max_seq_length=64, save_steps=args.steps + 1, logging_steps=1,
    )  # fmt: skip
    rows = test_rows(args.test)
    before, base_answers = accuracy(plan_for(config), None, rows, args.completion)
    started = time.time()
    state = RunManager().start(config, owner="bench/grpo_arithmetic", background=False)
    took = time.time() - started
    if state.status != "completed":
        raise SystemExit(f"the run ended {state.status}: {state.error}")
    run = RunDir(Path(state.run_dir))
    after, tuned_answers = accuracy(run.load_plan(), run.path, rows, args.completion)
    logs = run.read_events(("log",))
    first, last = logs[: max(1, len(logs) // 4)], logs[-max(1, len(logs) // 4) :]
    reward_before = sum(e["reward"] for e in first) / len(first)
    reward_after = sum(e["reward"] for e in last) / len(last)
    headline = (
        f"grpo arithmetic: held-out accuracy {before:.0%} -> {after:.0%} on {len(rows)} problems; "
        f"mean reward {reward_before:.2f} -> {reward_after:.2f} over {args.steps} steps in {took / 60:.1f} min"
    )
    if args.out:
        lines = [
            "# GRPO on bundled:arithmetic (embedded SmolLM2-135M, number_match)",
            "",
            f"- command: `{' '.join(['python bench/grpo_arithmetic.py', *(argv or sys.argv[1:])])}`",
            f"- run: {args.method}, {args.steps} steps of {args.batch} completions (4 per prompt), "
            f"max_completion_length {args.completion}, learning rate {args.learning_rate:g}; {took / 60:.1f} min "
            f"on this CPU (load average {loadavg()})",
            f"- held-out accuracy (greedy, {len(rows)} test problems): before {before:.0%}, after {after:.0%}",
            f"- mean reward over the first / last quarter of the steps: {reward_before:.2f} / {reward_after:.2f}",
            "",
            "| problem | answer | base model | after GRPO |",
            "|---|---|---|---|",
        ]
        for (row, base, _), (_, tuned, _) in list(zip(base_answers, tuned_answers, strict=True))[:8]:
            cells = [row["prompt"].split("?")[0] + "?", row["answer"], _cell(base), _cell(tuned)]
            lines.append("| " + " | ".join(cells) + " |")
        Path(args.out).write_text("\n".join(lines + ["", headline, ""]), encoding="utf-8")
    print(headline)
    return headline


def _cell(text: str) -> str:
    one = " ".join(text.split()).replace("|", "\\|")
    return one if len(one) <= 60 else one[:57] + "..."


if __name__ == "__main__":
    main()
