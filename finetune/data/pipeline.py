"""The whole pipeline: load, detect and prepare the train and eval sets for the objective's trainer."""

from __future__ import annotations

from typing import Any

from finetune.config import TrainConfig
from finetune.data.detection import detect_format
from finetune.data.kinds import PreparedData
from finetune.data.loading import load_raw
from finetune.data.registry import handler


def prepare(config: TrainConfig, tokenizer: Any) -> PreparedData:
    """Load, detect and tokenise the train and eval sets (one example per row; the collator lays out batches)."""
    train_raw, eval_raw = load_raw(config)
    fmt = detect_format(list(train_raw.column_names), config)
    return handler(fmt.kind).prepare(config, tokenizer, train_raw, eval_raw, fmt)
