"""The DeepSpeed engine: an explicit `deepspeed.initialize` loop, written out in plain sight.

    engine = deepspeed.initialize(model=..., config=<generated from TrainConfig>, model_parameters=<trainable>)
    for batch in loader:                    # DistributedSampler over the same tokenised data as the Trainer path
        loss = engine(**batch).loss
        engine.backward(loss)
        engine.step()                       # optimizer + scheduler step at each accumulation boundary

It reports to the same `Progress` (status, "log" events with step and loss, tokens/s, "checkpoint", "saved"), honours
the same stop flag (save a checkpoint, then end) and writes the same run directory as the Trainer path:
  ds_config.json          the generated DeepSpeed config, as the engine used it
  checkpoint-N/           engine.save_checkpoint (ZeRO shards), then trainer_state.json written last (= complete)
  adapter / model files   gathered from the ZeRO-3 shards on rank 0, so they are a normal PEFT adapter or HF model

Several processes (torchrun / deepspeed launchers) agree every optimizer step on the mean loss, the tokens seen and
whether to stop, so they stop together. Without a launcher, `engines.world.distributed_world()` sets up a world of
size 1 (gloo on CPU, nccl on GPU) and tears it down afterwards, so another run in the same process works.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

from finetune.atomic import read_json, write_json
from finetune.config import TrainConfig
from finetune.engines.common import Prepared, prepare_run, samples_event
from finetune.engines.deepspeed_config import deepspeed_config, write_ds_config
from finetune.engines.world import World, distributed_world
from finetune.plan import RunPlan
from finetune.runs.progress import Progress

# Keep the two newest checkpoints: if the process dies while writing one, the one before is still complete.
KEEP_CHECKPOINTS = 2
# DeepSpeed's converters from ZeRO shards to a plain state dict (python checkpoint-N/zero_to_fp32.py RUN OUT -t TAG).
RECOVERY_SCRIPTS = ("zero_to_fp32.py", "zero_to_torch.py")


# --------------------------------------------------------------------------- the run
def train(plan: RunPlan, progress: Progress, resume_from: Path | None = None) -> str:
    """Train to the end (or until stopped) with the DeepSpeed engine; returns "completed" or "stopped"."""
    if not os.environ.get("FINETUNE_DEBUG"):
        # Our progress replaces its per-step INFO lines; a quieter level set by the CLI (no -v) is kept.
        ds_logger = logging.getLogger("DeepSpeed")
        ds_logger.setLevel(max(logging.WARNING, ds_logger.level))
    with distributed_world(plan.device) as world:
        return _train(plan, progress, resume_from, world)


def _train(plan: RunPlan, progress: Progress, resume_from: Path | None, world: World) -> str:
    import deepspeed
    from torch.utils.data import DataLoader, DistributedSampler
    from transformers import set_seed

    config = plan.config
    set_seed(config.seed)  # identical adapter initialisation on every rank and in every run of this config
    prepared = prepare_run(plan, progress)
    plan = prepared.plan  # as it runs (packing vetoed by the model, if it was)
    if _agree(world, progress.stop_requested.is_set()):
        return "stopped"
    model = prepared.model
    peft = hasattr(model, "peft_config")
    if config.gradient_checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})

    micro, accumulation = config.per_device_train_batch_size, config.gradient_accumulation_steps
    sampler = DistributedSampler(
        prepared.data.train, num_replicas=world.size, rank=world.rank, shuffle=True, seed=config.seed
    )
    loader = DataLoader(
        prepared.data.train, batch_size=micro, sampler=sampler, collate_fn=prepared.collator, num_workers=0
    )
    steps_per_epoch = max(1, len(loader) // accumulation)
    max_steps = config.max_steps if config.max_steps > 0 else math.ceil(config.num_train_epochs * steps_per_epoch)

    ds_config = deepspeed_config(
        plan, total_steps=max_steps, hidden_size=getattr(getattr(model, "config", None), "hidden_size", None)
    )
    if progress.write_files:
        write_ds_config(ds_config, progress.run.path)
    progress.message(
        f"DeepSpeed ZeRO-{config.zero_stage} on {world.size} process{'es' if world.size > 1 else ''}: "
        f"global batch {ds_config['train_batch_size']} = {micro} × {accumulation} × {world.size}"
        + (f", optimizer offload to {config.offload_optimizer}" if config.offload_optimizer != "none" else "")
        + (f", parameter offload to {config.offload_param}" if config.offload_param != "none" else "")
    )
    engine, _, _, _ = deepspeed.initialize(
        model=model, config=ds_config, model_parameters=[p for p in model.parameters() if p.requires_grad]
    )
    prepared.model = None
    try:
        if engine.lr_scheduler is not None and engine.lr_scheduler.last_batch_iteration < 0:
            # DeepSpeed's schedulers start one step behind Trainer's: step 1 should use the rate for step 0.
            engine.lr_scheduler.step()
        tokens_seen = 0
        if resume_from is not None:
            tokens_seen = _load_checkpoint(engine, Path(resume_from), peft, progress)
            if not load_rng_state(Path(resume_from), world.rank):
                set_seed(config.seed + engine.global_steps)  # an older checkpoint: fresh dropout masks at least
        return _loop(config, progress, prepared, engine, loader, sampler, world, max_steps, tokens_seen, peft)
    finally:
        engine.destroy()
        del engine


def _loop(
    config: TrainConfig,
    progress: Progress,
    prepared: Prepared,
    engine: Any,
    loader: Any,
    sampler: Any,
    world: World,
    max_steps: int,
    tokens_seen: int,
    peft: bool,
) -> str:
    import torch

    accumulation = config.gradient_accumulation_steps
    step = engine.global_steps
    consumed = step * accumulation  # micro batches this rank has trained on (resume continues after them)
    epoch, skip = divmod(consumed, len(loader))
    progress.set_status("running", step=step, max_steps=max_steps, message=f"training for {max_steps} steps")
    if step == 0:
        _samples(engine, prepared, progress, world, 0)
    window_loss, window_steps = 0.0, 0  # the loss is logged as the mean over each logging window, as Trainer does
    step_loss = torch.zeros((), dtype=torch.float64)
    step_micro = 0
    step_tokens = 0
    engine.train()
    while step < max_steps:
        sampler.set_epoch(epoch)
        for index, batch in enumerate(loader):
            if index < skip:
                continue
            batch = on_device(batch, engine.device)
            loss = engine(**batch).loss
            engine.backward(loss)
            before = engine.global_steps
            engine.step()
            step_loss += loss.detach().double().cpu()
            step_micro += 1
            # Real tokens: a padded batch's mask, or every token of a packed row (it has no mask and no padding).
            step_tokens += (
                int(batch["attention_mask"].sum()) if "attention_mask" in batch else batch["input_ids"].numel()
            )
            if engine.global_steps == before:
                continue  # still accumulating
            step = engine.global_steps
            loss_mean, tokens, stop = _step_stats(world, step_loss, step_micro, step_tokens, progress)
            step_loss.zero_()
            step_micro = step_tokens = 0
            tokens_seen += tokens
            window_loss += loss_mean
            window_steps += 1
            epoch_float = (step * accumulation) / len(loader)
            progress.on_step(step, max_steps, epoch_float, tokens_seen)
            if step % config.logging_steps == 0 or step == 1 or step == max_steps or stop:
                progress.on_log(
                    step,
                    {
                        "loss": window_loss / window_steps,
                        "learning_rate": _lr(engine),
                        "grad_norm": _grad_norm(engine),
                        "epoch": epoch_float,
                        "num_input_tokens_seen": tokens_seen,
                    },
                )
                window_loss, window_steps = 0.0, 0
            if prepared.data.eval is not None and step % config.eval_steps == 0:
                _evaluate(engine, prepared, progress, world, config, step)
            if step % config.save_steps == 0 or stop:
                if stop:
                    progress.set_status("stopping", message=f"stopping at step {step}: saving a checkpoint")
                _save_checkpoint(engine, progress, world, config, step, epoch_float, tokens_seen, peft)
            if stop:
                return "stopped"
            if step >= max_steps:
                break
        skip = 0
        epoch += 1
    if prepared.data.eval is not None and step % config.eval_steps:
        _evaluate(engine, prepared, progress, world, config, step)  # the last evaluation, at the final step
    _save_final(engine, prepared, progress, world, peft)
    return "completed"


# --------------------------------------------------------------------------- per-step agreement between ranks
def _step_stats(world: World, loss_sum: Any, micro: int, tokens: int, progress: Progress) -> tuple[float, int, bool]:
    """Mean loss over every rank's micro batches of this step, tokens over all ranks, and whether any rank stops."""
    import torch
    import torch.distributed as dist

    stop = 1.0 if progress.stop_requested.is_set() else 0.0
    if world.size == 1:
        return float(loss_sum) / max(micro, 1), tokens, bool(stop)
    stats = torch.tensor([float(loss_sum), float(micro), float(tokens)], dtype=torch.float64, device=world.device)
    flag = torch.tensor([stop], dtype=torch.float64, device=world.device)
    dist.all_reduce(stats, op=dist.ReduceOp.SUM)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    total_loss, total_micro, total_tokens = stats.tolist()
    return total_loss / max(total_micro, 1.0), int(total_tokens), bool(flag.item())


