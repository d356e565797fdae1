"""`python -m finetune chat [RUN_DIR]`: chat with the base model or a run's adapter in the terminal."""

from __future__ import annotations

from typing import Any

from finetune.cli.args import add_config_args, load_config
from finetune.errors import UserError


def register(subparsers: Any) -> None:
    """Add `chat`."""
    chat = subparsers.add_parser("chat", help="chat with the base model or a run's adapter in the terminal")
    add_config_args(chat)
    chat.add_argument("run_dir", nargs="?", help="run directory (default: the base model)")
    chat.add_argument("--max-new-tokens", type=int, default=128)
    chat.add_argument("--prompt", help="answer this one prompt and exit")
    chat.set_defaults(func=cmd_chat)


def cmd_chat(args: Any) -> int:
    """Handle `chat`: one `--prompt`, or a conversation read from the terminal until end of input."""
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
