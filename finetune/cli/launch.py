"""`python -m finetune launch-command`, `launch` and `stop`: the commands that launch a config on several processes,
a run started as a detached process group, and its stop (finetune/runs/launch.py and process_group.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from finetune.cli.args import add_config_args, load_config
from finetune.cli.terminal import follow, summary_line
from finetune.errors import UserError
from finetune.plan import RunPlan, plan_for
from finetune.runs.launch import (
    DEEPSPEED_HOSTFILE,
    DEFAULT_MASTER_PORT,
    Nodes,
    describe,
    launch_commands,
    launch_group,
    others_command,
    resume_group,
)
from finetune.runs.rundir import RunDir


def register(subparsers: Any) -> None:
    """Add `launch-command`, `launch` and `stop`."""
    parser = subparsers.add_parser("launch-command", help="print the commands that launch a config on 1..N GPUs")
    add_config_args(parser)
    parser.add_argument("--gpus", type=int, default=1, help="GPUs per machine (default 1)")
    parser.add_argument("--nodes", type=int, default=1, help="machines (default 1)")
    parser.add_argument("--hostfile", help=f"deepspeed hostfile for several machines (default {DEEPSPEED_HOSTFILE})")
    parser.add_argument("--master-addr", help="address of the first machine (several machines)")
    parser.add_argument("--master-port", type=int, default=DEFAULT_MASTER_PORT)
    parser.add_argument(
        "--ds-config", metavar="FILE", help="also write the DeepSpeed JSON this launch will use (gpus × nodes ranks)"
    )
    parser.set_defaults(func=cmd_launch_command)

    launch = subparsers.add_parser(
        "launch", help="start a run as a detached group of processes (torchrun / deepspeed); prints its run directory"
    )
    add_config_args(launch)
    launch.add_argument("--nproc", type=int, help="processes (default: one per --gpus, else 1)")
    launch.add_argument("--gpus", default="", help="GPU numbers to use, e.g. 0,1 (default: the first --nproc GPUs)")
    launch.add_argument("--launcher", default=None, help="torchrun (default) or deepspeed")
    launch.add_argument("--resume", metavar="RUN_DIR", help="continue a launched run with the same process count")
    launch.add_argument("--follow", action="store_true", help="stay attached with a progress bar; Ctrl-C stops the run")
    launch.add_argument(
        "--nodes", type=int, default=1, help="machines; this one runs node 0, the command for the others is printed"
    )
    launch.add_argument("--master-addr", help="this machine's address as the others see it (several machines)")
    launch.add_argument("--master-port", type=int, default=DEFAULT_MASTER_PORT)
    launch.set_defaults(func=cmd_launch)

    stop = subparsers.add_parser("stop", help="stop a launched run: every rank saves a checkpoint, then all end")
    stop.add_argument("run_dir", help="the run directory (or its name under the runs folder); a Slurm run too")
    stop.set_defaults(func=cmd_stop)


def cmd_launch_command(args: Any) -> int:
    """Handle `launch-command`: print each command under a heading; with --ds-config, also write DeepSpeed's JSON."""
    config = load_config(args.config, args.set)
    plan = plan_for(config)
    commands = launch_commands(
        plan,
        config_path=args.config or "run.yaml",
        gpus=args.gpus,
        nodes=args.nodes,
        hostfile=args.hostfile,
        master_addr=args.master_addr,
        master_port=args.master_port,
        sets=args.set,
    )
    if not args.config:
        print(f"# no --config given: save this config as run.yaml first ({config.backend} backend, defaults)")
    for key, command in commands.items():
        print(f"# {describe(key, args.gpus, args.nodes, plan.deepspeed)}")
        print(command)
    if args.ds_config:
        _write_exported_ds_config(plan, Path(args.ds_config), args.gpus * args.nodes)
    return 0


def _write_exported_ds_config(plan: RunPlan, path: Path, world_size: int) -> None:
    from finetune.atomic import write_text
    from finetune.engines.deepspeed_config import deepspeed_config
    from finetune.plan import launch_plan

    if not plan.deepspeed:
        raise UserError("--ds-config: this config does not use DeepSpeed; set zero_stage or backend: deepspeed")
    ds = deepspeed_config(launch_plan(plan.config, world_size))
    write_text(path, json.dumps(ds, indent=2) + "\n")
    print(f"# DeepSpeed config for {world_size} processes written to {path}")


def cmd_launch(args: Any) -> int:
    """Handle `launch`: start (or resume) a detached group, print its directory, optionally follow it."""
    from finetune.runs.process_group import read_group

    nodes = Nodes(args.nodes, args.master_addr or "", args.master_port)
    if args.nodes != 1 and args.resume:
        raise UserError("--nodes: --resume works on one machine; resume a run on several with its commands by hand")
    if args.resume:
        if args.config:
            raise UserError("--config: not used with --resume (the run's own config.yaml is used); use --set to change")
        run = resume_group(args.resume, nproc=args.nproc, gpus=args.gpus, launcher=args.launcher, sets=args.set)
    else:
        config = load_config(args.config, args.set)
        launcher = args.launcher or "torchrun"
        run = launch_group(config, nproc=args.nproc, gpus=args.gpus, launcher=launcher, nodes=nodes)
        if nodes.count > 1:
            nproc = read_group(run.path)["nproc"]
            print(f"# run this on each other machine (NODE_RANK 1..{nodes.count - 1}), with the same config file:")
            print(others_command(args.config or "run.yaml", run, nproc, nodes, args.set))
    print(run.path, flush=True)
    if not args.follow:
        return 0
    return follow_group(run)


def follow_group(run: RunDir) -> int:
    """Stay attached to a launched run with `train`'s progress bar; Ctrl-C asks it to stop (checkpoint saved)."""
    from finetune.runs.manager import RunManager

    manager = RunManager()
    manager.follow_group(run)
    final = follow(manager, show_bar=True)
    if final is not None and final.status == "failed":
        print(f"error: {final.error}", file=sys.stderr, flush=True)
        return 1
    print(summary_line(final, manager))
    return 0 if final is not None and final.status in ("completed", "stopped") else 1


def cmd_stop(args: Any) -> int:
    """Handle `stop RUN_DIR`: the stop flag every rank of the run reads at its next step."""
    from finetune import paths
    from finetune.cluster import scheduler
    from finetune.runs.process_group import group_alive, request_stop
    from finetune.runs.rundir import ACTIVE, find_run

    run = find_run(args.run_dir, paths.runs_root(), field="run_dir")
    if scheduler.is_slurm_run(run.path):
        print(scheduler.stop_run(run.path))
        return 0
    if not group_alive(run.path) and run.effective_status() not in ACTIVE:
        raise UserError(f"run_dir: {run.name} is not running (it is {run.effective_status()})", "run_dir")
    if not group_alive(run.path):
        raise UserError(f"run_dir: {run.name} runs in another process, not a launched group; stop it there", "run_dir")
    request_stop(run.path)
    print(f"stop requested: {run.name} saves a checkpoint after the current step, then every process ends")
    return 0
