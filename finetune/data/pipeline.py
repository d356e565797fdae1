"""The whole pipeline: load, detect and prepare the train and eval sets for the objective's trainer."""

from __future__ import annotations

from typing import Any

from finetune import objectives
from finetune.config import TrainConfig
from finetune.data import classification, masking, preference, prompts
from finetune.data.detection import detect_format
from finetune.data.kinds import DataKind, PreparedData
from finetune.data.loading import load_raw
from finetune.errors import UserError


def prepare(config: TrainConfig, tokenizer: Any) -> PreparedData:
    """Load, detect and tokenise the train and eval sets (one example per row; the collator lays out batches)."""
    train_raw, eval_raw = load_raw(config)
    fmt = detect_format(list(train_raw.column_names), config)
    if fmt.kind in (DataKind.PREFERENCE, DataKind.UNPAIRED):
        return preference.prepare(config, tokenizer, train_raw, eval_raw, fmt)
    if fmt.kind is DataKind.PROMPTS:
        return prompts.prepare(config, tokenizer, train_raw, eval_raw, fmt)
    if not objectives.of(config).is_classifier and fmt.kind is DataKind.CLASSIFICATION:
        raise UserError("task: this data has labels; set task: sequence_classification", field="task")
    if fmt.kind is DataKind.CLASSIFICATION:
        return classification.prepare(config, tokenizer, train_raw, eval_raw, fmt)
    return masking.prepare(config, tokenizer, train_raw, eval_raw, fmt)
