"""Publish a finished run to the Hugging Face Hub: the adapter (or the merged model) with a model card, in one commit.

    push_run(run_dir, "owner/name", token=..., private=False, merged=False, allow_env_token=True) -> repo URL
    python -m finetune push RUN_DIR --repo-id OWNER/NAME [--private] [--merged] [...]  # finetune/cli/hub.py

What is pushed is staged in a temporary folder first, so only these files can reach the Hub: the adapter
(adapter_config.json + adapter_model.safetensors) or the full model, the tokenizer, config.yaml, README.md
(the model card) and loss_curve.png. Never checkpoints, optimizer states, events or status files.

Nothing pushed names a path of this machine: config.yaml, the card and adapter_config.json are built from
`public.public_config` (a local model or dataset appears as its base name and sha256, or its Hub id when
one is on record; output_dir and nvme_path are left out), and the staged folder is scanned for the run's local
paths and the home directory before anything is uploaded. The run directory itself is never changed.

The token comes from the `token` argument (the Publish tab's password field), else the environment (`HF_TOKEN`,
which is also how a Space secret arrives), else a stored `hf auth login`. With `allow_env_token=False` (a public
Space: a visitor must never borrow the operator's token) only the `token` argument counts. The token is always passed
to the Hub client explicitly, so the client never looks one up by itself. It reaches nothing else: no file, log line
or error message here contains it (the staged files are checked before upload).
`HF_ENDPOINT` is read at each push, so a stand-in Hub can be used without re-importing anything.

torch / transformers / peft are imported only inside the `--merged` path.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from finetune.config import TrainConfig
from finetune.errors import UserError
from finetune.publish.model_card import (
    LOSS_CURVE,
    build_model_card,
    known_license,
    plot_loss_curve,
    summarize,
)
from finetune.publish.public import (
    ADAPTER_FILES,
    FULL_MODEL_FILES,
    TOKENIZER_FILES,
    check_no_local_paths,
    public_adapter_config,
    public_config,
)
from finetune.runs.rundir import RunDir

log = logging.getLogger(__name__)

TOKEN_ENV = "HF_TOKEN"
TOKEN_PAGE = "https://huggingface.co/settings/tokens"
_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
_TEXT_SCAN_LIMIT = 16 * 1024 * 1024  # token scan: text-like files up to this size (weights cannot hold a token)

Progress = Callable[[str], None]


# ------------------------------------------------------------------------------------------------ public API


def push_run(
    run_dir: str | Path,
    repo_id: str,
    token: str | None = None,
    private: bool = False,
    merged: bool = False,
    *,
    progress: Progress | None = None,
    allow_env_token: bool = True,
    gguf: str | None = None,
) -> str:
    """Push a finished run to `repo_id` in one commit and return the repository URL.

    gguf ("f16" or "q8_0") adds the run exported as one .gguf file and its Ollama Modelfile, and the card says how
    to run them.

    allow_env_token=False uses only `token` (never `HF_TOKEN` or a stored login): what a public Space must do.
    Raises `UserError` (one line, never containing the token) for a missing or rejected token, a bad repo id,
    a run that is not finished, a `--merged` QLoRA run, a staged file that names a local path, an unreachable Hub.
    """
    say = progress or (lambda message: None)
    run = resolve_run_dir(run_dir)
    repo_id = check_repo_id(repo_id)
    token = resolve_token(token, allow_env=allow_env_token)
    if gguf:
        from finetune.publish.export import check_format

        _, gguf = check_format("gguf", gguf)
    config = run.load_config()
    merged = merged and config.method != "full"  # a full fine-tune is already a whole model: nothing to merge
    if merged and config.method == "qlora":
        raise UserError(
            "--merged: not available for a qlora run: the adapter was trained against 4-bit rounded base weights, "
            "so merging it into the 16/32-bit base gives a model that differs from the one you evaluated, and "
            "merging into the 4-bit weights is lossy; push the adapter (without --merged) and load it on the 4-bit "
            "base as the model card shows",
            field="merged",
        )

    from huggingface_hub import HfApi, constants

    if constants.is_offline_mode():
        raise UserError("cannot publish while offline mode is on (HF_HUB_OFFLINE=1): unset it and try again")
    endpoint = hub_endpoint()
    api = HfApi(endpoint=endpoint, token=token, library_name="finetune-studio")
    full_model = merged or config.method == "full"

    with tempfile.TemporaryDirectory(prefix="finetune-push-") as tmp:
        stage = Path(tmp)
        with _redacting(token):
            if merged:
                say("Merging the adapter into the base model…")
                _stage_merged(run, config, stage, token)
            else:
                say("Collecting the adapter files…" if not full_model else "Collecting the model files…")
                _stage_files(run, stage, ADAPTER_FILES if not full_model else FULL_MODEL_FILES)
            _stage_files(run, stage, TOKENIZER_FILES)
            (stage / "config.yaml").write_text(public_config(config, run).to_yaml(), encoding="utf-8")
            if not full_model:
                _rewrite_adapter_base(stage, config)
            gguf_file = _stage_gguf(run, gguf, stage, say) if gguf else None

            say("Writing the model card…")
            summary = summarize(run.path)
            license_id = _license_from_hub(api, summary, token)
            has_curve = plot_loss_curve(run.path, stage / LOSS_CURVE, summary=summary)
            card = build_model_card(
                run.path,
                repo_id,
                merged=merged,
                license=license_id,
                loss_curve=LOSS_CURVE if has_curve else None,
                gguf_file=gguf_file,
            )
            (stage / "README.md").write_text(card, encoding="utf-8")
            _check_no_token(stage, token)
            check_no_local_paths(stage, config, run)
            files = sorted(p.relative_to(stage).as_posix() for p in stage.rglob("*") if p.is_file())

        with _hub_errors(repo_id, endpoint, token):
            say(f"Creating {repo_id} on {endpoint}…")
            url = api.create_repo(repo_id, private=private, exist_ok=True)
            if private:
                info = api.repo_info(repo_id)
                if info.private is False:
                    raise UserError(
                        f"--private: {repo_id} already exists and is public; make it private in its settings on the "
                        "Hub or pick another repo id",
                        field="private",
                    )
            say(f"Uploading {len(files)} files in one commit…")
            kind = "merged model" if merged else ("model" if full_model else f"{config.method} adapter")
            api.upload_folder(
                repo_id=repo_id,
                folder_path=stage,
                commit_message=f"Upload {kind} from Finetune Studio run {run.name}",
                commit_description=f"Files: {', '.join(files)}",
            )
    log.info("pushed run %s to %s (%d files)", run.name, url, len(files))
    say(f"Pushed to {url}")
    return str(url)


def _stage_gguf(run: RunDir, quant: str, stage: Path, say: Any) -> str:
    """Export the run as GGUF beside the staged files (the .gguf and its Modelfile); returns the .gguf's name."""
    from finetune.publish.export import export_run

    with tempfile.TemporaryDirectory(prefix="finetune-gguf-") as tmp:
        result = export_run(run.path, "gguf", quant, out=Path(tmp) / "gguf", progress=say)
        for item in result.folder.iterdir():
            if item.is_file():
                shutil.copy2(item, stage / item.name)
        return result.main.name


