"""Preference tuning (DPO, ORPO, KTO) on TRL's trainers, built from the run plan with the SFT path's own pieces.

The model, tokenizer, data and held-out prompts come from `prepare_run`; the Trainer settings from
`training_arguments` (so ZeRO, schedulers, checkpoints and precision match an SFT run); the callbacks, the stop flag,
checkpoint sealing and the final save are the SFT path's. What is new here is only what TRL needs: its config class
with beta / loss type / length, and the reference model the plan chose:

- "adapter-off": LoRA and QLoRA runs compare against the same weights with the adapter switched off (no second copy);
- "copy": full fine-tuning compares against a frozen copy of the starting weights, loaded as the policy was.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers.trainer_callback import PrinterCallback

from finetune.engines.common import Prepared, prepare_run, save_final
from finetune.engines.hf_trainer import ProgressCallback, StudioTrainer, training_arguments
from finetune.engines.world import trainer_world_if
from finetune.model import loading
from finetune.objectives import NO_REFERENCE, Objective
from finetune.plan import RunPlan
from finetune.runs.progress import Progress

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # ORPO lives in trl.experimental; its import warning is noise


class StudioTRL:
    """What our Trainer does differently, mixed into TRL's trainers (preference and GRPO): the run's scheduler, no
    draft card."""

    create_scheduler = StudioTrainer.create_scheduler

    def create_model_card(self, *args: Any, **kwargs: Any) -> None:
        """TRL writes a draft README.md into the run directory at each checkpoint; the run's card is made at publish
        time from the run's own records (finetune.publish.model_card), so none is written here."""
        return None


def trainer_class(objective: Objective) -> Any:
    """TRL's trainer for an objective (its record names it), with the Studio scheduler."""
    trl_class = load_class(objective.trainer)
    return type(f"Studio{trl_class.__name__}", (StudioTRL, trl_class), {})


def load_class(path: str) -> Any:
    """A class named "module:Class" (the objectives registry's way of naming trainers and their configs)."""
    import importlib

    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def preference_arguments(plan: RunPlan, output_dir: Path, has_eval: bool) -> Any:
    """The SFT run's `TrainingArguments`, every field carried into TRL's config for the objective, plus its own
    settings: beta, the DPO loss and the sequence length (prompt + answer)."""
    config = plan.config
    args = training_arguments(plan, output_dir, has_eval)
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init}
    values.update(beta=plan.beta, max_length=config.max_seq_length)
    if plan.loss_type:
        values["loss_type"] = plan.objective.trl_loss(plan.loss_type)
    if plan.objective.sequential_batches:
        # KTO's KL term pairs each prompt with its batch neighbour's answer, precomputed in data order: TRL needs
        # the batches in that order.
        values["train_sampling_strategy"] = "sequential"
    return load_class(plan.objective.trainer_config)(**values)


def reference_model(prepared: Prepared) -> Any:
    """The frozen reference for full fine-tuning: the starting weights, loaded the way the policy was; None when
    the plan uses the policy with its adapter switched off."""
    if prepared.plan.reference != "copy":
        return None
    reference = loading.load_base(prepared.plan)
    reference.requires_grad_(False)
    return reference.eval()


def drop_reference_adapter(trainer: Any, plan: RunPlan) -> None:
    """TRL copies an adapter that is already there into a second "ref" adapter. Ours starts as a no-op (B = 0), so
    the base with the adapter off is the same reference: drop the copy, as the plan says, and save one adapter."""
    model = trainer.model
    if plan.reference == "adapter-off" and "ref" in getattr(model, "peft_config", {}):
        model.delete_adapter("ref")
        model.set_adapter("default")


def train(plan: RunPlan, progress: Progress, resume_from: Path | None = None) -> str:
    """Train to the end (or until stopped); returns the final status: completed or stopped."""
    return in_world(plan, lambda: _train(plan, progress, resume_from))


def in_world(plan: RunPlan, run: Callable[[], str]) -> str:
    """`run()` in the process group DeepSpeed through the Trainer needs (one of size 1 without a launcher, torn down
    after the run); as it is without DeepSpeed."""
    with trainer_world_if(plan):
        return run()


def prepare_trl_run(plan: RunPlan, progress: Progress) -> Prepared | None:
    """The SFT path's model, tokenizer and data for a TRL trainer (None: stopped while loading)."""
    from transformers import set_seed

    set_seed(plan.config.seed)  # before the adapter is built, as for SFT
    prepared = prepare_run(plan, progress)
    return None if progress.stop_requested.is_set() else prepared


def _train(plan: RunPlan, progress: Progress, resume_from: Path | None = None) -> str:
    prepared = prepare_trl_run(plan, progress)
    if prepared is None:
        return "stopped"
    progress.event(  # what the run compares and reads, for the model card
        "objective",
        objective=plan.objective.name,
        beta=plan.beta,
        loss_type=plan.loss_type or None,
        reference=plan.reference,
        columns=prepared.data.format.columns,
    )
    args = preference_arguments(plan, progress.run.path, prepared.data.eval is not None)
    kwargs: dict[str, Any] = {}
    if plan.objective.reference != NO_REFERENCE:
        kwargs["ref_model"] = reference_model(prepared)
    trainer = trainer_class(plan.objective)(
        model=prepared.model,
        args=args,
        train_dataset=prepared.data.train,
        eval_dataset=prepared.data.eval,
        processing_class=prepared.tokenizer,
        callbacks=[ProgressCallback(progress, prepared)],
        **kwargs,
    )
    return run_to_the_end(trainer, prepared, progress, resume_from)


def run_to_the_end(trainer: Any, prepared: Prepared, progress: Progress, resume_from: Path | None) -> str:
    """Train a TRL trainer to the end (or until stopped) with the SFT path's progress and final save; "completed" or
    "stopped". One adapter is trained and saved (TRL's "ref" copy dropped, as the plan says); the models are let go
    afterwards, so their memory can be released before the next run in this process."""
    plan, config = prepared.plan, prepared.plan.config
    drop_reference_adapter(trainer, plan)
    trainer.remove_callback(PrinterCallback)  # our progress (terminal bar, UI) replaces its raw dict prints
    try:
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        if progress.stop_requested.is_set():
            return "stopped"
        if prepared.data.eval is not None and trainer.state.global_step % config.eval_steps:
            trainer.evaluate()  # the last evaluation (and sample answers) at the final step
        save_final(trainer.model, prepared.tokenizer, progress, trainer=trainer, plan=plan)
        return "completed"
    finally:
        trainer.model = trainer.model_wrapped = None
        trainer.optimizer = trainer.lr_scheduler = None
        if hasattr(trainer, "ref_model"):
            trainer.ref_model = None
        prepared.model = None
