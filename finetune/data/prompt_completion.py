"""Prompt/completion data: a prompt and its answer per row, the loss on the answer only. With a chat template the pair
is a two-message conversation (what the model then sees in chat); without one, the prompt ends on a new line."""

from __future__ import annotations

from typing import Any

from finetune.config import TrainConfig
from finetune.data.checks import text_value
from finetune.data.handler import Row, Sample, Segments
from finetune.data.kinds import DataFormat, DataKind
from finetune.data.masking import chat_segments, masked_kind
from finetune.data.names import PAIR_NAMES


def detect(columns: list[str], config: TrainConfig) -> DataFormat | None:
    """The columns the config names, else the first known pair of names (prompt/completion, question/answer, ...)."""
    cols = set(columns)
    prompt, completion = config.prompt_column, config.completion_column
    if not (prompt and completion):
        for p, c in PAIR_NAMES:
            if (prompt or p) in cols and (completion or c) in cols:
                prompt, completion = prompt or p, completion or c
                break
    if prompt and completion and not config.text_column:
        return DataFormat(DataKind.PROMPT_COMPLETION, {"prompt": prompt, "completion": completion})
    return None


def to_messages(row: Row, fmt: DataFormat) -> list[dict[str, str]]:
    """The pair as a user message and the assistant's answer."""
    return [
        {"role": "user", "content": text_value(row[fmt.columns["prompt"]])},
        {"role": "assistant", "content": text_value(row[fmt.columns["completion"]])},
    ]


def render(row: Row, fmt: DataFormat, tokenizer: Any) -> Segments:
    """The prompt (not trained) and the completion with the end-of-text token (trained)."""
    if tokenizer.chat_template:
        return chat_segments(to_messages(row, fmt), tokenizer)
    eos = tokenizer.eos_token or ""
    prompt = text_value(row[fmt.columns["prompt"]]).rstrip() + "\n"
    return [(prompt, False), (text_value(row[fmt.columns["completion"]]) + eos, True)]


def samples(row: Row, fmt: DataFormat) -> list[Sample]:
    """The prompt, with the completion as the reference."""
    return [(str(row[fmt.columns["prompt"]]), text_value(row[fmt.columns["completion"]]))]


HANDLER = masked_kind(DataKind.PROMPT_COMPLETION, detect, render, samples, conversation=to_messages)
