"""Uploaded data files: one folder per identity, bounded, pruned when old and unused.

    store = Uploads(home / "uploads", UploadLimits())
    value = store.add("alice", "/tmp/gradio/…/my data.jsonl", "my data.jsonl")   # "upload:my_data.jsonl"
    store.resolve("alice", value)   # the kept file; another identity gets None, as for a name never uploaded
    store.add_set("alice", [("/tmp/…/data.jsonl", "data.jsonl"), ("/tmp/…/a.png", "a.png")])  # upload:data/data.jsonl
    store.add_set("alice", [("/tmp/…/shapes.zip", "shapes.zip")])  # the same, unpacked

The form's `dataset` / `eval_split` carry `upload:NAME` (the kept file's name, never a server path); only the
identity that uploaded it can resolve it. Every limit is checked before anything is written, so a refused upload
keeps nothing. Names stay readable: the sent name made safe, with `-2`, `-3`… when that name is taken (an upload
never overwrites another).

Image data comes as a set: its data file with the images it names (paths relative to the data file), sent as
several files or as one .zip. A set is kept whole in a folder of its own (`upload:FOLDER/data.jsonl`), so the data
file's relative paths find their images beside it and a later set never overwrites an earlier one's images. A zip is
unpacked member by member: no absolute path, no `..`, no link, only data and image files (others are left out),
each within the per-file limit, all within the total, counted as they are written (a zip's own sizes may lie).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import threading
import time
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune.errors import UserError
from finetune.paths import mark_uploads_root

PREFIX = "upload:"
DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")  # finetune.data.FILE_TYPES (not imported: it pulls datasets)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")
ZIP_SUFFIX = ".zip"
SET_FILES_LIMIT = 10_000  # files in one set (a zip's members): a zip of tiny files cannot fill the disk's inodes
INCOMING = ".incoming-"  # a set being written; renamed to its own name once whole, removed if it fails
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

    def entries(self, identity: str) -> list[Path]:
        """This identity's uploads as counted against the limit: each kept file and each set's folder, oldest first."""
        try:
            found = [p for p in self.folder(identity).iterdir() if not p.name.startswith(".") and not p.is_symlink()]
        except OSError:
            return []
        return sorted(found, key=_mtime)

    def files(self, identity: str) -> list[Path]:
        """This identity's kept data files (single uploads, and the data files of each set), oldest first."""
        found = []
        for entry in self.entries(identity):
            if entry.is_file():
                found.append(entry)
            elif entry.is_dir():
                found += [p for p in sorted(entry.rglob("*")) if p.suffix.lower() in DATA_SUFFIXES and p.is_file()]
        return sorted(found, key=_mtime)

    def name_of(self, identity: str, path: Path) -> str:
        """The `upload:NAME` value of one of this identity's kept files (NAME relative to its folder)."""
        return PREFIX + Path(path).relative_to(self.folder(identity)).as_posix()

    def resolve(self, identity: str | None, value: str) -> Path | None:
        """The kept file an `upload:NAME` value names for this identity (NAME: a file, or a file inside one of its
        sets, `FOLDER/…/FILE`); None when it has no such upload."""
        name = value[len(PREFIX) :] if is_upload(value) else ""
        parts = name.split("/")
        if identity is None or not name or "\\" in name or any(not p or p.startswith(".") for p in parts):
            return None
        folder = self.folder(identity)
        path = folder.joinpath(*parts)
        try:  # never through a link out of the folder
            inside = path.resolve().is_relative_to(folder.resolve())
        except OSError:
            return None
        return path if inside and path.is_file() else None

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
            self._check_room(identity, shown, size)
            return PREFIX + self._copy(source, self.folder(identity), shown)

    def add_image(self, identity: str, source: str | Path, name: str | None = None) -> str:
        """Keep one uploaded image (a chat's picture) as `add` keeps a data file; returns its `upload:NAME`."""
        source = Path(source)
        shown = safe_name(name or source.name, IMAGE_SUFFIXES)
        if Path(str(name or source.name)).suffix.lower() not in IMAGE_SUFFIXES:
            raise UserError(f"images: {shown} is not a {' / '.join(IMAGE_SUFFIXES)} file", "images")
        size = _size(source)
        if not source.is_file():
            raise UserError(f"images: the upload of {shown} did not arrive; try again", "images")
        if size > self.limits.file_bytes:
            have, allowed = _sizes(size, self.limits.file_bytes)
            raise UserError(f"images: {shown} is {have}, more than the {allowed} allowed per file", "images")
        with self._lock:
            try:
                self._check_room(identity, shown, size)
            except UserError as exc:
                raise UserError("images" + str(exc)[len("dataset") :], "images") from None
            return PREFIX + self._copy(source, self.folder(identity), shown)

    def add_set(self, identity: str, sources: list[tuple[str | Path, str]]) -> str:
        """Keep a data file with its images (several uploaded files, or one .zip holding both) in a folder of their
        own, paths inside kept; returns the data file's `upload:FOLDER/NAME` (one named like "train" first when
        there are several). Refused in one line, keeping nothing, when a name is unsafe, no data file is in it, or
        a limit would be passed."""
        members = self._set_members(sources)
        data = [m for m in members if Path(m[0]).suffix.lower() in DATA_SUFFIXES]
        if not data:
            raise UserError(
                f"dataset: no data file ({' / '.join(DATA_SUFFIXES)}) among the uploaded files; add the one that "
                "names the images",
                "dataset",
            )
        data.sort(key=lambda m: ("train" not in Path(m[0]).name.lower(), m[0].count("/"), m[0]))
        limits = self.limits
        total = sum(m[2] for m in members)
        folder = self.folder(identity)
        stem = safe_name(Path(data[0][0]).stem)
        with self._lock:
            self._check_room(identity, stem, total)
            mark_uploads_root(self.root)
            folder.mkdir(parents=True, exist_ok=True)
            incoming = folder / f"{INCOMING}{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}"
            incoming.mkdir()
            try:
                written = 0
                for relative, opener, _ in members:
                    target = incoming.joinpath(*relative.split("/"))
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with opener() as src, open(target, "xb") as out:
                        while chunk := src.read(MB):
                            written += len(chunk)
                            if written > limits.total_bytes or out.tell() + len(chunk) > limits.file_bytes:
                                raise UserError(
                                    f"dataset: {relative} unpacks past the {_sizes(0, limits.file_bytes)[1]} "
                                    "allowed per file or your uploads' total",
                                    "dataset",
                                )
                            out.write(chunk)
                kept = _rename_free(incoming, folder, stem)
            except BaseException:
                shutil.rmtree(incoming, ignore_errors=True)
                raise
        return PREFIX + f"{kept}/{data[0][0]}"

    def _set_members(self, sources: list[tuple[str | Path, str]]) -> list[tuple[str, Any, int]]:
        """(relative path, opener, size) of each file of a set: the sent files by their safe names, a zip's members
        by their checked paths (a folder that holds all of them dropped)."""
        limits = self.limits
        members: list[tuple[str, Any, int]] = []
        for source, name in sources:
            source, suffix = Path(source), Path(str(name)).suffix.lower()
            size = _size(source)
            shown = safe_name(name, (*IMAGE_SUFFIXES, ZIP_SUFFIX))
            if not source.is_file():
                raise UserError(f"dataset: the upload of {shown} did not arrive; try again", "dataset")
            if size > limits.file_bytes:
                have, allowed = _sizes(size, limits.file_bytes)
                raise UserError(f"dataset: {shown} is {have}, more than the {allowed} allowed per file", "dataset")
            if suffix == ZIP_SUFFIX:
                members += _zip_members(source, shown, limits)
            elif suffix in DATA_SUFFIXES:
                members.append((shown, _opener(source), size))
            elif suffix in IMAGE_SUFFIXES:  # kept by the name the data file gives it
                members.append((_kept_name(Path(str(name).replace("\\", "/")).name, shown), _opener(source), size))
            else:
                kinds = " / ".join((*DATA_SUFFIXES, *IMAGE_SUFFIXES, ZIP_SUFFIX))
                raise UserError(f"dataset: {shown} is not a {kinds} file", "dataset")
        names = [m[0].lower() for m in members]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise UserError(f"dataset: two uploaded files are both named {twice[0]}; rename one", "dataset")
        if len(members) > SET_FILES_LIMIT:
            raise UserError(f"dataset: {len(members)} files in one upload, more than {SET_FILES_LIMIT:,}", "dataset")
        return members

    def _check_room(self, identity: str, shown: str, size: int) -> None:
        """Refuse (one line) an upload of `size` bytes that would pass the count or the total limit."""
        limits = self.limits
        kept = self.entries(identity)
        if len(kept) >= limits.count:
            raise UserError(
                f"dataset: you already keep {len(kept)} uploads, the most allowed; uploads unused for "
                f"{limits.keep_days:g} days are removed",
                "dataset",
            )
        total = sum(_tree_size(p) for p in kept)
        if total + size > limits.total_bytes:
            have, allowed = _sizes(total + size, limits.total_bytes)
            raise UserError(
                f"dataset: {shown} would bring your uploads to {have}, more than the {allowed} allowed in all",
                "dataset",
            )

    @staticmethod
    def _copy(source: Path, folder: Path, name: str) -> str:
        mark_uploads_root(folder.parent)
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
                if path.is_symlink() or _mtime(path) >= cutoff or any(str(path) in text for text in texts):
                    continue
                try:
                    if path.is_dir():  # a set (or a set left half-written): its data file is what runs name
                        shutil.rmtree(path)
                    elif path.is_file():
                        path.unlink()
                    else:
                        continue
                    removed.append(path)
                except OSError:
                    pass  # removed meanwhile, or not ours to remove
        return removed


