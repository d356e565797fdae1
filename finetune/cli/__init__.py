"""Command line: python -m finetune {train,propose,estimate,chat,eval,compare,push,export,launch-command}. Bad input:
one line, exit 2."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from finetune import objectives
from finetune.cli.args import add_config_args, load_config
from finetune.cli.terminal import follow, summary_line
from finetune.config import parse_set_option
from finetune.errors import UserError


def quiet_libraries() -> None:
    """Keep library warnings and progress bars off the terminal: the run's own bar and one `error:` line say it all.

    Everything still reaches the run's events.jsonl (traceback included); `-v` shows the libraries' output too.
    The environment covers libraries imported later; the calls cover those already imported."""
    import logging
    import warnings

    # TQDM_DISABLE: every library's tqdm bar (lm-eval's too) is off by default; ours pass disable=False
    for name in (
        "HF_HUB_DISABLE_PROGRESS_BARS",
        "HF_DATASETS_DISABLE_PROGRESS_BARS",
        "TRL_EXPERIMENTAL_SILENCE",
        "TQDM_DISABLE",
    ):
        os.environ.setdefault(name, "1")
    if not Path("/dev/nvidiactl").exists() and not Path("/dev/kfd").exists():
        # No GPU device on this machine: tell DeepSpeed so, instead of it warning about the guess on every run.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("DATASETS_VERBOSITY", "error")
    warnings.filterwarnings("ignore")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    if "huggingface_hub" in sys.modules:
        sys.modules["huggingface_hub"].utils.disable_progress_bars()
    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()
    if "transformers" in sys.modules:
        sys.modules["transformers"].utils.logging.disable_progress_bar()


QUIET_LOGGERS = (
    "transformers",
    "datasets",
    "huggingface_hub",
    "peft",
    "accelerate",
    "DeepSpeed",
    "torch",
    "trl",
    "bitsandbytes",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m finetune", description="Finetune Studio: fine-tune language models."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train a model (or resume a run)")
    add_config_args(train)
    train.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    train.add_argument("--no-progress", action="store_true", help="no progress bar (log lines only)")
    # A rank of a group that `launch` started: the run directory it prepared (not for typing by hand).
    train.add_argument("--launched", metavar="RUN_DIR", help=argparse.SUPPRESS)
    train.set_defaults(func=cmd_train)

    chat = sub.add_parser("chat", help="chat with the base model or a run's adapter in the terminal")
    add_config_args(chat)
    chat.add_argument("run_dir", nargs="?", help="run directory (default: the base model)")
    chat.add_argument("--max-new-tokens", type=int, default=128)
    chat.add_argument("--prompt", help="answer this one prompt and exit")
    chat.set_defaults(func=cmd_chat)

    propose = sub.add_parser(
        "propose",
        help="propose settings that fit a GPU for a model, data and goal (what the Start tab proposes)",
        description="The configuration the app's Start tab proposes, from the same search: the fastest settings that "
        "fit with headroom (max(5%% of the card, 1 GiB)), keeping every row of the data whole where any combination "
        "can, at the same effective batch. When nothing fits, it names the smallest card (or number of GPUs) that "
        "holds the run. No weights are downloaded; the data is read to measure its token lengths. A setting given "
        "with --set is kept as set.",
    )
    add_config_args(propose)
    propose.add_argument("--model", help="a Hub id, a local model folder or the embedded model (default: the config's)")
    propose.add_argument("--data", help="a data file, a Hub dataset id or bundled:pirate (default: the config's)")
    goals = ", ".join(dict.fromkeys([*objectives.GOALS, *objectives.OBJECTIVES]))
    goal = objectives.DEFAULT_GOAL
    propose.add_argument("--goal", default=goal, help=f"{goals} (default: {goal})")
    propose.add_argument("--gpu-gib", required=True, help="memory per GPU in GiB, or a card's name (e.g. l4, a100)")
    propose.add_argument("--gpus", default="1", help="number of GPUs (default: 1)")
    propose.add_argument("--json", action="store_true", help="print one JSON object instead of the text")
    propose.set_defaults(func=cmd_propose)

    # The sub-commands that live with the feature they drive, each registered by its own module.
    from finetune import memory
    from finetune.evaluation import command as evaluation
    from finetune.publish import export, hub
    from finetune.runs import launch

    for module in (memory, evaluation, hub, export, launch):
        module.register_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    if not {"-v", "--verbose"} & set(argv):
        quiet_libraries()  # before the sub-commands' modules import the libraries
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # never a traceback for the user; FINETUNE_DEBUG=1 shows it
        if os.environ.get("FINETUNE_DEBUG"):
            raise
        print(
            f"error: unexpected {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
            "(rerun with FINETUNE_DEBUG=1 for details)",
            file=sys.stderr,
        )
        return 1


# --------------------------------------------------------------------------- train
def cmd_train(args: Any) -> int:
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


# --------------------------------------------------------------------------- propose
def cmd_propose(args: Any) -> int:
    """Print the proposal for a model, data, goal and hardware (text, or JSON with --json)."""
    import json

    from finetune.cli.args import parse_count, parse_gib
    from finetune.config import TrainConfig
    from finetune.memory import propose
    from finetune.plan import plan_for

    values = load_config(args.config, args.set).to_dict()
    pinned = tuple(parse_set_option(item)[0] for item in args.set or [])
    values.update({k: v for k, v in (("model", args.model), ("dataset", args.data)) if v})
    usual = TrainConfig().to_dict()
    given = {*pinned, *(name for name, value in values.items() if value != usual.get(name))}  # --set or the file
    values.update(objectives.goal_settings(str(args.goal).strip().lower(), given=given))
    gib = parse_gib(args.gpu_gib)
    if gib is None:
        raise UserError("--gpu-gib: give the memory of one GPU in GiB, or a card's name (e.g. l4)")
    gpus = parse_count(args.gpus, "--gpus")
    plan = plan_for(TrainConfig.from_dict(values), device="cuda", world_size=gpus)
    proposal = propose(plan, gpu_gib=gib, pinned=pinned)
    print(json.dumps(proposal.to_dict(), indent=2, default=str) if args.json else proposal.render_text())
    return 0


# --------------------------------------------------------------------------- chat
def cmd_chat(args: Any) -> int:
    from finetune.model.inference import MAX_NEW_TOKENS, GenerationSettings, load_for_chat, stream_reply
    from finetune.paths import runs_root
    from finetune.plan import plan_for
    from finetune.runs.rundir import find_run

    if not 1 <= args.max_new_tokens <= MAX_NEW_TOKENS:  # before minutes of model loading
        raise UserError(f"--max-new-tokens: {args.max_new_tokens} is out of range; use 1 to {MAX_NEW_TOKENS}")
    run = find_run(args.run_dir, runs_root(), field="run_dir") if args.run_dir else None
    plan = run.load_plan() if run else plan_for(load_config(args.config, args.set))  # a run: as it trained
    model, tokenizer = load_for_chat(plan, run.path if run else None)
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens)
    prompts = [args.prompt] if args.prompt else None
    history: list[dict[str, str]] = []
    while True:
        if prompts is not None:
            if not prompts:
                return 0
            prompt = prompts.pop()
        else:
            try:
                prompt = input("you> ").strip()
            except EOFError:
                return 0
            if not prompt:
                continue
        history.append({"role": "user", "content": prompt})
        shown = ""
        for text in stream_reply(model, tokenizer, history, settings):
            print(text[len(shown) :], end="", flush=True)
            shown = text
        print()
        history.append({"role": "assistant", "content": shown})
