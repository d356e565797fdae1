"""Learning from rewards (GRPO) on TRL's `GRPOTrainer`, built from the run plan with the SFT path's pieces.

For each prompt the model samples `num_generations` answers; the reward functions (`finetune.objectives.rewards`:
number_match,
regex:..., python:FILE:FUNCTION, ...) score them, and each answer is pushed up or down by how much better it scored
than its group's mean. The model, tokenizer, prompts and held-out prompts come from `prepare_run`; the Trainer
settings from `training_arguments` (ZeRO, schedulers, checkpoints and precision as for SFT); callbacks, the stop flag,
checkpoint sealing and the final save are the SFT path's. New here: TRL's config with the generation settings, the
reward functions, and what the live view shows of each logged step (a few completions with their rewards).

The reference (when beta > 0) is the plan's: the base with the adapter off for LoRA / QLoRA, a frozen copy of the
starting weights for full fine-tuning (TRL loads it the way the policy was loaded).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from finetune.engines.hf_trainer import ProgressCallback, training_arguments
from finetune.engines.preference import StudioTRL, in_world, load_class, prepare_trl_run, run_to_the_end
from finetune.objectives import rewards
from finetune.plan import RunPlan
from finetune.runs.progress import Progress

COMPLETIONS_SHOWN = 4  # completions (with their rewards) written to the live view per logged step
COMPLETION_CHARS = 400  # each shown completion is cut to this many characters


class _StudioGRPO(StudioTRL):
    """Our scheduler and no draft card (as for the preference trainers), and a few completions per logged step."""

    studio_progress: Progress | None = None

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's log (the step's reward metrics averaged), then the last completions with their rewards."""
        training = self.model.training
        super().log(logs, start_time)
        progress = self.studio_progress
        if progress is not None and training and "loss" in logs:
            progress.event("completions", step=self.state.global_step, completions=last_completions(self._logs))


def last_completions(logged: dict[str, Any], count: int = COMPLETIONS_SHOWN) -> list[dict[str, Any]]:
    """The newest `count` (prompt, completion, rewards) TRL keeps for its completions table."""
    prompts, completions = list(logged["prompt"]), list(logged["completion"])
    scores = {name: list(values) for name, values in logged["rewards"].items()}
    out = []
    for index in range(max(0, len(completions) - count), len(completions)):
        by_name = {name: _number(values[index]) for name, values in scores.items() if index < len(values)}
        out.append(
            {
                "prompt": _text(prompts[index])[-COMPLETION_CHARS:],
                "completion": _text(completions[index])[:COMPLETION_CHARS],
                "rewards": by_name,
            }
        )
    return out


def _text(value: Any) -> str:
    """A prompt or completion as text (the last user / assistant message of a conversation)."""
    if isinstance(value, list):
        return rewards.completion_text(value[-1:]) if value else ""
    return str(value)


def _number(value: Any) -> float | None:
    number = float(value)
    return None if math.isnan(number) else number


def grpo_arguments(plan: RunPlan, output_dir: Path, has_eval: bool) -> Any:
    """The SFT run's `TrainingArguments`, every field carried into TRL's `GRPOConfig`, plus the generation settings,
    beta (the plan's) and the loss."""
    config = plan.config
    args = training_arguments(plan, output_dir, has_eval)
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init}
    specs = rewards.parse(config.rewards)
    values.update(
        beta=plan.beta,
        loss_type=plan.loss_type,
        num_generations=config.num_generations,
        max_completion_length=config.max_completion_length,
        temperature=config.temperature,
        reward_weights=rewards.weights(config.reward_weights, len(specs)),
        # An evaluation batch holds whole groups: one generation batch, as in training.
        per_device_eval_batch_size=config.per_device_train_batch_size * config.gradient_accumulation_steps,
        log_completions=False,  # the live view gets a few completions per logged step (`_StudioGRPO.log`)
        include_num_input_tokens_seen="no",  # GRPOTrainer counts prompt and answer tokens itself
    )
    return load_class(plan.objective.trainer_config)(**values)


def train(plan: RunPlan, progress: Progress, resume_from: Path | None = None) -> str:
    """Train to the end (or until stopped); returns the final status: completed or stopped."""
    return in_world(plan, lambda: _train(plan, progress, resume_from))


def _train(plan: RunPlan, progress: Progress, resume_from: Path | None = None) -> str:
    prepared = prepare_trl_run(plan, progress)
    if prepared is None:
        return "stopped"
    specs = rewards.parse(plan.config.rewards)
    progress.event(  # what the run rewards and reads, for the live view and the model card
        "objective",
        objective=plan.objective.name,
        beta=plan.beta,
        loss_type=plan.loss_type,
        reference=plan.reference,
        columns=prepared.data.format.columns,
        rewards=rewards.names(specs),
        reward_specs=[spec.text for spec in specs],
    )
    args = grpo_arguments(plan, progress.run.path, prepared.data.eval is not None)
    trainer_class = type("StudioGRPOTrainer", (_StudioGRPO, load_class(plan.objective.trainer)), {})
    trainer = trainer_class(
        model=prepared.model,
        reward_funcs=rewards.reward_functions(specs, prepared.tokenizer),
        args=args,
        train_dataset=prepared.data.train,
        eval_dataset=prepared.data.eval,
        processing_class=prepared.tokenizer,
        callbacks=[ProgressCallback(progress, prepared)],
    )
    trainer.studio_progress = progress
    return run_to_the_end(trainer, prepared, progress, resume_from)
