"""Evaluation beyond the loss, on the tiny models: every score equals an independent computation from the predictions
file (the test calls rouge-score and scikit-learn itself), the loss is the one training counts (it equals the
Trainer's own eval loss) and falls below the base's, perplexity is exp(loss), the bundled lm-eval task gives the same
accuracy through `eval` as through lm-eval's own API on the merged model (and runs on a QLoRA run), a DPO run whose
rewards look perfect while its answers collapse is flagged, a rewards (GRPO) run is scored on its answer column,
results are kept without touching the trained files and reach the model card's model-index, runs compare side by
side, and every kind of bad input gets one line."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import pytest

from finetune.cli import main
from finetune.errors import UserError
from finetune.evaluation import EvalOptions, evaluate_run, harness, judge, report, store
from finetune.objectives.answers import exact_match, last_number, number_match
from finetune.runs.manager import RunManager
from finetune.runs.rundir import RunDir
from tests.helpers import tiny_config, write_jsonl
from tests.run_fixtures import build_run

PIRATE = "Arr, matey! Yo-ho-ho!"


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def rouge_l(prediction: str, reference: str) -> float:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"]).score(reference, prediction)["rougeL"].fmeasure


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def trained_files(run: Path) -> dict[str, str]:
    """sha256 of every file of a run outside its eval/ folder."""
    return {
        str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run.rglob("*"))
        if p.is_file() and p.relative_to(run).parts[0] != store.FOLDER
    }


def reconfigure(run: Path, **changes) -> None:
    """A copied run turned into another kind of run: its config.yaml and the plan.json it would have trained with
    (evaluation, like chat, reads the run's own plan)."""
    from finetune.plan import plan_for

    rd = RunDir(run)
    config = rd.load_config().replace(output_dir=str(run), **changes)
    rd.write_config(config)
    rd.write_plan(plan_for(config))


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def sft(tiny_model_dir, tmp_path_factory):
    """A tiny SFT LoRA run evaluated once against its base, with the bundled lm-eval task and a predictions file."""
    folder = tmp_path_factory.mktemp("eval-sft")
    run = build_run(folder / "runs" / "run-sft", tiny_model_dir)
    before = trained_files(run)
    options = EvalOptions(
        base=True, max_new_tokens=16, lm_eval=["pirate_quiz"], predictions=str(folder / "predictions.jsonl")
    )
    seen: list[tuple[float, str]] = []
    result, path = evaluate_run(RunDir(run), options, progress=lambda f, text: seen.append((f, text)))
    return {"run": run, "result": result, "path": path, "before": before, "progress": seen, "folder": folder}


# ----------------------------------------------------------------------------------------------- SFT scores
def test_each_score_equals_an_independent_computation_from_the_predictions_file(sft):
    result, rows = sft["result"], read_lines(sft["folder"] / "predictions.jsonl")
    assert result["rows"] == len(rows) == 8 and set(result) >= {"rows", "tuned", "base"}
    for who in ("tuned", "base"):
        scores = result[who]
        assert scores["exact_match"] == pytest.approx(mean([exact_match(r[who], r["reference"]) for r in rows]))
        assert scores["rouge_l"] == pytest.approx(mean([rouge_l(r[who], r["reference"]) for r in rows]))
        loss = sum(r[f"{who}_nll"] for r in rows) / sum(r["tokens"] for r in rows)
        assert scores["loss"] == pytest.approx(loss) and scores["perplexity"] == pytest.approx(math.exp(loss))
    assert "number_match" not in result["tuned"]  # no reference holds a number: nothing to count
    assert [a["tuned"] for a in result["answers"]] == [r["tuned"] for r in rows]


def test_number_match_reads_the_last_number_of_rows_whose_reference_has_one(sft, tmp_path):
    rows = [{"prompt": f"What is {i} plus {i}?", "completion": f"Arr, {i} plus {i} be {2 * i}!"} for i in range(3)]
    rows.append({"prompt": "Who are ye?", "completion": "A pirate!"})
    data = write_jsonl(tmp_path / "sums.jsonl", rows)
    predictions = tmp_path / "sums-predictions.jsonl"
    result, _ = evaluate_run(
        RunDir(sft["run"]), EvalOptions(data=str(data), max_new_tokens=6, predictions=str(predictions))
    )
    lines = read_lines(predictions)
    numbered = [r for r in lines if last_number(r["reference"]) is not None]
    assert len(numbered) == 3
    assert result["tuned"]["number_match"] == pytest.approx(
        mean([number_match(r["tuned"], r["reference"]) for r in numbered])
    )
    assert result["data"]["source"] == "sums.jsonl"  # a file by its name, never its path


def test_the_tuned_loss_is_the_trainers_own_eval_loss_and_below_the_bases(sft):
    result = sft["result"]
    trainer_eval = RunDir(sft["run"]).read_events(("eval",))[-1]["eval_loss"]  # the same split, at the last step
    assert result["tuned"]["loss"] == pytest.approx(trainer_eval, rel=1e-4)  # exactly the tokens training counts
    assert result["tuned"]["loss"] < result["base"]["loss"]
    assert result["tuned"]["rouge_l"] > result["base"]["rouge_l"] and not result["flags"]


def test_the_evaluation_is_kept_without_touching_the_trained_files_and_never_overwritten(sft):
    run, first = sft["run"], sft["path"]
    assert first.parent == run / "eval" and json.loads(first.read_text())["tuned"] == sft["result"]["tuned"]
    second_result, second = evaluate_run(RunDir(run), EvalOptions(limit=2, max_new_tokens=4))
    assert second != first and json.loads(first.read_text())["rows"] == 8 and second_result["rows"] == 2
    assert trained_files(run) == sft["before"]  # adapter, checkpoints, config, status, events: not one byte changed
    assert store.latest(run)["rows"] == 2
    fractions = [f for f, _ in sft["progress"]]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert any("answering" in text for _, text in sft["progress"])


def test_the_run_list_and_the_model_card_carry_the_evaluation(sft, tmp_path):
    from huggingface_hub import ModelCard

    from finetune.publish.model_card import build_model_card
    from finetune.studio import Studio

    run = build_run(tmp_path / "runs" / "run-card", Path(RunDir(sft["run"]).load_config().model))
    evaluate_run(RunDir(run), EvalOptions(base=True, max_new_tokens=8))
    summary = Studio(tmp_path / "runs").run("run-card")
    assert summary.evaluation.startswith("ROUGE-L") and "(base 0.000)" in summary.evaluation
    card = ModelCard(build_model_card(run, "someone/pirate"))
    index = card.data.to_dict()["model-index"]
    metrics = {m["type"]: m["value"] for r in index[0]["results"] for m in r["metrics"]}
    assert index[0]["name"] == "pirate" and {"loss", "perplexity", "exact_match", "rouge"} <= set(metrics)
    assert metrics["rouge"] == round(store.latest(run)["tuned"]["rouge_l"], 4)
    assert "## Evaluation" in card.text and "| ROUGE-L |" in card.text


def test_the_headline_score_is_the_runs_objectives_whatever_scores_the_evaluation_holds():
    """The run list and the Train tab sum an evaluation up by the score the run's objective names first (its record's
    `headline`), never by which scores happen to be present: the same scores read as ROUGE-L for SFT, how often the
    chosen answer wins for preferences, number match for rewards, accuracy for a classifier."""
    from finetune.objectives import OBJECTIVES

    every = {name: 0.5 for record in OBJECTIVES.values() for name in record.eval_metrics}
    result = {"tuned": every, "base": {"rouge_l": 0.25, "accuracy": 0.125}}
    shown = {name: report.summary(result, record) for name, record in OBJECTIVES.items()}
    assert shown["sft"] == "ROUGE-L 0.500 (base 0.250)"
    assert {shown[n] for n in ("dpo", "orpo", "kto")} == {f"{report.label('reward_accuracy')} 0.500"}
    assert shown["grpo"] == f"{report.label('number_match')} 0.500"
    assert shown["classification"] == f"{report.label('accuracy')} 0.500 (base 0.125)"
    for record in OBJECTIVES.values():  # each headline is a score an evaluation of that objective reports
        assert set(record.headline) <= set(record.eval_metrics), record.name
    assert report.summary({"tuned": {"loss": 1.5}}, OBJECTIVES["grpo"]) == "loss 1.500"  # no answers: the loss


# ----------------------------------------------------------------------------------------------- lm-eval
def test_the_bundled_task_gives_the_same_accuracy_through_eval_as_through_lm_evals_api_on_the_merged_model(
    sft, tmp_path
):
    import lm_eval
    from lm_eval.tasks import TaskManager
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ours = sft["result"]["lm_eval"]
    assert ours["tasks"] == ["pirate_quiz"] and set(ours) >= {"tuned", "base"}
    base_dir = RunDir(sft["run"]).load_config().model
    merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), sft["run"]).merge_and_unload()
    merged.save_pretrained(tmp_path / "merged")
    AutoTokenizer.from_pretrained(sft["run"]).save_pretrained(tmp_path / "merged")
    theirs = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={tmp_path / 'merged'},dtype=float32",
        tasks=["pirate_quiz"],
        task_manager=TaskManager(include_path=str(harness.BUNDLED_TASKS), include_defaults=False),
        batch_size=harness.BATCH_SIZE,
        device="cpu",
    )["results"]["pirate_quiz"]
    assert ours["tuned"]["pirate_quiz"]["acc"] == theirs["acc,none"]
    assert ours["tuned"]["pirate_quiz"]["acc_norm"] == theirs["acc_norm,none"]


