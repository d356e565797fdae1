"""Preference data (dpo, orpo, kto): prompt/chosen/rejected pairs, or for kto prompt/completion/true-false label rows,
shaped as TRL's trainers read them (TRL tokenises them)."""

from __future__ import annotations

from typing import Any

from finetune import objectives
from finetune.config import TrainConfig
from finetune.data.kinds import DataFormat, DataKind, PreparedData
from finetune.data.trl_rows import trl_row


def prepare(config: TrainConfig, tokenizer: Any, train_raw: Any, eval_raw: Any, fmt: DataFormat) -> PreparedData:
    """Rows in TRL's shape (prompt/chosen/rejected, or prompt/completion/label); TRL's trainers tokenise them."""

    def shaped(raw: Any, name: str) -> Any:
        return raw.map(
            lambda row: trl_row(row, fmt, tokenizer), remove_columns=raw.column_names, desc=f"shaping {name} rows"
        )

    notes = []
    train = shaped(train_raw, "train")
    evaluation = shaped(eval_raw, "eval") if eval_raw is not None else None
    if DataKind.UNPAIRED in objectives.of(config).data_kinds:
        if fmt.kind is DataKind.PREFERENCE:
            notes.append("kto: each pair gives two rows, the chosen answer marked good and the rejected one bad")
            train = _unpaired(train)
            evaluation = _unpaired(evaluation) if evaluation is not None else None
        # TRL reads KTO batches in data order (its KL term pairs neighbours); mix good and bad rows once, seeded,
        # so that batches are not all good then all bad (and a resume sees the same order).
        train = train.shuffle(seed=config.seed).flatten_indices()
    return PreparedData(train, evaluation, fmt, notes=notes)


def _unpaired(pairs: Any) -> Any:
    """prompt/chosen/rejected pairs as kto rows: (prompt, chosen, good) and (prompt, rejected, bad)."""

    def split(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        size = len(batch["prompt"])
        return {
            "prompt": batch["prompt"] * 2,
            "completion": batch["chosen"] + batch["rejected"],
            "label": [True] * size + [False] * size,
        }

    return pairs.map(split, batched=True, remove_columns=pairs.column_names, desc="unpairing")
