"""Prompts for learning from rewards (grpo): a prompt column, text or a conversation; every other column goes to the
reward functions."""

from __future__ import annotations

from typing import Any

from finetune.config import TrainConfig
from finetune.data.kinds import DataFormat, DataKind, PreparedData
from finetune.data.trl_rows import render_preference, trl_row
from finetune.errors import UserError

PREVIEW_COLUMNS = 4  # a prompt's other columns shown in the preview


def prepare(config: TrainConfig, tokenizer: Any, train_raw: Any, eval_raw: Any, fmt: DataFormat) -> PreparedData:
    """Rows for learning from rewards in TRL's shape: `prompt` (a conversation when the model has a chat template),
    every other column as it is (the reward functions read them), and the data row each came from (for errors).
    Prompts longer than max_seq_length tokens are skipped, with a note."""
    from finetune.objectives.rewards import ROW_COLUMN

    column = fmt.columns["prompt"]
    notes: list[str] = []

    def shaped(raw: Any, name: str) -> Any:
        def one(row: dict[str, Any], index: int) -> dict[str, Any]:
            prompt = trl_row({"prompt": row[column]}, DataFormat(DataKind.PROMPTS, {"prompt": "prompt"}), tokenizer)
            return {**{k: v for k, v in row.items() if k != column}, **prompt, ROW_COLUMN: index + 1}

        rows = raw.map(one, with_indices=True, remove_columns=[column], desc=f"shaping {name} prompts")
        kept = rows.filter(lambda row: _prompt_tokens(row["prompt"], tokenizer) <= config.max_seq_length)
        if len(kept) < len(rows):
            notes.append(f"{len(rows) - len(kept)} {name} prompts are longer than max_seq_length and were skipped")
        if len(kept) == 0:
            raise UserError(
                f"max_seq_length: every {name} prompt is longer than {config.max_seq_length} tokens; raise it",
                "max_seq_length",
            )
        return kept

    evaluation = shaped(eval_raw, "eval") if eval_raw is not None else None
    return PreparedData(shaped(train_raw, "train"), evaluation, fmt, notes=notes)


def _prompt_tokens(prompt: Any, tokenizer: Any) -> int:
    """Tokens of a prompt as the model reads it before its answer (chat markup included)."""
    text = render_preference({"prompt": prompt}, tokenizer)["prompt"]
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])
