"""What a visitor of the web app may do, decided once from how the app was started.

    policy = AccessPolicy.decide(host="0.0.0.0", env=os.environ, auth=True, lend_server_token=True)
    policy.problems(values, uploads)  # {field: one-line refusal} for what this visitor may not use

On this machine only (the app listens on 127.0.0.1 / localhost / ::1 and is not a Space) everything stays allowed, as
on the command line. Wherever the app can be reached from elsewhere (another address, or `SPACE_ID` set), it is
public and locked by default:
- `model` and `dataset` take Hub ids, the embedded model, the bundled data and the files uploaded to this app since it
  started; server paths only with `--allow-server-paths`. `dataset_split` / `eval_split` are split names (or an
  uploaded file), `nvme_path` stays empty.
- `trust_remote_code` only with `--allow-remote-code`.
- Publishing uses the visitor's own token (their Hugging Face sign-in on a Space, or one they paste); the server's
  `HF_TOKEN` only with `--lend-server-token`, which is accepted only together with `--auth`.
- Runs and uploads belong to an identity: the visitor's login (`--auth`) or Hugging Face sign-in (a Space). A visitor
  sees and acts on their own runs and uploads only; an operator named with `--admin` on every run. Anonymous
  visitors may estimate, configure, preview the bundled data and chat with a base model, but not upload or train,
  unless the operator passed `--open-training`: then they share one identity, `ANONYMOUS`. On the local app there is
  one identity that owns everything, as before.

A refusal never depends on whether a path exists: every refused value of a field gets the same message, so the
answers tell nothing about the server's files. The one exception is a value shaped like a Hub id that also names a
file or folder in the app's working directory (the backend would read that instead of the Hub): it is refused with
the same message.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune.access.uploads import DATA_SUFFIXES, UploadLimits
from finetune.config import BUNDLED_DATASET, EMBEDDED_MODEL

LOOPBACK_HOSTS = ("localhost", "::1", "0:0:0:0:0:0:0:1")
TRUE = ("1", "true", "yes", "on")
LOCAL = "local"  # the one identity of the local app
ANONYMOUS = "(anonymous)"  # anonymous visitors with --open-training; no login or Hub name can be spelt like this
SIGN_IN = {  # how an anonymous visitor of a public app gets an identity
    "space": "sign in with Hugging Face (the button at the top of the page)",
    "auth": "log in",
    "public": "log in (the operator starts the app with --auth, or --open-training for everyone)",
}
_HUB_PART = r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
_HUB_ID = re.compile(rf"{_HUB_PART}(?:/{_HUB_PART})?")
_BUNDLED = re.compile(r"bundled:[A-Za-z0-9_-]{1,64}")
_SPLIT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:%+\[\]-]{0,199}")  # train, validation, train[:10%]
SWITCHES = {
    "allow_server_paths": ("--allow-server-paths", "FINETUNE_ALLOW_SERVER_PATHS"),
    "allow_remote_code": ("--allow-remote-code", "FINETUNE_ALLOW_REMOTE_CODE"),
    "lend_server_token": ("--lend-server-token", "FINETUNE_LEND_SERVER_TOKEN"),
}

REFUSED = {
    "model": (
        f"model: files on the server are not available in this public app; give a Hub model id (owner/name) or "
        f"{EMBEDDED_MODEL}"
    ),
    "dataset": (
        f"dataset: files on the server are not available in this public app; give a Hub dataset id (owner/name), "
        f"{BUNDLED_DATASET}, or upload a data file"
    ),
    "dataset_split": "dataset_split: give a split name such as train (paths are not available in this public app)",
    "eval_split": (
        "eval_split: give a split name such as validation, an uploaded data file, or leave it empty (paths are not "
        "available in this public app)"
    ),
    "nvme_path": "nvme_path: folders on the server are not available in this public app; leave it empty",
    "trust_remote_code": (
        "trust_remote_code: not available in this public app (the model repository's code would run on the server)"
    ),
    "rewards": (
        "rewards: python: rewards are not available in this public app (a visitor's code would run on the server); "
        "use number_match, exact_match, regex:, contains: or max_length:"
    ),
}


def is_loopback(host: str) -> bool:
    """True when `host` reaches this machine only (127.x, localhost, ::1)."""
    host = (host or "").strip().strip("[]").lower()
    return host.startswith("127.") or host in LOOPBACK_HOSTS


def env_flag(env: Mapping[str, str], name: str) -> bool:
    """An on/off environment switch: 1, true, yes or on (any case) turn it on."""
    return str(env.get(name, "")).strip().lower() in TRUE


@dataclass(frozen=True)
class AccessPolicy:
    """The rules for visitors of one app process. The default is the local app: everything allowed."""

    public: bool = False  # reachable from other machines: the locked rules apply
    space: bool = False  # on a Hugging Face Space: visitors sign in with Hugging Face (OAuth)
    allow_server_paths: bool = False
    allow_remote_code: bool = False
    operator_lends_token: bool = False
    admins: frozenset[str] = frozenset()  # identities that see and stop every run (--admin)
    open_training: bool = False  # anonymous visitors may upload and train, as one shared identity
    logins: bool = False  # visitors log in with a user and password (--auth)
    uploads: UploadLimits = UploadLimits()

    @classmethod
    def local(cls) -> AccessPolicy:
        """This machine only: today's freedom (server paths, remote code, the server's token)."""
        return cls()

    @classmethod
    def decide(
        cls,
        host: str,
        env: Mapping[str, str] | None = None,
        *,
        auth: bool = False,
        allow_server_paths: bool = False,
        allow_remote_code: bool = False,
        lend_server_token: bool = False,
        admins: Iterable[str] = (),
        open_training: bool = False,
        uploads: UploadLimits | None = None,
    ) -> AccessPolicy:
        """The policy for an app listening on `host` with these operator switches; `ValueError` (one line) for a
        switch that is refused (lending the server's token without `--auth`)."""
        env = os.environ if env is None else env
        admins = {a.strip() for a in admins if a.strip()} | {
            a.strip() for a in str(env.get("FINETUNE_ADMIN", "")).split(",") if a.strip()
        }
        lend = lend_server_token or env_flag(env, SWITCHES["lend_server_token"][1])
        if lend and not auth:
            raise ValueError(
                "--lend-server-token (FINETUNE_LEND_SERVER_TOKEN) needs --auth USER:PASSWORD (FINETUNE_AUTH): the "
                "server's Hub token is lent only to people who log in"
            )
        space = bool(str(env.get("SPACE_ID", "")).strip())
        return cls(
            public=space or not is_loopback(host),
            space=space,
            allow_server_paths=allow_server_paths or env_flag(env, SWITCHES["allow_server_paths"][1]),
            allow_remote_code=allow_remote_code or env_flag(env, SWITCHES["allow_remote_code"][1]),
            operator_lends_token=lend,
            admins=frozenset(admins),
            open_training=open_training or env_flag(env, "FINETUNE_OPEN_TRAINING"),
            logins=auth,
            uploads=uploads or UploadLimits(),
        )

    # ------------------------------------------------------------------ who owns what
    def identity(self, user: str | None) -> str | None:
        """The identity a visitor's runs and uploads belong to (`user`: their login or Hugging Face name, None when
        anonymous): on the local app the one local identity; on a public app their name, the shared anonymous
        identity with --open-training, else None (they may not upload or train)."""
        if not self.public:
            return LOCAL
        if user:
            return user
        return ANONYMOUS if self.open_training else None

    def run_owner(self, user: str | None) -> str:
        """What a new run records as its owner: the identity (on the local app, the login name when there is one:
        it names who uses the device)."""
        if not self.public:
            return user or "the web app"
        return self.identity(user) or ""

    def may_see(self, user: str | None, owner: str | None) -> bool:
        """May this visitor see and act on a run (or upload) of `owner`? Everyone on the local app; an admin
        everything; otherwise only their own identity's."""
        if not self.public or (user and user in self.admins):
            return True
        mine = self.identity(user)
        return mine is not None and owner == mine

    def is_admin(self, user: str | None) -> bool:
        """An operator named with --admin (or anyone on the local app)."""
        return not self.public or bool(user and user in self.admins)

    def needs_identity(self, field: str, action: str) -> str:
        """The one-line refusal for an anonymous visitor of a public app whose `action` ("train", "upload data")
        needs an identity; `field` names where the refusal belongs."""
        how = SIGN_IN["space" if self.space else "auth" if self.logins else "public"]
        return f"{field}: {how} to {action}; anonymous visitors may estimate, configure and chat with a base model"

    # ------------------------------------------------------------------ what a visitor may use
    @property
    def lend_server_token(self) -> bool:
        """May a push without a token of its own fall back to the server's token (HF_TOKEN / stored login)?"""
        return not self.public or self.operator_lends_token

    @property
    def server_paths(self) -> bool:
        """May `model`, `dataset` and the split fields name files and folders on the server?"""
        return not self.public or self.allow_server_paths

    @property
    def remote_code(self) -> bool:
        """May a visitor turn on `trust_remote_code`?"""
        return not self.public or self.allow_remote_code

    def summary(self) -> str:
        """One line for the operator's terminal: what visitors may and may not do."""
        if not self.public:
            return "local app (this machine only): server paths, trust_remote_code and the server's Hub token are on"
        rules = (
            ("server paths", self.allow_server_paths, "--allow-server-paths"),
            ("trust_remote_code", self.allow_remote_code, "--allow-remote-code"),
            ("the server's Hub token", self.operator_lends_token, "--lend-server-token"),
        )
        parts = [f"{name} {'on (' + switch + ')' if on else 'off'}" for name, on, switch in rules]
        parts.append("anonymous training " + ("on (--open-training)" if self.open_training else "off"))
        if self.admins:
            parts.append("admin " + ", ".join(sorted(self.admins)))
        return "public app" + (" (Hugging Face sign-in)" if self.space else "") + ": " + ", ".join(parts)

    def problems(self, values: Mapping[str, Any], uploads: Iterable[str | Path] = ()) -> dict[str, str]:
        """{field: one-line refusal} for the values this visitor may not use (empty when all are allowed)."""
        out: dict[str, str] = {}
        if not self.remote_code and _truthy(values.get("trust_remote_code")):
            out["trust_remote_code"] = REFUSED["trust_remote_code"]
        if self.public and _runs_code(values.get("rewards")):
            out["rewards"] = REFUSED["rewards"]
        if self.server_paths:
            return out
        allowed_files = {str(p) for p in uploads}
        checks = {
            "model": self._model_ok,
            "dataset": lambda v: self._dataset_ok(v, allowed_files),
            "dataset_split": _split_ok,
            "eval_split": lambda v: v == "" or _split_ok(v) or v in allowed_files,
            "nvme_path": lambda v: v == "",
        }
        for name, ok in checks.items():
            if name not in values:
                continue
            value = values[name]
            text = "" if value is None else str(value).strip()
            if not ok(text):
                out[name] = REFUSED[name]
        return out

    def refuses_run(self, config_values: Mapping[str, Any]) -> str | None:
        """The refusal for using an existing run (chat, resume) whose config needs what visitors may not use.

        A run's own model and data were vetted when it started (or chosen by the operator), so only the switch that
        runs code on the server is checked again."""
        if not self.remote_code and _truthy(config_values.get("trust_remote_code")):
            return REFUSED["trust_remote_code"]
        return None

    @staticmethod
    def _model_ok(value: str) -> bool:
        return value == EMBEDDED_MODEL or _hub_id(value)

    @staticmethod
    def _dataset_ok(value: str, uploads: set[str]) -> bool:
        if value in uploads:
            return True
        if _BUNDLED.fullmatch(value):
            return True
        return _hub_id(value) and not value.lower().endswith(DATA_SUFFIXES)


def _runs_code(rewards: Any) -> bool:
    """Whether a `rewards` value names a python: reward (code from a file, run by the server)."""
    from finetune.objectives.rewards import split

    return isinstance(rewards, str) and any(part.strip().startswith("python:") for part in split(rewards))


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in TRUE
    return bool(value)


def _hub_id(value: str) -> bool:
    """`name` or `owner/name` as the Hub spells them, and not also the name of something in the working directory
    (the backend would read that local path instead of going to the Hub)."""
    if not _HUB_ID.fullmatch(value) or ".." in value:
        return False
    try:
        return not os.path.lexists(value)
    except (OSError, ValueError):
        return False


def _split_ok(value: str) -> bool:
    """A split name (train, validation, train[:10%]): no path separators, no `..`, no file suffix."""
    return bool(_SPLIT.fullmatch(value)) and ".." not in value and not value.lower().endswith(DATA_SUFFIXES)