# ------------------------------------------------------------------------------------------------- checks


def hub_endpoint() -> str:
    """The Hub to talk to: `HF_ENDPOINT` at call time, else the client's default."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT", "").strip() or constants.ENDPOINT).rstrip("/")


def token_user(token: str) -> str | None:
    """The Hub user a token belongs to (whoami), or None when the Hub refuses it or cannot be reached."""
    from huggingface_hub import HfApi

    try:
        info = HfApi(endpoint=hub_endpoint(), library_name="finetune-studio").whoami(token=token)
    except Exception:  # a bad token, no network, an offline hub: no identity, never an error page
        return None
    name = info.get("name") if isinstance(info, dict) and info.get("type", "user") == "user" else None
    return str(name) if name else None


def resolve_token(token: str | None, allow_env: bool = True) -> str:
    """The token to use: the given one, else (if allow_env) `HF_TOKEN`, else a stored `hf auth login`."""
    if token and token.strip():
        return token.strip()
    if not allow_env:
        raise UserError(
            "token: no Hugging Face token; sign in with Hugging Face, or paste a write token in the token field "
            f"(create one at {TOKEN_PAGE})",
            field="token",
        )
    for candidate in (os.environ.get(TOKEN_ENV), _stored_token()):
        if candidate and candidate.strip():
            return candidate.strip()
    raise UserError(
        "no Hugging Face token: paste a write token in the Publish tab's token field, set the HF_TOKEN environment "
        f"variable, or add HF_TOKEN as a secret in your Space's settings (create a token at {TOKEN_PAGE})",
        field="token",
    )


def _stored_token() -> str | None:
    try:
        from huggingface_hub import get_token

        return get_token()
    except Exception:  # a broken token file must not hide the clear "no token" message
        return None


def check_repo_id(repo_id: str) -> str:
    """`OWNER/NAME` with the Hub's naming rules, or a UserError saying what is wrong."""
    repo_id = (repo_id or "").strip()
    if repo_id.startswith(("https://", "http://")):
        repo_id = re.sub(r"^https?://[^/]+/", "", repo_id).strip("/")
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts):
        raise UserError(f"repo id: expected OWNER/NAME (like alice/pirate-lora), got {repo_id!r}", field="repo_id")
    for part in parts:
        if not _NAME.match(part) or "--" in part or ".." in part or part.endswith(".git") or len(part) > 96:
            raise UserError(
                f"repo id: {part!r} is not a valid name: use letters, digits, '-', '_' or '.', start and end with a "
                "letter or digit, no '--' or '..', at most 96 characters",
                field="repo_id",
            )
    return repo_id