def _agree(world: World, flag: bool) -> bool:
    """True on every rank when any rank's flag is set."""
    if world.size == 1:
        return flag
    import torch
    import torch.distributed as dist

    value = torch.tensor([1.0 if flag else 0.0], device=world.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def on_device(batch: dict[str, Any], device: Any) -> dict[str, Any]:
    """A collated batch on the engine's device; plain values (a packed batch's longest example) stay as they are."""
    return {key: value.to(device) if hasattr(value, "to") else value for key, value in batch.items()}


def _lr(engine: Any) -> float | None:
    rates = engine.get_lr()
    return float(rates[0]) if rates else None


def _grad_norm(engine: Any) -> float | None:
    norm = engine.get_global_grad_norm()
    if norm is None:
        return None
    value = float(norm)
    return value if math.isfinite(value) else None


# --------------------------------------------------------------------------- evaluation and sample answers
def _evaluate(
    engine: Any, prepared: Prepared, progress: Progress, world: World, config: TrainConfig, step: int
) -> None:
    """Mean eval loss over the whole eval set (split across ranks), then sample answers."""
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler

    sampler = DistributedSampler(prepared.data.eval, num_replicas=world.size, rank=world.rank, shuffle=False)
    loader = DataLoader(
        prepared.data.eval,
        batch_size=config.per_device_train_batch_size,
        sampler=sampler,
        collate_fn=prepared.collator,
    )
    engine.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=world.device)
    with torch.no_grad():
        for batch in loader:
            batch = on_device(batch, engine.device)
            totals[0] += engine(**batch).loss.double()
            totals[1] += 1
    if world.size > 1:
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    engine.train()
    if totals[1] > 0:
        progress.on_log(step, {"eval_loss": float(totals[0] / totals[1])})
    _samples(engine, prepared, progress, world, step)


