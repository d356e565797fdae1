"""What the UI shows of the data: the first examples as the model sees them."""

from __future__ import annotations

from typing import Any

from finetune.config import TrainConfig
from finetune.data.detection import detect_format
from finetune.data.kinds import DataKind
from finetune.data.loading import load_raw
from finetune.data.masking import IGNORE, render_segments, tokenize_segments
from finetune.data.prompts import PREVIEW_COLUMNS
from finetune.data.trl_rows import preview_example


def preview(config: TrainConfig, tokenizer: Any, n: int = 3) -> dict[str, Any]:
    """The first `n` examples as the model sees them: text pieces (trained or masked) and token counts."""
    train_raw, eval_raw = load_raw(config)
    fmt = detect_format(list(train_raw.column_names), config)
    examples = []
    for row in train_raw.select(range(min(n, len(train_raw)))):
        if fmt.kind in (DataKind.PREFERENCE, DataKind.UNPAIRED, DataKind.PROMPTS):
            example = preview_example(row, fmt, tokenizer)
            if fmt.kind is DataKind.PROMPTS:  # what the rewards read besides the prompt
                others = [(k, v) for k, v in row.items() if k not in fmt.columns.values()]
                example["columns"] = {k: str(v)[:80] for k, v in others[:PREVIEW_COLUMNS]}
            examples.append(example)
            continue
        if fmt.kind is DataKind.CLASSIFICATION:
            pair = row.get(fmt.columns.get("text_pair", ""), "")
            text = f"{row[fmt.columns['text']]}" + (f" [SEP] {pair}" if pair else "")
            tokens = len(tokenizer(text)["input_ids"])
            examples.append({"segments": [(text, False)], "label": row[fmt.columns["label"]], "tokens": tokens})
            continue
        segments = render_segments(row, fmt, tokenizer)
        encoded = tokenize_segments(segments, tokenizer, config.max_seq_length)
        trained = sum(1 for label in encoded["labels"] if label != IGNORE)
        examples.append({"segments": segments, "tokens": len(encoded["input_ids"]), "trained_tokens": trained})
    return {
        "format": fmt.describe(),
        "rows": len(train_raw),
        "eval_rows": len(eval_raw) if eval_raw is not None else 0,
        "examples": examples,
    }