def safe_name(name: str, suffixes: tuple[str, ...] = ()) -> str:
    """A file name safe to keep: letters, digits and . _ -, at most 80 characters, keeping a data file's suffix (or
    one of `suffixes`)."""
    path = Path(str(name).replace("\\", "/")).name
    suffix = Path(path).suffix.lower()
    suffix = suffix if suffix in DATA_SUFFIXES or suffix in suffixes else ""
    stem = path[: len(path) - len(suffix)] if suffix else path
    keep = "".join(c if c.isalnum() or c in "._-" else "_" for c in stem).lstrip(".")
    return (keep[:80] or "data") + suffix


def _zip_members(path: Path, shown: str, limits: UploadLimits) -> list[tuple[str, Any, int]]:
    """The data and image files of a zip as set members; a member with an unsafe path or that is a link refuses the
    whole zip; other files (a README, macOS's __MACOSX folder) are left out."""
    try:
        archive = zipfile.ZipFile(path)
        infos = archive.infolist()
    except (zipfile.BadZipFile, OSError) as exc:
        raise UserError(f"dataset: {shown} is not a readable zip file ({str(exc)[:80]})", "dataset") from None
    if len(infos) > SET_FILES_LIMIT:
        raise UserError(f"dataset: {shown} holds {len(infos):,} files, more than {SET_FILES_LIMIT:,}", "dataset")
    kept = []
    for info in infos:
        name = info.filename
        parts = name.replace("\\", "/").split("/")
        if name.startswith(("/", "\\")) or ".." in parts or ":" in parts[0]:
            raise UserError(f"dataset: {shown} holds {name[:80]!r}, a path outside its folder", "dataset")
        if info.is_dir() or parts[0] == "__MACOSX" or any(p.startswith(".") for p in parts if p):
            continue
        if stat.S_ISLNK(info.external_attr >> 16):
            raise UserError(f"dataset: {shown} holds {name[:80]!r}, a link; zip the files themselves", "dataset")
        if Path(name).suffix.lower() not in (*DATA_SUFFIXES, *IMAGE_SUFFIXES):
            continue
        if info.file_size > limits.file_bytes:
            have, allowed = _sizes(info.file_size, limits.file_bytes)
            raise UserError(f"dataset: {name[:80]} in {shown} is {have}, more than the {allowed} allowed", "dataset")
        kept.append(("/".join(_kept_name(p, shown) for p in parts if p), _zip_opener(archive, info), info.file_size))
    tops = {m[0].split("/")[0] for m in kept}
    if len(tops) == 1 and all("/" in m[0] for m in kept):  # the zip of a folder: its contents, not the folder
        kept = [(m[0].split("/", 1)[1], m[1], m[2]) for m in kept]
    return kept