def _samples(engine: Any, prepared: Prepared, progress: Progress, world: World, step: int) -> None:
    """Answers to the held-out prompts, from rank 0 while the others wait at the next step. Not under ZeRO-3 with
    several processes: its sharded weights would need every rank in every generation step."""
    if not prepared.prompts or not world.is_main:
        return
    if world.size > 1 and engine.zero_optimization_partition_weights():
        if step == 0:
            progress.message("sample answers: not shown for ZeRO-3 on several processes (chat with a checkpoint)")
        return
    from finetune.model.inference import generate_answers

    answers = generate_answers(engine.module, prepared.tokenizer, prepared.prompts)
    engine.train()
    progress.event("samples", step=step, **samples_event(prepared, answers))


# --------------------------------------------------------------------------- checkpoints
def _save_checkpoint(
    engine: Any,
    progress: Progress,
    world: World,
    config: TrainConfig,
    step: int,
    epoch: float,
    tokens_seen: int,
    peft: bool,
) -> None:
    """engine.save_checkpoint into checkpoint-N (every rank writes its shards), then rank 0 writes
    trainer_state.json last: only then is the checkpoint complete for resume discovery."""
    import torch.distributed as dist

    run = progress.run.path
    tag = f"checkpoint-{step}"
    client = {"global_step": step, "tokens_seen": tokens_seen, "epoch": epoch}
    # LoRA: the frozen base is not saved (it is reloaded from the model); only adapters and optimizer state are.
    engine.save_checkpoint(str(run), tag=tag, client_state=client, save_latest=False, exclude_frozen_parameters=peft)
    save_rng_state(run / tag, world.rank)
    dist.barrier()
    if world.is_main:
        for script in RECOVERY_SCRIPTS:  # DeepSpeed copies its converters next to the tag; keep them with it
            if (run / script).is_file():
                os.replace(run / script, run / tag / script)
        write_json(
            run / tag / "trainer_state.json",
            {
                "global_step": step,
                "epoch": epoch,
                "tokens_seen": tokens_seen,
                "backend": "deepspeed",
                "zero_stage": config.zero_stage,
                "world_size": world.size,
                "train_batch_size": engine.train_batch_size(),
                "max_steps": progress.snapshot().max_steps,
                "saved_at": time.time(),
            },
        )
        progress.checkpoint_saved(step, path=tag)
        _prune_checkpoints(run)
    dist.barrier()


