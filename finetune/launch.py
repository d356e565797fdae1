"""Launch commands for a config: one GPU, several GPUs on one machine, several machines.

`launch_commands()` is a pure function (the Configure tab and the model card call it); the CLI prints its result:

    python -m finetune launch-command --config run.yaml --gpus 4 [--nodes 2 --hostfile hosts --master-addr 10.0.0.1]

Every command runs the same `python -m finetune train` CLI. Under a launcher each process trains its share of every
global batch and rank 0 alone writes the run directory, so the app follows the run through its events as usual.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from finetune.config import TrainConfig
from finetune.errors import UserError
from finetune.plan import uses_deepspeed

DEFAULT_MASTER_PORT = 29500
DEEPSPEED_HOSTFILE = "/job/hostfile"  # where the deepspeed launcher looks when --hostfile is not given


def launch_commands(
    config: TrainConfig,
    config_path: str | Path = "run.yaml",
    gpus: int = 1,
    nodes: int = 1,
    hostfile: str | Path | None = None,
    master_addr: str | None = None,
    master_port: int = DEFAULT_MASTER_PORT,
    sets: list[str] | None = None,
    output_dir: str | Path | None = None,
) -> dict[str, str]:
    """Shell commands that train `config` (saved at `config_path`), by launcher.

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
    if uses_deepspeed(config):
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
        if uses_deepspeed(config):
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
    from finetune.runs import unique_run_path

    return str(unique_run_path(paths.runs_root(), config))


def _join(parts: list[str]) -> str:
    """Quote for a POSIX shell, leaving $VARIABLES for the shell to expand."""
    return " ".join(part if part.startswith("$") and part[1:].isidentifier() else shlex.quote(part) for part in parts)


# --------------------------------------------------------------------------- CLI
def register_cli(subparsers: Any) -> None:
    """`python -m finetune launch-command`."""
    from finetune.cli_args import add_config_args

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


def cmd_launch_command(args: Any) -> int:
    from finetune.cli_args import load_config

    config = load_config(args.config, args.set)
    commands = launch_commands(
        config,
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
        print(f"# {describe(key, args.gpus, args.nodes, uses_deepspeed(config))}")
        print(command)
    if args.ds_config:
        _write_exported_ds_config(config, Path(args.ds_config), args.gpus * args.nodes)
    return 0


def _write_exported_ds_config(config: TrainConfig, path: Path, world_size: int) -> None:
    import json

    from finetune.atomic import write_text
    from finetune.deepspeed_config import deepspeed_config, export_precision

    if not uses_deepspeed(config):
        raise UserError("--ds-config: this config does not use DeepSpeed; set zero_stage or backend: deepspeed")
    ds = deepspeed_config(config, world_size=world_size, precision=export_precision(config))
    write_text(path, json.dumps(ds, indent=2) + "\n")
    print(f"# DeepSpeed config for {world_size} processes written to {path}")
