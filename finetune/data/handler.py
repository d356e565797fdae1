"""What a kind's module provides: one `KindHandler`, the functions the shared pipeline calls for rows of that kind
(detection, row checks, preparation, the preview, the held-out samples). `finetune.data.registry` lists them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from finetune.config import TrainConfig
from finetune.data.checks import Table
from finetune.data.kinds import DataFormat, DataKind, PreparedData

Row = dict[str, Any]
Segments = list[tuple[str, bool]]  # text pieces, each flagged True when the model is trained on it
Sample = tuple[str, str | None]  # a held-out prompt and its reference answer (None where the data has none)


@dataclass(frozen=True)
class KindHandler:
    """The functions for rows of one kind."""

    kind: DataKind
    # The format when the columns hold this kind, else None (or a UserError naming the one column still missing).
    detect: Callable[[list[str], TrainConfig], DataFormat | None]
    # Every row of the used columns of each table checked; the normalised columns of each table.
    check: Callable[[list[Table], DataFormat, TrainConfig], list[dict[str, list[Any]]]]
    # The train and eval sets as the objective's trainer reads them: (config, tokenizer, train_raw, eval_raw, format).
    prepare: Callable[[TrainConfig, Any, Any, Any | None, DataFormat], PreparedData]
    # One row as the preview shows it: (row, format, tokenizer, config).
    example: Callable[[Row, DataFormat, Any, TrainConfig], dict[str, Any]]
    # The held-out prompts (with their reference answers) one row gives.
    samples: Callable[[Row, DataFormat], list[Sample]]
    # Kinds whose loss masking is ours: the row as text pieces, trained or not (None: TRL or a classifier reads it).
    render: Callable[[Row, DataFormat, Any], Segments] | None = None
    # Kinds read through the chat template: the row as chat messages.
    conversation: Callable[[Row, DataFormat], list[dict[str, str]]] | None = None


def no_samples(row: Row, fmt: DataFormat) -> list[Sample]:
    """For kinds whose rows hold no prompt to answer (plain text, classification)."""
    return []
