"""The one facade the web UI talks to. It takes plain form values, builds a `TrainConfig`, and calls the backend.

No gradio here; every method returns typed data (one dataclass per kind of answer: `TrainConfig`, `RunSummary`,
`TrainingState`, the estimate, ...) or raises `UserError` with a one-line message naming its field
(`field_problem` turns any error into that {field: message} pair, the one way the UI shows it). What a visitor may
use (server paths, remote code, the server's Hub token) is decided by the `AccessPolicy` the app was started with
(finetune/access/policy.py) and enforced here, so an API client is held to the same rules as the page.

Who asks matters on a public app: `studio.as_visitor(user)` is the same studio acting for one visitor (their login or
Hugging Face name, None when anonymous). It finds, lists, follows and acts on that visitor's own runs and uploads only
(an admin's: all); another visitor's run gets the same refusal as a run that does not exist.
"""

from __future__ import annotations

import copy
import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune import objectives
from finetune.access.policy import AccessPolicy
from finetune.access.uploads import Uploads, is_upload
from finetune.cluster import scheduler, slurm
from finetune.config import FIELDS, TrainConfig, field_kind, field_label, field_optional
from finetune.data.images import IMAGE_TAG  # noqa: F401 - the chat's picture tag, for the UI and the API
from finetune.errors import BusyError, ConfigError, UserError
from finetune.model.inference import MAX_NEW_TOKENS, Classification, GenerationSettings
from finetune.paths import BUNDLED
from finetune.plan import RunPlan
from finetune.runs.events import (
    CheckpointEvent,
    CompletionsEvent,
    EvalEvent,
    Event,
    LogEvent,
    MessageEvent,
    SamplesEvent,
    SavedEvent,
    StatusEvent,
)
from finetune.runs.manager import RunManager
from finetune.runs.progress import TrainingState
from finetune.runs.rundir import RunDir, find_run, list_runs

BASE = "base"
BASE_OF = "base-of:"  # chat source: the model a run started from (`base-of:RUN_ID`), whatever the form says now
RUN_ID_LIMIT = 200  # characters of a run id (folder names are shorter)
TOKEN_LIMIT = 4096  # characters of a pasted Hub token
CHAT_MESSAGE_LIMIT = 8000  # characters of one chat message (or the system prompt)
CHAT_CONVERSATION_LIMIT = 64000  # characters of the whole conversation sent to the model
CHAT_TURNS_LIMIT = 200  # messages in one conversation
CHAT_IMAGES_LIMIT = 16  # images in one conversation (a vision-language model's chat)
TEXT_ONLY_CHAT = (
    "images: this model reads text only; choose a vision-language model (or a run of one) to send a picture"
)
CHAT_MAX_NEW_TOKENS = MAX_NEW_TOKENS
PREVIEW_LIMIT = 50  # examples one data preview shows
DOWNLOAD_KEEP_SECONDS = 3600  # a downloaded YAML file is removed after an hour
RUNS_COMPARED = 8  # runs shown side by side at most
TOKEN_USER_SECONDS = 600  # how long the Hub user of an API client's token is remembered


NUMBER_TYPES = ("int", "float")


@dataclass(frozen=True)
class RunSummary:
    """One run of the runs folder as the app lists it: what it trains, where it stands (the live step for the run
    training now), and what can be done with it."""

    run_id: str
    status: str
    step: int = 0
    max_steps: int = 0
    loss: float | None = None
    eval_loss: float | None = None
    started_at: float | None = None
    owner: str = ""
    model: str = ""  # a short name: the Hub id's or folder's last part, never a server path
    method: str = ""  # full | lora | qlora
    objective: str = objectives.DEFAULT  # the objectives registry's record name
    resumable: bool = False
    final: bool = False  # the final adapter / model is saved (chat, export and publish use it)
    checkpoint_step: int | None = None  # the newest complete checkpoint
    evaluation: str = ""  # the latest evaluation in a few words ("ROUGE-L 0.42 (base 0.10)"), "" when none

    @property
    def active(self) -> bool:
        return self.status in ("pending", "loading", "running", "stopping")


@dataclass(frozen=True)
class RunPreview:
    """What Start would run with these settings, in a few facts (the Train tab shows it before Start)."""

    model: str
    dataset: str
    method: str
    objective: str
    max_steps: int
    epochs: float
    effective_batch: int
    max_seq_length: int
    device: str  # where it would train: cuda | cpu
    processes: int = 1
    estimate_bytes: int | None = None  # peak memory per device; None when it could not be estimated
    estimate_note: str = ""  # why there is no estimate
    packing: bool = False  # micro batches without padding (the plan's decision)
    packing_note: str = ""  # the plan's reason, in one line


def field_problem(exc: BaseException, default_field: str = "config") -> dict[str, str]:
    """{field: one-line message} for an error: its own field when it names a form field, else `default_field`."""
    field = getattr(exc, "field", None)
    message = str(exc) if isinstance(exc, UserError) else _one_line(exc)
    return {field if field in FIELDS else default_field: message}


def _data_problem(config: TrainConfig) -> dict[str, str]:
    """{field: one-line message} when the training data cannot be found or read, else {}."""
    from finetune.runs.preflight import data_ready

    try:
        data_ready(config)
    except Exception as exc:
        return field_problem(exc, "dataset")
    return {}


