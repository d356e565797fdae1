"""Submitting a run to Slurm, resuming it, and what its job does before the ranks start.

    python -m finetune submit --config run.yaml --slurm --nodes 2 --gpus-per-node 8 [--partition P --time 04:00:00]
    python -m finetune submit --resume RUN_DIR          # a new job that continues from the last checkpoint
    python -m finetune stop RUN_DIR                     # checkpoint and stop; a second stop cancels at once

Everything is checked before anything is written or submitted, one line naming the field each: sbatch on PATH, the
partition, the nodes and GPUs per node the partition has, the config, model and data, the run folder being new and
seen by every node (a marker file written here is read on each node of a short `srun`). Then the run folder gets its
config.yaml, a pending status.json, the batch script (slurm.sbatch, finetune/cluster/script.py) and slurm.json with
the job id; a run has one job at a time.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from finetune import paths
from finetune.atomic import write_text
from finetune.cluster import scheduler
from finetune.cluster.script import job_plan, processes_per_node, render
from finetune.config import TrainConfig
from finetune.errors import UserError
from finetune.plan import RunPlan
from finetune.runs.preflight import check_new_run_dir, confined_path, model_ready, preflight, unique_run_path
from finetune.runs.progress import TrainingState
from finetune.runs.rundir import RunDir, find_run

VISIBLE_CHECK_S = 20  # how long the visibility check waits for its allocation (srun --immediate)
MARKER = ".finetune-visible-"


@dataclass(frozen=True)
class Submitted:
    """A submitted run: its folder, its job id and the batch script as submitted."""

    run: RunDir
    job_id: str
    script: str


# --------------------------------------------------------------------------- checks
def check_cluster(config: TrainConfig) -> None:
    """sbatch on PATH, the partition exists, it has the nodes and each node the GPUs asked for."""
    scheduler.require_sbatch()
    partition = config.slurm_partition.strip()
    nodes = _partition_nodes(partition)
    if partition and not nodes:
        known = ", ".join(sorted({p for p, _, _ in _partition_nodes("", every=True)})) or "none"
        raise UserError(f"slurm_partition: {partition!r} is not a partition of this cluster (it has: {known})",
                        "slurm_partition")  # fmt: skip
    if not nodes:
        raise UserError("runs_on: sinfo lists no node on this cluster; is slurmctld running?", "runs_on")
    names = {node for _, node, _ in nodes}
    where = f"partition {partition}" if partition else "the default partition"
    if config.nodes > len(names):
        raise UserError(f"nodes: {config.nodes} nodes asked, but {where} has {len(names)}", "nodes")
    most = max(gpus for _, _, gpus in nodes)
    if config.gpus_per_node > most:
        raise UserError(
            f"gpus_per_node: {config.gpus_per_node} GPUs per node asked, but the nodes of {where} have at most {most}"
            + ("; use 0 to train on their CPUs" if most == 0 else ""),
            "gpus_per_node",
        )


def _partition_nodes(partition: str, every: bool = False) -> list[tuple[str, str, int]]:
    """(partition, node, GPUs) for each node of `partition` (empty: the default one; `every`: all partitions)."""
    args = ["sinfo", "-h", "-N", "-o", "%P|%N|%G"]
    if partition:
        args += ["-p", partition]
    try:
        result = scheduler.slurm(args)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"runs_on: sinfo did not answer: {exc}", "runs_on") from None
    rows = []
    for line in result.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 3:
            continue
        name, node, gres = parts
        default = name.endswith("*")
        if every or partition or default:
            rows.append((name.rstrip("*"), node, gpus_in(gres)))
    return rows


def gpus_in(gres: str) -> int:
    """GPUs in sinfo's %G of a node: gpu:8, gpu:a100:4(S:0-1), gpu:2,shard:4; 0 for (null)."""
    total = 0
    for item in gres.split(","):
        item = re.sub(r"\(.*?\)", "", item.strip())
        parts = item.split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def check_visible(run_path: Path, config: TrainConfig) -> None:
    """The run folder is seen by every node the job may get: a marker written here is read back on each node of a
    short job step. A cluster too busy to grant it at once is not refused (the check cannot run now)."""
    token = secrets.token_hex(8)
    marker = run_path / f"{MARKER}{token}"
    write_text(marker, token + "\n")
    try:
        args = ["srun", f"--nodes={config.nodes}", "--ntasks-per-node=1", f"--immediate={VISIBLE_CHECK_S}"]
        args += ["--time=1", "--job-name=finetune-check", "--quiet"]
        if config.slurm_partition:
            args.append(f"--partition={config.slurm_partition.strip()}")
        if config.slurm_account:
            args.append(f"--account={config.slurm_account.strip()}")
        args += ["cat", str(marker)]
        try:
            result = scheduler.slurm(args, timeout=VISIBLE_CHECK_S + 30)
        except (OSError, subprocess.TimeoutExpired):
            return
        if result.stdout.count(token) >= config.nodes:
            return
        if "immediate" in result.stderr.lower() or "unable to allocate" in result.stderr.lower():
            return  # no allocation now: the check cannot run, and a busy cluster is no reason to refuse
        raise UserError(
            f"output_dir: {run_path.parent} is not seen by every node of the cluster (a file written here could not "
            "be read there); put the runs folder on storage every node mounts (FINETUNE_STUDIO_HOME)",
            "output_dir",
        )
    finally:
        marker.unlink(missing_ok=True)