def _kept_name(part: str, shown: str) -> str:
    """A name inside a set, kept exactly as sent (the data file names its images by it), when it is a plain name."""
    if not part or part.startswith(".") or any(not (c.isalnum() or c in "._-") for c in part) or len(part) > 120:
        raise UserError(
            f"dataset: {shown}: {part[:80]!r} is not a plain file name (letters, digits, . _ -); rename it and the "
            "data file's mention of it",
            "dataset",
        )
    return part


def _opener(path: Path) -> Any:
    return lambda: open(path, "rb")


def _zip_opener(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> Any:
    return lambda: archive.open(info)


def _rename_free(incoming: Path, folder: Path, stem: str) -> str:
    """Move a written set to `folder/stem` (or `stem-2`, `stem-3`… when taken); returns the name it got."""
    for n in range(1, 10_000):
        name = stem if n == 1 else f"{stem}-{n}"
        try:
            (folder / name).mkdir()  # claims the name; the set then moves into the empty folder
        except FileExistsError:
            continue
        os.replace(incoming, folder / name)
        return name
    raise UserError(f"dataset: too many uploads named {stem}; rename the file", "dataset")


def _tree_size(path: Path) -> int:
    """A file's size, or all the files' under a folder."""
    if path.is_dir():
        return sum(_size(p) for p in path.rglob("*") if p.is_file())
    return _size(path)


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
