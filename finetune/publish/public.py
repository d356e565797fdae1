"""What of a run may leave the machine: its config with local paths replaced, and a last-line scan for paths.

    public_config(config, run) -> PublicConfig     the config as published (YAML, reproduce command, fill-ins)
    public_adapter_config(data, config) -> dict   adapter_config.json as published (base model: Hub id or null)
    local_path_needles(config, run) -> {path: what it is}
    scan_for_local_paths(folder, needles) -> [(file, what)]
    check_no_local_paths(folder, config, run)      raises UserError naming the file (never the path)

A local model or dataset is published as its base name plus its sha256 (the weights' digest for a model folder, the
file's digest for data, as recorded in the run's "dataset" event), or as its Hub id when one is on record (a snapshot
in the Hugging Face cache, or the `_name_or_path` saved in the folder's config.json). Its value in the published
config becomes a placeholder (`<path to your copy of NAME>`) that the reproduce command asks the reader to fill in.
Paths that only meant something on the training machine (`output_dir`, `nvme_path`) are left out. The run directory
on disk is never changed: it keeps the real paths, so resume keeps working.

Every publishing path (Hub push, and exporters to come) stages its files, builds them from `public_config`, and runs
`check_no_local_paths` over the staged folder before anything leaves. No torch / transformers imports here.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from finetune.config import EMBEDDED_MODEL, FIELDS, TrainConfig
from finetune.errors import UserError
from finetune.runs.events import DatasetEvent, of_type
from finetune.runs.rundir import RunDir

# The files of a run directory that are published (pushed or exported); nothing else of the folder leaves it.
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")
FULL_MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model-*-of-*.safetensors",
    "model.safetensors.index.json",
)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "*.tiktoken",
    "processor_config.json",  # a vision-language model's processor (its image settings) with its tokenizer
    "preprocessor_config.json",
)

EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
LAUNCH_COMMAND = "python -m finetune train --config config.yaml"
LOCAL_ONLY_FIELDS = ("output_dir", "nvme_path")  # where the run wrote on the training machine: never published
DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".txt", ".tsv", ".arrow")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "model*.bin")
SCAN_LIMIT = 16 * 1024 * 1024  # bytes read per staged file: whole text files, the header of large weight files
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
HUB_ID = re.compile(rf"^{_NAME}/{_NAME}$")
CANONICAL_NAME = re.compile(rf"^{_NAME}$")  # legacy Hub ids without an owner (e.g. `imdb`, `gpt2`)
_CACHE_SNAPSHOT = re.compile(r"(?:^|/)models--([^/]+?)--([^/]+)/snapshots/")
_WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")
_PATH_CHAR = rb"A-Za-z0-9._-"  # a needle must not be glued to more of a name on either side


@dataclass(frozen=True)
class LocalRef:
    """One config value that named something on the training machine, and how it is published instead."""

    field: str  # the TrainConfig field
    kind: str  # "model directory" | "data file" | "directory" | "path"
    name: str  # base name, shown in the card
    sha256: str | None = None  # file digest (data) or weights digest (model directory); None when unknown
    sha256_of: str = ""  # what the digest covers, e.g. "model.safetensors"
    hub_id: str | None = None  # the Hub id on record, used instead of a placeholder
    hint: str = ""  # what to fill in, when "your copy of NAME" does not fit
    published: str = ""  # the whole published value, when the placeholder is only part of it (a python: reward)

    @property
    def value(self) -> str:
        """What the published config holds: the Hub id on record, else a placeholder to fill in."""
        return self.hub_id or self.published or (f"<{self.hint}>" if self.hint else placeholder(self.name))

    @property
    def to_fill_in(self) -> bool:
        return self.hub_id is None

    @property
    def digest(self) -> str:
        """Markdown, e.g. model.safetensors sha256 `ab12…`; empty when no digest is known."""
        if not self.sha256:
            return ""
        return f"{self.sha256_of} sha256 `{self.sha256}`" if self.sha256_of else f"sha256 `{self.sha256}`"

    def describe(self) -> str:
        """Markdown, e.g. local data file `tickets.jsonl` (sha256 `ab12…`)."""
        digest = f" ({self.digest})" if self.digest else ""
        text = f"local {self.kind} `{self.name}`{digest}"
        if self.hub_id:
            text = f"`{self.hub_id}` on the Hub ({text})"
        return text


@dataclass
class PublicConfig:
    """The run's config as it may be published: no local path, every replacement explained."""

    values: dict[str, Any]  # field -> value, local-only fields left out (what config.yaml holds)
    refs: list[LocalRef] = field(default_factory=list)  # local references that were replaced
    left_out: tuple[str, ...] = LOCAL_ONLY_FIELDS

    def ref(self, name: str) -> LocalRef | None:
        """The replacement made for one field, if any."""
        return next((r for r in self.refs if r.field == name), None)

    @property
    def fill_in(self) -> list[LocalRef]:
        """References with no Hub id on record: the reader supplies their own copy."""
        return [r for r in self.refs if r.to_fill_in]

    def reproduce_command(self) -> str:
        """`python -m finetune train --config config.yaml` plus one `--set` per value to fill in."""
        sets = [f"--set {r.field}={shlex.quote(r.value)}" for r in self.fill_in]
        return " ".join([LAUNCH_COMMAND, *sets])

    def to_yaml(self) -> str:
        """config.yaml as published: a comment header naming each replacement, then one key per field."""
        lines = ["# Finetune Studio run configuration, as published: local paths are replaced (see below)."]
        for r in self.refs:
            action = f"fill in: --set {r.field}=..." if r.to_fill_in else "its Hub id is used"
            lines.append(f"#   {r.field}: {_plain(r.describe())} ({action})")
        if self.left_out:
            lines.append(f"#   left out (paths on the training machine only): {', '.join(self.left_out)}")
        lines.append(f"# Reproduce: {self.reproduce_command()}")
        body = yaml.safe_dump(self.values, sort_keys=False, allow_unicode=True, width=10_000)
        return "\n".join(lines) + "\n" + body

    def as_dict(self) -> dict[str, Any]:
        """A copy of the published values."""
        return dict(self.values)


