"""`python -m finetune propose` and `python -m finetune estimate`: what fits a GPU, on the command line (the memory
search and estimator are finetune/memory/)."""

from __future__ import annotations

import json
from typing import Any

from finetune import objectives
from finetune.cli.args import add_config_args, load_config, parse_count, parse_gib
from finetune.config import TrainConfig, parse_set_option
from finetune.errors import UserError
from finetune.model.catalogue import GPU_CARDS


def register(subparsers: Any) -> None:
    """Add `propose` and `estimate`."""
    propose = subparsers.add_parser(
        "propose",
        help="propose settings that fit a GPU for a model, data and goal (what the Start tab proposes)",
        description="The configuration the app's Start tab proposes, from the same search: the fastest settings that "
        "fit with headroom (max(5%% of the card, 1 GiB)), keeping every row of the data whole where any combination "
        "can, at the same effective batch. When nothing fits, it names the smallest card (or number of GPUs) that "
        "holds the run. No weights are downloaded; the data is read to measure its token lengths. A setting given "
        "with --set is kept as set.",
    )
    add_config_args(propose)
    propose.add_argument("--model", help="a Hub id, a local model folder or the embedded model (default: the config's)")
    propose.add_argument("--data", help="a data file, a Hub dataset id or bundled:pirate (default: the config's)")
    goals = ", ".join(dict.fromkeys([*objectives.GOALS, *objectives.OBJECTIVES]))
    goal = objectives.DEFAULT_GOAL
    propose.add_argument("--goal", default=goal, help=f"{goals} (default: {goal})")
    propose.add_argument("--gpu-gib", required=True, help="memory per GPU in GiB, or a card's name (e.g. l4, a100)")
    propose.add_argument("--gpus", default="1", help="number of GPUs (default: 1)")
    propose.add_argument("--json", action="store_true", help="print one JSON object instead of the text")
    propose.set_defaults(func=cmd_propose)

    estimate = subparsers.add_parser(
        "estimate",
        help="estimate peak memory of a run, check it against a GPU, and suggest changes",
        description="Peak memory per device of one training step (replayed on fake tensors: no download of "
        "weights), with a breakdown, a fit verdict for --gpu-gib and ranked suggestions.",
    )
    add_config_args(estimate)
    estimate.add_argument("--device", default="cuda", help="cuda (default: a GPU run, bf16 unless fp32) or cpu (fp32)")
    estimate.add_argument("--gpus", default="1", help="GPUs per node (DDP replicas, or ZeRO shards)")
    estimate.add_argument("--gpu-gib", default=None, help=f"GPU memory in GiB, or a card: {', '.join(GPU_CARDS)}")
    estimate.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    estimate.set_defaults(func=cmd_estimate)


def cmd_propose(args: Any) -> int:
    """Print the proposal for a model, data, goal and hardware (text, or JSON with --json)."""
    from finetune.memory import propose
    from finetune.plan import plan_for

    values = load_config(args.config, args.set).to_dict()
    pinned = tuple(parse_set_option(item)[0] for item in args.set or [])
    values.update({k: v for k, v in (("model", args.model), ("dataset", args.data)) if v})
    usual = TrainConfig().to_dict()
    given = {*pinned, *(name for name, value in values.items() if value != usual.get(name))}  # --set or the file
    values.update(objectives.goal_settings(str(args.goal).strip().lower(), given=given))
    gib = parse_gib(args.gpu_gib)
    if gib is None:
        raise UserError("--gpu-gib: give the memory of one GPU in GiB, or a card's name (e.g. l4)")
    gpus = parse_count(args.gpus, "--gpus")
    plan = plan_for(TrainConfig.from_dict(values), device="cuda", world_size=gpus)
    proposal = propose(plan, gpu_gib=gib, pinned=pinned)
    print(json.dumps(proposal.to_dict(), indent=2, default=str) if args.json else proposal.render_text())
    return 0


def cmd_estimate(args: Any) -> int:
    """Print the estimate of a config's peak memory: a table, or JSON with --json."""
    from finetune.memory import estimate
    from finetune.plan import plan_for

    config = load_config(args.config, args.set)
    device = str(args.device or "cuda").lower()
    gpus = parse_count(args.gpus, "--gpus")
    gib = parse_gib(args.gpu_gib)
    if device not in ("cpu", "cuda"):
        raise UserError(f"--device: {device!r} is not allowed; choose cpu or cuda", field="device")
    est = estimate(plan_for(config, device=device, world_size=gpus), gpu_gib=gib)
    print(json.dumps(est.to_dict(), indent=2) if args.json else est.render_text())
    return 0
