"""`python -m finetune eval RUN [...]` and `python -m finetune compare RUN RUN ...`: the evaluation
(finetune/evaluation/) on the command line."""

from __future__ import annotations

import argparse
import json
from typing import Any

from finetune.cli.terminal import ProgressLine
from finetune.errors import UserError


def register(subparsers: Any) -> None:
    """Add `eval` and `compare`."""
    run_eval = subparsers.add_parser("eval", help="score a run against its base model on held-out data")
    run_eval.add_argument("run", metavar="RUN", help="run directory or run name (under the runs folder)")
    run_eval.add_argument("--checkpoint", type=int, metavar="STEP", help="evaluate this checkpoint (default: final)")
    run_eval.add_argument("--data", default="", metavar="D", help="data to score (file, bundled:NAME or Hub id)")
    run_eval.add_argument("--split", default="", help="split of the data (default: the run's evaluation split)")
    run_eval.add_argument(
        "--limit", type=int, metavar="N", help="score at most N rows (and N examples per lm-eval task)"
    )
    run_eval.add_argument("--max-new-tokens", type=int, default=64, metavar="N", help="answer length (default 64)")
    run_eval.add_argument("--temperature", type=float, default=0.0, help="sample answers (default 0: greedy)")
    run_eval.add_argument("--base", action="store_true", help="also score the base model on the same rows")
    run_eval.add_argument("--predictions", default="", metavar="FILE", help="write one JSON line per row here")
    run_eval.add_argument("--json", action="store_true", help="print the result as JSON")
    run_eval.add_argument("--lm-eval", default="", metavar="TASKS", help="lm-eval tasks, comma-separated")
    run_eval.add_argument("--include-path", default="", metavar="DIR", help="folder of local lm-eval task files")
    run_eval.add_argument("--num-fewshot", type=int, metavar="K", help="lm-eval few-shot examples")
    run_eval.add_argument("--judge", default="", metavar="MODEL", help="a causal LM that compares base and tuned")
    run_eval.add_argument("--no-progress", action="store_true", help="no progress line")
    run_eval.add_argument("-v", "--verbose", action="store_true", help="also show the libraries' own output")
    run_eval.set_defaults(func=cmd_eval)

    compare = subparsers.add_parser("compare", help="runs side by side: their latest evaluations and answers")
    compare.add_argument("runs", nargs="+", metavar="RUN", help="two or more run directories or names")
    compare.add_argument("--json", action="store_true", help="print the comparison as JSON")
    compare.set_defaults(func=cmd_compare)


def cmd_eval(args: argparse.Namespace) -> int:
    """Handle `eval`: score the run, print the report (or JSON); a progress line on stderr meanwhile."""
    from finetune.evaluation import report
    from finetune.evaluation.evaluate import EvalOptions, evaluate_run

    options = EvalOptions(
        data=args.data,
        split=args.split,
        limit=args.limit,
        max_new_tokens=args.max_new_tokens,
        base=args.base,
        temperature=args.temperature,
        checkpoint=args.checkpoint,
        lm_eval=[t for t in args.lm_eval.split(",") if t.strip()],
        include_path=args.include_path,
        num_fewshot=args.num_fewshot,
        judge=args.judge,
        predictions=args.predictions,
    )
    line = None if args.no_progress else ProgressLine()
    result, path = evaluate_run(_run(args.run), options, progress=line)
    if line is not None:
        line.close()
    print(json.dumps(result, ensure_ascii=False, indent=1) if args.json else report.render_text(result, path))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Handle `compare`: the runs' latest evaluations side by side (text, or JSON with --json)."""
    from dataclasses import asdict

    from finetune.evaluation.compare import compare_runs, render_text

    comparison = compare_runs([_run(name) for name in args.runs])
    print(json.dumps(asdict(comparison), ensure_ascii=False, indent=1) if args.json else render_text(comparison))
    return 0


def _run(value: str) -> Any:
    from finetune.paths import runs_root
    from finetune.runs.rundir import find_run

    try:
        return find_run(value, runs_root(), field="run")
    except UserError:
        raise UserError(f"run: {value} is not a run (a run directory, or a run's name under {runs_root()})") from None