def placeholder(name: str) -> str:
    """The value a reader replaces: `<path to your copy of NAME>`."""
    return f"<path to your copy of {name}>"


def _plain(markdown: str) -> str:
    return markdown.replace("`", "")


# ---------------------------------------------------------------------------------------------- the config


def public_config(config: TrainConfig, run: RunDir | str | Path | None = None) -> PublicConfig:
    """The config as it may leave the machine; `run` supplies what training recorded (the dataset's sha256)."""
    run = RunDir(Path(run)) if run is not None and not isinstance(run, RunDir) else run
    values = config.to_dict()
    refs: list[LocalRef] = []
    left_out = [name for name in LOCAL_ONLY_FIELDS if name in values]
    for name in left_out:
        values.pop(name)
    if "nvme" in (config.offload_optimizer, config.offload_param):
        # Required by validation when NVMe offload is on: a placeholder keeps the file loadable.
        refs.append(LocalRef("nvme_path", "directory", "nvme_path", hint="a directory on a fast local disk"))
        left_out.remove("nvme_path")

    if is_local_model(config.model):
        path = Path(config.model).expanduser()
        sha, of = weights_sha256(path)
        refs.append(LocalRef("model", "model directory", _base_name(path), sha, of, model_hub_id(config.model)))
    if is_local_data(config.dataset):
        path = Path(config.dataset).expanduser()
        sha = _recorded_dataset_sha256(run, config.dataset) or _sha256_if_file(path)
        refs.append(LocalRef("dataset", "data file", _base_name(path), sha))
    if _eval_split_is_file(config.eval_split):
        path = Path(config.eval_split).expanduser()
        refs.append(LocalRef("eval_split", "data file", _base_name(path), _sha256_if_file(path)))
    refs += _reward_files(config.rewards)
    replaced = {r.field for r in refs}
    for name, value in list(values.items()):  # any other field that holds a path (a field added later, say)
        if name not in replaced and isinstance(value, str) and looks_like_path(value) and _is_path_field(name, value):
            path = Path(value).expanduser()
            refs.append(LocalRef(name, "path", _base_name(path), _sha256_if_file(path)))
    for r in refs:
        values[r.field] = r.value
    return PublicConfig(values, refs, tuple(left_out))


