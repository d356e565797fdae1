"""Format detection: which kind of data the columns hold, trying the kinds the objective learns from in its order
(each kind's module detects its own columns), and one line saying what to set when none fits."""

from __future__ import annotations

from finetune import objectives
from finetune.config import TrainConfig
from finetune.data.kinds import DataFormat, DataKind
from finetune.data.names import CHOSEN_NAMES, REJECTED_NAMES, first
from finetune.data.registry import handler
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
    for kind in objective.data_kinds:  # the kinds it learns from, in order
        found = handler(kind).detect(columns, config)
        if found is not None:
            return found
    if DataKind.PREFERENCE in objective.data_kinds:
        raise _no_pairs(columns, config)
    raise _no_format(columns, objective)


def _no_format(columns: list[str], objective: objectives.Objective) -> UserError:
    """Why no format fits: pairs for an objective that cannot learn from them, or columns that say nothing."""
    cols = set(columns)
    if first(CHOSEN_NAMES, cols) and first(REJECTED_NAMES, cols):
        learners = [o.name for o in objectives.OBJECTIVES.values() if DataKind.PREFERENCE in o.data_kinds]
        return UserError(
            f"objective: columns {', '.join(columns)} hold preference pairs, which objective: {objective.name} cannot "
            f"learn from; set objective: {', '.join(learners[:-1])} or {learners[-1]}",
            field="objective",
        )
    return UserError(
        f"dataset: cannot tell the format from columns {', '.join(columns)}; set messages_column, "
        "prompt_column + completion_column, or text_column",
        field="dataset",
    )


def _no_pairs(columns: list[str], config: TrainConfig) -> UserError:
    """Why a preference objective found no pairs (or kto rows): the one side that is missing, or what to use."""
    cols = set(columns)
    chosen = config.chosen_column or first(CHOSEN_NAMES, cols)
    rejected = config.rejected_column or first(REJECTED_NAMES, cols)
    if chosen or rejected:  # one side named or found: say which column is missing
        key, what = ("rejected_column", "worse") if chosen else ("chosen_column", "preferred")
        return UserError(
            f"{key}: no column with the {what} answer found among {', '.join(columns)}; set {key}", field=key
        )
    return UserError(_not_preference_data(columns, config), field="dataset")


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