def save_rng_state(folder: Path, rank: int) -> None:
    """Every random generator this rank draws from (Python, NumPy, torch CPU and CUDA), as Trainer saves them:
    a resumed run draws the same dropout masks and sampling as one that never stopped."""
    import random

    import numpy as np
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.random.get_rng_state_all()
    torch.save(state, folder / f"rng_state_{rank}.pth")


def load_rng_state(folder: Path, rank: int) -> bool:
    """Restore what `save_rng_state` saved for this rank; False when the checkpoint has none."""
    import random

    import numpy as np
    import torch

    path = folder / f"rng_state_{rank}.pth"
    if not path.is_file():
        return False
    state = torch.load(path, weights_only=False)  # our own file, written by save_rng_state
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.random.set_rng_state(state["cpu"])
    if torch.cuda.is_available() and "cuda" in state:
        torch.cuda.random.set_rng_state_all(state["cuda"])
    return True


def _prune_checkpoints(run: Path) -> None:
    from finetune.runs.rundir import RunDir

    complete = RunDir(run).checkpoints()
    for old in complete[:-KEEP_CHECKPOINTS]:
        shutil.rmtree(old, ignore_errors=True)


def _load_checkpoint(engine: Any, checkpoint: Path, peft: bool, progress: Progress) -> int:
    """engine.load_checkpoint from checkpoint-N (written by this engine); returns the tokens seen so far."""
    state = read_json(checkpoint / "trainer_state.json") or {}
    if state.get("backend") != "deepspeed":
        from finetune.errors import UserError

        raise UserError(
            f"resume: {checkpoint.name} was written by the Trainer backend; resume with backend: trainer",
            field="backend",
        )
    path, client = engine.load_checkpoint(
        str(checkpoint.parent), tag=checkpoint.name, load_module_strict=not peft, load_optimizer_states=True
    )
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load the checkpoint in {checkpoint}")
    client = client or {}
    progress.message(f"resumed from {checkpoint.name} (step {engine.global_steps})")
    return int(client.get("tokens_seen", state.get("tokens_seen", 0)))


# --------------------------------------------------------------------------- the result
def _save_final(engine: Any, prepared: Prepared, progress: Progress, world: World, peft: bool) -> None:
    """A normal PEFT adapter or HF model in the run directory, like `common.save_final`: under ZeRO-3 the shards
    are gathered onto rank 0 first (every rank takes part), then rank 0 alone writes."""
    import torch.distributed as dist

    target = progress.run.path
    module = engine.module
    state_dict = None
    if engine.zero_optimization_partition_weights():
        state_dict = engine._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=peft)
    if progress.write_files:
        if state_dict is not None:
            module.save_pretrained(str(target), state_dict=state_dict)
        else:
            module.save_pretrained(str(target))
        prepared.tokenizer.save_pretrained(str(target))
        progress.event("saved", path=str(target))
    dist.barrier()
