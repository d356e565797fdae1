"""Format detection: which kind of data the columns hold for the objective, and which column plays each role."""

from __future__ import annotations

from finetune import objectives
from finetune.config import TrainConfig
from finetune.data.kinds import DataFormat, DataKind
from finetune.data.names import (
    CHOSEN_NAMES,
    KTO_COMPLETION_NAMES,
    LABEL_NAMES,
    MESSAGES_NAMES,
    PAIR_NAMES,
    PREFERENCE_PROMPT_NAMES,
    REJECTED_NAMES,
    TEXT_NAMES,
    TEXT_PAIR_NAMES,
    first,
)
from finetune.errors import UserError


def detect_format(columns: list[str], config: TrainConfig) -> DataFormat:
    """Which format the columns hold; explicit `*_column` settings win over detection."""
    cols = set(columns)
    for key in (
        "text_column",
        "text_pair_column",
        "prompt_column",
        "completion_column",
        "messages_column",
        "label_column",
        "chosen_column",
        "rejected_column",
    ):
        value = getattr(config, key)
        if value and value not in cols:
            raise UserError(f"{key}: column {value!r} is not in the data; columns: {', '.join(columns)}", field=key)
    objective = objectives.of(config)
    if objective.is_classifier:
        return _detect_classification(columns, config)
    if DataKind.PREFERENCE in objective.data_kinds:
        return _detect_preference(columns, config)
    if DataKind.PROMPTS in objective.data_kinds:
        return _detect_prompts(columns, config)
    messages = config.messages_column or first(MESSAGES_NAMES, cols)
    if messages and not (config.prompt_column or config.text_column):
        return DataFormat(DataKind.MESSAGES, {"messages": messages})
    prompt, completion = config.prompt_column, config.completion_column
    if not (prompt and completion):
        for p, c in PAIR_NAMES:
            if (prompt or p) in cols and (completion or c) in cols:
                prompt, completion = prompt or p, completion or c
                break
    if prompt and completion and not config.text_column:
        return DataFormat(DataKind.PROMPT_COMPLETION, {"prompt": prompt, "completion": completion})
    text = config.text_column or first(TEXT_NAMES, cols)
    if text:
        return DataFormat(DataKind.TEXT, {"text": text})
    if first(CHOSEN_NAMES, cols) and first(REJECTED_NAMES, cols):
        learners = [o.name for o in objectives.OBJECTIVES.values() if DataKind.PREFERENCE in o.data_kinds]
        raise UserError(
            f"objective: columns {', '.join(columns)} hold preference pairs, which objective: {objective.name} cannot "
            f"learn from; set objective: {', '.join(learners[:-1])} or {learners[-1]}",
            field="objective",
        )
    raise UserError(
        f"dataset: cannot tell the format from columns {', '.join(columns)}; set messages_column, "
        "prompt_column + completion_column, or text_column",
        field="dataset",
    )


def _detect_classification(columns: list[str], config: TrainConfig) -> DataFormat:
    cols = set(columns)
    text = config.text_column or first(TEXT_NAMES + ("question", "prompt"), cols)
    label = config.label_column or first(LABEL_NAMES, cols)
    if not text:
        raise UserError(f"text_column: no text column found among {', '.join(columns)}; set text_column", "text_column")
    if not label:
        raise UserError(
            f"label_column: no label column found among {', '.join(columns)}; set label_column", "label_column"
        )
    found = {"text": text, "label": label}
    pair = config.text_pair_column or first(TEXT_PAIR_NAMES, cols - {text})
    if pair:
        found["text_pair"] = pair
    return DataFormat(DataKind.CLASSIFICATION, found)


def _detect_preference(columns: list[str], config: TrainConfig) -> DataFormat:
    """prompt/chosen/rejected pairs (dpo, orpo, kto), or for kto prompt/completion/label rows."""
    cols = set(columns)
    prompt = config.prompt_column or first(PREFERENCE_PROMPT_NAMES, cols)
    chosen = config.chosen_column or first(CHOSEN_NAMES, cols)
    rejected = config.rejected_column or first(REJECTED_NAMES, cols)
    if chosen and rejected:
        if not prompt:
            raise UserError(
                f"prompt_column: no prompt column found among {', '.join(columns)}; set prompt_column", "prompt_column"
            )
        return DataFormat(DataKind.PREFERENCE, {"prompt": prompt, "chosen": chosen, "rejected": rejected})
    if DataKind.UNPAIRED in objectives.of(config).data_kinds:
        completion = config.completion_column or first(KTO_COMPLETION_NAMES, cols)
        label = config.label_column or first(LABEL_NAMES, cols)
        if prompt and completion and label:
            return DataFormat(DataKind.UNPAIRED, {"prompt": prompt, "completion": completion, "label": label})
    if chosen or rejected:  # one side named or found: say which column is missing
        key, what = ("rejected_column", "worse") if chosen else ("chosen_column", "preferred")
        raise UserError(
            f"{key}: no column with the {what} answer found among {', '.join(columns)}; set {key}", field=key
        )
    raise UserError(_not_preference_data(columns, config), field="dataset")


def _detect_prompts(columns: list[str], config: TrainConfig) -> DataFormat:
    """A prompt column (text or a conversation) for learning from rewards; the rest goes to the reward functions."""
    prompt = config.prompt_column or first(PREFERENCE_PROMPT_NAMES, set(columns))
    if not prompt:
        raise UserError(
            f"prompt_column: no prompt column among {', '.join(columns)}; objective: {config.objective} samples "
            "answers to prompts: name the column with prompt_column (text or chat messages)",
            field="prompt_column",
        )
    return DataFormat(DataKind.PROMPTS, {"prompt": prompt})


def _not_preference_data(columns: list[str], config: TrainConfig) -> str:
    """Why data without pairs cannot train a preference objective, and what to use instead."""
    objective = objectives.of(config)
    needs = "prompt, chosen and rejected columns"
    if DataKind.UNPAIRED in objective.data_kinds:
        needs += " (or prompt, completion and a true/false label)"
    advice = "set chosen_column and rejected_column if they have other names"
    if config.dataset.startswith("bundled:") and objective.bundled_data not in ("", config.dataset):
        advice = f"use dataset: {objective.bundled_data}, the same set as preference pairs"
    return (
        f"dataset: {config.dataset} has columns {', '.join(columns)}, not preference data; "
        f"objective: {objective.name} needs {needs}; {advice}"
    )
