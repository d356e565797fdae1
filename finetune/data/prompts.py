"""Prompts for learning from rewards (grpo): a prompt column, text or a conversation; every other column goes to the
reward functions."""

from __future__ import annotations

from typing import Any

from finetune.config import TrainConfig
from finetune.data.checks import Bad, is_empty, text_value
from finetune.data.handler import KindHandler, Row, Sample
from finetune.data.kinds import DataFormat, DataKind, PreparedData
from finetune.data.names import PREFERENCE_PROMPT_NAMES, first
from finetune.data.trl_rows import check, last_user_prompt, preview_example, render_preference, trl_row
from finetune.errors import UserError

PREVIEW_COLUMNS = 4  # a prompt's other columns shown in the preview


def detect(columns: list[str], config: TrainConfig) -> DataFormat:
    """A prompt column (text or a conversation) for learning from rewards; the rest goes to the reward functions."""
    prompt = config.prompt_column or first(PREFERENCE_PROMPT_NAMES, set(columns))
    if not prompt:
        raise UserError(
            f"prompt_column: no prompt column among {', '.join(columns)}; objective: {config.objective} samples "
            "answers to prompts: name the column with prompt_column (text or chat messages)",
            field="prompt_column",
        )
    return DataFormat(DataKind.PROMPTS, {"prompt": prompt})


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


def reference_answer(row: Row, fmt: DataFormat) -> str | None:
    """A prompt's `answer` column, which the built-in rewards compare with, as text (None when the data has none)."""
    from finetune.objectives.rewards import ANSWER_COLUMN

    value = row.get(ANSWER_COLUMN)
    if is_empty(value):
        return None
    try:
        return text_value(value)
    except Bad:  # neither text nor a number: nothing an answer can be compared with
        return None


def example(row: Row, fmt: DataFormat, tokenizer: Any, config: TrainConfig) -> dict[str, Any]:
    """A prompt for the preview, as the model reads it, with the columns the rewards read besides it."""
    shown = preview_example(row, fmt, tokenizer, config)
    others = [(k, v) for k, v in row.items() if k not in fmt.columns.values()]
    shown["columns"] = {k: str(v)[:80] for k, v in others[:PREVIEW_COLUMNS]}
    return shown


def samples(row: Row, fmt: DataFormat) -> list[Sample]:
    """The prompt's last user message, with its `answer` column as the reference."""
    return [(user, reference_answer(row, fmt)) for user in last_user_prompt(row, fmt)]


HANDLER = KindHandler(DataKind.PROMPTS, detect=detect, check=check, prepare=prepare, example=example, samples=samples)
