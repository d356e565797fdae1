"""The one facade the web UI talks to. It takes plain form values, builds a `TrainConfig`, and calls the backend.

No gradio here; every method returns plain data (dicts, lists, dataclasses) or raises `UserError` with a
one-line message. What a visitor may use (server paths, remote code, the server's Hub token) is decided by the
`AccessPolicy` the app was started with (finetune/access.py) and enforced here, so an API client is held to the same
rules as the page.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from finetune.access import DATA_SUFFIXES, AccessPolicy
from finetune.config import FIELDS, TrainConfig
from finetune.errors import ConfigError, UserError
from finetune.inference import Classification, GenerationSettings
from finetune.progress import TrainingState
from finetune.rundir import RunDir, find_run
from finetune.runs import RunManager

BASE = "base"
BASE_OF = "base-of:"  # chat source: the model a run started from (`base-of:RUN_ID`), whatever the form says now
UPLOAD_LIMIT_BYTES = 200 * 1024**2  # one uploaded data file
RUN_ID_LIMIT = 200  # characters of a run id (folder names are shorter)
TOKEN_LIMIT = 4096  # characters of a pasted Hub token
CHAT_MESSAGE_LIMIT = 8000  # characters of one chat message (or the system prompt)
CHAT_CONVERSATION_LIMIT = 64000  # characters of the whole conversation sent to the model
CHAT_TURNS_LIMIT = 200  # messages in one conversation
CHAT_MAX_NEW_TOKENS = 1024
DOWNLOAD_KEEP_SECONDS = 3600  # a downloaded YAML file is removed after an hour


class Studio:
    """Backend facade for one app process: config, memory, data preview, runs, chat and publish."""

    def __init__(
        self, runs_root: Path | None = None, chat_cache_size: int = 2, policy: AccessPolicy | None = None
    ) -> None:
        self.manager = RunManager(runs_root)
        self.policy = policy or AccessPolicy.local()
        self._chat_models: OrderedDict[str, tuple[Any, ...]] = OrderedDict()  # chat: (model, tokenizer); +names
        self._chat_lock = threading.Lock()  # one generation at a time: requests queue instead of thrashing the CPU/GPU
        self._chat_cache_size = chat_cache_size
        self._uploads: set[str] = set()  # files uploaded to this app since it started (allowed as data when public)
        self._uploads_lock = threading.Lock()

    @property
    def uploads_dir(self) -> Path:
        """Where uploaded data files are kept (next to the runs folder)."""
        return Path(self.manager.root).parent / "uploads"

    @property
    def downloads_dir(self) -> Path:
        """Where settings are written for the browser to download (one file per distinct settings, pruned)."""
        return Path(self.manager.root).parent / "downloads"

    # ----------------------------------------------------------------- config
    @staticmethod
    def default_values() -> dict[str, Any]:
        """The form's initial values (the defaults give a short demo)."""
        return TrainConfig().to_dict()

    def check(self, values: dict[str, Any]) -> tuple[TrainConfig | None, dict[str, str]]:
        """(config, {}) when valid and allowed, else (None, {field: one-line error}) for every bad field.

        Cheap (no file or network access): the form runs it after each edit. `verify` adds Start's own checks."""
        clean = {k: v for k, v in values.items() if k in FIELDS}
        unknown = [k for k in values if k not in FIELDS]
        if unknown:
            try:
                TrainConfig.from_dict({unknown[0]: values[unknown[0]]})
            except ConfigError as exc:
                return None, {unknown[0]: str(exc)}
        config = TrainConfig.__new__(TrainConfig)
        for name, f in FIELDS.items():
            default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
            setattr(config, name, clean.get(name, default))
        problems = {p.field or "config": str(p) for p in config.errors()}
        allowed = self.policy.problems(config.to_dict() if not problems else clean, self._uploads)
        problems.update({k: v for k, v in allowed.items() if k not in problems})
        if problems:
            return None, problems
        return config, {}

    def verify(self, values: dict[str, Any]) -> tuple[TrainConfig | None, dict[str, str]]:
        """As `check`, plus every check Start makes before a run exists (the model and data can be found, the data
        file reads, output_dir is free): Check and Start give the same verdict. Loads no model."""
        config, problems = self.check(values)
        if config is None:
            return None, problems
        try:
            self.manager.check_start(config, confine=True)
        except UserError as exc:
            field = getattr(exc, "field", None)
            return None, {field if field in FIELDS else "config": str(exc)}
        except Exception as exc:  # what Start would report as one line
            return None, {"config": _one_line(exc)}
        return config, {}

    def config(self, values: dict[str, Any]) -> TrainConfig:
        """A valid config from form values, or the first problem as a `ConfigError`."""
        config, problems = self.check(values)
        if config is None:
            field, message = next(iter(problems.items()))
            raise ConfigError(message, field=field)
        return config

    @staticmethod
    def config_from_yaml(text: str) -> TrainConfig:
        """A config from YAML text, through the backend's bounded parser (one-line `ConfigError` otherwise)."""
        return TrainConfig.from_yaml(text)

    def save_yaml(self, config: TrainConfig) -> Path:
        """The settings as a YAML file to download: one file per distinct settings in `downloads_dir`, files older
        than an hour removed; no folder is made per download."""
        from finetune.atomic import write_text

        text = config.to_yaml()
        folder = self.downloads_dir
        folder.mkdir(parents=True, exist_ok=True)
        now = time.time()
        for old in folder.glob("finetune-*.yaml"):
            try:
                if now - old.stat().st_mtime > DOWNLOAD_KEEP_SECONDS:
                    old.unlink()
            except OSError:
                pass  # another request removed it first
        path = folder / f"finetune-{hashlib.sha256(text.encode('utf-8')).hexdigest()[:12]}.yaml"
        write_text(path, text)
        return path

    def add_upload(self, source: str | Path, name: str | None = None) -> str:
        """Keep an uploaded data file under `uploads_dir` with a name of its own (two uploads never overwrite each
        other) and allow it as `dataset` / `eval_split`; returns its path."""
        source = Path(source)
        name = name or source.name
        if Path(name).suffix.lower() not in DATA_SUFFIXES:
            raise UserError(f"dataset: {_safe_name(name)} is not a {' / '.join(DATA_SUFFIXES)} file", field="dataset")
        try:
            size = source.stat().st_size
        except OSError:
            raise UserError(f"dataset: the upload of {_safe_name(name)} did not arrive; try again", "dataset") from None
        if size > UPLOAD_LIMIT_BYTES:
            raise UserError(
                f"dataset: {_safe_name(name)} is larger than the {UPLOAD_LIMIT_BYTES // 1024**2} MB allowed", "dataset"
            )
        folder = self.uploads_dir
        folder.mkdir(parents=True, exist_ok=True)
        while True:
            target = folder / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}-{_safe_name(name)}"
            try:
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue
            break
        try:
            with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
                shutil.copyfileobj(src, out)
        except BaseException:
            target.unlink(missing_ok=True)
            raise
        with self._uploads_lock:
            self._uploads.add(str(target))
        return str(target)

    # ----------------------------------------------------------------- memory, data, commands
    def estimate(
        self, values: dict[str, Any], device: str = "cuda", gpus: int = 1, gpu_gib: float | None = None
    ) -> Any:
        """The memory estimate (breakdown, fit verdict, advice) for these settings."""
        from finetune import memory

        return memory.estimate(self.config(values), device=device, gpus=gpus, gpu_gib=gpu_gib)

    def preview_data(self, values: dict[str, Any], n: int = 3) -> dict[str, Any]:
        """The first examples as the model sees them, with what is masked from the loss."""
        from finetune import data, models

        config = self.config(values)
        return data.preview(config, models.load_tokenizer(config), n=n)

    def commands(self, values: dict[str, Any], gpus: int = 2, nodes: int = 2) -> dict[str, str]:
        """The CLI, torchrun and deepspeed commands that run these settings."""
        from finetune.launch import launch_commands
        from finetune.runs import unique_run_path

        config = self.config(values)
        # Multi-process runs need their folder fixed in advance: one under this app's runs root, so the app lists it.
        output_dir = None if config.output_dir else unique_run_path(self.manager.root, config)
        return launch_commands(config, gpus=gpus, nodes=nodes, output_dir=output_dir)

    # ----------------------------------------------------------------- runs
    def start(self, values: dict[str, Any], owner: str = "the web app") -> TrainingState:
        """Start a run in the background (output_dir confined to the runs folder)."""
        return self.manager.start(self.config(values), owner=owner, confine=True)

    def resume(self, run_id: str, owner: str = "the web app") -> TrainingState:
        """Continue a stopped, interrupted or failed run of the runs folder from its last checkpoint."""
        run = self._run(run_id)
        self._check_run_allowed(run)
        return self.manager.resume(run.path, owner=owner)

    def stop(self) -> bool:
        return self.manager.stop()

    def state(self) -> TrainingState | None:
        return self.manager.state()

    @staticmethod
    def gpu_cards() -> dict[str, float]:
        """Common GPU cards (name → GiB) the Memory tab offers."""
        from finetune.memory import GPU_CARDS

        return {str(k): float(v) for k, v in dict(GPU_CARDS).items()}

    def run_stamp(self, run_id: str) -> tuple:
        """(size, mtime) of a run's event log and status file: changes whenever the run writes (cheap, for polling;
        a run of another process is followed through its files)."""
        run = RunDir(self.manager.root / Path(run_id).name)  # a run id names a folder of the runs root
        return (_file_stamp(run.events_path), _file_stamp(run.status_path))

    def runs(self) -> list[dict[str, Any]]:
        return self.manager.runs()

    def events(self, run_id: str, types: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        """The run's events (log, eval, samples, message, status ...)."""
        return self._run(run_id).read_events(types)

    def run_config(self, run_id: str) -> TrainConfig:
        """The settings a run was started with."""
        return self._run(run_id).load_config()

    def _run(self, run_id: str) -> RunDir:
        """A run by its folder name, confined to the runs root (`rundir.find_run`'s rule for the app)."""
        try:
            return find_run(run_id, self.manager.root, field="run", confine=True)
        except UserError:
            shown = repr(run_id[:RUN_ID_LIMIT]) if isinstance(run_id, str) else "that"
            where = "the runs folder" if self.policy.public else str(self.manager.root)  # no server paths to visitors
            raise UserError(f"run: {shown} is not a run in {where}", field="run") from None

    def _check_run_allowed(self, run: RunDir) -> None:
        """Refuse a run whose settings need what visitors may not use (its model's own code)."""
        try:
            values = run.load_config().to_dict()
        except UserError:
            return  # the backend reports an unreadable config in its own words
        refusal = self.policy.refuses_run(values)
        if refusal:
            raise UserError(refusal, field="trust_remote_code")

    # ----------------------------------------------------------------- chat
    def chat_sources(self) -> list[tuple[str, str]]:
        """(label, value) pairs: the base model, finished runs, and the running run's latest checkpoint."""
        sources = [("Base model", BASE)]
        for run in self.runs():
            run_dir = RunDir(Path(run["run_dir"]))
            if run_dir.has_final_model():
                sources.append((f"{run['run_id']} (final)", run["run_id"]))
            elif run_dir.last_checkpoint() is not None:
                step = run_dir.last_checkpoint().name.split("-")[-1]
                sources.append((f"{run['run_id']} (checkpoint {step}, {run['status']})", run["run_id"]))
        return sources

    @staticmethod
    def check_chat(messages: list[dict[str, Any]], settings: Any = None) -> None:
        """Refuse, in one line, a conversation or settings beyond the chat's bounds (before any model loads)."""
        if not isinstance(messages, list) or len(messages) > CHAT_TURNS_LIMIT:
            raise UserError(
                f"chat: a conversation holds at most {CHAT_TURNS_LIMIT} messages; press Clear to start a new one",
                field="message",
            )
        total = 0
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if not isinstance(content, str):
                raise UserError("chat: each message needs text content", field="message")
            if len(content) > CHAT_MESSAGE_LIMIT:
                raise UserError(
                    f"message: {len(content)} characters is too long (at most {CHAT_MESSAGE_LIMIT}); shorten it",
                    field="message",
                )
            total += len(content)
        if total > CHAT_CONVERSATION_LIMIT:
            raise UserError(
                f"chat: the conversation is {total} characters, more than the {CHAT_CONVERSATION_LIMIT} allowed; "
                "press Clear to start a new one",
                field="message",
            )
        if settings is None:
            return
        tokens = getattr(settings, "max_new_tokens", 1)
        if not isinstance(tokens, int) or not 1 <= tokens <= CHAT_MAX_NEW_TOKENS:
            raise UserError(f"max new tokens: use 1 to {CHAT_MAX_NEW_TOKENS}", field="max_new_tokens")
        temperature, top_p = getattr(settings, "temperature", 0.0), getattr(settings, "top_p", 1.0)
        if not 0.0 <= float(temperature) <= 2.0:
            raise UserError("temperature: use 0 to 2", field="temperature")
        if not 0.0 < float(top_p) <= 1.0:
            raise UserError("top-p: use a number above 0 and at most 1", field="top_p")
        if len(getattr(settings, "system_prompt", "") or "") > CHAT_MESSAGE_LIMIT:
            raise UserError(f"system prompt: longer than {CHAT_MESSAGE_LIMIT} characters; shorten it", "system_prompt")

    def chat(
        self, source: str, messages: list[dict[str, str]], settings: Any, base_values: dict | None = None
    ) -> Iterator[str]:
        """Stream a reply from the base model (`base`: the form's model; `base-of:RUN`: the model a run started
        from) or a run's weights; yields the text so far."""
        from finetune.inference import stream_reply

        self.check_chat(messages, settings)
        model, tokenizer = self._chat_model(source, base_values)
        with self._chat_lock:
            yield from stream_reply(model, tokenizer, messages, settings)

    def _chat_model(self, source: str, base_values: dict | None) -> tuple[Any, Any]:
        from finetune.inference import adapter_dir, load_for_chat

        if source == BASE:
            config = self.config(base_values or {})
            key, run_path = f"base:{config.model}", None
        elif isinstance(source, str) and source.startswith(BASE_OF):
            run = self._run(source[len(BASE_OF) :])
            self._check_run_allowed(run)
            config, run_path = run.load_config(), None
            key = f"base:{config.model}"
        else:
            run = self._run(source)
            self._check_run_allowed(run)
            config, run_path = run.load_config(), run.path
            weights = adapter_dir(run.path)
            key = f"{source}:{weights}"  # a newer checkpoint of a running run loads afresh
        with self._chat_lock:
            if key in self._chat_models:
                self._chat_models.move_to_end(key)
                return self._chat_models[key]
            loaded = load_for_chat(config, run_path)
            self._chat_models[key] = loaded
            while len(self._chat_models) > self._chat_cache_size:
                self._chat_models.popitem(last=False)
            return loaded

    # ----------------------------------------------------------------- classifier
    def source_kind(self, source: str | None) -> str:
        """How a chat source answers: "classifier" for a sequence-classification run (text in, labels and scores
        out), "chat" for everything else."""
        if not isinstance(source, str) or source == BASE or source.startswith(BASE_OF):
            return "chat"
        try:
            config = self._run(source).load_config()
        except UserError:
            return "chat"  # an unknown run: the chat itself reports it in its own words
        return "classifier" if config.task == "sequence_classification" else "chat"

    def classify(self, source: str, text: str, text_pair: str = "") -> Classification:
        """Every label's probability for a text (and optional second text) from a sequence-classification run."""
        from finetune.inference import adapter_dir, classify, load_classifier

        for name, value in (("text", text), ("second text", text_pair)):
            if not isinstance(value, str) or len(value) > CHAT_MESSAGE_LIMIT:
                raise UserError(f"{name}: give text of at most {CHAT_MESSAGE_LIMIT} characters", field=name)
        if not text.strip():
            raise UserError("text: empty; type the text to classify", field="text")
        run = self._run(source)
        self._check_run_allowed(run)
        config = run.load_config()
        key = f"classify:{source}:{adapter_dir(run.path)}"  # a newer checkpoint of a running run loads afresh
        with self._chat_lock:
            if key not in self._chat_models:
                self._chat_models[key] = load_classifier(config, run.path)
                while len(self._chat_models) > self._chat_cache_size:
                    self._chat_models.popitem(last=False)
            self._chat_models.move_to_end(key)
            model, tokenizer, names = self._chat_models[key]
            return classify(model, tokenizer, names, text.strip(), text_pair.strip(), config.max_seq_length)

    # ----------------------------------------------------------------- publish
    def push(
        self,
        run_id: str,
        repo_id: str,
        token: str | None,
        private: bool = False,
        merged: bool = False,
        gguf: str | None = None,
    ) -> str:
        """Push a run's adapter (or merged model) to the Hub with the visitor's token; returns the repo URL.

        The server's own token (HF_TOKEN, a stored login) is used only where the policy lends it: the local app, or
        a public one whose operator passed --lend-server-token (with --auth)."""
        from finetune.publish import hub

        token = (token or "").strip() or None
        if token is not None and (len(token) > TOKEN_LIMIT or any(c.isspace() for c in token)):
            raise UserError("token: that is not a Hugging Face token (hf_…)", field="token")
        if token is None and not self.policy.lend_server_token:
            how = (
                "sign in with Hugging Face (the button at the top of the page) or paste"
                if self.policy.space
                else ("paste")
            )
            raise UserError(
                f"token: {how} a Hub token with write access; this public app does not lend the server's token",
                field="token",
            )
        run = self._run(run_id)
        return hub.push_run(
            run.path,
            repo_id,
            token=token,
            private=private,
            merged=merged,
            allow_env_token=self.policy.lend_server_token,
            gguf=gguf or None,
        )

    # ----------------------------------------------------------------- export
    def export(self, run_id: str, fmt: str, quant: str | None = None, progress: Any = None) -> Any:
        """Export a finished run under its exports/ folder (merged model, or GGUF + Modelfile); an ExportResult."""
        from finetune.publish import export

        run = self._run(run_id)
        self._check_run_allowed(run)  # the merge loads the base model: the same rule as chat
        return export.export_run(run.path, fmt, quant=quant, progress=progress)


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:300]


def _safe_name(name: str) -> str:
    """A file name safe to keep: letters, digits and . _ -, at most 80 characters, keeping its suffix."""
    path = Path(str(name).replace("\\", "/")).name
    suffix = Path(path).suffix.lower()
    suffix = suffix if suffix in DATA_SUFFIXES else ""
    stem = path[: len(path) - len(suffix)] if suffix else path
    keep = "".join(c if c.isalnum() or c in "._-" else "_" for c in stem).lstrip(".")
    return (keep[:80] or "data") + suffix


def _file_stamp(path: Path) -> tuple[int, float]:
    try:
        st = path.stat()
    except OSError:
        return (0, 0.0)
    return (st.st_size, st.st_mtime)


__all__ = ["BASE", "BASE_OF", "Classification", "GenerationSettings", "Studio"]
