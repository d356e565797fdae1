"""What each training goal is judged by: ONE table, so that it moves into the objectives registry in one step.

A goal is the run's objective (sft, dpo, orpo, kto) or, for a sequence-classification run, "classification".
`metrics` are the scores an evaluation reports, in the order shown; `during_training` the cheap ones computed on the
held-out sample answers at each evaluation while the run trains. METRICS says how to read each score: which way is
better, and how large a drop against the base is flagged (smaller differences are noise on a few dozen rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ANSWER_METRICS = ("exact_match", "rouge_l", "number_match")  # generated answers against the reference answers
REWARD_METRICS = ("reward_accuracy", "reward_margin")  # preference pairs, relative to the reference model


@dataclass(frozen=True)
class Goal:
    """The scores that fit one training goal."""

    name: str
    metrics: tuple[str, ...]
    during_training: tuple[str, ...]
    answers: bool = True  # generated answers are part of the evaluation (not for a classifier)


GOALS: dict[str, Goal] = {
    "sft": Goal("sft", ("loss", "perplexity", *ANSWER_METRICS), ANSWER_METRICS),
    "dpo": Goal("dpo", (*REWARD_METRICS, "loss", "perplexity", *ANSWER_METRICS), ANSWER_METRICS),
    "orpo": Goal("orpo", (*REWARD_METRICS, "loss", "perplexity", *ANSWER_METRICS), ANSWER_METRICS),
    "kto": Goal("kto", (*REWARD_METRICS, "loss", "perplexity", *ANSWER_METRICS), ANSWER_METRICS),
    "classification": Goal("classification", ("loss", "perplexity", "accuracy", "macro_f1"), (), answers=False),
}


@dataclass(frozen=True)
class Metric:
    """How a person reads one score."""

    label: str  # what the tables call it
    meaning: str  # one line: what it measures
    higher_is_better: bool
    worse_by: float  # a change against the base beyond this (in the worse direction) is flagged
    relative: bool = False  # worse_by is a share of the base value (losses), not an absolute difference


METRICS: dict[str, Metric] = {
    "loss": Metric("loss", "mean negative log-likelihood per trained token (nats)", False, 0.02, relative=True),
    "perplexity": Metric("perplexity", "exp(loss)", False, 0.02, relative=True),
    "exact_match": Metric("exact match", "answers equal to the reference after normalisation", True, 0.05),
    "rouge_l": Metric("ROUGE-L", "longest common word sequence with the reference (F-measure)", True, 0.02),
    "number_match": Metric("number match", "last number of the answer equals the reference's", True, 0.05),
    "accuracy": Metric("accuracy", "share of texts given the right label", True, 0.02),
    "macro_f1": Metric("macro F1", "F1 of each label, averaged over the labels", True, 0.02),
    "reward_accuracy": Metric(
        "reward accuracy", "share of pairs where the model prefers the chosen answer more than the base does", True, 0
    ),
    "reward_margin": Metric(
        "reward margin", "beta × (chosen − rejected) log-likelihood gain over the base, averaged over pairs", True, 0
    ),
    "judge_win_rate": Metric("judge win rate", "share of prompts where the judge prefers the tuned answer", True, 0),
}

# Where a flag says what got worse (the loss of a preference run is the chosen answers' likelihood).
FLAG_NAMES = {"loss": "the likelihood of the reference answers", "perplexity": ""}


def goal_of(config: Any) -> Goal:
    """The goal a run's config trains for."""
    if getattr(config, "task", "causal_lm") == "sequence_classification":
        return GOALS["classification"]
    return GOALS[getattr(config, "objective", "sft")]


def worse(name: str, tuned: float, base: float) -> bool:
    """Whether `tuned` is worse than `base` on metric `name` by more than its noise allowance."""
    metric = METRICS[name]
    allowance = metric.worse_by * abs(base) if metric.relative else metric.worse_by
    drop = (base - tuned) if metric.higher_is_better else (tuned - base)
    return drop > allowance
