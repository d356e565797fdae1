"""`python -m finetune` with the run held at one step, for tests that signal or kill a running training process.

    python -m tests.hold STEP MARKER train --config run.yaml ...        (also under torchrun / the deepspeed launcher)

At the end of optimizer step STEP every rank writes MARKER.rank<N> (its pid; rank 0 also writes MARKER itself), then
waits there until its run is asked to stop (Ctrl-C) or the process is killed. A test that waits for MARKER acts on a
run that is certainly still training, at a known step, whatever the speed of the machine: no sleeps, no races.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HOLD_LIMIT_S = 300  # the run goes on by itself after this, so a failing test never leaves a process behind for long


def main(argv: list[str]) -> int:
    step, marker, args = int(argv[0]), Path(argv[1]), argv[2:]
    from finetune.cli import main as cli_main
    from finetune.runs.progress import Progress

    original = Progress.on_step

    def on_step(self, current, *rest, **kwargs):
        original(self, current, *rest, **kwargs)
        if current == step:
            rank = os.environ.get("RANK", "0")
            Path(f"{marker}.rank{rank}").write_text(str(os.getpid()))
            if rank == "0":
                marker.write_text(str(os.getpid()))
            self.stop_requested.wait(HOLD_LIMIT_S)

    Progress.on_step = on_step
    return cli_main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
