"""The column names each role is found under when the config does not name the column (`*_column` settings win)."""

from __future__ import annotations

MESSAGES_NAMES = ("messages", "conversations", "conversation", "chat")
PAIR_NAMES = (
    ("prompt", "completion"),
    ("prompt", "response"),
    ("instruction", "output"),
    ("instruction", "response"),
    ("question", "answer"),
    ("input", "output"),
)
TEXT_NAMES = ("text", "sentence", "sentence1", "content", "document")
TEXT_PAIR_NAMES = ("sentence2", "text_pair", "text2", "hypothesis")
LABEL_NAMES = ("label", "labels", "class", "target")
CHOSEN_NAMES = ("chosen", "preferred", "accepted", "chosen_response")
REJECTED_NAMES = ("rejected", "dispreferred", "rejected_response")
PREFERENCE_PROMPT_NAMES = ("prompt", "question", "instruction", "input")
KTO_COMPLETION_NAMES = ("completion", "response", "answer", "output")


def first(names: tuple[str, ...], cols: set[str]) -> str:
    """The first of `names` that is a column, else ""."""
    return next((n for n in names if n in cols), "")
