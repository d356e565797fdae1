"""Command line: python -m finetune {train,chat,propose,estimate,eval,compare,push,export,launch-command,launch,stop,
submit}. Bad input: one line, exit 2.

This package is the only place that parses arguments: one module per group of sub-commands (train, chat, memory,
evaluate, hub, export, launch, submit), each registering its own parser and calling the backend's functions; args.py
holds the shared --config/--set handling and terminal.py the progress bar. The backend never imports it."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

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
    """The root parser with every sub-command, each registered by its module in this package (in `--help` order)."""
    # Imported here, after quiet_libraries(): the sub-commands' modules import the backend and its libraries.
    from finetune.cli import chat, evaluate, export, hub, launch, memory, submit, train

    parser = argparse.ArgumentParser(
        prog="python -m finetune", description="Finetune Studio: fine-tune language models."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (train, chat, memory, evaluate, hub, export, launch, submit):
        module.register(sub)
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
