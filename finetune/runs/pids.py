"""Which process a recorded pid means: a pid with the start time recorded beside it.

A pid alone is not an identity: after a reboot (or a long uptime) the number is given to another process, and a run
that looked "still running" could never be resumed or would be stopped by a flag nobody reads. Every pid the project
records for a run (status.json's `pid`, launch.json's supervisor, launcher and ranks) is written with its process's
start time (psutil's `create_time`), and counts as the run's only while a process with that pid and that start time
runs. Records written before start times were kept fall back to the pid alone.
"""

from __future__ import annotations

import os
from typing import Any

# psutil derives a start time from the boot time, which the kernel may re-estimate by a second when the clock is
# adjusted; a reused pid starts long after (a reboot, or the pid space wrapping), never within this margin.
SAME_START_S = 2.0


def started_at(pid: Any) -> float | None:
    """The start time of process `pid` (seconds since the epoch), or None when no such process runs."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def own_start() -> float | None:
    """This process's start time, to record beside `os.getpid()`."""
    return started_at(os.getpid())


def same_process(pid: Any, started: Any = None) -> bool:
    """True while the process recorded as (`pid`, `started`) still runs: the pid is alive, not a zombie, and (when a
    start time was recorded) started at that time, so a reused pid does not count."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    import psutil

    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:  # dead, not yet reaped by its parent
            return False
        created = process.create_time()
    except psutil.AccessDenied:  # another user's process: alive, but whose cannot be told; count it as before
        return True
    except psutil.Error:
        return False
    if isinstance(started, (int, float)) and not isinstance(started, bool):
        return abs(created - float(started)) <= SAME_START_S
    return True
