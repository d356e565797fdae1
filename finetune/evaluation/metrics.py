"""Scores from what the models produced: nothing here runs a model. Answer matching comes from
`finetune.objectives.answers`
(the copy GRPO rewards share), ROUGE-L from Google's `rouge-score`, classification scores from scikit-learn.

Definitions (each test recomputes them from the predictions file):
- loss: summed negative log-likelihood of the trained tokens over all rows / their count (nats per token);
  perplexity: exp(loss). A classifier's loss is the mean negative log-likelihood of the true label.
- exact_match: share of answers equal to the reference after normalisation; rouge_l: mean ROUGE-L F-measure;
  number_match: share of answers whose last number equals the reference's, over the rows whose reference has one.
- reward (DPO's implicit reward, relative to the reference model, the base): beta × (log p_tuned(answer) −
  log p_base(answer)) summed over the answer's trained tokens. reward_margin: mean of reward(chosen) − reward(rejected)
  over pairs; reward_accuracy: share of pairs where it is positive. kto rows: accuracy is the share whose reward has
  the sign of its label, the margin the mean reward of good answers minus that of bad ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from finetune.objectives import Objective
from finetune.objectives.answers import exact_match, last_number, number_match


@dataclass(frozen=True)
class Metric:
    """How a person reads one score."""

    label: str  # what the tables call it
    meaning: str  # one line: what it measures
    higher_is_better: bool
    worse_by: float  # a change against the base beyond this (in the worse direction) is flagged
    relative: bool = False  # worse_by is a share of the base value (losses), not an absolute difference


# Which scores fit which objective is the objectives registry's (`Objective.eval_metrics`); how to read each is here.
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


def worse(name: str, tuned: float, base: float) -> bool:
    """Whether `tuned` is worse than `base` on metric `name` by more than its noise allowance."""
    metric = METRICS[name]
    allowance = metric.worse_by * abs(base) if metric.relative else metric.worse_by
    drop = (base - tuned) if metric.higher_is_better else (tuned - base)
    return drop > allowance


def loss_scores(nll: list[tuple[float, int]]) -> dict[str, float]:
    """loss and perplexity from (summed NLL, tokens) per row; {} when no row has a trained token."""
    tokens = sum(count for _, count in nll)
    if not tokens:
        return {}
    loss = sum(total for total, _ in nll) / tokens
    return {"loss": loss, "perplexity": math.exp(loss)}


def answer_scores(predictions: list[str], references: list[str | None]) -> dict[str, float]:
    """exact_match, rouge_l and number_match of answers against their references (rows without one left out)."""
    pairs = [(p, r) for p, r in zip(predictions, references, strict=True) if r is not None]
    if not pairs:
        return {}
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"])
    scores = {
        "exact_match": _mean([exact_match(p, r) for p, r in pairs]),
        "rouge_l": _mean([scorer.score(r, p)["rougeL"].fmeasure for p, r in pairs]),
    }
    numbered = [(p, r) for p, r in pairs if last_number(r) is not None]
    if numbered:
        scores["number_match"] = _mean([number_match(p, r) for p, r in numbered])
    return scores


def classification_scores(truth: list[int], predicted: list[int], names: list[str]) -> tuple[dict[str, float], list]:
    """({accuracy, macro_f1}, confusion matrix rows: true label by predicted label, in the order of `names`)."""
    from sklearn.metrics import accuracy_score, confusion_matrix, f1_score

    scores = {
        "accuracy": float(accuracy_score(truth, predicted)),
        "macro_f1": float(f1_score(truth, predicted, average="macro")),
    }
    matrix = confusion_matrix(truth, predicted, labels=list(range(len(names)))).tolist()
    return scores, matrix


def reward_scores(
    tuned: list[float],
    reference: list[float],
    tuned_rejected: list[float],
    reference_rejected: list[float],
    beta: float,
) -> dict[str, float]:
    """reward_accuracy and reward_margin of pairs from the answers' summed log-likelihoods under each model."""
    margins = [
        beta * ((tc - rc) - (tr - rr))
        for tc, rc, tr, rr in zip(tuned, reference, tuned_rejected, reference_rejected, strict=True)
    ]
    if not margins:
        return {}
    return {"reward_accuracy": _mean([float(m > 0) for m in margins]), "reward_margin": _mean(margins)}


def unpaired_reward_scores(tuned: list[float], reference: list[float], good: list[bool], beta: float) -> dict:
    """kto rows: reward_accuracy (the reward's sign agrees with the label) and reward_margin (good − bad)."""
    rewards = [beta * (t - r) for t, r in zip(tuned, reference, strict=True)]
    if not rewards:
        return {}
    scores = {"reward_accuracy": _mean([float((r > 0) == g) for r, g in zip(rewards, good, strict=True)])}
    goods = [r for r, g in zip(rewards, good, strict=True) if g]
    bads = [r for r, g in zip(rewards, good, strict=True) if not g]
    if goods and bads:
        scores["reward_margin"] = _mean(goods) - _mean(bads)
    return scores


def flags(tuned: dict[str, float], base: dict[str, float], objective: Objective) -> list[str]:
    """Plain words for every score the tuned model lost against the base beyond the noise allowance."""
    out = []
    for name in objective.eval_metrics:
        if name == "perplexity" or name not in tuned or name not in base:
            continue  # perplexity moves with the loss: one flag says it
        if worse(name, tuned[name], base[name]):
            what = objective.eval_loss_words if name == "loss" else METRICS[name].label
            out.append(f"answers got worse than the base on {what} ({_shown(name, base[name], tuned[name])})")
    return out


def _shown(name: str, base: float, tuned: float) -> str:
    unit = " nats per token" if name == "loss" else ""
    return f"{name} {base:.3f} → {tuned:.3f}{unit}"


def wilson_interval(successes: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a share `successes / n` (95% by default)."""
    if n <= 0:
        return (0.0, 1.0)
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def _mean(values: list[float]) -> float:
    return float(sum(values) / len(values))


def sample_scores(objective: Objective, answers: list[str], references: list[str | None]) -> dict[str, Any]:
    """The objective's cheap scores of held-out sample answers (during training); {} when no reference is known."""
    if not objective.eval_during_training:
        return {}
    scores = answer_scores(answers, references)
    return {name: value for name, value in scores.items() if name in objective.eval_during_training}
