"""What a failed run tells the user: one plain line (and advice for out-of-memory), and memory given back."""

from __future__ import annotations

import errno
import gc
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from finetune.errors import UserError, os_reason

if TYPE_CHECKING:
    from finetune.plan import RunPlan
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
WRITE_LIMITS = (*DISK_FULL, errno.EFBIG)  # EFBIG: a file-size limit (ulimit -f)
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")  # safetensors' writer: "I/O error: ... (os error 28)"
PROBE_BYTES = 64 * 1024


def plain_error(exc: BaseException, plan: RunPlan, step: int) -> tuple[str, str | None]:
    """A one-line message for the user and, for out-of-memory, the estimator's advice for the run's plan."""
    if isinstance(exc, UserError):
        return str(exc), None
    if isinstance(exc, OSError) and exc.errno is not None:
        return (
            f"could not write the run's files at step {step}: {os_reason(exc)}",
            "Free disk space or fix the folder's permissions, then resume: training continues from the last "
            "complete checkpoint.",
        )
    if is_out_of_memory(exc):
        try:
            from finetune.memory import advice_text

            advice = advice_text(plan)
        except Exception:  # the advice is a help, never a second failure
            advice = "Try gradient_checkpointing: true, a smaller per_device_train_batch_size, or method: qlora."
        return f"out of memory at step {step}: the run needs more memory than the device has", advice
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted by the user (Ctrl-C)", None
    first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    return f"training failed at step {step}: {type(exc).__name__}{': ' + first if first else ''}", None


def disk_error(exc: BaseException, folder: Path) -> OSError | None:
    """The full disk (or file-size limit) behind a failed run, or None: an OSError saying so anywhere in the
    exception's chain; its error number in a library's message (safetensors); else, when `folder` has no room left,
    "No space left on device" (torch.save on a full disk only says "unexpected pos 73408 vs 73300")."""
    if isinstance(exc, (UserError, KeyboardInterrupt, MemoryError)) or is_out_of_memory(exc):
        return None  # already said in plain words
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, OSError) and link.errno in WRITE_LIMITS:
            return link
        link = link.__cause__ or link.__context__
    found = _RUST_OS_ERROR.search(str(exc))
    if found and int(found.group(1)) in WRITE_LIMITS:
        return OSError(int(found.group(1)), os.strerror(int(found.group(1))), str(folder))
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder)) if no_room(folder) else None


def no_room(folder: Path) -> bool:
    """True when a small file cannot be written in `folder` because its disk (or quota) is full."""
    try:
        with tempfile.TemporaryFile(dir=folder) as fh:
            fh.write(b"\0" * PROBE_BYTES)
            fh.flush()
    except OSError as exc:
        return exc.errno in DISK_FULL
    return False


def is_out_of_memory(exc: BaseException) -> bool:
    """torch's OOM error, or an allocator message that says the same."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, (MemoryError, RuntimeError)) and "out of memory" in str(exc).lower()


def release_memory() -> None:
    """Give memory back after a run so the next one in this process starts clean."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