def resolve_run_dir(run_dir: str | Path) -> RunDir:
    """A finished run: a directory (or a run name under the runs root) with a final adapter or model."""
    from finetune.paths import runs_root
    from finetune.runs.rundir import find_finished_run

    return find_finished_run(run_dir, runs_root(), "publish")


# ------------------------------------------------------------------------------------------------- staging


def _stage_files(run: RunDir, stage: Path, patterns: tuple[str, ...]) -> list[str]:
    """Link (or copy) the run's top-level files that match `patterns` into the staging folder."""
    staged = []
    for pattern in patterns:
        for source in sorted(run.path.glob(pattern)):
            target = stage / source.name
            if not source.is_file() or target.exists():
                continue
            try:
                target.symlink_to(source.resolve())
            except OSError:
                shutil.copy2(source, target)
            staged.append(source.name)
    return staged


def _rewrite_adapter_base(stage: Path, config: TrainConfig) -> None:
    """Point the pushed adapter_config.json at the base model's Hub id, or at nothing when none is on record.

    The local path training saved there means nothing elsewhere and shows this machine's folders.
    """
    path = stage / "adapter_config.json"
    if not path.is_file():
        return
    data = public_adapter_config(json.loads(path.read_text(encoding="utf-8")), config)
    path.unlink()  # a link into the run directory: replace it, never write through it
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _stage_merged(run: RunDir, config: TrainConfig, stage: Path, token: str) -> None:
    """Load the base, apply the LoRA adapter, merge it into the weights and save the full model into `stage`."""
    import torch
    from peft import PeftModel

    from finetune.model.inference import label_names

    plan = run.load_plan()  # the run's own: its model class
    model_cls = plan.auto_class()
    kwargs: dict = {}
    if plan.is_classifier:
        names = label_names(run.path, config)  # the run's class names, so the merged model answers with them
        kwargs.update(
            num_labels=len(names), id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)}
        )
    base = _load_base(config, model_cls, token, **kwargs)
    with torch.no_grad():
        model = PeftModel.from_pretrained(base, str(run.path))
        model = model.merge_and_unload()
    model.save_pretrained(str(stage))
    del model, base


def _load_base(config: TrainConfig, model_cls, token: str, **kwargs):
    """The base model in its saved precision, from where the run took it (the embedded one from its cache)."""
    from finetune.model.loading import resolve_model_path

    path = resolve_model_path(config.model)  # the embedded model: its converted safetensors cache
    hub_kwargs = {} if Path(path).is_dir() else {"token": token}
    try:
        return model_cls.from_pretrained(
            path, dtype="auto", trust_remote_code=config.trust_remote_code, **hub_kwargs, **kwargs
        )
    except OSError as exc:
        raise UserError(f"--merged: cannot load the base model {config.model}: {_first_line(exc)}") from None


