"""Holds a Slurm test run at one step (tests/test_slurm.py puts this folder on PYTHONPATH, and the job inherits it).

With FINETUNE_TEST_HOLD=STEP:MARKER in the environment at submission, each rank of the job, at the end of optimizer
step STEP, writes MARKER.rank<N> and waits until MARKER.release exists (at most HOLD_LIMIT_S). A rank that finds its
MARKER.rank<N> already written (a requeued job reaching the step again) goes on: the hold happens once per run."""

import os

HOLD_LIMIT_S = 300

if os.environ.get("FINETUNE_TEST_HOLD"):
    import time
    from pathlib import Path

    from finetune.runs.progress import Progress

    _step, _, _marker = os.environ["FINETUNE_TEST_HOLD"].partition(":")
    _original = Progress.on_step

    def _held_on_step(self, current, *rest, **kwargs):
        _original(self, current, *rest, **kwargs)
        mine = Path(f"{_marker}.rank{os.environ.get('RANK', '0')}")
        if current != int(_step) or mine.exists():
            return
        self.update(force=True)  # status.json says this step while the run waits (its writes are throttled)
        mine.write_text(str(os.getpid()))
        deadline = time.monotonic() + HOLD_LIMIT_S
        while not Path(f"{_marker}.release").exists() and time.monotonic() < deadline:
            time.sleep(0.1)

    Progress.on_step = _held_on_step
