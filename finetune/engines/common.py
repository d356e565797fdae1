"""What every engine does before and after its loop: tokenizer, data, model, sample prompts, final save."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from finetune import data, models
from finetune.config import TrainConfig
from finetune.errors import UserError
from finetune.progress import Progress


@dataclass
class Prepared:
    """Everything a training loop needs, built from the config."""

    tokenizer: Any
    model: Any
    data: data.PreparedData
    collator: Any
    prompts: list[str]
    precision: str


def prepare_run(config: TrainConfig, progress: Progress) -> Prepared:
    """Load tokenizer, data and model, reporting each stage to the user."""
    import torch

    precision = models.compute_dtype_name(config)
    if config.precision in ("fp16", "bf16") and precision == "fp32":
        progress.message(f"precision: {config.precision} needs a GPU; none found, so this run uses fp32")
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    progress.update(device=device)
    if config.trust_remote_code:
        progress.message("warning: trust_remote_code is on: Python code from the model repository runs on this machine")
    progress.set_status("loading", message="loading the tokenizer and data")
    tokenizer = models.load_tokenizer(config)
    check_sequence_length(config)
    prepared_data = data.prepare(config, tokenizer)
    progress.message(
        f"data: {prepared_data.format.describe()}, {len(prepared_data.train)} training rows"
        + (f", {len(prepared_data.eval)} eval rows" if prepared_data.eval is not None else ", no eval split")
    )
    progress.event("dataset", dataset=config.dataset, **data.fingerprint(config))
    for note in prepared_data.notes:
        progress.message(note)
    progress.message(f"loading the model ({config.method}, {precision}) on {device}")
    model = models.load_model(config, num_labels=prepared_data.num_labels or None)
    if prepared_data.label_names:
        model.config.id2label = dict(enumerate(prepared_data.label_names))
        model.config.label2id = {name: i for i, name in enumerate(prepared_data.label_names)}
    trainable, total = models.parameter_counts(model)
    progress.message(
        f"model: {total / 1e6:.1f}M parameters, {trainable / 1e6:.2f}M trainable ({trainable / total:.2%})"
    )
    return Prepared(
        tokenizer=tokenizer,
        model=model,
        data=prepared_data,
        collator=data.collator(config, tokenizer),
        prompts=data.heldout_prompts(config),
        precision=precision,
    )


def check_sequence_length(config: TrainConfig) -> None:
    """Refuse a max_seq_length beyond what the model's position embeddings support."""
    limit = models.max_positions(models.load_model_config(config.model, config.trust_remote_code))
    if limit and config.max_seq_length > limit:
        raise UserError(
            f"max_seq_length: {config.max_seq_length} is beyond this model's limit of {limit} tokens; use ≤ {limit}",
            field="max_seq_length",
        )


def save_final(model: Any, tokenizer: Any, progress: Progress, trainer: Any = None) -> None:
    """Save the adapter (or full model) and tokenizer into the run directory."""
    target = progress.run.path
    if trainer is not None:
        trainer.save_model(str(target))  # handles DeepSpeed gathering and rank-0-only writes
    elif progress.write_files:
        model.save_pretrained(str(target))
    if progress.write_files:
        tokenizer.save_pretrained(str(target))
        progress.event("saved", path=str(target))
