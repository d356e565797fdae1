"""Start Finetune Studio: `python app.py [--host H] [--port P] [--auth user:password] [--runs-root DIR]`.

Binds 127.0.0.1 unless told otherwise (a Space sets GRADIO_SERVER_NAME=0.0.0.0). Heavy libraries load on first use.
Listening beyond this machine (or on a Space: `SPACE_ID` set) locks what visitors may do (finetune/access.py);
`--allow-server-paths`, `--allow-remote-code` and `--lend-server-token` (only with `--auth`) open it up again.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def parse_args(argv: list[str] | None = None, env: dict[str, str] | None = None) -> argparse.Namespace:
    """The command line (and its environment defaults), with `policy`: what visitors may do."""
    env = os.environ if env is None else env
    parser = argparse.ArgumentParser(description="Finetune Studio: fine-tune a language model in your browser.")
    parser.add_argument(
        "--host",
        default=env.get("GRADIO_SERVER_NAME") or "127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only; env GRADIO_SERVER_NAME)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=int(env.get("GRADIO_SERVER_PORT") or 7860),
        help="port (default 7860; env GRADIO_SERVER_PORT)",
    )
    parser.add_argument(
        "--auth",
        default=env.get("FINETUNE_AUTH") or None,
        metavar="USER:PASSWORD",
        help="require this login (for a shared machine; env FINETUNE_AUTH)",
    )
    parser.add_argument(
        "--runs-root", type=Path, default=None, help="folder that holds the runs (default $FINETUNE_STUDIO_HOME/runs)"
    )
    public = parser.add_argument_group(
        "a public app (listening beyond 127.0.0.1, or on a Space)",
        "Visitors then get Hub models and data, the bundled set and their own uploads only; these switches open more.",
    )
    public.add_argument(
        "--allow-server-paths",
        action="store_true",
        help="let visitors name files and folders on this server as model or dataset "
        "(env FINETUNE_ALLOW_SERVER_PATHS=1)",
    )
    public.add_argument(
        "--allow-remote-code",
        action="store_true",
        help="let visitors turn on trust_remote_code: a model repository's code runs here "
        "(env FINETUNE_ALLOW_REMOTE_CODE=1)",
    )
    public.add_argument(
        "--lend-server-token",
        action="store_true",
        help="let logged-in users publish with this server's HF_TOKEN when they give no token of their own; needs "
        "--auth (env FINETUNE_LEND_SERVER_TOKEN=1)",
    )
    args = parser.parse_args(argv)
    if args.auth is not None:
        user, sep, password = args.auth.partition(":")
        if not sep or not user or not password:
            parser.error("--auth: expected user:password")
        args.auth = (user, password)
    from finetune.access import AccessPolicy

    try:
        args.policy = AccessPolicy.decide(
            args.host,
            env,
            auth=args.auth is not None,
            allow_server_paths=args.allow_server_paths,
            allow_remote_code=args.allow_remote_code,
            lend_server_token=args.lend_server_token,
        )
    except ValueError as exc:  # one line, no usage text: the operator asked for something refused
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    return args


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments, build the backend facade and the UI, and serve until stopped."""
    # The training thread shares the CPU with the web server: passive OpenMP threads keep both responsive
    # (bench/results/cpu-threads.md). Set before torch is imported; a user's own setting wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # Training processes get CUDA's expandable segments (less allocator slack, issue 13) unless the user configured
    # the allocator; set before torch initialises CUDA (see finetune/__main__.py).
    if not (os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF")):
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    args = parse_args(argv)
    from finetune.studio import Studio
    from ui.app import build_app, launch

    if args.policy.space:
        import importlib.util

        missing = [m for m in ("authlib", "itsdangerous") if importlib.util.find_spec(m) is None]
        if missing:  # gradio's Hugging Face sign-in (gr.LoginButton) needs them; say so instead of a traceback
            print(
                f"error: the Space's Hugging Face sign-in needs gradio's oauth extra (missing: {', '.join(missing)}): "
                "pip install 'gradio[oauth]'",
                file=sys.stderr,
            )
            raise SystemExit(2)
    print(f"Finetune Studio: {args.policy.summary()}", file=sys.stderr)
    launch(build_app(Studio(args.runs_root, policy=args.policy)), host=args.host, port=args.port, auth=args.auth)


if __name__ == "__main__":
    main(sys.argv[1:])
