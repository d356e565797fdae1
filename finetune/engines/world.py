"""The process group a run needs: a launcher's world as it is, or a one-process world set up and torn down around a
run, so DeepSpeed (its engine loop, or the Trainer with a ZeRO config) works with or without torchrun and a later run
in the same process starts clean. Shared by every engine; the multi-process supervisor is
finetune/runs/process_group.py.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from finetune.plan import RunPlan

_WORLD_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class World:
    rank: int
    local_rank: int
    size: int
    launched: bool  # True under torchrun / deepspeed (the launcher owns the environment)
    device: Any = None  # the torch device of this rank's collectives: its GPU (nccl) or the CPU (gloo)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def free_port() -> int:
    """A TCP port nobody listens on right now (for MASTER_PORT of a one-process world)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def under_launcher() -> bool:
    """True when a launcher (torchrun, deepspeed, mpirun wrappers) has set the distributed environment."""
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


@contextlib.contextmanager
def distributed_world(device: str) -> Iterator[World]:
    """The process group DeepSpeed needs on `device` (the plan's: "cuda" takes nccl and this rank's GPU, "cpu" gloo),
    for the duration of one run.

    Under a launcher: its environment as is. Otherwise a world of size 1 on a free local port (DeepSpeed would try
    MPI discovery and fail without it). The group this function created is destroyed at the end and the environment
    restored, so the next run in this process starts clean; a group someone else created is left alone.
    """
    import torch
    import torch.distributed as dist

    launched = under_launcher()
    saved = {name: os.environ.get(name) for name in _WORLD_ENV}
    if not launched:
        os.environ.update(
            {
                "RANK": "0",
                "LOCAL_RANK": "0",
                "WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(free_port()),
            }
        )
    os.environ.setdefault("LOCAL_RANK", "0")
    created = False
    try:
        if not dist.is_initialized():
            import deepspeed

            backend = "nccl" if device == "cuda" else "gloo"
            deepspeed.init_distributed(
                dist_backend=backend, auto_mpi_discovery=False, verbose=False, timeout=collective_timeout()
            )
            created = True
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        where = torch.device("cpu")
        if device == "cuda":
            torch.cuda.set_device(local_rank)
            where = torch.device("cuda", local_rank)
        yield World(dist.get_rank(), local_rank, dist.get_world_size(), launched, where)
    finally:
        restore_linear()
        if created and dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.barrier()
            import deepspeed.comm

            deepspeed.comm.destroy_process_group()
        if not launched:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def collective_timeout() -> Any:
    """How long a collective may wait before it fails instead of hanging (finetune/runs/process_group.py decides)."""
    from finetune.runs.process_group import collective_timeout as timeout

    return timeout()


def restore_linear() -> None:
    """Undo ZeRO-3's process-wide swap of `torch.nn.functional.linear` (DeepSpeed leaves it "unless manually reset"),
    so later runs and memory estimates in this process use the real function."""
    import sys

    import torch

    module = sys.modules.get("deepspeed.runtime.zero.partition_parameters")
    original = getattr(getattr(module, "InsertPostInitMethodToModuleSubClasses", None), "linear_bk", None)
    if original is not None:
        torch.nn.functional.linear = original


@contextlib.contextmanager
def trainer_world(device: str) -> Iterator[World]:
    """`distributed_world(device)` for the Trainer path with a DeepSpeed config: on exit also forget the DeepSpeed
    state that transformers and accelerate keep process-wide, so a later run (with or without DeepSpeed) is not
    affected."""
    saved = {name: value for name, value in os.environ.items() if name.startswith("ACCELERATE_")}
    try:
        with distributed_world(device) as world:
            yield world
    finally:
        from accelerate.state import AcceleratorState
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        unset_hf_deepspeed_config()
        AcceleratorState._reset_state(reset_partial_state=True)
        # accelerate leaves ACCELERATE_USE_DEEPSPEED=true behind, which would turn the next plain run into DeepSpeed.
        for name in [n for n in os.environ if n.startswith("ACCELERATE_")]:
            if name not in saved:
                del os.environ[name]
        os.environ.update(saved)


def trainer_world_if(plan: RunPlan) -> contextlib.AbstractContextManager:
    """`trainer_world()` on the plan's device when the plan uses DeepSpeed through the Trainer (it needs a process
    group), else nothing."""
    return trainer_world(plan.device) if plan.deepspeed else contextlib.nullcontext()
