"""Start Finetune Studio: `python app.py [--host H] [--port P] [--auth alice:pw1,bob:pw2] [--runs-root DIR] [--mcp]`.

Binds 127.0.0.1 unless told otherwise (a Space sets GRADIO_SERVER_NAME=0.0.0.0). Heavy libraries load on first use.
Listening beyond this machine (or on a Space: `SPACE_ID` set) locks what visitors may do (finetune/access/policy.py):
each visitor (a login of `--auth` / `--auth-file`, or a Hugging Face sign-in on a Space) has their own runs and uploads;
`--admin` names who sees every run; `--allow-server-paths`, `--allow-remote-code`, `--lend-server-token` (only with
`--auth`) and `--open-training` open it up.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

USER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")


def parse_args(argv: list[str] | None = None, env: dict[str, str] | None = None) -> argparse.Namespace:
    """The command line (and its environment defaults), with `policy`: what visitors may do."""
    from finetune.access.policy import env_flag

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
        metavar="USER:PASSWORD[,USER:PASSWORD...]",
        help="require a login; each user is an identity with their own runs on a public app (env FINETUNE_AUTH)",
    )
    parser.add_argument(
        "--auth-file",
        type=Path,
        default=env.get("FINETUNE_AUTH_FILE") or None,
        metavar="FILE",
        help="the logins as user:password lines (# comments; env FINETUNE_AUTH_FILE)",
    )
    parser.add_argument(
        "--mcp",
        action="store_true",
        default=env_flag(env, "FINETUNE_MCP"),
        help="also serve the API as MCP tools at /gradio_api/mcp/ (env FINETUNE_MCP=1)",
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
    public.add_argument(
        "--admin",
        action="append",
        default=[],
        metavar="USER",
        help="this user sees and stops every run (repeat, or USER,USER; env FINETUNE_ADMIN)",
    )
    public.add_argument(
        "--open-training",
        action="store_true",
        help="let visitors who are not signed in upload and train, all as one shared identity "
        "(env FINETUNE_OPEN_TRAINING=1)",
    )
    from finetune.access.uploads import LIMIT_SWITCHES

    for name, (flag, variable, default, what) in LIMIT_SWITCHES.items():
        public.add_argument(
            flag, dest=name, default=None, metavar="N", help=f"{what} (default {default}; env {variable})"
        )
    args = parser.parse_args(argv)
    try:
        args.auth = logins(args.auth, args.auth_file)
        args.policy = decide_policy(args, env)
    except ValueError as exc:  # one line, no usage text: the operator asked for something refused
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    return args


def logins(text: str | None, file: Path | None) -> list[tuple[str, str]] | None:
    """The (user, password) pairs of `--auth` and `--auth-file` (None: no login asked); ValueError in one line."""
    pairs: list[tuple[str, str]] = []
    entries = [("--auth", e) for e in (text or "").split(",") if e.strip()]
    if file is not None:
        try:
            lines = file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--auth-file: cannot read {file}: {getattr(exc, 'strerror', None) or exc}") from None
        entries += [(f"--auth-file line {n}", line) for n, line in enumerate(lines, 1) if line.strip()]
    for where, entry in entries:
        if entry.lstrip().startswith("#"):
            continue
        user, sep, password = entry.strip().partition(":")
        if not sep or not password or not USER_NAME.fullmatch(user):
            raise ValueError(f"{where}: expected user:password (user: letters, digits and . _ @ -)")
        if any(user == known for known, _ in pairs):
            raise ValueError(f"{where}: user {user} is given twice")
        pairs.append((user, password))
    if (text or file is not None) and not pairs:
        raise ValueError("--auth: no user:password given")
    return pairs or None


def decide_policy(args: argparse.Namespace, env: Mapping[str, str]) -> Any:
    """What visitors may do, from the switches (ValueError in one line for a refused combination)."""
    from finetune.access.policy import AccessPolicy
    from finetune.access.uploads import LIMIT_SWITCHES, UploadLimits

    admins = [a.strip() for given in args.admin for a in given.split(",") if a.strip()]
    users = {user for user, _ in args.auth or []}
    strangers = sorted(a for a in admins if users and a not in users)
    if strangers:
        raise ValueError(f"--admin: {', '.join(strangers)} is not a user of --auth / --auth-file")
    if args.mcp and args.auth:
        # gradio's MCP server calls the app back through a client of its own, which cannot log in
        raise ValueError(
            "--mcp cannot be combined with --auth (gradio's MCP server cannot log in); serve MCP on a Space, where "
            "clients name themselves with their Hugging Face token, or on the local app"
        )
    uploads = UploadLimits.decide({name: getattr(args, name) for name in LIMIT_SWITCHES}, env)
    return AccessPolicy.decide(
        args.host,
        env,
        auth=args.auth is not None,
        allow_server_paths=args.allow_server_paths,
        allow_remote_code=args.allow_remote_code,
        lend_server_token=args.lend_server_token,
        admins=admins,
        open_training=args.open_training,
        uploads=uploads,
    )


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments, build the backend facade and the UI, and serve until stopped."""
    from finetune.process_env import apply_defaults

    apply_defaults()  # the training thread shares the CPU with the web server; set before torch is imported
    args = parse_args(argv)
    from finetune.studio import Studio
    from ui.app import build_app, launch

    if args.policy.space and os.environ.get("SYSTEM") != "spaces":
        # gradio would mock the sign-in with this machine's own Hub login (and fail without one): refuse instead.
        print(
            "error: SPACE_ID is set but this is not a Hugging Face Space (SYSTEM is not 'spaces'); the Hugging Face "
            "sign-in works only on a Space: unset SPACE_ID, and use --auth for logins elsewhere",
            file=sys.stderr,
        )
        raise SystemExit(2)
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
    launch(
        build_app(Studio(args.runs_root, policy=args.policy)),
        host=args.host,
        port=args.port,
        auth=args.auth,
        mcp=args.mcp,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
