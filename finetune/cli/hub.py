"""`python -m finetune push RUN_DIR --repo-id OWNER/NAME [--private] [--merged] [--gguf Q] [--token-env NAME] [-v]`:
a finished run published to the Hugging Face Hub (finetune/publish/hub.py); the repository's URL on stdout."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from finetune.cli.terminal import to_stderr
from finetune.errors import UserError
from finetune.publish.hub import TOKEN_ENV, push_run


def register(subparsers: Any) -> None:
    """Add `push`."""
    parser = subparsers.add_parser(
        "push",
        help="publish a finished run (adapter + model card) to the Hugging Face Hub",
        description=(
            "Publish a finished run to the Hugging Face Hub in one commit: the LoRA adapter (or, with --merged, "
            "the base model with the adapter merged in), the tokenizer, config.yaml, a model card and the loss "
            f"curve. The token is read from an environment variable (default {TOKEN_ENV}), never from the "
            "command line."
        ),
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run directory, or the name of a run under the runs root")
    parser.add_argument("--repo-id", required=True, metavar="OWNER/NAME", help="Hub repository to create or update")
    parser.add_argument("--private", action="store_true", help="create the repository as private")
    parser.add_argument(
        "--merged",
        action="store_true",
        help="merge the LoRA adapter into the base model and push the full model (not for qlora runs)",
    )
    parser.add_argument(
        "--gguf",
        choices=("f16", "q8_0"),
        help="also push the run exported as one .gguf file (f16 or q8_0) with an Ollama Modelfile",
    )
    parser.add_argument(
        "--token-env",
        default=TOKEN_ENV,
        metavar="NAME",
        help=f"environment variable that holds a Hub write token (default {TOKEN_ENV})",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="print each stage on stderr (the default on a terminal; otherwise only the URL or one error line)",
    )
    parser.set_defaults(func=cmd_push)


def cmd_push(args: argparse.Namespace) -> int:
    """Handle `push`: the token from --token-env (else push_run's own lookup), then print the repository URL."""
    token = None
    if args.token_env != TOKEN_ENV:
        token = os.environ.get(args.token_env, "").strip()
        if not token:
            raise UserError(f"--token-env: the environment variable {args.token_env} is not set or empty")
    url = push_run(
        args.run_dir,
        args.repo_id,
        token=token,
        private=args.private,
        merged=args.merged,
        gguf=args.gguf,
        progress=to_stderr if (args.verbose or sys.stderr.isatty()) else None,
    )
    print(url)
    return 0
