"""Launching a config on several processes: the commands to run by hand, and runs the project launches itself.

`launch_commands()` is a pure function (the Configure tab and the model card call it); the CLI prints its result:

    python -m finetune launch-command --config run.yaml --gpus 4 [--nodes 2 --hostfile hosts --master-addr 10.0.0.1]

`launch_group()` starts a run as a detached process group (finetune/runs/process_group.py) and returns its directory:

    python -m finetune launch --config run.yaml --nproc 2 [--gpus 0,1] [--launcher torchrun|deepspeed] [--follow]
    python -m finetune stop RUN_DIR            # every rank finishes its step, a checkpoint is saved, all end
    python -m finetune launch --resume RUN_DIR # the same number of processes, from the last checkpoint

Every command runs the same `python -m finetune train` CLI. Under a launcher each process trains its share of every
global batch and rank 0 alone writes the run directory, so the app follows the run through its events as usual.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune.config import TrainConfig
from finetune.errors import BusyError, UserError
from finetune.plan import RunPlan, plan_for
from finetune.runs.rundir import RunDir
from finetune.paths import PACKAGE

LAUNCHERS = ("torchrun", "deepspeed")
CPU_PROCESS_CHOICE = 4  # the most processes the app offers on a CPU (each one loads its own copy of the model)

DEFAULT_MASTER_PORT = 29500
GROUP_END_WAIT_S = 120.0  # how long a resume waits for a stopped run's processes to end (seconds on a loaded machine)
DEEPSPEED_HOSTFILE = "/job/hostfile"  # where the deepspeed launcher looks when --hostfile is not given


def launch_commands(
    plan: RunPlan,
    config_path: str | Path = "run.yaml",
    gpus: int = 1,
    nodes: int = 1,
    hostfile: str | Path | None = None,
    master_addr: str | None = None,
    master_port: int = DEFAULT_MASTER_PORT,
    sets: list[str] | None = None,
    output_dir: str | Path | None = None,
) -> dict[str, str]:
    """Shell commands that train the plan's config (saved at `config_path`), by launcher.

    Keys: "single" (one GPU, no launcher); "torchrun" and, when the run uses DeepSpeed, "deepspeed" (`gpus` GPUs on
    this machine); with nodes > 1 also "multinode" (the deepspeed launcher with a hostfile when the run uses DeepSpeed,
    else torchrun) and "multinode_torchrun" (run on every node, with that node's NODE_RANK).
    `sets` are extra `KEY=VALUE` overrides passed on as `--set`. A multi-process run needs its output_dir fixed in
    advance (every process must write to the same run): the config's, else `output_dir`, else a new folder under the
    runs root that the app lists.
    """
    if not isinstance(gpus, int) or gpus < 1:
        raise UserError(f"--gpus: {gpus!r} must be a whole number ≥ 1", field="gpus")
    if not isinstance(nodes, int) or nodes < 1:
        raise UserError(f"--nodes: {nodes!r} must be a whole number ≥ 1", field="nodes")
    if not isinstance(master_port, int) or not 1 <= master_port <= 65535:
        raise UserError(f"--master-port: {master_port!r} must be a port number (1-65535)", field="master_port")
    config = plan.config
    config.validate()

    base_args = ["train", "--config", str(config_path)]
    for item in sets or []:
        base_args += ["--set", item]
    commands = {"single": _join(["python", "-m", "finetune", *base_args])}

    overridden = any(item.split("=", 1)[0].strip() == "output_dir" for item in sets or [])
    multi_args = list(base_args)
    if not config.output_dir and not overridden:
        multi_args += ["--set", f"output_dir={output_dir or _new_run_dir(config)}"]
    train_module = ["-m", "finetune", *multi_args]

    commands["torchrun"] = _join(["torchrun", "--standalone", "--nproc_per_node", str(gpus), *train_module])
    if plan.deepspeed:
        commands["deepspeed"] = _join(
            ["deepspeed", "--num_gpus", str(gpus), "--no_local_rank", "--module", "finetune", *multi_args]
        )
    if nodes > 1:
        addr = master_addr or "$MASTER_ADDR"
        torchrun_nodes = [
            "torchrun",
            "--nnodes",
            str(nodes),
            "--nproc_per_node",
            str(gpus),
            "--node_rank",
            "$NODE_RANK",
            "--master_addr",
            addr,
            "--master_port",
            str(master_port),
            *train_module,
        ]
        if plan.deepspeed:
            deepspeed_nodes = [
                "deepspeed",
                "--hostfile",
                str(hostfile or DEEPSPEED_HOSTFILE),
                "--num_nodes",
                str(nodes),
                "--num_gpus",
                str(gpus),
                "--master_port",
                str(master_port),
            ]
            if master_addr:
                deepspeed_nodes += ["--master_addr", master_addr]
            deepspeed_nodes += ["--no_local_rank", "--module", "finetune", *multi_args]
            commands["multinode"] = _join(deepspeed_nodes)
        else:
            commands["multinode"] = _join(torchrun_nodes)
        commands["multinode_torchrun"] = _join(torchrun_nodes)
    return commands


def describe(key: str, gpus: int, nodes: int, deepspeed: bool = False) -> str:
    """A heading for one command (CLI output, the Configure tab)."""
    per_node = "run on every machine, with NODE_RANK 0 on the first"
    headings = {
        "single": "1 GPU (or the CPU), no launcher",
        "torchrun": f"{gpus} GPU{'s' if gpus > 1 else ''} on this machine (torchrun)",
        "deepspeed": f"{gpus} GPU{'s' if gpus > 1 else ''} on this machine (deepspeed launcher)",
        "multinode": f"{nodes} machines × {gpus} GPUs: "
        + (
            "deepspeed launcher, run once on the first machine (it starts the others over ssh)"
            if deepspeed
            else per_node
        ),
        "multinode_torchrun": f"{nodes} machines × {gpus} GPUs with torchrun: {per_node}",
    }
    return headings.get(key, key)


def _new_run_dir(config: TrainConfig) -> str:
    from finetune import paths
    from finetune.runs.manager import unique_run_path

    return str(unique_run_path(paths.runs_root(), config))


def _join(parts: list[str]) -> str:
    """Quote for a POSIX shell, leaving $VARIABLES for the shell to expand."""
    return " ".join(part if part.startswith("$") and part[1:].isidentifier() else shlex.quote(part) for part in parts)


# --------------------------------------------------------------------------- runs launched by the project
def visible_gpus() -> int:
    """GPUs this process can see (0 on a CPU machine)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def max_processes() -> int:
    """The most processes to offer for a run here: one per visible GPU, else min(4, CPU cores)."""
    gpus = visible_gpus()
    return gpus if gpus else max(1, min(CPU_PROCESS_CHOICE, os.cpu_count() or 1))


def check_launch(nproc: int | None, gpus: str = "", launcher: str = "torchrun") -> tuple[int, list[int]]:
    """(process count, GPU ids) for a launch, or the one-line refusal naming the flag, before anything starts."""
    if launcher not in LAUNCHERS:
        raise UserError(f"--launcher: {launcher!r} is not a launcher; use torchrun or deepspeed", field="launcher")
    if launcher_path(launcher) is None:
        raise UserError(f"--launcher: {launcher} is not installed in this environment; use torchrun", "launcher")
    ids = _gpu_ids(gpus)
    count = visible_gpus()
    if nproc is None:
        nproc = len(ids) or 1
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise UserError(f"--nproc: {nproc!r} must be a whole number ≥ 1", field="nproc")
    if count == 0:
        cores = os.cpu_count() or 1
        if nproc > cores:
            raise UserError(f"--nproc: {nproc} processes on a CPU with {cores} cores; use at most {cores}", "nproc")
    elif ids and nproc != len(ids):
        raise UserError(f"--nproc: {nproc} processes for {len(ids)} GPUs (--gpus {gpus}); use one per GPU", "nproc")
    elif nproc > count:
        raise UserError(f"--nproc: {nproc} processes but this machine has {count} GPUs; use at most {count}", "nproc")
    return nproc, ids


def _gpu_ids(gpus: str) -> list[int]:
    text = (gpus or "").strip()
    if not text:
        return []
    count = visible_gpus()
    if count == 0:
        raise UserError(f"--gpus: {text}: this machine has no GPU; leave --gpus out (processes run on the CPU)", "gpus")
    ids = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise UserError(f"--gpus: {part!r} is not a GPU number; give numbers like 0,1", field="gpus")
        if int(part) >= count:
            raise UserError(f"--gpus: GPU {part} does not exist; this machine has GPUs 0-{count - 1}", field="gpus")
        if int(part) in ids:
            raise UserError(f"--gpus: GPU {part} is given twice", field="gpus")
        ids.append(int(part))
    return ids


def launcher_path(launcher: str) -> str | None:
    """The launcher's program: this environment's first (the one that belongs to this Python)."""
    local = Path(sys.executable).parent / launcher
    return str(local) if local.is_file() else shutil.which(launcher)


def group_command(
    launcher: str, nproc: int, ids: list[int], train_args: list[str], nodes: Nodes | None = None
) -> list[str]:
    """The launcher command line that starts `nproc` ranks of `python -m finetune <train_args>` on this machine
    (with `nodes`: as node 0 of several machines)."""
    from finetune.engines.world import free_port

    program = launcher_path(launcher) or launcher
    if nodes is not None and nodes.count > 1:
        return [program, *nodes.torchrun_args(0), "--nproc_per_node", str(nproc), "-m", "finetune", *train_args]
    if launcher == "deepspeed":
        where = ["--include", "localhost:" + ",".join(map(str, ids))] if ids else ["--num_gpus", str(nproc)]
        return [program, *where, "--master_port", str(free_port()), "--no_local_rank", "--module", "finetune"] + [
            *train_args
        ]
    return [program, "--standalone", "--nproc_per_node", str(nproc), "-m", "finetune", *train_args]


@dataclass(frozen=True)
class Nodes:
    """Several machines: how many, and where node 0 (this machine) listens."""

    count: int = 1
    master_addr: str = ""
    master_port: int = DEFAULT_MASTER_PORT

    def torchrun_args(self, node_rank: int | str) -> list[str]:
        """torchrun's flags for one node."""
        return [
            "--nnodes",
            str(self.count),
            "--node_rank",
            str(node_rank),
            "--master_addr",
            self.master_addr,
            "--master_port",
            str(self.master_port),
        ]


def check_nodes(nodes: Nodes, launcher: str) -> None:
    """Refuse a multi-machine launch that cannot work, naming the flag."""
    if not isinstance(nodes.count, int) or nodes.count < 1:
        raise UserError(f"--nodes: {nodes.count!r} must be a whole number ≥ 1", field="nodes")
    if nodes.count == 1:
        return
    if not nodes.master_addr:
        raise UserError("--master-addr: give this machine's address as the other machines reach it", "master_addr")
    if not 1 <= nodes.master_port <= 65535:
        raise UserError(f"--master-port: {nodes.master_port!r} must be a port number (1-65535)", "master_port")
    if launcher != "torchrun":
        raise UserError("--launcher: several machines are launched with torchrun here; see launch-command", "launcher")


def launch_group(
    config: TrainConfig,
    nproc: int | None,
    gpus: str = "",
    launcher: str = "torchrun",
    root: Path | None = None,
    owner: str = "the command line",
    confine: bool = False,
    nodes: Nodes | None = None,
) -> RunDir:
    """Start `config` as a detached group of `nproc` processes; returns the new run directory (status pending).
    With `nodes` (several machines) this machine runs node 0; `others_command` gives the rest their command.

    Everything is checked first (flags, config, model, data, output folder, the device being free); then the run
    directory gets config.yaml, status.json (with world_size) and launch.json, and the supervisor starts."""
    from finetune.runs.manager import RunManager

    nodes = nodes or Nodes()
    check_nodes(nodes, launcher)
    nproc, ids = check_launch(nproc, gpus, launcher)
    path = RunManager(root).check_start(config, confine=confine)
    run = RunDir(path)
    train_args = ["train", "--launched", str(run.path), "--no-progress"]
    command = group_command(launcher, nproc, ids, train_args, nodes)
    return _start_group(run, config, nproc, ids, launcher, owner, root, command, fresh=True, nodes=nodes.count)


def others_command(config_path: str, run: RunDir, nproc: int, nodes: Nodes, sets: list[str] | None = None) -> str:
    """What every other machine runs to join node 0's run: the same config, the same run directory."""
    args = ["train", "--config", config_path, *[x for item in sets or [] for x in ("--set", item)]]
    args += ["--set", f"output_dir={run.path}"]
    torchrun = ["torchrun", *nodes.torchrun_args("$NODE_RANK"), "--nproc_per_node", str(nproc)]
    return _join([*torchrun, "-m", "finetune", *args])


def resume_group(
    run_dir: str | Path,
    nproc: int | None = None,
    gpus: str = "",
    launcher: str | None = None,
    root: Path | None = None,
    owner: str = "the command line",
    confine: bool = False,
    sets: list[str] | None = None,
) -> RunDir:
    """Continue a stopped, interrupted or failed run from its last checkpoint with the same number of processes."""
    from finetune import paths
    from finetune.runs.process_group import read_group
    from finetune.runs.rundir import ACTIVE, find_run

    root = Path(root) if root else paths.runs_root()
    run = find_run(run_dir, root, field="resume", confine=confine)
    status, record = run.read_status(), read_group(run.path)
    if run.effective_status() in ACTIVE:
        raise UserError(f"--resume: {run.name} is still running; stop it first (python -m finetune stop)", "resume")
    if status.get("status") == "completed":
        raise UserError(f"--resume: {run.name} already completed; start a new run to train further", "resume")
    if run.last_checkpoint() is None:
        raise UserError(f"--resume: {run.name} has no complete checkpoint yet; start a new run instead", "resume")
    if int(record.get("nodes") or 1) > 1:
        raise UserError(f"--resume: {run.name} ran on several machines; resume it with the same commands by hand")
    trained_with = int(record.get("nproc") or status.get("world_size") or 1)
    if nproc is not None and nproc != trained_with:
        raise UserError(
            f"--nproc: {run.name} was trained with {trained_with} processes; resume it with the same number", "nproc"
        )
    launcher = launcher or record.get("launcher") or "torchrun"
    if not gpus and record.get("gpus"):
        gpus = ",".join(map(str, record["gpus"]))
    nproc, ids = check_launch(trained_with, gpus, launcher)
    train_args = ["train", "--resume", str(run.path), "--no-progress"]
    for item in sets or []:
        train_args += ["--set", item]
    command = group_command(launcher, nproc, ids, train_args)
    _wait_for_group_end(run)
    return _start_group(run, run.load_config(), nproc, ids, launcher, owner, root, command, fresh=False)


def _wait_for_group_end(run: RunDir) -> None:
    """A stopped (or failed) run's processes take a few seconds more to end after its final status is written (the
    ranks leave their process group, the launcher and the supervisor exit): a resume waits for them, within bounds."""
    from finetune.runs.process_group import group_alive

    deadline = time.monotonic() + GROUP_END_WAIT_S
    while group_alive(run.path):
        if time.monotonic() >= deadline:
            raise UserError(
                f"--resume: {run.name} is {run.effective_status()} but its processes have not ended after "
                f"{GROUP_END_WAIT_S:.0f} s; try again once they have",
                "resume",
            )
        time.sleep(0.1)


def _start_group(
    run: RunDir,
    config: TrainConfig,
    nproc: int,
    ids: list[int],
    launcher: str,
    owner: str,
    root: Path | None,
    command: list[str],
    fresh: bool,
    nodes: int = 1,
) -> RunDir:
    from finetune import paths
    from finetune.runs.device_lock import DeviceLock
    from finetune.runs.pids import started_at
    from finetune.runs.process_group import GROUP_FILE, LOG_FILE, holder_alive, keep_supervisor, stop_path, update_group
    from finetune.runs.progress import TrainingState

    lock = DeviceLock(Path(root) if root else paths.runs_root(), still_busy=holder_alive)
    now = time.time()
    holder = {"run_id": run.name, "owner": owner, "started_at": now, "run_dir": str(run.path), "group": True}
    lock.acquire({**holder, "pid": os.getpid()})  # busy: refused here, before anything is written
    try:
        made = not run.path.exists()
        run.path.mkdir(parents=True, exist_ok=True)
        stop_path(run.path).unlink(missing_ok=True)  # a flag left by the previous stop of this run
        record = {
            "launcher": launcher,
            "nproc": nproc,
            "gpus": ids,
            "cuda_visible_devices": ",".join(map(str, ids)),
            "command": command,
            "nodes": nodes,
            "started_at": now,
            "rank_pids": [],
        }
        from finetune.atomic import write_json

        write_json(run.path / GROUP_FILE, record)
        if fresh:
            run.write_config(config)
            state = TrainingState(
                run_id=run.name,
                run_dir=str(run.path),
                status="pending",
                max_steps=config.max_steps,
                message=f"starting {nproc} processes ({launcher})",
                owner=owner,
                started_at=now,
                updated_at=now,
                world_size=nproc * nodes,
            )
            run.write_status(state.to_dict())
            run.append_event({"type": "status", "status": "pending", "step": 0, "world_size": nproc * nodes})
        proc = _spawn_supervisor(run, lock)
        proc_started = started_at(proc.pid)
        update_group(run.path, supervisor_pid=proc.pid, supervisor_started=proc_started)
    except OSError as exc:
        from finetune.errors import os_reason

        lock.release()
        if fresh:
            run.remove_own_files(remove_folder=made)
            for name in (GROUP_FILE, LOG_FILE):
                (run.path / name).unlink(missing_ok=True)
        raise UserError(f"output_dir: cannot write the run in {run.path}: {os_reason(exc)}", "output_dir") from None
    except BusyError:
        lock.release()
        raise
    if fresh:
        status = run.read_status()
        if status.get("status") == "pending":
            run.write_status({**status, "pid": proc.pid, "pid_started": proc_started})
    lock.rewrite({**holder, "pid": proc.pid})
    lock.hand_over()  # the supervisor holds the lock from now on (same open file), until the group ends
    keep_supervisor(proc)
    return run


def _spawn_supervisor(run: RunDir, lock: Any) -> subprocess.Popen:
    from finetune.runs.process_group import LOG_FILE

    package_parent = str(PACKAGE.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")]))}
    with open(run.path / LOG_FILE, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "finetune.runs.process_group", str(run.path), str(lock.fileno())],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            start_new_session=True,  # survives the terminal and the app; Ctrl-C in the terminal does not reach it
            pass_fds=(lock.fileno(),),
            cwd=os.getcwd(),  # relative data paths in the config mean what they meant to the user
        )


# --------------------------------------------------------------------------- CLI
def register_cli(subparsers: Any) -> None:
    """`python -m finetune launch-command`."""
    from finetune.cli.args import add_config_args

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
    stop.add_argument("run_dir", help="the run directory (or its name under the runs folder)")
    stop.set_defaults(func=cmd_stop)


def cmd_launch_command(args: Any) -> int:
    from finetune.cli.args import load_config

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
    import json

    from finetune.atomic import write_text
    from finetune.engines.deepspeed_config import deepspeed_config
    from finetune.plan import launch_plan

    if not plan.deepspeed:
        raise UserError("--ds-config: this config does not use DeepSpeed; set zero_stage or backend: deepspeed")
    ds = deepspeed_config(launch_plan(plan.config, world_size))
    write_text(path, json.dumps(ds, indent=2) + "\n")
    print(f"# DeepSpeed config for {world_size} processes written to {path}")


def cmd_launch(args: Any) -> int:
    """`python -m finetune launch`: start (or resume) a detached group, print its directory, optionally follow it."""
    from finetune.cli.args import load_config
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
    from finetune.cli.terminal import follow, summary_line

    manager = RunManager()
    manager.follow_group(run)
    final = follow(manager, show_bar=True)
    if final is not None and final.status == "failed":
        print(f"error: {final.error}", file=sys.stderr, flush=True)
        return 1
    print(summary_line(final, manager))
    return 0 if final is not None and final.status in ("completed", "stopped") else 1


def cmd_stop(args: Any) -> int:
    """`python -m finetune stop RUN_DIR`: the stop flag every rank of the run reads at its next step."""
    from finetune import paths
    from finetune.runs.process_group import group_alive, request_stop
    from finetune.runs.rundir import ACTIVE, find_run

    run = find_run(args.run_dir, paths.runs_root(), field="run_dir")
    if not group_alive(run.path) and run.effective_status() not in ACTIVE:
        raise UserError(f"run_dir: {run.name} is not running (it is {run.effective_status()})", "run_dir")
    if not group_alive(run.path):
        raise UserError(f"run_dir: {run.name} runs in another process, not a launched group; stop it there", "run_dir")
    request_stop(run.path)
    print(f"stop requested: {run.name} saves a checkpoint after the current step, then every process ends")
    return 0
