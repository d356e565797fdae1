"""A sequence-classification run is offered as a classifier: text in, its labels and their probabilities out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetune.errors import UserError
from finetune.studio import Studio
from tests.helpers import tiny_config, write_jsonl

WORDS = "abcdefghijkl"


def _reviews(tmp_path: Path) -> Path:
    # Two classes a tiny model separates in a few steps: the class is in the first word.
    rows = [{"text": f"great {w} great", "label": "positive"} for w in WORDS]
    rows += [{"text": f"awful {w} awful", "label": "negative"} for w in WORDS]
    return write_jsonl(tmp_path / "reviews.jsonl", rows)


def _train(studio: Studio, config) -> str:
    state = studio.manager.start(config, background=False)
    assert state.status == "completed", (state.status, state.error)
    return state.run_id


@pytest.fixture(scope="module")
def classifier_runs(tiny_model_dir, tmp_path_factory):
    """One LoRA and one full-fine-tuning classifier, trained into one runs folder."""
    tmp = tmp_path_factory.mktemp("classifier")
    studio = Studio(runs_root=tmp / "runs")
    common = {"dataset": str(_reviews(tmp)), "task": "sequence_classification", "max_steps": 16}
    lora = _train(studio, tiny_config(tiny_model_dir, learning_rate=2e-2, **common))
    full = _train(studio, tiny_config(tiny_model_dir, method="full", learning_rate=1e-3, **common))
    return studio, lora, full


@pytest.mark.parametrize("which", ["lora", "full"])
def test_a_classifier_run_answers_with_its_own_label_names_and_probabilities(classifier_runs, which):
    studio, lora, full = classifier_runs
    run_id = lora if which == "lora" else full
    assert studio.source_kind(run_id) == "classifier"
    good = studio.classify(run_id, "great x great")
    bad = studio.classify(run_id, "awful x awful")
    assert {label for label, _ in good.scores} == {"positive", "negative"}  # names, not LABEL_0
    assert abs(sum(p for _, p in good.scores) - 1.0) < 1e-5
    assert good.scores == sorted(good.scores, key=lambda item: item[1], reverse=True)
    assert (good.label, bad.label) == ("positive", "negative")  # it learnt the task


def test_the_class_names_are_kept_beside_a_lora_adapter(classifier_runs):
    studio, lora, _ = classifier_runs
    names = json.loads((studio.manager.root / lora / "labels.json").read_text())
    assert sorted(names) == ["negative", "positive"]


def test_chat_refuses_a_classifier_and_the_classifier_refuses_a_chat_run(classifier_runs, tiny_model_dir):
    studio, lora, _ = classifier_runs
    with pytest.raises(UserError, match="classify a text instead"):
        list(studio.chat(lora, [{"role": "user", "content": "hi"}], None))
    chat_run = _train(studio, tiny_config(tiny_model_dir, max_steps=2))
    assert studio.source_kind(chat_run) == "chat" and studio.source_kind("base") == "chat"
    with pytest.raises(UserError, match="talk to it in the chat"):
        studio.classify(chat_run, "hello")


def test_empty_or_oversized_text_is_refused_in_one_line(classifier_runs):
    studio, lora, _ = classifier_runs
    with pytest.raises(UserError, match="^text: empty"):
        studio.classify(lora, "   ")
    with pytest.raises(UserError, match="^text: give text of at most"):
        studio.classify(lora, "x" * 100_000)


def test_the_chat_tab_turns_into_a_classifier_for_a_classification_run(classifier_runs):
    from ui.app import build_app

    studio, lora, _ = classifier_runs
    chat = build_app(studio).studio_ui.chat
    chat_area, compare, classifier = chat.mode(lora)
    assert (chat_area["visible"], compare["visible"], classifier["visible"]) == (False, False, True)
    assert [u["visible"] for u in chat.mode("base")] == [True, True, False]
    scores = chat.classify(lora, "great y great", "")
    assert max(scores, key=scores.get) == "positive" and set(scores) == {"positive", "negative"}