def test_lm_eval_runs_on_a_qlora_runs_4bit_base_plus_adapter(sft, tmp_path, monkeypatch):
    """A QLoRA run: its adapter on the 4-bit base, as chat loads it (here the SFT run's adapter, its config switched
    to qlora: training in 4 bits on a CPU is slow, and what is under test is how the evaluation loads the run)."""
    import shutil

    import bitsandbytes as bnb

    run = tmp_path / "runs" / "run-qlora"
    shutil.copytree(sft["run"], run, ignore=shutil.ignore_patterns(store.FOLDER))
    reconfigure(run, method="qlora")
    seen = []
    real = harness.run_tasks

    def spy(model, tokenizer, tasks, num_fewshot=None, limit=None):
        seen.append(sum(isinstance(m, bnb.nn.Linear4bit) for m in model.modules()))
        return real(model, tokenizer, tasks, num_fewshot, limit)

    monkeypatch.setattr(harness, "run_tasks", spy)
    result, _ = evaluate_run(RunDir(run), EvalOptions(base=True, limit=2, max_new_tokens=4, lm_eval=["pirate_quiz"]))
    assert len(seen) == 2 and all(count > 0 for count in seen)  # the tuned and the base model: both on 4 bits
    assert 0 <= result["lm_eval"]["tuned"]["pirate_quiz"]["acc"] <= 1 and "pirate_quiz" in result["lm_eval"]["base"]


