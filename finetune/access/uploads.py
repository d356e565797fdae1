"""Uploaded data files: one folder per identity, bounded, pruned when old and unused.

    store = Uploads(home / "uploads", UploadLimits())
    value = store.add("alice", "/tmp/gradio/…/my data.jsonl", "my data.jsonl")   # "upload:my_data.jsonl"
    store.resolve("alice", value)   # the kept file; another identity gets None, as for a name never uploaded

The form's `dataset` / `eval_split` carry `upload:NAME` (the kept file's name, never a server path); only the
identity that uploaded it can resolve it. Every limit is checked before anything is written, so a refused upload
keeps nothing. Names stay readable: the sent name made safe, with `-2`, `-3`… when that name is taken (an upload
never overwrites another).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from finetune.errors import UserError

PREFIX = "upload:"
DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")  # finetune.data.FILE_TYPES (not imported: it pulls datasets)
MB = 1024**2
_SAFE_IDENTITY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
LIMIT_SWITCHES = {  # field: (flag, environment variable, default, what it limits)
    "file_mb": ("--upload-max-mb", "FINETUNE_UPLOAD_MAX_MB", 200.0, "MB per uploaded file"),
    "total_mb": ("--uploads-total-mb", "FINETUNE_UPLOADS_TOTAL_MB", 1024.0, "MB of uploads per person"),
    "count": ("--uploads-max-files", "FINETUNE_UPLOADS_MAX_FILES", 20, "uploaded files per person"),
    "keep_days": (
        "--keep-uploads-days",
        "FINETUNE_KEEP_UPLOADS_DAYS",
        7.0,
        "days an upload no run uses is kept (0: always)",
    ),
}


@dataclass(frozen=True)
class UploadLimits:
    """What one identity may keep: each file, all of them together, how many, and for how long unused (0: always)."""

    file_mb: float = 200.0
    total_mb: float = 1024.0
    count: int = 20
    keep_days: float = 7.0

    @property
    def file_bytes(self) -> int:
        return int(round(self.file_mb * MB))

    @property
    def total_bytes(self) -> int:
        return int(round(self.total_mb * MB))

    @classmethod
    def decide(cls, given: Mapping[str, float | int | None], env: Mapping[str, str]) -> UploadLimits:
        """The limits from flags (`given`, None where not passed), else their environment variables, else the
        defaults; `ValueError` (one line naming the flag) for a value that is not a number ≥ 0."""
        values = {}
        for name, (flag, variable, default, _) in LIMIT_SWITCHES.items():
            value = given.get(name)
            source = flag
            if value is None and str(env.get(variable, "")).strip():
                value, source = env[variable], variable
            if value is None:
                value = default
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"{source}: {str(value)[:40]!r} is not a number") from None
            if not number >= 0 or number == float("inf"):
                raise ValueError(f"{source}: give a number of 0 or more, not {value}")
            values[name] = int(number) if isinstance(default, int) else number
        return cls(**values)


def is_upload(value: object) -> bool:
    """True for a form value that names an upload (`upload:NAME`)."""
    return isinstance(value, str) and value.startswith(PREFIX)


class Uploads:
    """The uploads folder: `ROOT/<identity>/NAME`, one folder per identity."""

    def __init__(self, root: Path, limits: UploadLimits | None = None) -> None:
        self.root = Path(root)
        self.limits = limits or UploadLimits()
        self._lock = threading.Lock()  # two uploads of one identity check the limits one after the other

    def folder(self, identity: str) -> Path:
        """This identity's folder: its name when that is a plain name, with a short hash so no two identities share
        one (names that differ only in characters a folder cannot hold)."""
        digest = hashlib.sha256(identity.encode("utf-8")).hexdigest()[:8]
        slug = identity if _SAFE_IDENTITY.fullmatch(identity) else re.sub(r"[^A-Za-z0-9._-]", "_", identity)[:64]
        return self.root / f"{slug.lstrip('.') or 'user'}-{digest}"

    def files(self, identity: str) -> list[Path]:
        """This identity's kept files, oldest first."""
        try:
            found = [p for p in self.folder(identity).iterdir() if p.is_file() and not p.name.startswith(".")]
        except OSError:
            return []
        return sorted(found, key=_mtime)

    def resolve(self, identity: str | None, value: str) -> Path | None:
        """The kept file an `upload:NAME` value names for this identity; None when it has no such upload."""
        name = value[len(PREFIX) :] if is_upload(value) else ""
        if identity is None or not name or name != Path(name).name or name.startswith("."):
            return None
        path = self.folder(identity) / name
        return path if path.is_file() else None

    def add(self, identity: str, source: str | Path, name: str | None = None) -> str:
        """Keep an uploaded file for `identity` under a name of its own; returns its `upload:NAME` value. Refused in
        one line (nothing kept) when it is not a data file or would pass a limit."""
        source = Path(source)
        shown = safe_name(name or source.name)
        if Path(str(name or source.name)).suffix.lower() not in DATA_SUFFIXES:
            raise UserError(f"dataset: {shown} is not a {' / '.join(DATA_SUFFIXES)} file", "dataset")
        try:
            size = source.stat().st_size
        except OSError:
            raise UserError(f"dataset: the upload of {shown} did not arrive; try again", "dataset") from None
        limits = self.limits
        if size > limits.file_bytes:
            have, allowed = _sizes(size, limits.file_bytes)
            raise UserError(f"dataset: {shown} is {have}, more than the {allowed} allowed per file", "dataset")
        with self._lock:
            kept = self.files(identity)
            if len(kept) >= limits.count:
                raise UserError(
                    f"dataset: you already keep {len(kept)} uploads, the most allowed; uploads unused for "
                    f"{limits.keep_days:g} days are removed",
                    "dataset",
                )
            total = sum(_size(p) for p in kept)
            if total + size > limits.total_bytes:
                have, allowed = _sizes(total + size, limits.total_bytes)
                raise UserError(
                    f"dataset: {shown} would bring your uploads to {have}, more than the {allowed} allowed in all",
                    "dataset",
                )
            return PREFIX + self._copy(source, self.folder(identity), shown)

    @staticmethod
    def _copy(source: Path, folder: Path, name: str) -> str:
        folder.mkdir(parents=True, exist_ok=True)
        stem, suffix = name[: -len(Path(name).suffix)], Path(name).suffix
        for n in range(1, 10_000):
            target = folder / (name if n == 1 else f"{stem}-{n}{suffix}")
            try:
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue
            try:
                with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
                    shutil.copyfileobj(src, out)
            except BaseException:
                target.unlink(missing_ok=True)
                raise
            return target.name
        raise UserError(f"dataset: too many uploads named {name}; rename the file", "dataset")

    def prune(self, used: Iterable[str], now: float | None = None) -> list[Path]:
        """Remove uploads older than `keep_days` that no run uses (`used`: texts of the runs' config files, which
        name the files they train on); returns what was removed. `keep_days` 0 keeps everything."""
        if not self.limits.keep_days:
            return []
        cutoff = (now or time.time()) - self.limits.keep_days * 86400
        texts = list(used)
        removed = []
        try:
            folders = [p for p in self.root.iterdir() if p.is_dir()]
        except OSError:
            return []
        for folder in folders:
            for path in list(folder.iterdir()):
                if not path.is_file() or _mtime(path) >= cutoff or any(str(path) in text for text in texts):
                    continue
                try:
                    path.unlink()
                    removed.append(path)
                except OSError:
                    pass  # removed meanwhile, or not ours to remove
        return removed


def safe_name(name: str) -> str:
    """A file name safe to keep: letters, digits and . _ -, at most 80 characters, keeping a data file's suffix."""
    path = Path(str(name).replace("\\", "/")).name
    suffix = Path(path).suffix.lower()
    suffix = suffix if suffix in DATA_SUFFIXES else ""
    stem = path[: len(path) - len(suffix)] if suffix else path
    keep = "".join(c if c.isalnum() or c in "._-" else "_" for c in stem).lstrip(".")
    return (keep[:80] or "data") + suffix


def _sizes(size: int, limit: int) -> tuple[str, str]:
    """Two sizes in MB as a person reads them; in bytes where MB would show them equal (one byte over)."""
    have, allowed = f"{size / MB:.1f} MB", f"{limit / MB:.1f} MB"
    return (have, allowed) if have != allowed else (f"{size:,} bytes", f"{limit:,} bytes")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
