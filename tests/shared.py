"""Folders built once for the whole test run and shared by the pytest-xdist workers (the tiny models, trained runs).

The controlling pytest process names one temporary folder (`FINETUNE_TESTS_SHARED`, set in `tests/conftest.py`
before the workers start, removed at its exit); the first process that needs a folder builds it under a file lock,
the others wait and read it. Shared folders are read-only for tests: a test that changes a run works on a copy.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

VARIABLE = "FINETUNE_TESTS_SHARED"


def create_root() -> None:
    """Name the shared folder for this test run (the controlling process; workers inherit the variable)."""
    if VARIABLE not in os.environ:
        root = tempfile.mkdtemp(prefix="finetune-tests-shared-")
        os.environ[VARIABLE] = root
        atexit.register(shutil.rmtree, root, True)


def shared_folder(name: str, build: Callable[[Path], object]) -> Path:
    """The folder `name` under the shared root, built by `build(path)` by the first process that asks."""
    from filelock import FileLock

    create_root()  # a process started without the controller's variable (e.g. pytest -p no:xdist) keeps its own
    target = Path(os.environ[VARIABLE]) / name
    with FileLock(str(target) + ".lock"):
        if not (target.parent / f"{name}.done").exists():
            shutil.rmtree(target, ignore_errors=True)  # a build that died half way
            target.mkdir(parents=True)
            build(target)
            (target.parent / f"{name}.done").touch()
    return target