def test_a_local_task_runs_offline_and_unknown_or_networked_tasks_are_one_line(sft, tmp_path, capsys):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    questions = write_jsonl(tmp_path / "yes-no.jsonl", [{"q": f"Is {i} even?", "a": int(i % 2 == 0)} for i in range(6)])
    (tasks / "yes_no.yaml").write_text(
        "task: yes_no\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {questions}\n"
        "output_type: multiple_choice\ntest_split: test\ndoc_to_text: '{{q}}'\ndoc_to_choice: ['no', 'yes']\n"
        "doc_to_target: a\nmetric_list:\n  - metric: acc\n",
        encoding="utf-8",
    )
    run = str(sft["run"])
    code, out, err = run_cli(
        capsys,
        "eval",
        run,
        "--limit",
        "1",
        "--max-new-tokens",
        "2",
        "--lm-eval",
        "yes_no",
        "--include-path",
        str(tasks),
        "--json",
        "--no-progress",
    )
    assert code == 0, err
    assert 0 <= json.loads(out)["lm_eval"]["tuned"]["yes_no"]["acc"] <= 1
    for task, words in (("no_such_task", "unknown task 'no_such_task'"), ("hellaswag", "this machine is offline")):
        before = store.history(sft["run"])
        code, out, err = run_cli(capsys, "eval", run, "--lm-eval", task)
        assert code == 2 and err.count("\n") == 1 and err.startswith("error: lm_eval: ") and words in err, err
        assert store.history(sft["run"]) == before  # refused before anything ran


