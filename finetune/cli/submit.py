"""`python -m finetune submit`: a run on a Slurm cluster (finetune/cluster/): check, write the batch script, sbatch;
`--print` shows the script without submitting; `--resume RUN_DIR` submits a new job that continues a run. Also the
step the batch script runs before its ranks (`slurm-job-start`, not for typing by hand)."""

from __future__ import annotations

import sys
from typing import Any

from finetune.cli.args import add_config_args, load_config
from finetune.errors import UserError


def register(subparsers: Any) -> None:
    """Add `submit` and the batch script's `slurm-job-start`."""
    submit = subparsers.add_parser("submit", help="submit a run to a Slurm cluster (sbatch); prints its run directory")
    add_config_args(submit)
    submit.add_argument("--slurm", action="store_true", help="run on a Slurm cluster (runs_on: slurm)")
    submit.add_argument("--nodes", type=int, help="nodes (machines) the job uses (nodes)")
    submit.add_argument("--gpus-per-node", type=int, help="GPUs per node, one process each; 0: CPUs (gpus_per_node)")
    submit.add_argument("--partition", help="the partition (slurm_partition)")
    submit.add_argument("--time", help="the time limit, e.g. 04:00:00 (slurm_time)")
    submit.add_argument("--account", help="the account charged (slurm_account)")
    submit.add_argument("--print", action="store_true", help="print the batch script and submit nothing")
    submit.add_argument("--resume", metavar="RUN_DIR", help="submit a new job that continues this Slurm run")
    submit.set_defaults(func=cmd_submit)
    start = subparsers.add_parser("slurm-job-start")  # run by the batch script; no help line: not for typing
    start.add_argument("run_dir")
    start.set_defaults(func=cmd_job_start)


def submit_config(args: Any) -> Any:
    """The config of `--config` / `--set` with the flags laid over it (the flags name their config fields)."""
    config = load_config(args.config, args.set)
    flags = {
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "slurm_partition": args.partition,
        "slurm_time": args.time,
        "slurm_account": args.account,
    }
    changes = {key: value for key, value in flags.items() if value is not None}
    if args.slurm:
        changes["runs_on"] = "slurm"
    return config.replace(**changes) if changes else config


def cmd_submit(args: Any) -> int:
    """Handle `submit`: print the script (--print), resume, or submit; prints the run directory and the job id."""
    from finetune.cluster import slurm

    if args.resume:
        if args.config or args.print:
            raise UserError("--resume: a resumed run keeps its own config and batch script; leave --config out")
        done = slurm.resume(args.resume)
    else:
        config = submit_config(args)
        if config.runs_on != "slurm":
            raise UserError("--slurm: say where it runs: --slurm (or runs_on: slurm in the config)", "runs_on")
        if args.print:
            print(slurm.preview(config)[0], end="")
            return 0
        done = slurm.submit(config)
    print(f"# Slurm job {done.job_id}; follow it in the app, stop it with: python -m finetune stop {done.run.path}")
    print(done.run.path, flush=True)
    return 0


def cmd_job_start(args: Any) -> int:
    """Handle `slurm-job-start RUN_DIR`: print --resume or --launched for the batch script."""
    from finetune.cluster.slurm import job_start

    try:
        print(job_start(args.run_dir))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0
