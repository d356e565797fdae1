"""The kinds of training data (`DataKind`) and what is known once a kind is detected: the format (the kind and the
columns it reads) and the prepared train / eval sets.

Light on purpose (no project imports): the objectives registry names the kinds each objective learns from, and
`finetune.config` imports the registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class DataKind(StrEnum):
    """What a data set's rows are; its value is how the run log and the preview name it."""

    MESSAGES = "messages"  # chat: a list of {role, content} messages per row
    PROMPT_COMPLETION = "prompt_completion"  # a prompt and its answer (the loss on the answer only)
    TEXT = "text"  # plain text, all of it trained
    IMAGES = "images"  # images with a conversation, a prompt and answer, or a caption (vision-language models)
    CLASSIFICATION = "classification"  # a text (and a second one) with a class label
    PREFERENCE = "preference"  # prompt/chosen/rejected pairs (dpo, orpo; kto splits them)
    UNPAIRED = "unpaired"  # prompt/completion/true-false label rows (kto)
    PROMPTS = "prompts"  # prompts alone (learning from rewards): every other column goes to the reward functions


@dataclass
class DataFormat:
    """How rows are read: the kind and the columns it uses."""

    kind: DataKind
    columns: dict[str, str]

    def describe(self) -> str:
        cols = ", ".join(f"{k}={v}" for k, v in self.columns.items())
        return f"{self.kind} ({cols})"


@dataclass
class PreparedData:
    """Tokenised train / eval sets and what was learnt about the data."""

    train: Any
    eval: Any | None
    format: DataFormat
    label_names: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def num_labels(self) -> int:
        return len(self.label_names)