def short_model_name(model: str) -> str:
    """A model as a person reads it in a list: the last part of a Hub id or folder, never the whole server path."""
    text = str(model or "").rstrip("/\\")
    if text.startswith("embedded:"):
        return text.split(":", 1)[1]
    return text.replace("\\", "/").rsplit("/", 1)[-1] or "?"


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
        self._eval_lock = threading.Lock()  # one evaluation at a time (each loads models); others wait their turn
        self._evaluated = {"at": 0.0}  # when this app last wrote an evaluation (shared by every visitor's view)
        self.user: str | None = None  # the visitor this studio acts for (`as_visitor`); None: anonymous
        self._token_users: dict[str, tuple[str | None, float]] = {}  # sha256(token) -> (Hub user, until)
        self.uploads = Uploads(Path(self.manager.root).parent / "uploads", self.policy.uploads)
        self.prune_uploads()

    def as_visitor(self, user: str | None) -> Studio:
        """This studio acting for one visitor (`user`: their login or Hugging Face name; None: anonymous). It shares
        the runs, the chat models and the locks; only whose runs and uploads it sees differs."""
        view = copy.copy(self)
        view.user = str(user) if user else None
        return view

    def token_user(self, token: str) -> str | None:
        """The Hub user an API client's token belongs to (on a Space, that names the visitor); asked once per token
        every ten minutes, None when the Hub refuses it."""
        from finetune.publish.hub import token_user

        key = hashlib.sha256(token.encode("utf-8")).hexdigest()
        now = time.monotonic()
        known = self._token_users.get(key)
        if known is None or known[1] < now:
            known = (token_user(token), now + TOKEN_USER_SECONDS)
            self._token_users[key] = known
        return known[0]

    @property
    def identity(self) -> str | None:
        """Whom this visitor's runs and uploads belong to (None: an anonymous visitor who may not train)."""
        return self.policy.identity(self.user)

    @property
    def uploads_dir(self) -> Path:
        """Where this visitor's uploaded data files are kept (next to the runs folder)."""
        identity = self.identity
        return self.uploads.folder(identity) if identity is not None else self.uploads.root

    def prune_uploads(self) -> list[Path]:
        """Remove uploads older than the operator's limit that no run trains on; returns what went."""
        texts = []
        for run in list_runs(self.manager.root):
            try:
                texts.append(run.config_path.read_text(encoding="utf-8"))
            except OSError:
                pass
        return self.uploads.prune(texts)

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

        Cheap (no file or network access): the form runs it after each edit. `verify` adds Start's own checks.
        An uploaded file is named `upload:NAME`: it becomes the file this visitor uploaded by that name."""
        values, missing = self._with_uploads(values)
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
        problems.update(_empty_numbers(clean))  # "Learning rate: empty; give a number", not "None is not a number"
        mine = [str(p) for p in self.uploads.files(self.identity)] if self.identity is not None else []
        allowed = self.policy.problems(config.to_dict() if not problems else clean, mine)
        problems.update({k: v for k, v in allowed.items() if k not in problems})
        problems.update(missing)
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
        except Exception as exc:  # what Start would report, as one line beside its field
            problems = field_problem(exc)
            if "model" in problems:  # the data needs no model: both problems at once, not one per click
                problems.update(_data_problem(config))
            return None, problems
        return config, {}

    def config(self, values: dict[str, Any]) -> TrainConfig:
        """A valid config from form values, or the first problem as a `ConfigError`."""
        config, problems = self.check(values)
        if config is None:
            field, message = next(iter(problems.items()))
            raise ConfigError(message, field=field)
        return config

    def plan(self, values: dict[str, Any], device: str | None = None, gpus: int | None = None) -> RunPlan:
        """The run plan of form values on `device` with `gpus` processes (default: this machine, one process): what
        the estimate, the commands, the preview and the base model's chat are made from."""
        from finetune.plan import plan_for

        return plan_for(self.config(values), device=device, world_size=gpus)

    @staticmethod
    def config_from_yaml(text: str) -> TrainConfig:
        """A config from YAML text, through the backend's bounded parser (one-line `ConfigError` otherwise)."""
        return TrainConfig.from_yaml(text)

    def save_yaml(self, config: TrainConfig) -> Path:
        """The settings as `run.yaml` to download (the name the launch commands use): one small folder per distinct
        settings in `downloads_dir` (same settings, same file), those older than an hour removed."""
        from finetune.atomic import write_text

        text = config.to_yaml()
        folder = self.downloads_dir
        folder.mkdir(parents=True, exist_ok=True)
        now = time.time()
        for old in folder.glob("settings-*/run.yaml"):
            try:
                if now - old.stat().st_mtime > DOWNLOAD_KEEP_SECONDS:
                    old.unlink()
                    old.parent.rmdir()  # only ours: a settings-* folder that held just this file
            except OSError:
                pass  # another request removed it first
        path = folder / f"settings-{hashlib.sha256(text.encode('utf-8')).hexdigest()[:12]}" / "run.yaml"
        path.parent.mkdir(exist_ok=True)
        write_text(path, text)
        return path

    def add_upload(self, source: str | Path, name: str | None = None) -> str:
        """Keep an uploaded data file in this visitor's uploads folder under a name of its own (two uploads never
        overwrite each other); returns `upload:NAME`, the value `dataset` / `eval_split` take. Refused in one line,
        keeping nothing, for an anonymous visitor of a public app or past the operator's limits."""
        identity = self.identity
        if identity is None:
            raise UserError(self.policy.needs_identity("dataset", "upload data"), "dataset")
        self.prune_uploads()
        return self.uploads.add(identity, source, name)

    def add_uploads(self, files: list[tuple[str | Path, str]]) -> str:
        """Keep uploaded data: one data file as `add_upload`, or a data file with its images (several files, or one
        .zip holding both) kept together in a folder of their own; returns the data file's `upload:NAME`."""
        identity = self.identity
        if identity is None:
            raise UserError(self.policy.needs_identity("dataset", "upload data"), "dataset")
        if len(files) == 1 and not str(files[0][1]).lower().endswith(".zip"):
            return self.add_upload(*files[0])
        self.prune_uploads()
        return self.uploads.add_set(identity, files)

    def add_chat_image(self, chat_source: str, base_values: dict | None, source: str | Path, name: str) -> str:
        """Keep a picture sent to `chat_source` (as `chat` names it) among this visitor's uploads; refused in one
        line, keeping nothing, when that model reads text only. Returns its `upload:NAME`."""
        if not self.takes_images(chat_source, base_values):
            raise UserError(TEXT_ONLY_CHAT, "images")
        return self.add_image(source, name)

    def add_image(self, source: str | Path, name: str | None = None) -> str:
        """Keep an image for the chat in this visitor's uploads (the same limits); returns its `upload:NAME`."""
        identity = self.identity
        if identity is None:
            raise UserError(self.policy.needs_identity("images", "upload images"), "images")
        self.prune_uploads()
        return self.uploads.add_image(identity, source, name)

    def upload_names(self) -> list[str]:
        """This visitor's uploads as `upload:NAME` values, newest first."""
        if self.identity is None:
            return []
        return [self.uploads.name_of(self.identity, p) for p in reversed(self.uploads.files(self.identity))]

    def takes_images(self, source: str | None, base_values: dict | None = None) -> bool:
        """Whether a chat source is a vision-language model (the base: the form's model, from its config alone)."""
        from finetune.plan import vision_family

        try:
            if source in (None, "", BASE):
                model = str((base_values or {}).get("model") or "").strip()
                if self.policy.problems({"model": model}):  # a server path where visitors may not name one
                    return False
                return vision_family(model) is not None
            run = self._run(source[len(BASE_OF) :] if source.startswith(BASE_OF) else source)
            self._check_run_allowed(run)
            return run.load_plan().vision is not None
        except Exception:  # noqa: BLE001 - a model or run that cannot be read takes no images (chat says why)
            return False

    def _with_uploads(self, values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        """The values with each `upload:NAME` replaced by this visitor's file of that name, and {field: refusal} for
        a name this visitor has no upload of (whoever else has one: the same line)."""
        out, missing = dict(values), {}
        for name in ("dataset", "eval_split"):
            value = values.get(name)
            if not is_upload(value):
                continue
            path = self.uploads.resolve(self.identity, value)
            if path is None:
                shown = repr(str(value)[:RUN_ID_LIMIT])
                missing[name] = f"{name}: {shown} is not one of your uploads; upload the file again"
            else:
                out[name] = str(path)
        return out, missing

    # ----------------------------------------------------------------- memory, data, commands
    def estimate(
        self, values: dict[str, Any], device: str = "cuda", gpus: int = 1, gpu_gib: float | None = None
    ) -> Any:
        """The memory estimate (breakdown, fit verdict, advice) for these settings on `gpus` processes of `device`."""
        from finetune import memory

        return memory.estimate(self.plan(values, device=device, gpus=gpus), gpu_gib=gpu_gib)

    def preview_data(self, values: dict[str, Any], n: int = 3) -> dict[str, Any]:
        """The first examples as the model sees them, with what is masked from the loss (image rows: their image
        files and image tokens too)."""
        from finetune import data
        from finetune.model import loading

        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= PREVIEW_LIMIT:
            raise UserError(f"n: {str(n)[:40]!r} is not a number of examples from 1 to {PREVIEW_LIMIT}", "n")
        plan = self.plan(values)
        config = plan.config
        # A vision-language model's rows are rendered by its processor (each row's "images" then lists their files).
        tokenizer = loading.load_processor(plan) if plan.vision is not None else loading.load_tokenizer(config)
        preview = data.preview(config, tokenizer, n=n)
        self._confine_images(preview)
        return preview

    def _confine_images(self, preview: dict[str, Any]) -> None:
        """Where visitors may not name server files, a previewed row's images (whose pictures the page shows) must
        be this visitor's uploads or bundled data: a data file naming any other file is refused in one line."""
        if self.policy.server_paths:
            return
        roots = [self.uploads_dir.resolve(), (Path(__file__).parent / "bundled").resolve()]
        for example in preview.get("examples") or []:
            for image in example.get("images") or []:
                if not any(Path(image).resolve().is_relative_to(root) for root in roots):
                    raise UserError(
                        f"dataset: the image {Path(image).name!r} is not among your uploads; upload it with the data "
                        "file (paths relative to it)",
                        "dataset",
                    )

    def commands(self, values: dict[str, Any], gpus: int = 2, nodes: int = 1) -> dict[str, str]:
        """The CLI, torchrun and deepspeed commands that run these settings (saved as run.yaml), each command once.

        Paths are relative (run them in the folder that holds run.yaml): a multi-process run's folder is fixed in
        advance as runs/NAME, never as a path of this server."""
        from finetune.runs.launch import launch_commands
        from finetune.runs.manager import unique_run_path

        plan = self.plan(values)
        config = plan.config
        output_dir = None if config.output_dir else Path("runs") / unique_run_path(self.manager.root, config).name
        commands: dict[str, str] = {}
        for key, command in launch_commands(plan, gpus=gpus, nodes=nodes, output_dir=output_dir).items():
            if command not in commands.values():  # without DeepSpeed the multi-node launcher is torchrun's
                commands[key] = command
        return commands

    def preview_run(self, values: dict[str, Any], estimate: bool = True) -> RunPreview:
        """What Start would run with these settings on this machine: model, data, method, objective, steps, batch
        and (with `estimate`) the estimated peak memory per device. A `ConfigError` for bad settings."""
        plan = self.plan(values)
        config = plan.config
        peak, note = None, ""
        if estimate:
            from finetune import memory

            try:
                peak = int(memory.estimate(plan).total_bytes)
            except Exception as exc:  # the model config cannot be read offline, ...: the rest still holds
                note = next(iter(field_problem(exc).values()))
        return RunPreview(
            model=short_model_name(config.model) if self.policy.public else str(config.model),
            dataset=Path(config.dataset).name if self.policy.public else str(config.dataset),
            method=config.method,
            objective=plan.objective.name,
            max_steps=int(config.max_steps),
            epochs=float(config.num_train_epochs),
            effective_batch=int(plan.effective_batch),
            max_seq_length=int(config.max_seq_length),
            device=plan.device,
            processes=int(plan.world_size),
            estimate_bytes=peak,
            estimate_note=note,
            packing=plan.packing,
            packing_note=plan.packing_note,
        )

    # ----------------------------------------------------------------- runs
    def start(
        self, values: dict[str, Any], owner: str | None = None, processes: int = 1, gpus: str = ""
    ) -> TrainingState:
        """Start a run (output_dir confined to the runs folder) owned by this visitor: in a background thread for one
        process, as a launched process group for more (`gpus`: which GPUs, e.g. "0,1"; empty: the first
        `processes`). `owner` names who starts it on the local app; a public app records the visitor's identity."""
        if self.identity is None:
            raise UserError(self.policy.needs_identity("start", "train"), "start")
        owner = self.policy.run_owner(self.user) if self.policy.public or not owner else owner
        config = self.config(values)
        if config.runs_on == "slurm":
            return self._submit(config, owner)
        with self._neutral_busy():
            if _process_count(processes) == 1 and not gpus:
                return self.manager.start(config, owner=owner, confine=True)
            return self._start_group(values, owner, processes, gpus)

    def resume(self, run_id: str, owner: str | None = None, processes: int = 1, gpus: str = "") -> TrainingState:
        """Continue a stopped, interrupted or failed run of this visitor from its last checkpoint, with as many
        processes as it was trained with (a launched run is launched again; another count is refused). The run
        keeps its owner (an admin resuming a visitor's run does not take it over)."""
        run = self._run(run_id)
        self._check_run_allowed(run)
        recorded = str(run.read_status().get("owner") or "")
        owner = recorded if self.policy.public else (owner or self.policy.run_owner(self.user))
        if scheduler.is_slurm_run(run.path):
            self._check_slurm_allowed()
            return self._follow(slurm.resume(run.path, self.manager.root, confine=True).run)
        with self._neutral_busy():
            if self._was_launched(run) or _process_count(processes) > 1:
                return self._resume_group(run, owner, processes, gpus)
            return self.manager.resume(run.path, owner=owner)

    def stop(self, run_id: str | None = None) -> bool:
        """Ask a run to save a checkpoint and stop: `run_id` (refused as missing when it is not this visitor's; a
        one-line `UserError` when it is not the one training), or this visitor's run training now. False when
        nothing of this visitor's is running."""
        state = self.state()
        if run_id:
            run = self._run(run_id)
            if scheduler.is_slurm_run(run.path):  # its job runs elsewhere, beside whatever trains here
                self.manager.stop_slurm(run)
                return True
            if state is None or not state.active or state.run_id != run.name:
                raise UserError(f"run: {run.name} is not training now; nothing to stop", "run")
        elif state is None or not state.active:
            return False
        return self.manager.stop()

    def stop_words(self) -> str:
        """What the last Stop of a Slurm run did, in a line ("" for any other run)."""
        return self.manager.last_stop

    # ---- Slurm (finetune/cluster/, docs/cluster.md)
    def batch_script(self, values: dict[str, Any]) -> tuple[str, str]:
        """(the batch script Start would submit for these settings (runs_on: slurm), its run folder's name). With
        output_dir set to that name, Start submits this very script; the run keeps it as submitted
        (`submitted_script`)."""
        config = self.config(values)
        if config.runs_on != "slurm":
            raise UserError("runs_on: this run trains on this machine; choose a Slurm cluster to see its script")
        self._check_slurm_allowed()
        script, path = slurm.preview(config, self.manager.root, confine=True)
        return script, path.name

    def submitted_script(self, run_id: str) -> str:
        """The batch script a Slurm run was submitted with ("" for a run that trained here)."""
        return slurm.submitted_script(self._run(run_id))

    def script_file(self, text: str) -> Path:
        """A batch script as a file to download (one per distinct script in `downloads_dir`)."""
        from finetune.atomic import write_text

        path = self.downloads_dir / f"script-{hashlib.sha256(text.encode('utf-8')).hexdigest()[:12]}" / "run.sbatch"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, text)
        return path

    def job_log(self, run_id: str) -> str:
        """The end of a Slurm run's job log ("" for a run that trained here, or before the job wrote anything)."""
        return slurm.job_log(self._run(run_id))

    def _check_slurm_allowed(self) -> None:
        if self.policy.public:
            raise UserError("runs_on: a public app does not submit jobs to a Slurm cluster", "runs_on")

    def _submit(self, config: TrainConfig, owner: str) -> TrainingState:
        self._check_slurm_allowed()
        return self._follow(slurm.submit(config, self.manager.root, owner=owner, confine=True).run)

    def _follow(self, run: RunDir) -> TrainingState:
        self.manager.follow_group(run)
        return self.manager.state() or TrainingState(run_id=run.name, run_dir=str(run.path), status="pending")

    def state(self) -> TrainingState | None:
        """The run training now (or the last one this app ran), when it is this visitor's to see."""
        state = self.manager.state()
        return state if state is not None and self.policy.may_see(self.user, state.owner) else None

    @contextmanager
    def _neutral_busy(self) -> Iterator[None]:
        """On a public app, "busy" says until about when the device is taken, not whose run it is."""
        try:
            yield
        except BusyError:
            if not self.policy.public or self.state() is not None:
                raise  # the local app names who holds it; a visitor's own run is theirs to know
            until = self._busy_until()
            raise BusyError(
                f"busy: the device is training another run{until}; try again then (one run at a time)"
            ) from None

    def _busy_until(self) -> str:
        """' until about 14:32' from the training run's estimate, or ' (no estimate of its end yet)'."""
        state = self.manager.state()
        if state is None or not state.active:
            holder = self.manager.device_holder()
            run = RunDir(Path(self.manager.root) / str(holder.get("run_id") or "-"))
            status = run.read_status() if run.exists() else {}
            eta, at = status.get("eta_seconds"), status.get("updated_at")
        else:
            eta, at = state.eta_seconds, state.updated_at
        if not isinstance(eta, (int, float)) or not isinstance(at, (int, float)):
            return " (no estimate of its end yet)"
        return " until about " + time.strftime("%H:%M", time.localtime(at + eta + 30))

    @staticmethod
    def gpu_cards() -> dict[str, float]:
        """Common GPU cards (name → GiB) the Memory tab offers."""
        from finetune.memory import GPU_CARDS

        return {str(k): float(v) for k, v in dict(GPU_CARDS).items()}

    def run_stamp(self, run_id: str) -> tuple:
        """(size, mtime) of a run's event log, status file and eval/ folder: changes whenever the run writes or is
        evaluated (cheap, for polling; a run of another process is followed through its files). A name that is no run
        gives zeros."""
        try:
            run = self._run(run_id)
        except UserError:
            return ((0, 0.0), (0, 0.0), (0, 0.0))
        return (_file_stamp(run.events_path), _file_stamp(run.status_path), _file_stamp(run.path / "eval"))

    def runs_stamp(self) -> float:
        """Changes when a run folder appears or goes, or this app evaluates a run (cheap, for polling)."""
        try:
            return max(Path(self.manager.root).stat().st_mtime, self._evaluated["at"])
        except OSError:
            return self._evaluated["at"]

    def runs(self) -> list[RunSummary]:
        """This visitor's runs (on the local app and for an admin: every run of the runs folder), newest first; the
        run training now with its live step and loss."""
        live = self.state()
        out = []
        for run in self.manager.runs():
            if not self.policy.may_see(self.user, run.get("owner")):
                continue
            summary = _summary(run)
            if live is not None and live.active and live.run_dir == run.get("run_dir"):
                summary = _with_live(summary, live)
            out.append(summary)
        return out

    def run(self, run_id: str) -> RunSummary | None:
        """One run of the runs folder by its name (the live state for the run training now), or None."""
        return next((r for r in self.runs() if r.run_id == run_id), None)

    def summary(self, run_id: str) -> RunSummary:
        """This visitor's run by its id, as `run` gives it; the one refusal when it is missing or not theirs."""
        found = self.run(self._run(run_id).name)
        if found is None:  # removed between the two looks
            raise UserError(f"run: {str(run_id)[:RUN_ID_LIMIT]!r} is not a run in the runs folder", "run")
        return found

    def events(self, run_id: str) -> list[Event]:
        """The run's events, typed (finetune/runs/events.py: log, eval, samples, message, status ...)."""
        return self._run(run_id).events()

    def objective(self, run_id: str) -> objectives.Objective:
        """The objective's record a run trains with (its plan.json, or its config.yaml for older runs): what its
        metrics are called, which are plotted, which scores judge it."""
        return self._run(run_id).objective()

    def run_config(self, run_id: str) -> TrainConfig:
        """The settings a run was started with."""
        return self._run(run_id).load_config()

    def _run(self, run_id: str) -> RunDir:
        """A run of this visitor by its folder name, confined to the runs root (`rundir.find_run`'s rule for the
        app). Another visitor's run is refused with the same line as a run that does not exist."""
        try:
            run = find_run(run_id, self.manager.root, field="run", confine=True)
            if not self.policy.may_see(self.user, run.read_status().get("owner")):
                raise UserError("not this visitor's run")
            return run
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
            if run.final:
                sources.append((f"{run.run_id} (final)", run.run_id))
            elif run.checkpoint_step is not None:
                sources.append((f"{run.run_id} (checkpoint {run.checkpoint_step}, {run.status})", run.run_id))
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
        self,
        source: str,
        messages: list[dict[str, str]],
        settings: Any,
        base_values: dict | None = None,
        images: list[str] | None = None,
    ) -> Iterator[str]:
        """Stream a reply from the base model (`base`: the form's model; `base-of:RUN`: the model a run started
        from) or a run's weights; yields the text so far. A vision-language model sees `images` (this visitor's
        uploads as `upload:NAME`, or files on this machine where server paths are allowed), one per `<image>` tag
        in the messages, in order."""
        from finetune.model.inference import stream_reply

        self.check_chat(messages, settings)
        files = self.image_files(images or [])
        if files and not self.takes_images(source, base_values):
            raise UserError(TEXT_ONLY_CHAT, "images")
        model, tokenizer = self._chat_model(source, base_values)
        with self._chat_lock:
            yield from stream_reply(model, tokenizer, messages, settings, *([files] if files else []))

    def image_files(self, images: list[str]) -> list[str]:
        """Chat images as files: `upload:NAME` from this visitor's uploads; a path only where server paths are
        allowed (the local app); each must exist. Refused in one line naming `images`."""
        if not isinstance(images, list) or len(images) > CHAT_IMAGES_LIMIT:
            raise UserError(f"images: at most {CHAT_IMAGES_LIMIT} images a conversation", field="images")
        files = []
        for value in images:
            if is_upload(value):
                path = self.uploads.resolve(self.identity, value)
                if path is None:
                    raise UserError(
                        f"images: {str(value)[:80]!r} is not one of your uploads; upload it again", "images"
                    )
            elif self.policy.public and not self.policy.allow_server_paths:
                raise UserError("images: upload the image (files on the server are not allowed here)", "images")
            else:
                path = Path(str(value)).expanduser()
            if not Path(path).is_file():
                raise UserError(f"images: {str(value)[:80]!r} is not a file", field="images")
            files.append(str(path))
        return files

    def chat_pair(
        self,
        source: str,
        messages: list[dict[str, str]],
        base_messages: list[dict[str, str]],
        settings: Any,
        images: list[str] | None = None,
    ) -> Iterator[tuple[str, str, BaseException | None]]:
        """Stream a run's reply and its base model's reply (`base-of:RUN`) at the same time: yields (side, text so
        far, None) for side "run" or "base" as either grows, or (side, "", error) when that side fails (the other
        goes on). Both generate together under the one chat lock: the pair is one request. `images`: as for `chat`."""
        import queue

        from finetune.model.inference import stream_reply

        self.check_chat(messages, settings)
        self.check_chat(base_messages, settings)
        files = self.image_files(images or [])  # a vision-language model's images: both sides see the same ones
        models: dict[str, tuple[Any, Any]] = {}
        for side, which in (("run", source), ("base", BASE_OF + source)):
            try:
                models[side] = self._chat_model(which, None)
            except Exception as exc:  # noqa: BLE001 - that side's answer is its error; the other still answers
                yield side, "", exc
        conversations = {"run": messages, "base": base_messages}
        pieces: queue.Queue = queue.Queue()

        def generate(side: str) -> None:
            try:
                for text in stream_reply(*models[side], conversations[side], settings, *([files] if files else [])):
                    pieces.put((side, text, None))
            except Exception as exc:  # noqa: BLE001 - reported on that side
                pieces.put((side, "", exc))
            finally:
                pieces.put((side, None, None))

        with self._chat_lock:
            workers = [threading.Thread(target=generate, args=(side,), daemon=True) for side in models]
            for worker in workers:
                worker.start()
            going = len(workers)
            while going:
                side, text, error = pieces.get()
                if text is None and error is None:
                    going -= 1
                    continue
                yield side, text, error
            for worker in workers:
                worker.join()

    def _chat_model(self, source: str, base_values: dict | None) -> tuple[Any, Any]:
        from finetune.model.inference import adapter_dir, load_for_chat

        if source == BASE:
            plan = self.plan(base_values or {})
            key, run_path = f"base:{plan.config.model}", None
        elif isinstance(source, str) and source.startswith(BASE_OF):
            run = self._run(source[len(BASE_OF) :])
            self._check_run_allowed(run)
            plan, run_path = run.load_plan(), None  # the base as the run loaded it
            key = f"base:{plan.config.model}"
        else:
            run = self._run(source)
            self._check_run_allowed(run)
            plan, run_path = run.load_plan(), run.path  # the run's own plan: its class, dtype, 4-bit base, adapter
            weights = adapter_dir(run.path)
            key = f"{source}:{weights}"  # a newer checkpoint of a running run loads afresh
        with self._chat_lock:
            if key in self._chat_models:
                self._chat_models.move_to_end(key)
                return self._chat_models[key]
            loaded = load_for_chat(plan, run_path)
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
            plan = self._run(source).load_plan()
        except UserError:
            return "chat"  # an unknown run: the chat itself reports it in its own words
        return "classifier" if plan.is_classifier else "chat"

    def classify(self, source: str, text: str, text_pair: str = "") -> Classification:
        """Every label's probability for a text (and optional second text) from a sequence-classification run."""
        from finetune.model.inference import adapter_dir, classify, load_classifier

        for name, value in (("text", text), ("second text", text_pair)):
            if not isinstance(value, str) or len(value) > CHAT_MESSAGE_LIMIT:
                raise UserError(f"{name}: give text of at most {CHAT_MESSAGE_LIMIT} characters", field=name)
        if not text.strip():
            raise UserError("text: empty; type the text to classify", field="text")
        run = self._run(source)
        self._check_run_allowed(run)
        plan = run.load_plan()
        config = plan.config
        key = f"classify:{source}:{adapter_dir(run.path)}"  # a newer checkpoint of a running run loads afresh
        with self._chat_lock:
            if key not in self._chat_models:
                self._chat_models[key] = load_classifier(plan, run.path)
                while len(self._chat_models) > self._chat_cache_size:
                    self._chat_models.popitem(last=False)
            self._chat_models.move_to_end(key)
            model, tokenizer, names = self._chat_models[key]
            return classify(model, tokenizer, names, text.strip(), text_pair.strip(), config.max_seq_length)

    # ----------------------------------------------------------------- evaluation
    def evaluation_sources(self) -> list[tuple[str, str]]:
        """(label, value) of what can be evaluated: each finished run's final weights (`RUN`) and every run's
        checkpoints (`RUN@STEP`), newest run first."""
        sources = []
        for run in self.runs():
            if run.final and not run.active:
                sources.append((f"{run.run_id} (final)", run.run_id))
            for path in reversed(self._run(run.run_id).checkpoints()):
                step = path.name.split("-")[-1]
                sources.append((f"{run.run_id} · checkpoint {step} ({run.status})", f"{run.run_id}@{step}"))
        return sources

    def evaluate(self, source: str, options: dict[str, Any] | None = None, progress: Any = None) -> Any:
        """Evaluate a run (`RUN`; `RUN@STEP` for a checkpoint) with `options` (`EvalOptions` fields: data, split,
        limit, max_new_tokens, base, temperature, lm_eval, include_path, num_fewshot, judge) and keep the result in
        the run's eval/ folder; an `EvalView`. `progress(fraction, text)` hears how far it is."""
        from finetune.evaluation import EvalOptions, evaluate_run
        from finetune.evaluation.report import view

        run_id, _, step = str(source or "").partition("@")
        values = dict(options or {})
        allowed = set(EvalOptions.__dataclass_fields__) - {"predictions"}  # no file of a visitor's choosing is written
        unknown = sorted(set(values) - allowed)
        if unknown:
            raise UserError(f"{unknown[0]}: not an evaluation option here", field=unknown[0])
        if step:
            if not step.isdigit():
                raise UserError(f"checkpoint: {step[:20]!r} is not a checkpoint step", field="checkpoint")
            values["checkpoint"] = int(step)
        self._check_evaluation_allowed(values)
        run = self._run(run_id)
        self._check_run_allowed(run)
        with self._eval_lock:
            result, path = evaluate_run(run, EvalOptions(**values), progress)
            self._evaluated["at"] = time.time()
        return view(result, path.name, run.objective())

    def evaluations(self, run_id: str) -> list[str]:
        """The file names of a run's evaluations, newest first."""
        from finetune.evaluation import store

        return [path.name for path in reversed(store.history(self._run(run_id).path))]

    def evaluation(self, run_id: str, name: str | None = None) -> Any:
        """One of a run's evaluations (by file name; default the newest) as an `EvalView`, or None when it has none."""
        from finetune.evaluation import store
        from finetune.evaluation.report import view

        run = self._run(run_id)
        for path in reversed(store.history(run.path)):
            if name in (None, "", path.name):
                result = store.load(path)
                if result is not None:
                    return view(result, path.name, run.objective())
        return None

    def held_out_scores(self, run_id: str, events: list[Event] | None = None) -> list[dict[str, Any]]:
        """The objective's cheap scores of the held-out answers the run logged at step 0 and at each evaluation, against
        their reference answers: [{"step": N, "rouge_l": ..., "exact_match": ..., ...}] ([] without references).
        `events`: the run's events when the caller has just read them."""
        from finetune.evaluation.metrics import sample_scores

        run = self._run(run_id)
        try:
            objective = run.objective()  # the run's own record: which scores it is judged by
        except UserError:
            return []
        out = []
        for event in events if events is not None else run.events():
            if not isinstance(event, SamplesEvent):
                continue
            answers, references = [s.answer for s in event.samples], [s.reference for s in event.samples]
            scores = sample_scores(objective, answers, references) if any(r is not None for r in references) else {}
            if scores:
                out.append({"step": event.step, **scores})
        return out

    def compare(self, run_ids: list[str]) -> Any:
        """Two or more runs side by side: a `Comparison` (loss curves, latest scores, answers to the same prompts)."""
        from finetune.evaluation.compare import compare_runs

        if not isinstance(run_ids, list) or not all(isinstance(r, str) for r in run_ids):
            raise UserError("runs: pick two or more runs to compare", field="runs")
        return compare_runs([self._run(run_id) for run_id in run_ids[:RUNS_COMPARED]])

    def _check_evaluation_allowed(self, values: dict[str, Any]) -> None:
        """Refuse, as for a run's settings, what this visitor may not use: server files as data, a judge from the
        server's disk, a folder of lm-eval tasks on the server. Data named `upload:NAME` becomes this visitor's
        uploaded file of that name."""
        resolved, missing = self._with_uploads({"dataset": values.get("data")})
        if missing:
            raise UserError("data: " + missing["dataset"].split(": ", 1)[-1], field="data")
        if values.get("data"):
            values["data"] = resolved["dataset"]
        names = {"dataset": "data", "dataset_split": "split", "model": "judge"}
        asked = {field: values.get(option) for field, option in names.items() if values.get(option)}
        mine = [str(p) for p in self.uploads.files(self.identity)] if self.identity is not None else []
        for field, message in self.policy.problems(asked, mine).items():
            option = names[field]
            raise UserError(f"{option}: {message.split(': ', 1)[-1]}", field=option)
        if values.get("include_path") and not self.policy.server_paths:
            raise UserError(
                "include_path: folders on the server are not available in this public app; use the bundled "
                "pirate_quiz or lm-eval's own tasks",
                field="include_path",
            )

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
    @staticmethod
    def export_formats() -> tuple[str, ...]:
        """The export formats, in the order a picker offers them (merged, gguf, gguf-lora)."""
        from finetune.publish.export import FORMATS

        return FORMATS

    def export(self, run_id: str, fmt: str, quant: str | None = None, progress: Any = None) -> Any:
        """Export a finished run under its exports/ folder (merged model, GGUF + Modelfile, or the adapter as a
        llama.cpp LoRA GGUF); an ExportResult."""
        from finetune.publish import export

        run = self._run(run_id)
        self._check_run_allowed(run)  # the merge loads the base model: the same rule as chat
        return export.export_run(run.path, fmt, quant=quant, progress=progress)

    # ---- guided start (first screen)
    @staticmethod
    def bundled_datasets() -> list[str]:
        """The data sets shipped with the app, as `bundled:NAME` (the default first)."""
        from finetune.config import BUNDLED_DATASET

        names = sorted(f"bundled:{p.name}" for p in BUNDLED.iterdir() if (p / "train.jsonl").is_file())
        return sorted(names, key=lambda n: n != BUNDLED_DATASET)

    @staticmethod
    def detected_gpu() -> tuple[str, float] | None:
        """(name, GiB) of this machine's first CUDA GPU, or None where there is none (the first screen offers it)."""
        import torch

        if not torch.cuda.is_available():
            return None
        props = torch.cuda.get_device_properties(0)
        return str(props.name), round(props.total_memory / 2**30, 1)

    # ---- guided start (advice)
    @staticmethod
    def popular_models() -> list[str]:
        """Models to offer first: the embedded default, then the bundled catalogue's Hub ids (estimated offline)."""
        from finetune.config import EMBEDDED_MODEL
        from finetune.model import catalogue

        return [EMBEDDED_MODEL, *catalogue.names()]

    def data_stats(self, values: dict[str, Any]) -> Any:
        """Token lengths of the training rows with the model's tokenizer and template: a `DataStats` (rows,
        p50/p90/p99/max, fit_share of max_seq_length, summary())."""
        from finetune.data.stats import data_stats

        return data_stats(self.config(values))

    def propose(
        self,
        values: dict[str, Any],
        device: str = "cuda",
        gpus: int = 1,
        gpu_gib: float | None = None,
        pinned: tuple[str, ...] = (),
    ) -> Any:
        """The one search's answer for these settings on `gpus` devices of `gpu_gib` GiB: a `Proposal` (values,
        reasons, estimate, fits with headroom, changes; when nothing fits, the hardware `needed`). `pinned` fields
        (set by the user on purpose) are kept; `python -m finetune propose` gives the same answer."""
        from finetune.memory import propose

        return propose(self.plan(values, device=device, gpus=gpus), gpu_gib=gpu_gib, pinned=tuple(pinned))

    @staticmethod
    def embedded_ready() -> bool:
        """Whether the embedded model is converted already (its first use converts it, once: about a minute)."""
        from finetune.model.loading import embedded_cache_dir

        folder = embedded_cache_dir()
        return (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()

    # ---- multi-process
    @staticmethod
    def max_processes() -> int:
        """The most processes a run may use here: the visible GPUs, or on a CPU min(4, cores)."""
        from finetune.runs.launch import max_processes

        return max_processes()

    def _start_group(self, values: dict[str, Any], owner: str, processes: int, gpus: str) -> TrainingState:
        """A new run as a launched process group under the runs root; its state once the group is on its way."""
        from finetune.runs.launch import launch_group

        run = launch_group(
            self.config(values), nproc=processes, gpus=gpus, root=self.manager.root, owner=owner, confine=True
        )
        self.manager.follow_group(run)
        return self.manager.state() or TrainingState(run_id=run.name, run_dir=str(run.path), status="pending")

    def _resume_group(self, run: RunDir, owner: str, processes: int, gpus: str) -> TrainingState:
        from finetune.runs.launch import resume_group

        count = processes if processes > 1 else None  # None: the count the run was trained with
        resumed = resume_group(run.path, nproc=count, gpus=gpus, root=self.manager.root, owner=owner)
        self.manager.follow_group(resumed)
        return self.manager.state() or TrainingState(run_id=run.name, run_dir=str(run.path), status="pending")

    @staticmethod
    def _was_launched(run: RunDir) -> bool:
        from finetune.runs.process_group import read_group

        return bool(read_group(run.path))


def _process_count(processes: Any) -> int:
    """A run's process count from the app or its API: a whole number ≥ 1, else the one-line refusal."""
    if not isinstance(processes, int) or isinstance(processes, bool) or processes < 1:
        raise UserError(f"processes: {str(processes)[:40]!r} is not a whole number ≥ 1", "processes")
    return processes


def _empty_numbers(values: dict[str, Any]) -> dict[str, str]:
    """{field: "Label: empty; give a number"} for number fields left blank (a form sends None)."""
    problems = {}
    for name, value in values.items():
        if (
            field_kind(name) in NUMBER_TYPES
            and not field_optional(name)
            and (value is None or (isinstance(value, str) and not value.strip()))
        ):
            problems[name] = f"{field_label(name)}: empty; give a number"
    return problems


def _summary(run: dict[str, Any]) -> RunSummary:
    """A `RunManager.runs()` entry with what the run trains (from its config.yaml) and what it holds."""
    folder = RunDir(Path(run["run_dir"]))
    try:
        config = folder.load_config()
        model, method, objective = short_model_name(config.model), config.method, folder.objective()
    except Exception:  # a run cut short before its config was written: listed by its name alone
        model, method, objective = "", "", objectives.OBJECTIVES[objectives.DEFAULT]
    checkpoint = folder.last_checkpoint()
    from finetune.evaluation import report, store

    return RunSummary(
        run_id=str(run["run_id"]),
        status=str(run.get("status") or "unknown"),
        step=int(run.get("step") or 0),
        max_steps=int(run.get("max_steps") or 0),
        loss=run.get("loss"),
        eval_loss=run.get("eval_loss"),
        started_at=run.get("started_at"),
        owner=str(run.get("owner") or ""),
        model=model,
        method=method,
        objective=objective.name,
        resumable=bool(run.get("resumable")),
        final=folder.has_final_model(),
        checkpoint_step=int(checkpoint.name.split("-")[-1]) if checkpoint is not None else None,
        evaluation=report.summary(store.latest(folder.path), objective),
    )


def _with_live(summary: RunSummary, live: TrainingState) -> RunSummary:
    """The summary of the run training now, with its live step and losses (its status file is written less often)."""
    from dataclasses import replace

    return replace(
        summary,
        status=live.status,
        step=live.step,
        max_steps=live.max_steps or summary.max_steps,
        loss=live.loss if live.loss is not None else summary.loss,
        eval_loss=live.eval_loss if live.eval_loss is not None else summary.eval_loss,
    )


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:300]


def _file_stamp(path: Path) -> tuple[int, float]:
    try:
        st = path.stat()
    except OSError:
        return (0, 0.0)
    return (st.st_size, st.st_mtime)


# Besides what the studio defines, the types of its answers that are defined elsewhere: the UI takes them from here.
__all__ = [
    "BASE",
    "BASE_OF",
    "CheckpointEvent",
    "Classification",
    "CompletionsEvent",
    "EvalEvent",
    "Event",
    "GenerationSettings",
    "LogEvent",
    "MessageEvent",
    "SamplesEvent",
    "SavedEvent",
    "StatusEvent",
    "Studio",
]
