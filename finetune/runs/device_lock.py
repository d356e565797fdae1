"""One run at a time per machine: a lock file under the runs root that the app and the CLI share."""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from finetune.errors import BusyError, UserError, os_reason


def distributed_rank() -> tuple[int, int]:
    """(rank, world size) under torchrun / deepspeed launchers; (0, 1) otherwise."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


class DeviceLock:
    """A lock file that one process at a time holds while it trains (the CLI and the app share it).

    `still_busy(previous_holder)`: asked when the lock is free but its file still names a holder (one that ended
    without clearing it); True keeps the device busy. A launched group's supervisor killed with -9 frees the lock
    while its ranks may still be ending: they must not train beside the next run."""

    def __init__(self, root: Path, still_busy: Callable[[dict[str, Any]], bool] | None = None) -> None:
        self.path = root / ".device.lock"
        self.still_busy = still_busy
        self._fh: Any = None

    def acquire(self, holder: dict[str, Any]) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fh = open(self.path, "a+", encoding="utf-8")
        except OSError as exc:
            raise UserError(f"runs folder: cannot use {self.path.parent}: {os_reason(exc)}", "output_dir") from None
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            info = _parse(fh.read())
            fh.close()
            raise BusyError(busy_message(info)) from None
        fh.seek(0)
        previous = _parse(fh.read())
        if previous and self.still_busy is not None and self.still_busy(previous):
            fcntl.flock(fh, fcntl.LOCK_UN)  # the holder line stays as it is, for the next one who asks
            fh.close()
            raise BusyError(busy_message(previous))
        self._fh = fh
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(json.dumps(holder))
            fh.flush()
        except OSError:
            pass  # a full disk: the lock holds all the same, only the "who" line is missing

    def rewrite(self, holder: dict[str, Any]) -> None:
        """Replace the "who holds it" line (a launched group: the supervisor's pid once it is known)."""
        if self._fh is None:
            return
        try:
            self._fh.seek(0)
            self._fh.truncate()
            self._fh.write(json.dumps(holder))
            self._fh.flush()
        except OSError:
            pass

    def fileno(self) -> int:
        """The lock file's descriptor, for a child process that takes over the lock (`hand_over`)."""
        return self._fh.fileno()

    def hand_over(self) -> None:
        """Close our descriptor without unlocking: a child that inherited it holds the lock until it exits."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def holder(self) -> dict[str, Any]:
        """Who holds the lock, as written in the file ({} when free or unreadable); does not take the lock."""
        try:
            return _parse(self.path.read_text(encoding="utf-8"))
        except OSError:
            return {}

    def release(self) -> None:
        if self._fh is not None:
            try:
                self._fh.truncate(0)
            except OSError:
                pass  # the holder line is information only; the lock itself is what matters
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None


def _parse(text: str) -> dict[str, Any]:
    try:
        return json.loads(text)
    except ValueError:
        return {}


def busy_message(info: dict[str, Any]) -> str:
    """'busy: run X, started by Y at Z, is training …' — who holds the device and since when."""
    when = time.strftime("%H:%M:%S", time.localtime(info["started_at"])) if info.get("started_at") else "?"
    who = info.get("owner") or "another process"
    return (
        f"busy: run {info.get('run_id', '?')} started by {who} at {when} is using the device; "
        "stop it or wait for it to finish"
    )