def _reward_files(rewards: str) -> list[LocalRef]:
    """The files python: rewards name, as one reference: each file becomes a placeholder inside the rewards value."""
    from finetune.objectives.rewards import split

    parts, files = [], []
    for part in split(rewards):
        kind, _, argument = part.partition(":")
        file, _, function = argument.rpartition(":")
        if kind.strip() == "python" and file:
            path = Path(file).expanduser()
            files.append(path)
            part = f"python:{placeholder(_base_name(path))}:{function}"
        parts.append(part)
    if not files:
        return []
    name = ", ".join(_base_name(path) for path in files)
    digest = _sha256_if_file(files[0]) if len(files) == 1 else None
    return [LocalRef("rewards", "reward file", name, digest, published=",".join(parts))]


def public_adapter_config(data: dict[str, Any], config: TrainConfig) -> dict[str, Any]:
    """adapter_config.json as published: `base_model_name_or_path` is the Hub id on record, else null (not a path)."""
    return {**data, "base_model_name_or_path": model_hub_id(config.model)}


def _is_path_field(name: str, value: str) -> bool:
    # Column names and split names are free text: only absolute or home-relative values count as paths there.
    return name in FIELDS and (value.startswith(("/", "~")) or bool(_WINDOWS_DRIVE.match(value)))


def _eval_split_is_file(value: str) -> bool:
    # eval_split is a split name ("validation") for Hub and bundled data, or a file beside a local dataset.
    return bool(value) and (looks_like_path(value) or value.lower().endswith(DATA_SUFFIXES))


def _base_name(path: Path) -> str:
    return path.name or str(path).strip("/\\") or "the file"


def looks_like_path(value: str) -> bool:
    """True for absolute, home-relative or explicitly relative paths, and Windows-style ones."""
    return value.startswith(("/", "~", "./", "../")) or "\\" in value or bool(_WINDOWS_DRIVE.match(value))


def is_local_model(model: str) -> bool:
    """True when `model` names a folder on this machine (not the embedded model, not a Hub id)."""
    if model == EMBEDDED_MODEL or model.startswith("embedded:"):
        return False
    return looks_like_path(model) or Path(model).expanduser().is_dir()


def is_local_data(value: str) -> bool:
    """True when a dataset (or eval_split) value names a file on this machine (not bundled data, not a Hub id)."""
    if value.startswith("bundled:"):
        return False
    path = Path(value).expanduser()
    return looks_like_path(value) or value.lower().endswith(DATA_SUFFIXES) or path.is_file()


def model_hub_id(model: str) -> str | None:
    """The base model's Hub id when one is on record: the embedded model's, a Hub cache snapshot's, a saved name's."""
    if model == EMBEDDED_MODEL:
        return EMBEDDED_HUB_ID
    if not is_local_model(model):
        return model if HUB_ID.match(model) or CANONICAL_NAME.match(model) else None
    path = Path(model).expanduser()
    snapshot = _CACHE_SNAPSHOT.search(str(path).replace(os.sep, "/"))
    if snapshot:  # a snapshot in the Hugging Face cache: its folder name holds the Hub id
        return f"{snapshot.group(1)}/{snapshot.group(2)}"
    name = _config_name_or_path(path)
    if name and HUB_ID.match(name) and not Path(name).expanduser().exists():
        return name
    return None


