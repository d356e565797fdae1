"""Preference data (dpo, orpo, kto): prompt/chosen/rejected pairs, or for kto prompt/completion/true-false label rows,
shaped as TRL's trainers read them (TRL tokenises them)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from finetune import objectives
from finetune.config import TrainConfig
from finetune.data.checks import kto_label
from finetune.data.handler import KindHandler, Row, Sample
from finetune.data.kinds import DataFormat, DataKind, PreparedData
from finetune.data.names import (
    CHOSEN_NAMES,
    KTO_COMPLETION_NAMES,
    LABEL_NAMES,
    PREFERENCE_PROMPT_NAMES,
    REJECTED_NAMES,
    first,
)
from finetune.data.trl_rows import answer_content, check, last_user_prompt, preview_example, trl_row
from finetune.errors import UserError


def detect_pairs(columns: list[str], config: TrainConfig) -> DataFormat | None:
    """A chosen and a rejected column (named or found), with the prompt column they answer."""
    cols = set(columns)
    chosen = config.chosen_column or first(CHOSEN_NAMES, cols)
    rejected = config.rejected_column or first(REJECTED_NAMES, cols)
    if not (chosen and rejected):
        return None
    prompt = config.prompt_column or first(PREFERENCE_PROMPT_NAMES, cols)
    if not prompt:
        raise UserError(
            f"prompt_column: no prompt column found among {', '.join(columns)}; set prompt_column", "prompt_column"
        )
    return DataFormat(DataKind.PREFERENCE, {"prompt": prompt, "chosen": chosen, "rejected": rejected})


def detect_unpaired(columns: list[str], config: TrainConfig) -> DataFormat | None:
    """kto rows: a prompt, a completion and a true/false label saying whether the completion is good."""
    cols = set(columns)
    prompt = config.prompt_column or first(PREFERENCE_PROMPT_NAMES, cols)
    completion = config.completion_column or first(KTO_COMPLETION_NAMES, cols)
    label = config.label_column or first(LABEL_NAMES, cols)
    if prompt and completion and label:
        return DataFormat(DataKind.UNPAIRED, {"prompt": prompt, "completion": completion, "label": label})
    return None


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


def reference_answer(row: Row, fmt: DataFormat) -> str | None:
    """The answer a row holds up as right, as text: the chosen one, or a kto answer marked good (None if bad)."""
    if fmt.kind is DataKind.UNPAIRED:
        if not kto_label(row[fmt.columns["label"]]):
            return None
        value = row[fmt.columns["completion"]]
    else:
        value = row[fmt.columns["chosen"]]
    return answer_content(value, "chosen")


def samples(row: Row, fmt: DataFormat) -> list[Sample]:
    """The prompt's last user message, with the chosen (or good) answer as the reference."""
    return [(user, reference_answer(row, fmt)) for user in last_user_prompt(row, fmt)]


PAIRS = KindHandler(
    DataKind.PREFERENCE, detect=detect_pairs, check=check, prepare=prepare, example=preview_example, samples=samples
)
UNPAIRED = replace(PAIRS, kind=DataKind.UNPAIRED, detect=detect_unpaired)  # kto rows: the same functions serve them
