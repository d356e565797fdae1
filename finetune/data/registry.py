"""The registry of data kinds: each `DataKind`'s handler, defined by the kind's own module. The shared pipeline
(loading, detection, preparation, the preview, the held-out samples) asks it what to do with rows of a kind."""

from __future__ import annotations

from typing import Any

from finetune.data import chat, classification, images, preference, prompt_completion, prompts, text
from finetune.data.handler import KindHandler, Row, Segments
from finetune.data.kinds import DataFormat, DataKind

HANDLERS: dict[DataKind, KindHandler] = {
    handler.kind: handler
    for handler in (
        chat.HANDLER,
        images.HANDLER,
        prompt_completion.HANDLER,
        text.HANDLER,
        classification.HANDLER,
        preference.PAIRS,
        preference.UNPAIRED,
        prompts.HANDLER,
    )
}


def handler(kind: DataKind) -> KindHandler:
    """The handler of rows of `kind`."""
    return HANDLERS[kind]


def render_segments(row: Row, fmt: DataFormat, tokenizer: Any) -> Segments:
    """The example as text pieces, each flagged True when the model is trained on it (kinds whose masking is ours)."""
    render = handler(fmt.kind).render
    if render is None:
        raise ValueError(f"{fmt.kind} rows are not rendered here: TRL's trainer (or a classifier) reads them")
    return render(row, fmt, tokenizer)


def to_messages(row: Row, fmt: DataFormat) -> list[dict[str, str]]:
    """A row as chat messages (role/content), for the kinds read through the chat template."""
    conversation = handler(fmt.kind).conversation
    if conversation is None:
        raise ValueError(f"{fmt.kind} rows are not a conversation")
    return conversation(row, fmt)