def _run_path(config: TrainConfig, root: Path, confine: bool) -> Path:
    if config.output_dir:
        path = confined_path(root, config.output_dir) if confine else Path(config.output_dir).expanduser()
        return path.resolve()
    return unique_run_path(root, config)


def check_submit(config: TrainConfig, root: Path | None = None, confine: bool = False) -> tuple[Path, RunPlan]:
    """Every check before a submission writes anything: the config, the cluster, the model and data; returns the
    run folder it would use and the job's plan (the visibility check needs the folder: `submit` makes it)."""
    config.validate()
    if config.runs_on != "slurm":
        raise UserError(
            "runs_on: this_machine; set runs_on: slurm (or --slurm) to submit to a Slurm cluster", "runs_on"
        )
    check_cluster(config)
    path = _run_path(config, Path(root) if root else paths.runs_root(), confine)
    check_new_run_dir(path)
    model_ready(config)
    plan = job_plan(config)
    preflight(plan)
    return path, plan


def preview(config: TrainConfig, root: Path | None = None, confine: bool = False) -> tuple[str, Path]:
    """(the batch script a submission of `config` would save and submit, its run folder). Without an output_dir the
    folder is named as it would be now: submitting with output_dir set to that folder submits this very script."""
    config.validate()
    path = _run_path(config, Path(root) if root else paths.runs_root(), confine)
    return render(job_plan(config), path), path


# --------------------------------------------------------------------------- submit, resume
def submit(
    config: TrainConfig, root: Path | None = None, owner: str = "the command line", confine: bool = False
) -> Submitted:
    """Check everything, write the run's first files and the batch script, `sbatch` it; the run is pending."""
    path, plan = check_submit(config, root, confine)
    run = RunDir(path)
    made = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    try:
        check_visible(path, config)
        script = render(plan, path)
        write_text(path / scheduler.SCRIPT_FILE, script)
        run.write_config(config)
        now = time.time()
        state = TrainingState(
            run_id=run.name,
            run_dir=str(path),
            status="pending",
            max_steps=config.max_steps,
            message="submitted to Slurm",
            owner=owner,
            started_at=now,
            updated_at=now,
            world_size=plan.world_size,
        )
        run.write_status(state.to_dict())
        run.append_event({"type": "status", "status": "pending", "step": 0, "world_size": plan.world_size})
        job_id = scheduler.submit_script(path / scheduler.SCRIPT_FILE)
    except BaseException:
        _undo(run, made)
        raise
    scheduler.update_job(
        path, job_id=job_id, jobs=[job_id], script=scheduler.SCRIPT_FILE, submitted_at=now, attempts=0,
        nodes=config.nodes, processes_per_node=processes_per_node(config),
    )  # fmt: skip
    return Submitted(run, job_id, script)


def _undo(run: RunDir, made: bool) -> None:
    """A submission refused after its folder was made: remove exactly what it wrote."""
    for name in (scheduler.SCRIPT_FILE, scheduler.JOB_FILE):
        (run.path / name).unlink(missing_ok=True)
    run.remove_own_files(remove_folder=made)


