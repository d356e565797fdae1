"""What the UI shows of the data: the first examples as the model sees them."""

from __future__ import annotations

from typing import Any

from finetune.config import TrainConfig
from finetune.data.detection import detect_format
from finetune.data.loading import load_raw
from finetune.data.registry import handler


def preview(config: TrainConfig, tokenizer: Any, n: int = 3) -> dict[str, Any]:
    """The first `n` examples as the model sees them: text pieces (trained or masked) and token counts."""
    train_raw, eval_raw = load_raw(config)
    fmt = detect_format(list(train_raw.column_names), config)
    example = handler(fmt.kind).example
    examples = [example(row, fmt, tokenizer, config) for row in train_raw.select(range(min(n, len(train_raw))))]
    return {
        "format": fmt.describe(),
        "rows": len(train_raw),
        "eval_rows": len(eval_raw) if eval_raw is not None else 0,
        "examples": examples,
    }
