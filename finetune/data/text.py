"""Plain text: every token trained, the end-of-text token added so the model learns where a text stops."""

from __future__ import annotations

from typing import Any

from finetune.config import TrainConfig
from finetune.data.checks import text_value
from finetune.data.handler import Row, Segments, no_samples
from finetune.data.kinds import DataFormat, DataKind
from finetune.data.masking import masked_kind
from finetune.data.names import TEXT_NAMES, first


def detect(columns: list[str], config: TrainConfig) -> DataFormat | None:
    """The text column the config names, else the first known text column."""
    text = config.text_column or first(TEXT_NAMES, set(columns))
    return DataFormat(DataKind.TEXT, {"text": text}) if text else None


def render(row: Row, fmt: DataFormat, tokenizer: Any) -> Segments:
    """The whole text, trained."""
    return [(text_value(row[fmt.columns["text"]]) + (tokenizer.eos_token or ""), True)]


HANDLER = masked_kind(DataKind.TEXT, detect, render, no_samples)