def resume(run_dir: str | Path, root: Path | None = None, confine: bool = False) -> Submitted:
    """A new job for a stopped, interrupted or failed Slurm run: the same batch script, which continues from the last
    complete checkpoint with the same step numbering. Refused while the run's job is queued or running."""
    run = find_run(run_dir, Path(root) if root else paths.runs_root(), field="resume", confine=confine)
    record = scheduler.read_job(run.path)
    if not record.get("job_id"):
        raise UserError(f"resume: {run.name} was not submitted to Slurm; resume it where it ran", "resume")
    refuse_second_job(run)
    state = run.effective_status()
    if state == "completed":
        raise UserError(f"resume: {run.name} already completed; submit a new run to train further", "resume")
    checkpoint = run.last_checkpoint()
    if checkpoint is None:
        raise UserError(f"resume: {run.name} has no complete checkpoint yet; submit a new run instead", "resume")
    scheduler.require_sbatch()
    script = (run.path / scheduler.SCRIPT_FILE).read_text(encoding="utf-8")
    previous = run.read_status()
    now = time.time()
    run.write_status({**previous, "status": "pending", "message": f"resubmitted to Slurm from {checkpoint.name}",
                      "error": None, "updated_at": now, "finished_at": None})  # fmt: skip
    try:
        job_id = scheduler.submit_script(run.path / scheduler.SCRIPT_FILE)
    except UserError:
        run.write_status(previous)
        raise
    jobs = [*record.get("jobs", []), job_id]
    scheduler.update_job(
        run.path, job_id=job_id, jobs=jobs, submitted_at=now, stop_requested_at=None, stop_job=None,
        cancelled_queued=None,
    )  # fmt: skip
    return Submitted(run, job_id, script)


def refuse_second_job(run: RunDir) -> None:
    """Exactly one job per run: refused, naming the job, while the run's job is queued or running."""
    record = scheduler.read_job(run.path)
    if not record.get("job_id"):
        return
    job = scheduler.job_state(str(record["job_id"]), fresh=True)
    if job.alive:
        raise UserError(
            f"run: {run.name} already has Slurm job {job.job_id} ({job.state.lower()}); stop it first", "run"
        )


# --------------------------------------------------------------------------- inside the job
def job_start(run_dir: str | Path) -> str:
    """In the batch script, before the ranks start: `--resume` when the run has a complete checkpoint (a requeued
    job, a Resume), else `--launched`; records the attempt. A run that cannot start is refused in one line."""
    run = RunDir(Path(run_dir).resolve())
    if not run.exists():
        raise UserError(f"run: {run_dir} is not a run folder prepared by submit (no config.yaml / status.json)", "run")
    run.load_config()  # a damaged config fails here, in one line, before any rank starts
    status = run.read_status()
    if status.get("status") == "completed":
        raise UserError(f"run: {run.name} already completed; nothing to train", "run")
    from finetune.runs.process_group import stop_path

    stop_path(run.path).unlink(missing_ok=True)  # a flag left by the previous job's stop
    job_id = os.environ.get("SLURM_JOB_ID", "")
    record = scheduler.read_job(run.path)
    scheduler.update_job(run.path, attempts=int(record.get("attempts") or 0) + 1, job_started_at=time.time(),
                         job_nodes=os.environ.get("SLURM_JOB_NODELIST", ""))  # fmt: skip
    checkpoint = run.last_checkpoint()
    if checkpoint is None and any(e.type == "log" for e in run.events()):
        # Started again before its first checkpoint: the steps it logged are trained again from step 0.
        run.append_event({"type": "resume", "step": 0, "checkpoint": ""})
    message = f"Slurm job {job_id} started on {os.environ.get('SLURM_JOB_NODELIST', '?')}"
    run.write_status({**status, "status": "pending", "message": message, "pid": None, "updated_at": time.time()})
    return "--resume" if checkpoint is not None else "--launched"


def submitted_script(run: RunDir) -> str:
    """The batch script a Slurm run was submitted with ("" for another run)."""
    try:
        return (run.path / scheduler.SCRIPT_FILE).read_text(encoding="utf-8")
    except OSError:
        return ""


def job_log(run: RunDir, limit: int = 20_000) -> str:
    """The end of a Slurm run's job log ("" before it has one)."""
    try:
        with open(run.path / scheduler.LOG_FILE, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - limit))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
