"""What a failed run tells the user: one plain line (and advice for out-of-memory), and memory given back."""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

from finetune.errors import UserError, os_reason

if TYPE_CHECKING:
    from finetune.plan import RunPlan


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
