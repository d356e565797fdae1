"""Chat data (`messages`): a list of {role, content} messages per row (ShareGPT's from/value accepted), rendered with
the model's chat template; the loss on the assistant messages only."""

from __future__ import annotations

from typing import Any

from finetune.config import TrainConfig
from finetune.data.checks import Bad, message_list
from finetune.data.handler import Row, Sample, Segments
from finetune.data.kinds import DataFormat, DataKind
from finetune.data.masking import chat_segments, masked_kind, require_chat_template
from finetune.data.names import MESSAGES_NAMES, first
from finetune.errors import UserError


def detect(columns: list[str], config: TrainConfig) -> DataFormat | None:
    """A conversation column, unless the config names a prompt or text column instead."""
    messages = config.messages_column or first(MESSAGES_NAMES, set(columns))
    if messages and not (config.prompt_column or config.text_column):
        return DataFormat(DataKind.MESSAGES, {"messages": messages})
    return None


def to_messages(row: Row, fmt: DataFormat) -> list[dict[str, str]]:
    """The row's conversation as role/content messages."""
    try:
        return message_list(row[fmt.columns["messages"]])  # load_raw checked every row: this does not refuse
    except Bad as exc:
        raise UserError(f"dataset: column {fmt.columns['messages']!r}: {exc}", "dataset") from None


def render(row: Row, fmt: DataFormat, tokenizer: Any) -> Segments:
    """The conversation through the chat template: the assistant messages trained, the rest not."""
    require_chat_template(tokenizer)
    return chat_segments(to_messages(row, fmt), tokenizer)


def samples(row: Row, fmt: DataFormat) -> list[Sample]:
    """The first user message, with the assistant's reply to it as the reference."""
    messages = to_messages(row, fmt)
    first = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
    if first is None:
        return []
    reply = next((m["content"] for m in messages[first + 1 :] if m["role"] == "assistant"), None)
    return [(messages[first]["content"], reply)]


HANDLER = masked_kind(DataKind.MESSAGES, detect, render, samples, conversation=to_messages)
