"""The ranks of a launched group stop after the same step (finetune/runs/process_group.py `GroupProgress`).

Two real processes joined by gloo step together through `GroupProgress.on_step`, and end their loop where the engines
end theirs: as soon as `stop_requested` is set after a step. Only ONE rank sees the stop each time: a stop asked in
that process, or the stop flag file found by one rank only (each rank looks in its own folder here: what happens
when the file appears after the other rank has looked). Both ranks must still stop after the same step, or the one
that goes on waits in its next collective for a rank that has left.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

MAX_STEPS = 8
WORLD = 2
# case: (the rank that sees the stop, the step after which it sees it, how it sees it)
CASES = {
    "asked-in-rank-1": (1, 3, "asked"),
    "flag-file-seen-by-rank-0": (0, 5, "file"),
}


def _steps_until_stop(progress, rank: int, who: int, at: int, how: str) -> int:
    """The engines' loop in short: a step, the progress hook, then stop if asked. Returns the last step run."""
    from finetune.runs.process_group import stop_path

    for step in range(1, MAX_STEPS + 1):
        if rank == who and step == at:
            if how == "asked":
                progress.stop_requested.set()
            else:
                stop_path(progress.run.path).write_text("{}\n", encoding="utf-8")
        progress.on_step(step, MAX_STEPS, step / MAX_STEPS, None)
        if progress.stop_requested.is_set():
            return step
    return MAX_STEPS


def _rank(rank: int, init_file: str, folder: str) -> None:
    """One rank: join the gloo group, run every case, write {case: the step it stopped after}."""
    import torch.distributed as dist

    from finetune.runs.process_group import GroupProgress
    from finetune.runs.rundir import RunDir

    os.environ["WORLD_SIZE"] = str(WORLD)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD, timeout=timedelta(seconds=120)
    )
    stopped = {}
    try:
        for case, (who, at, how) in CASES.items():
            run = RunDir(Path(folder) / case / f"rank-{rank}")
            run.path.mkdir(parents=True)
            stopped[case] = _steps_until_stop(GroupProgress(run, case, write_files=False), rank, who, at, how)
    finally:
        dist.destroy_process_group()
    (Path(folder) / f"rank-{rank}.json").write_text(json.dumps(stopped), encoding="utf-8")


def test_when_one_rank_sees_the_stop_every_rank_stops_after_the_same_step(tmp_path):
    import torch.multiprocessing as mp

    mp.start_processes(_rank, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, start_method="spawn")
    stopped = [json.loads((tmp_path / f"rank-{r}.json").read_text(encoding="utf-8")) for r in range(WORLD)]
    for case, (_, at, _) in CASES.items():
        assert [s[case] for s in stopped] == [at] * WORLD, (case, stopped)
