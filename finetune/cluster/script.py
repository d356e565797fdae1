"""The batch script of a Slurm run, rendered from its config and plan: what the page shows, what is saved in the run
folder as slurm.sbatch, and what sbatch gets (the same file).

What the script does on the first node of its allocation:
  1. traps USR1 (the app's Stop: `scancel --signal=USR1 --batch`, and the time limit's warning `--signal=B:USR1@N`)
     and writes the run's stop flag: every rank finishes its step, the ranks agree, one checkpoint, `stopped`
  2. `python -m finetune slurm-job-start RUN`: resume from the last complete checkpoint when there is one (a
     requeued job or a Resume), else start; it prints --resume or --launched, or an `error:` line and the job fails
  3. the rendezvous from the allocation: the first host of SLURM_JOB_NODELIST (`scontrol show hostnames`, its
     NodeAddr), a free port there, SLURM_NNODES and each task's SLURM_NODEID
  4. `srun` one torchrun per node (`--ntasks-per-node=1`), each starting the node's ranks of
     `python -m finetune train` (ZeRO and its ds_config as for a run on one machine); waits for it across the trap
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from finetune.cluster.scheduler import INSIDE_JOB_ENV, LOG_FILE
from finetune.config import TrainConfig, sbatch_extra_options
from finetune.paths import PACKAGE
from finetune.plan import RunPlan, plan_for

WARNING_S = 180  # the time limit's warning: long enough to finish a step and write a checkpoint
GROUP_ENV = (
    "FINETUNE_GROUP_RUN"  # finetune/runs/process_group.py's name (the ranks skip the device lock, read the flag)
)


def processes_per_node(config: TrainConfig) -> int:
    """One rank per GPU of a node; one per node on CPUs (gpus_per_node: 0)."""
    return max(1, config.gpus_per_node)


def job_plan(config: TrainConfig) -> RunPlan:
    """The plan of the whole job: nodes × processes per node ranks, on GPUs when the nodes have them (the nodes'
    hardware is not this machine's)."""
    world = config.nodes * processes_per_node(config)
    return plan_for(config, device="cuda" if config.gpus_per_node else "cpu", world_size=world)


def render(plan: RunPlan, run_path: Path, workdir: Path | None = None) -> str:
    """The batch script for `plan`'s config training the run in `run_path` (submitted from `workdir`: relative paths
    of the config mean what they meant there)."""
    config = plan.config
    run_path = Path(run_path)
    workdir = Path(workdir or os.getcwd())
    python = sys.executable
    torchrun = str(Path(python).parent / "torchrun")
    options = [
        f"--job-name=finetune-{run_path.name[:60]}",
        f"--nodes={config.nodes}",
        "--ntasks-per-node=1",
    ]
    if config.gpus_per_node:
        options.append(f"--gpus-per-node={config.gpus_per_node}")
    if config.slurm_time:
        options.append(f"--time={config.slurm_time.strip()}")
    if config.slurm_partition:
        options.append(f"--partition={config.slurm_partition.strip()}")
    if config.slurm_account:
        options.append(f"--account={config.slurm_account.strip()}")
    options += [
        f"--signal=B:USR1@{WARNING_S}",
        "--requeue",
        "--open-mode=append",
        f"--output={run_path / LOG_FILE}",
        f"--chdir={workdir}",
        *sbatch_extra_options(config.slurm_extra),
    ]
    engine = f"DeepSpeed ZeRO-{config.zero_stage}" if plan.deepspeed else "DDP"
    header = [
        "#!/bin/bash",
        f"# Finetune Studio: train run {run_path.name} on {config.nodes} node(s) × {processes_per_node(config)} "
        f"process(es) ({engine}, {plan.world_size} ranks).",
        "# Submitted as is with sbatch; docs/cluster.md says what each part does.",
        *(f"#SBATCH {shlex.quote(option) if _needs_quotes(option) else option}" for option in options),
    ]
    q = shlex.quote
    per_node = processes_per_node(config)
    body = f"""
set -u
RUN={q(str(run_path))}
PYTHON={q(python)}
TORCHRUN={q(torchrun)}
export PYTHONPATH={q(str(PACKAGE.parent))}${{PYTHONPATH:+:$PYTHONPATH}}
export {GROUP_ENV}="$RUN" {INSIDE_JOB_ENV}="$RUN"

# Stop and the time limit's warning: every rank finishes its step, saves a checkpoint and ends stopped.
trap 'echo "USR1: stop requested; finishing the step and saving a checkpoint"; date +%s > "$RUN/stop-requested"' USR1

echo "job $SLURM_JOB_ID (restart ${{SLURM_RESTART_COUNT:-0}}) on $SLURM_JOB_NODELIST at $(date -u +%FT%TZ)"
MODE=$("$PYTHON" -m finetune slurm-job-start "$RUN") || exit 1
FIRST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_ADDR=$(scontrol show node "$FIRST" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)
MASTER_PORT=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
export MASTER_ADDR="${{MASTER_ADDR:-$FIRST}}" MASTER_PORT MODE RUN TORCHRUN

srun --kill-on-bad-exit=1 --nodes="$SLURM_NNODES" --ntasks-per-node=1 bash -c \\
  'exec "$TORCHRUN" --nnodes "$SLURM_NNODES" --node_rank "$SLURM_NODEID" --nproc_per_node {per_node} \\
     --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" -m finetune train "$MODE" "$RUN" --no-progress' &
STEP=$!
# A trapped signal interrupts `wait`; the ranks go on to their checkpoint, so wait again until srun ends.
while true; do
  wait "$STEP"
  CODE=$?
  kill -0 "$STEP" 2>/dev/null || break
done
echo "job $SLURM_JOB_ID: srun ended with exit code $CODE"
exit "$CODE"
"""
    return "\n".join(header) + "\n" + body


def _needs_quotes(option: str) -> bool:
    return any(ch.isspace() for ch in option)
