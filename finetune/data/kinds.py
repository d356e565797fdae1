"""The kinds of training data and what is known once a kind is detected: the format (the kind and the columns it
reads) and the prepared train / eval sets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PREFERENCE_KINDS = ("preference", "unpaired")  # prompt/chosen/rejected pairs; prompt/completion/label (kto)
PROMPTS_KIND = "prompts"  # prompts alone (learning from rewards): every other column goes to the reward functions
TRL_KINDS = (*PREFERENCE_KINDS, PROMPTS_KIND)  # rows TRL's trainers read in their own shape


@dataclass
class DataFormat:
    """How rows are read: the kind and the columns it uses."""

    kind: str  # messages | prompt_completion | text | classification | preference | unpaired
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
