"""The one facade the web UI talks to. It takes plain form values, builds a `TrainConfig`, and calls the backend.

No gradio here; every method returns plain data (dicts, lists, dataclasses) or raises `UserError` with a
one-line message.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from finetune.config import FIELDS, TrainConfig
from finetune.errors import ConfigError, UserError
from finetune.progress import TrainingState
from finetune.rundir import RunDir
from finetune.runs import RunManager

BASE = "base"


class Studio:
    """Backend facade for one app process: config, memory, data preview, runs, chat and publish."""

    def __init__(self, runs_root: Path | None = None, chat_cache_size: int = 2) -> None:
        self.manager = RunManager(runs_root)
        self._chat_models: OrderedDict[str, tuple[Any, Any]] = OrderedDict()
        self._chat_lock = threading.Lock()  # one generation at a time: requests queue instead of thrashing the CPU/GPU
        self._chat_cache_size = chat_cache_size

    # ----------------------------------------------------------------- config
    @staticmethod
    def default_values() -> dict[str, Any]:
        """The form's initial values (the defaults give a short demo)."""
        return TrainConfig().to_dict()

    @staticmethod
    def check(values: dict[str, Any]) -> tuple[TrainConfig | None, dict[str, str]]:
        """(config, {}) when valid, else (None, {field: one-line error}) for every bad field."""
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
        problems = config.errors()
        if problems:
            return None, {p.field or "config": str(p) for p in problems}
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
        return TrainConfig.from_yaml(text)

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
        return self.manager.resume(self._run(run_id).path, owner=owner)

    def stop(self) -> bool:
        return self.manager.stop()

    def state(self) -> TrainingState | None:
        return self.manager.state()

    def runs(self) -> list[dict[str, Any]]:
        return self.manager.runs()

    def events(self, run_id: str, types: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        """The run's events (log, eval, samples, message, status ...)."""
        return self._run(run_id).read_events(types)

    def run_config(self, run_id: str) -> TrainConfig:
        return self._run(run_id).load_config()

    def _run(self, run_id: str) -> RunDir:
        """A run by its folder name, confined to the runs root."""
        path = (self.manager.root / run_id).resolve()
        if path.parent != self.manager.root.resolve() or not RunDir(path).exists():
            raise UserError(f"run: {run_id!r} is not a run in {self.manager.root}", field="run")
        return RunDir(path)

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

    def chat(
        self, source: str, messages: list[dict[str, str]], settings: Any, base_values: dict | None = None
    ) -> Iterator[str]:
        """Stream a reply from the base model or a run's weights; yields the text so far."""
        from finetune.inference import stream_reply

        model, tokenizer = self._chat_model(source, base_values)
        with self._chat_lock:
            yield from stream_reply(model, tokenizer, messages, settings)

    def _chat_model(self, source: str, base_values: dict | None) -> tuple[Any, Any]:
        from finetune.inference import adapter_dir, load_for_chat

        if source == BASE:
            config = self.config(base_values or {})
            key, run_path = f"base:{config.model}", None
        else:
            run = self._run(source)
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

    # ----------------------------------------------------------------- publish
    def push(self, run_id: str, repo_id: str, token: str | None, private: bool = False, merged: bool = False) -> str:
        """Push a run's adapter (or merged model) to the Hub; returns the repo URL."""
        from finetune import hub

        return hub.push_run(self._run(run_id).path, repo_id, token=token or None, private=private, merged=merged)
