"""User-facing errors: one line that names the field and what is allowed."""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix; its message is shown as is, without a traceback."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ConfigError(UserError):
    """A bad value for one `TrainConfig` field."""


class BusyError(UserError):
    """A run is already using the device."""


def os_reason(exc: OSError) -> str:
    """'No space left on device (/path)': an OS error in plain words, without errno numbers or a traceback."""
    reason = exc.strerror or type(exc).__name__
    return f"{reason} ({exc.filename})" if exc.filename else reason
