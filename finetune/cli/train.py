"""`python -m finetune train`: train a config (or resume a run) in this process, with a progress bar; also how each
rank of a launched group runs (`--launched`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from finetune.cli.args import add_config_args, load_config
from finetune.cli.terminal import follow, summary_line
from finetune.config import parse_set_option
from finetune.errors import UserError


def register(subparsers: Any) -> None:
    """Add `train`."""
    train = subparsers.add_parser("train", help="train a model (or resume a run)")
    add_config_args(train)
    train.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    train.add_argument("--no-progress", action="store_true", help="no progress bar (log lines only)")
    # A rank of a group that `launch` started: the run directory it prepared (not for typing by hand).
    train.add_argument("--launched", metavar="RUN_DIR", help=argparse.SUPPRESS)
    train.set_defaults(func=cmd_train)


def cmd_train(args: Any) -> int:
    """Handle `train`: alone, or as one rank of a process group (joined first, left at the end)."""
    from finetune.runs import process_group

    process_group.watch_supervisor()  # a rank of a launched group ends with its supervisor
    if not process_group.joined():
        return _train(args)
    # A rank of several: a process group with a bounded collective timeout first, torn down at the end.
    config = None if args.resume or args.launched else load_config(args.config, args.set)
    if args.launched or args.resume:
        from finetune.runs.rundir import RunDir

        saved = RunDir(Path(args.launched or args.resume))
        config = saved.load_config() if saved.config_path.is_file() else config
    from finetune.plan import uses_deepspeed

    process_group.join_group(uses_deepspeed(config) if config is not None else False)
    try:
        return _train(args)
    finally:
        process_group.leave_group()


def _train(args: Any) -> int:
    from finetune.runs.manager import RunManager, distributed_rank

    # Follow this run only, never a launched group this process is part of; the process ends with the run.
    manager = RunManager(find_groups=False, process_ends_with_run=True)
    if args.launched:
        state = manager.join_launched(args.launched)
    elif args.resume:
        overrides = dict(parse_set_option(item) for item in args.set or [])
        if args.config:
            raise UserError("--config: not used with --resume (the run's own config.yaml is used); use --set to change")
        state = manager.resume(args.resume, owner="the command line", overrides=overrides or None)
    else:
        state = manager.start(load_config(args.config, args.set), owner="the command line")
    rank, world = distributed_rank()
    final = follow(manager, show_bar=rank == 0 and not args.no_progress)
    if final and final.status == "failed" and world > 1:
        # One line per failing rank, named, for the launcher's log (the supervisor reports the first one).
        print(f"error: rank {rank}: {final.error}", file=sys.stderr, flush=True)
        return 1
    if final and final.status == "failed" and final.user_error:
        raise UserError(final.error or "training failed")
    if final and final.status == "failed":
        # The last line of output, whatever the libraries printed before it.
        advice = f" — {final.advice}" if final.advice else ""
        print(f"error: {final.error}{advice}", file=sys.stderr, flush=True)
        return 1
    if rank == 0:
        print(summary_line(final or state, manager))
    return 0 if final and final.status in ("completed", "stopped") else 1
