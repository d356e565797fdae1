"""Start Finetune Studio: `python app.py [--host H] [--port P] [--auth user:password] [--runs-root DIR]`.

Binds 127.0.0.1 unless told otherwise (a Space sets GRADIO_SERVER_NAME=0.0.0.0). Heavy libraries load on first use.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def parse_args(argv: list[str] | None = None, env: dict[str, str] | None = None) -> argparse.Namespace:
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
    args = parser.parse_args(argv)
    if args.auth is not None:
        user, sep, password = args.auth.partition(":")
        if not sep or not user or not password:
            parser.error("--auth: expected user:password")
        args.auth = (user, password)
    return args


def main(argv: list[str] | None = None) -> None:
    # The training thread shares the CPU with the web server: passive OpenMP threads keep both responsive
    # (bench/results/cpu-threads.md). Set before torch is imported; a user's own setting wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    args = parse_args(argv)
    from finetune.studio import Studio
    from ui.app import build_app, launch

    launch(build_app(Studio(args.runs_root)), host=args.host, port=args.port, auth=args.auth)


if __name__ == "__main__":
    main(sys.argv[1:])