# --------------------------------------------------------------------------------------------- license, token


def _license_from_hub(api, summary, token: str) -> str | None:
    """The base model's license: offline knowledge first, then its model card on the Hub (best effort)."""
    assert summary.base is not None
    license_id = known_license(summary.config, summary.base)
    if license_id or not summary.base.hub_id:
        return license_id
    try:
        info = api.model_info(summary.base.hub_id, token=token)
    except Exception:  # unknown license is stated in the card; it must not stop the push
        return None
    card = getattr(info, "card_data", None)
    value = getattr(card, "license", None) if card is not None else None
    return value if isinstance(value, str) and value else None


def _check_no_token(stage: Path, token: str) -> None:
    """Refuse to upload if any staged text file contains the token (defence in depth; nothing should)."""
    needle = token.encode()
    for path in stage.rglob("*"):
        if not path.is_file() or path.stat().st_size > _TEXT_SCAN_LIMIT:
            continue
        if needle in path.read_bytes():
            raise UserError(f"refusing to publish: {path.name} contains the Hub token; remove it from that file")


@contextlib.contextmanager
def _redacting(token: str) -> Iterator[None]:
    """Turn unexpected errors raised while staging into UserErrors whose text cannot contain the token."""
    try:
        yield
    except UserError as exc:
        if token in str(exc):
            raise UserError(str(exc).replace(token, "***"), field=exc.field) from None
        raise


@contextlib.contextmanager
def _hub_errors(repo_id: str, endpoint: str, token: str) -> Iterator[None]:
    """Map Hub client errors to one-line UserErrors that never include the token."""
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    owner = repo_id.split("/")[0]
    try:
        yield
    except UserError:
        raise
    except OfflineModeIsEnabled:
        raise UserError("cannot publish while offline mode is on (HF_HUB_OFFLINE=1): unset it and try again") from None
    except HfHubHTTPError as exc:
        code = exc.response.status_code if exc.response is not None else None
        if code == 401:
            message = (
                f"Hugging Face token rejected by {endpoint} (401: invalid or expired); create a write token at "
                f"{TOKEN_PAGE} and paste it again"
            )
        elif code == 403:
            message = (
                f"token rejected for {repo_id} (403): it cannot write to '{owner}'; use a token with the write role, "
                "or a fine-grained token allowed to write to that namespace"
            )
        elif code == 404:
            message = f"{repo_id} was not found on {endpoint} and could not be created (404); check the owner name"
        elif code == 429:
            message = "the Hub is rate-limiting this token (429); wait a minute and try again"
        elif code is not None and code >= 500:
            message = f"the Hub at {endpoint} failed ({code}); try again later"
        else:
            message = f"push to {repo_id} failed ({code}): {_server_message(exc)}"
        raise UserError(_redact(message, token)) from None
    except ValueError as exc:  # the Hub refused the model card metadata (validate-yaml)
        raise UserError(_redact(f"the Hub refused the model card: {_first_line(exc)}", token)) from None
    except OSError as exc:
        raise UserError(_redact(f"cannot reach the Hub at {endpoint}: {_first_line(exc)}", token)) from None
    except Exception as exc:
        if _is_transport_error(exc):
            raise UserError(
                _redact(f"cannot reach the Hub at {endpoint}: {type(exc).__name__}: {_first_line(exc)}", token)
            ) from None
        raise


def _is_transport_error(exc: BaseException) -> bool:
    for module in ("httpx2", "httpx"):
        try:
            request_error = __import__(module).RequestError
        except (ImportError, AttributeError):
            continue
        if isinstance(exc, request_error):
            return True
    return False


def _server_message(exc) -> str:
    response = exc.response
    try:
        data = response.json()
        text = data.get("error") if isinstance(data, dict) else None
    except Exception:  # not JSON
        text = None
    return _first_line(text or response.headers.get("X-Error-Message") or exc)


def _first_line(value) -> str:
    lines = [line.strip() for line in str(value).splitlines() if line.strip()]
    return (lines[0] if lines else type(value).__name__)[:300]


def _redact(message: str, token: str) -> str:
    return message.replace(token, "***") if token else message
