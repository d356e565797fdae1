"""Did tuning work? Evaluation beyond the loss curve: base against tuned on held-out data.

    result, path = evaluate_run(run, EvalOptions(base=True, lm_eval=["pirate_quiz"]))

- which scores fit a run is its objective's record (`finetune.objectives`: `eval_metrics`, `eval_during_training`);
- rows.py: which rows are scored, rendered and masked as training renders them;
- generation.py: what a model produces on them (answers, log-likelihoods, labels);
- metrics.py: how each score reads, and scores from those outputs (finetune.objectives.answers, rouge-score,
scikit-learn);
- harness.py: EleutherAI's lm-evaluation-harness through its Python API;
- judge.py: an optional judge model, pairwise, both orders, with a confidence interval;
- evaluate.py: one evaluation end to end; store.py: eval/<timestamp>.json in the run folder;
- compare.py: runs side by side; report.py: results as tables and plain words. The `eval` and `compare` commands are
finetune/cli/evaluate.py.
"""

from finetune.evaluation.evaluate import EvalOptions, evaluate_run

__all__ = ["EvalOptions", "evaluate_run"]