def _config_name_or_path(path: Path) -> str | None:
    try:
        value = json.loads((path / "config.json").read_text(encoding="utf-8")).get("_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


# ------------------------------------------------------------------------------------------------ digests


def weights_sha256(model_dir: Path) -> tuple[str | None, str]:
    """(digest, what it covers) of a model folder's weights: one file's sha256, or that of `sha256sum` over all."""
    if not model_dir.is_dir():
        return None, ""
    files = sorted({p for pattern in WEIGHT_PATTERNS for p in model_dir.glob(pattern) if p.is_file()})
    if not files:
        return None, ""
    if len(files) == 1:
        return sha256_file(files[0]), files[0].name
    listing = "".join(f"{sha256_file(p)}  {p.name}\n" for p in files)
    return hashlib.sha256(listing.encode()).hexdigest(), f"weights (`sha256sum` listing of {len(files)} files)"


def sha256_file(path: Path) -> str:
    """The sha256 of a file (cached while the file's size and mtime stay the same)."""
    stat = path.stat()
    return _sha256_cached(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _sha256_if_file(path: Path) -> str | None:
    try:
        return sha256_file(path) if path.is_file() else None
    except OSError:
        return None


def _recorded_dataset_sha256(run: RunDir | None, dataset: str) -> str | None:
    """The sha256 training recorded for this dataset (the run's last "dataset" event naming it)."""
    if run is None:
        return None
    for event in reversed(of_type(run.events(), DatasetEvent)):
        if event.dataset == dataset and event.sha256:
            return event.sha256
    return None


# -------------------------------------------------------------------------------------------- the last line


def local_path_needles(config: TrainConfig, run: RunDir | str | Path | None = None) -> dict[str, str]:
    """Absolute paths of this machine that must never leave it, each with a plain name for error messages."""
    from finetune.paths import studio_home

    needles: dict[str, str] = {}

    def add(value: str | Path | None, what: str, parents: bool = False) -> None:
        if not value:
            return
        raw = str(value)
        if not looks_like_path(raw) and not Path(raw).expanduser().exists():
            return
        path = Path(raw).expanduser()
        variants = {str(path)}
        try:
            variants |= {str(path.absolute()), str(path.resolve())}
        except OSError:
            pass
        for variant in variants:
            if _specific_enough(variant, minimum=1):
                needles.setdefault(variant.rstrip("/"), what)
            if parents:  # the folder a file came from names clients and projects too
                parent = str(Path(variant).parent)
                if _specific_enough(parent, minimum=2):
                    needles.setdefault(parent, f"the folder of {what}")

    if is_local_model(config.model):
        add(config.model, "the base model's folder", parents=True)
    if is_local_data(config.dataset):
        add(config.dataset, "the dataset file", parents=True)
    if _eval_split_is_file(config.eval_split):
        add(config.eval_split, "the eval data file", parents=True)
    for name in LOCAL_ONLY_FIELDS:
        add(getattr(config, name, ""), f"the {name}")
    for name, value in config.to_dict().items():
        if isinstance(value, str) and _is_path_field(name, value):
            add(value, f"the {name} path")
    if run is not None:
        add(RunDir(Path(run)).path if not isinstance(run, RunDir) else run.path, "the run directory")
    add(studio_home(), "the Finetune Studio folder")
    for candidate in _homes():
        if _specific_enough(candidate, minimum=2):  # /home/alice names a person; /root names nobody
            needles.setdefault(candidate.rstrip("/"), "your home directory")
    return needles


def _homes() -> set[str]:
    """The home directory as this process sees it ($HOME) and as the account database has it."""
    homes = {os.environ.get("HOME", ""), str(Path.home())}
    try:
        import pwd

        homes.add(pwd.getpwuid(os.getuid()).pw_dir)
    except (ImportError, KeyError, OSError):
        pass
    return {h for h in homes if h}


def _specific_enough(path: str, minimum: int) -> bool:
    """An absolute path with at least `minimum` parts below the root (never "/" itself)."""
    if not (path.startswith(("/", "\\")) or _WINDOWS_DRIVE.match(path)):
        return False
    parts = [p for p in re.sub(r"^[A-Za-z]:", "", path).replace("\\", "/").split("/") if p]
    return len(parts) >= minimum


def scan_for_local_paths(folder: str | Path, needles: dict[str, str] | Iterable[str]) -> list[tuple[str, str]]:
    """(file, what) for each file under `folder` that contains one of the `needles` as a whole path."""
    labels = dict(needles) if isinstance(needles, dict) else {n: n for n in needles}
    patterns = [
        (re.compile(rb"(?<![" + _PATH_CHAR + rb"])" + re.escape(n.encode()) + rb"(?![" + _PATH_CHAR + rb"])"), what)
        for n, what in sorted(labels.items(), key=lambda item: -len(item[0]))
        if n
    ]
    hits: list[tuple[str, str]] = []
    root = Path(folder)
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        with open(path, "rb") as fh:
            data = fh.read(SCAN_LIMIT)
        for candidate in (data, data.replace(b"\\/", b"/")):  # JSON may escape slashes
            found = next((what for pattern, what in patterns if pattern.search(candidate)), None)
            if found:
                hits.append((path.relative_to(root).as_posix(), found))
                break
    return hits


def check_no_local_paths(folder: str | Path, config: TrainConfig, run: RunDir | str | Path | None = None) -> None:
    """Refuse to publish `folder` if a file names the run's local paths or the home directory (the last-line guard)."""
    hits = scan_for_local_paths(folder, local_path_needles(config, run))
    if hits:
        name, what = hits[0]
        more = f" (and {len(hits) - 1} more files)" if len(hits) > 1 else ""
        raise UserError(
            f"refusing to publish: {name} contains a local path ({what}){more}; nothing was uploaded; "
            "remove that path from the file in the run directory and try again"
        )