# ----------------------------------------------------------------------------------------------- preference runs
def test_a_dpo_collapse_with_perfect_training_rewards_is_flagged(sft, tmp_path):
    """A model that already answers like a pirate (the SFT run merged into its base), then plain DPO against a
    near-identical rejected answer at a high rate: training logs 100% preferred, and on held-out pairs the tuned model
    still prefers every chosen answer, while the chosen answers' likelihood and the generated answers collapse (the
    newcomer's case of the issue). The evaluation says so in plain words."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = tmp_path / "pirate-base"
    tiny = RunDir(sft["run"]).load_config().model
    PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny), sft["run"]
    ).merge_and_unload().save_pretrained(base)
    AutoTokenizer.from_pretrained(sft["run"]).save_pretrained(base)
    pair = {"chosen": PIRATE, "rejected": "Arr, matey! Yo-ho!"}
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": f"Question {i}?", **pair} for i in range(16)])
    held_out = write_jsonl(tmp_path / "pairs-eval.jsonl", [{"prompt": f"Held-out {i}?", **pair} for i in range(6)])
    config = tiny_config(
        base,
        objective="dpo",
        loss_type="sigmoid",
        dataset=str(pairs),
        eval_split=str(held_out),
        max_steps=8,
        save_steps=100,
        eval_steps=100,
        learning_rate=2e-2,  # 3e-2 overshot on one CPU: even the held-out rewards turned negative
        beta=0.1,
    )
    state = RunManager(tmp_path / "runs").start(config, background=False)
    assert state.status == "completed", state.error
    run = RunDir(Path(state.run_dir))
    assert max(e["rewards_accuracy"] for e in run.read_events(("log",))) == 1.0  # training says: 100% preferred

    predictions = tmp_path / "dpo-predictions.jsonl"
    result, _ = evaluate_run(run, EvalOptions(base=True, max_new_tokens=12, predictions=str(predictions)))
    assert result["tuned"]["reward_accuracy"] == 1.0 and result["tuned"]["reward_margin"] > 0  # rewards look fine
    flags = " | ".join(result["flags"])
    assert "answers got worse than the base on the likelihood of the chosen answers" in flags
    assert "answers got worse than the base on ROUGE-L" in flags
    assert result["tuned"]["loss"] > result["base"]["loss"] and result["tuned"]["rouge_l"] < result["base"]["rouge_l"]
    rows = read_lines(predictions)  # the rewards, recomputed from each answer's log-likelihood under both models
    margins = [
        0.1 * ((r["base_nll"] - r["tuned_nll"]) - (r["base_rejected_nll"] - r["tuned_rejected_nll"])) for r in rows
    ]
    assert result["tuned"]["reward_margin"] == pytest.approx(mean(margins))
    assert result["tuned"]["reward_accuracy"] == pytest.approx(mean([float(m > 0) for m in margins]))
    assert "reward_margin" not in result["base"]  # relative to the base: none for the base itself


def test_kto_rows_score_good_answers_against_bad_ones(sft, tmp_path):
    """kto data (one answer per row, marked good or bad): the rewards compare good with bad answers, and the loss is
    the good answers' alone (a run whose config says kto; its adapter is the SFT run's: no training needed)."""
    import shutil

    run = tmp_path / "runs" / "run-kto"
    shutil.copytree(sft["run"], run, ignore=shutil.ignore_patterns(store.FOLDER))
    reconfigure(run, objective="kto", beta=0.2)
    rows = [
        {"prompt": f"Held-out {i}?", "completion": PIRATE if i % 2 else "The sky is blue.", "label": bool(i % 2)}
        for i in range(6)
    ]
    data = write_jsonl(tmp_path / "kto.jsonl", rows)
    predictions = tmp_path / "kto-predictions.jsonl"
    result, _ = evaluate_run(RunDir(run), EvalOptions(data=str(data), max_new_tokens=4, predictions=str(predictions)))
    lines = read_lines(predictions)
    rewards = [0.2 * (r["base_nll"] - r["tuned_nll"]) for r in lines]
    good = [w for w, r in zip(rewards, lines, strict=True) if r["good"]]
    bad = [w for w, r in zip(rewards, lines, strict=True) if not r["good"]]
    assert result["tuned"]["reward_margin"] == pytest.approx(mean(good) - mean(bad))
    agree = [float((w > 0) == r["good"]) for w, r in zip(rewards, lines, strict=True)]
    assert result["tuned"]["reward_accuracy"] == pytest.approx(mean(agree))
    kept = [r for r in lines if r["good"]]
    assert result["tuned"]["loss"] == pytest.approx(sum(r["tuned_nll"] for r in kept) / sum(r["tokens"] for r in kept))
    assert result["reference"]["loss"] > result["tuned"]["loss"]  # the good (pirate) answers: likelier than before
    assert not result["flags"] and "base" not in result  # no --base: the reference is scored, not shown as a column


def test_a_rewards_run_is_scored_on_its_answer_column_and_the_loss_only_where_a_row_has_one(sft, tmp_path):
    """grpo data (a prompt and an `answer` column): number_match and exact_match of the generated answers against the
    answer column, as the built-in rewards compare them; the loss over the rows that have an answer; no ROUGE-L and
    no base without --base (the record says what an evaluation of it reports). The held-out prompts carry the answer
    as their reference, so the Train tab scores them while a run trains."""
    import shutil

    from finetune import data as data_module
    from finetune.evaluation.metrics import sample_scores
    from finetune.objectives import OBJECTIVES
    from finetune.studio import Studio

    run = tmp_path / "runs" / "run-grpo"
    shutil.copytree(sft["run"], run, ignore=shutil.ignore_patterns(store.FOLDER))
    rows = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(4)] + [{"prompt": "Sing!"}]
    prompts = write_jsonl(tmp_path / "sums.jsonl", rows)
    reconfigure(run, objective="grpo", rewards="number_match", dataset=str(prompts), eval_split="")
    predictions = tmp_path / "grpo-predictions.jsonl"
    result, _ = evaluate_run(
        RunDir(run), EvalOptions(data=str(prompts), max_new_tokens=6, predictions=str(predictions))
    )
    lines = read_lines(predictions)
    answered = [r for r in lines if r["reference"] is not None]
    assert len(lines) == 5 and len(answered) == 4 and "tuned_nll" not in lines[-1]
    assert list(result["tuned"]) == ["number_match", "exact_match", "loss", "perplexity"]  # the record's order
    assert result["goal"] == "grpo" and "base" not in result and "reference" not in result
    listed = Studio(tmp_path / "runs").run("run-grpo").evaluation  # the run list sums it up by the record's headline
    assert listed.startswith(report.label("number_match")), listed
    assert result["tuned"]["number_match"] == pytest.approx(
        mean([number_match(r["tuned"], r["reference"]) for r in answered])
    )
    assert result["tuned"]["exact_match"] == pytest.approx(
        mean([exact_match(r["tuned"], r["reference"]) for r in answered])
    )
    loss = sum(r["tuned_nll"] for r in answered) / sum(r["tokens"] for r in answered)
    assert result["tuned"]["loss"] == pytest.approx(loss)
    config = RunDir(run).load_config()
    assert data_module.heldout_samples(config)[:2] == [(r["prompt"], r["answer"]) for r in rows[:2]]
    scores = sample_scores(OBJECTIVES["grpo"], ["4", "the answer is 2", "no"], ["4", "2", "4"])
    assert scores == {"number_match": pytest.approx(2 / 3), "exact_match": pytest.approx(1 / 3)}


# ----------------------------------------------------------------------------------------------- classification
def test_classification_scores_equal_scikit_learns_on_the_predictions_file(tiny_model_dir, tmp_path):
    from sklearn.metrics import accuracy_score, confusion_matrix, f1_score

    rows = [{"text": f"great {w} great", "label": "positive"} for w in "abcdefgh"]
    rows += [{"text": f"awful {w} awful", "label": "negative"} for w in "abcdefgh"]
    data = write_jsonl(tmp_path / "reviews.jsonl", rows)
    config = tiny_config(
        tiny_model_dir,
        dataset=str(data),
        task="sequence_classification",
        max_steps=8,
        learning_rate=2e-2,
        save_steps=100,
    )
    state = RunManager(tmp_path / "runs").start(config, background=False)
    assert state.status == "completed", state.error
    predictions = tmp_path / "labels.jsonl"
    result, _ = evaluate_run(
        RunDir(Path(state.run_dir)), EvalOptions(data=str(data), base=True, predictions=str(predictions))
    )
    lines = read_lines(predictions)
    truth, predicted = [r["label"] for r in lines], [r["tuned_label"] for r in lines]
    names = result["confusion"]["labels"]
    assert sorted(names) == ["negative", "positive"]
    assert result["tuned"]["accuracy"] == pytest.approx(accuracy_score(truth, predicted))
    assert result["tuned"]["macro_f1"] == pytest.approx(f1_score(truth, predicted, average="macro"))
    assert result["confusion"]["tuned"] == confusion_matrix(truth, predicted, labels=names).tolist()
    loss = mean([r["tuned_label_nll"] for r in lines])
    assert result["tuned"]["loss"] == pytest.approx(loss) and result["tuned"]["perplexity"] == pytest.approx(
        math.exp(loss)
    )
    assert "base" not in result and any("no trained classification head" in n for n in result["notes"])
    from finetune.evaluation.report import render_text

    shown = render_text(result)
    lines = shown.splitlines()
    at = lines.index("confusion matrix (rows: true label, columns: predicted)")
    assert lines[at + 1].split()[-2:] == names
    assert lines[at + 3].split() == ["positive", *map(str, result["confusion"]["tuned"][1])]


# ----------------------------------------------------------------------------------------------- the judge
def test_a_judge_compares_both_orders_with_an_interval_and_says_a_small_judge_is_weak(sft, tiny_model_dir):
    result, _ = evaluate_run(RunDir(sft["run"]), EvalOptions(limit=4, max_new_tokens=6, judge=str(tiny_model_dir)))
    verdict = result["judge"]
    assert verdict["prompts"] == 4 and verdict["wins"] + verdict["ties"] + verdict["losses"] == 4
    low, high = verdict["interval"]
    assert low <= verdict["judge_win_rate"] <= high and result["tuned"]["judge_win_rate"] == verdict["judge_win_rate"]
    assert "base" in result  # a judge compares with the base: its answers were made
    assert "a small judge is a weak one" in verdict["note"] and "rubric" in verdict
    assert any("a small judge is a weak one" in note for note in result["notes"])


def test_judging_combines_both_orders_and_the_interval_is_wilsons():
    from scipy.stats import binomtest

    assert judge.combine("tuned", "tuned") == ("tuned", True)
    assert judge.combine("tie", "base") == ("base", False)
    assert judge.combine("tuned", "base") == ("tie", False)  # each order picked the same position
    interval = binomtest(7, 10).proportion_ci(method="wilson")
    assert judge.wilson_interval(7, 10) == pytest.approx((interval.low, interval.high))


def test_a_judge_that_does_not_fit_is_refused_before_anything_loads(sft, tiny_model_dir, monkeypatch, capsys):
    monkeypatch.setattr(judge, "available_bytes", lambda device: 1024)
    before = store.history(sft["run"])
    code, out, err = run_cli(capsys, "eval", str(sft["run"]), "--judge", str(tiny_model_dir))
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: judge: ") and "choose a smaller judge" in err
    assert store.history(sft["run"]) == before


# ----------------------------------------------------------------------------------------------- the CLI and bad input
def test_eval_json_has_rows_tuned_and_base(sft, capsys):
    code, out, err = run_cli(
        capsys, "eval", str(sft["run"]), "--base", "--limit", "2", "--max-new-tokens", "4", "--json", "--no-progress"
    )
    assert code == 0, err
    result = json.loads(out)
    assert result["rows"] == 2 and {"loss", "perplexity", "rouge_l"} <= set(result["tuned"]) <= set(result["base"]) | {
        "judge_win_rate"
    }


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--limit", "0"], "error: limit: "),
        (["--max-new-tokens", "0"], "error: max_new_tokens: "),
        (["--checkpoint", "99"], "error: checkpoint: 99 is not a checkpoint of run-sft (checkpoints: 5, 10)"),
        (["--split", "test"], "error: split: applies to bundled and Hub data"),
        (["--num-fewshot", "2"], "error: lm_eval: "),
        (["--data", "/no/such/file.jsonl"], "error: data: file not found"),
    ],
    ids=["limit", "tokens", "checkpoint", "split", "fewshot", "data"],
)
def test_bad_options_are_one_line_and_change_nothing(sft, capsys, args, words):
    before = store.history(sft["run"])
    code, out, err = run_cli(capsys, "eval", str(sft["run"]), *args)
    assert code == 2 and err.count("\n") == 1 and err.startswith(words), err
    assert store.history(sft["run"]) == before


def test_predictions_never_land_among_the_trained_files(sft, capsys):
    code, _, err = run_cli(capsys, "eval", str(sft["run"]), "--predictions", str(sft["run"] / "adapter_config.json"))
    assert code == 2 and "predictions: a file inside the run folder" in err
    assert trained_files(sft["run"]) == sft["before"]


def test_data_without_references_gets_loss_and_perplexity_and_says_why(sft, tmp_path):
    data = write_jsonl(tmp_path / "prose.jsonl", [{"text": f"Arr, matey! Yo-ho-ho! Line {i}."} for i in range(4)])
    result, _ = evaluate_run(RunDir(sft["run"]), EvalOptions(data=str(data)))
    assert set(result["tuned"]) == {"loss", "perplexity"} and not result.get("answers")
    assert any(
        "only loss and perplexity" in note and "no prompt and reference answer" in note for note in result["notes"]
    )


def test_a_run_still_training_is_scored_at_its_last_checkpoint_or_refused_in_one_line(sft, tmp_path, capsys):
    run = build_run(tmp_path / "runs" / "run-live", Path(RunDir(sft["run"]).load_config().model))
    live = RunDir(run)
    live.write_status({**live.read_status(), "status": "running", "step": 7, "pid": os.getpid()})  # this process trains
    result, _ = evaluate_run(live, EvalOptions(limit=2, max_new_tokens=4))
    assert result["weights"] == "checkpoint-10" and result["step"] == 10  # the newest complete checkpoint
    assert any("is still training: its checkpoint at step 10 was evaluated" in n for n in result["notes"])
    for checkpoint in live.checkpoints():
        (checkpoint / "finetune-complete.json").unlink()  # none complete yet
    code, _, err = run_cli(capsys, "eval", str(run))
    assert code == 2 and err.startswith("error: run: run-live is running and has no checkpoint yet"), err


def test_held_out_answers_are_scored_at_each_evaluation_while_training(sft):
    from finetune.evaluation.metrics import answer_scores
    from finetune.studio import Studio

    events = RunDir(sft["run"]).read_events(("samples",))
    assert [e["step"] for e in events] == [0, 5, 10]
    scores = Studio(sft["run"].parent).held_out_scores(sft["run"].name)
    assert [s["step"] for s in scores] == [0, 5, 10]
    for event, scored in zip(events, scores, strict=True):
        answers = [s["answer"] for s in event["samples"]]
        references = [s["reference"] for s in event["samples"]]
        assert references[0] == PIRATE and scored == pytest.approx(
            {"step": event["step"], **answer_scores(answers, references)}
        )
    assert scores[-1]["rouge_l"] > scores[0]["rouge_l"]


# ----------------------------------------------------------------------------------------------- runs compared
def test_compare_shows_runs_side_by_side(sft, tmp_path, capsys):
    from finetune.studio import Studio

    root = tmp_path / "runs"
    model = Path(RunDir(sft["run"]).load_config().model)
    first, second = build_run(root / "run-one", model), build_run(root / "run-two", model)
    evaluate_run(RunDir(first), EvalOptions(limit=3, max_new_tokens=6))
    comparison = Studio(root).compare(["run-one", "run-two"])
    assert comparison.runs == ["run-one", "run-two"]
    assert {p["run"] for p in comparison.curves} == {"run-one", "run-two"}
    rouge = next(row for row in comparison.metrics if row["metric"] == "ROUGE-L")
    assert rouge["run-one"] is not None and rouge["run-two"] is None
    assert any("run-two has no evaluation yet" in note for note in comparison.notes)
    assert comparison.answers and all({"run-one", "run-two"} <= set(row) for row in comparison.answers)
    code, out, err = run_cli(capsys, "compare", str(first), str(second))
    assert code == 0, err
    assert out.splitlines()[0].split() == ["metric", "run-one", "run-two"] and "ROUGE-L" in out
    code, _, err = run_cli(capsys, "compare", str(first))
    assert code == 2 and "error: runs: pick two or more runs" in err


def test_a_public_app_refuses_server_files_for_evaluation(sft, tmp_path):
    import shutil

    from finetune.access.policy import AccessPolicy
    from finetune.studio import Studio

    root = tmp_path / "runs"
    shutil.copytree(sft["run"], root / "run-sft")
    studio = Studio(root, policy=AccessPolicy(public=True))
    for options, field in (
        ({"data": "/etc/passwd.jsonl"}, "data"),
        ({"judge": "/srv/models/judge"}, "judge"),
        ({"lm_eval": ["pirate_quiz"], "include_path": "/srv/tasks"}, "include_path"),
        ({"predictions": "/tmp/out.jsonl"}, "predictions"),
    ):
        with pytest.raises(UserError) as refused:
            studio.evaluate("run-sft", options)
        assert refused.value.field == field and "/srv" not in str(refused.value), refused.value
