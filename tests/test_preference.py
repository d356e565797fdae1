"""Preference tuning (DPO, ORPO, KTO) end to end on the tiny model: each objective trains and logs what a user
watches, DPO makes the model prefer held-out chosen answers more than the base did, a stopped DPO run resumes
exactly, full fine-tuning compares against a frozen copy, bad preference rows are refused before a run exists, and
the preview and the model card show what the run is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from finetune import data
from finetune.config import TrainConfig
from finetune.errors import UserError
from finetune.runs.rundir import RunDir
from tests.helpers import raw_events, stop_then_resume, tiny_config, train, write_jsonl
from tests.test_hub import GOOD, hub  # noqa: F401  (the stand-in Hub fixture and its token)
from tests.test_input_validation import assert_refused_before_a_run

CHOSEN = "Arr, matey! Yo-ho-ho!"
REJECTED = "The sky is blue."
REWARDS = ("rewards_chosen", "rewards_rejected", "rewards_margin", "rewards_accuracy")


def pairs_file(tmp_path: Path, n: int = 16, prefix: str = "Question") -> Path:
    """n prompt/chosen/rejected rows: a pirate answer preferred to a plain one."""
    rows = [{"prompt": f"{prefix} {i}?", "chosen": CHOSEN, "rejected": REJECTED} for i in range(n)]
    return write_jsonl(tmp_path / f"{prefix.lower()}-pairs.jsonl", rows)


def preference_config(model_dir: Path, dataset: Path, **overrides: Any) -> TrainConfig:
    values: dict[str, Any] = {"objective": "dpo", "dataset": str(dataset), "max_steps": 6, "save_steps": 100}
    values.update(overrides)
    return tiny_config(model_dir, **values)


def logged(run: RunDir) -> list[dict]:
    return run.read_events(("log",))


def answer_logprob(model: Any, tokenizer: Any, prompt: str, answer: str) -> float:
    """log p(answer | prompt) under the chat template, summed over the answer's tokens (its end-of-turn included)."""
    messages = [{"role": "user", "content": prompt}]
    head = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    whole = tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": answer}], tokenize=False)
    head_ids = tokenizer(head, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([tokenizer(whole, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        logprobs = model(ids).logits.log_softmax(-1)[0, :-1]
    targets = ids[0, 1:]
    picked = logprobs.gather(1, targets[:, None])[:, 0]
    return float(picked[len(head_ids) - 1 :].sum())


def heldout_margin(model: Any, tokenizer: Any, prompts: list[str]) -> float:
    """Mean over held-out prompts of log p(chosen) - log p(rejected)."""
    margins = [
        answer_logprob(model, tokenizer, p, CHOSEN) - answer_logprob(model, tokenizer, p, REJECTED) for p in prompts
    ]
    return sum(margins) / len(margins)


# ----------------------------------------------------------------------------- each objective trains
def test_dpo_with_lora_prefers_held_out_chosen_answers_and_publishes_its_objective(tiny_model_dir, tmp_path, hub):  # noqa: F811
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from finetune.publish.hub import push_run
    from finetune.publish.model_card import build_model_card

    run = train(preference_config(tiny_model_dir, pairs_file(tmp_path), beta=0.2))
    logs = logged(run)
    assert [e["step"] for e in logs] == list(range(1, 7))
    for event in logs:
        assert all(isinstance(event.get(key), float) for key in REWARDS), event
    assert logs[-1]["rewards_margin"] > 0 and logs[-1]["rewards_accuracy"] == 1.0, logs[-1]
    # One adapter saved: the reference was the base with the adapter off, not a second ("ref") adapter.
    assert (run.path / "adapter_model.safetensors").is_file() and not (run.path / "ref").exists()
    (objective,) = run.read_events(("objective",))
    assert objective["reference"] == "adapter-off" and objective["columns"]["chosen"] == "chosen"

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prompts = [f"Unseen {i}?" for i in range(4)]
    before = heldout_margin(base, tokenizer, prompts)
    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), run.path).eval()
    after = heldout_margin(tuned, tokenizer, prompts)
    assert after > before + 5, (before, after)  # nats: the tuned model clearly prefers the chosen style

    card = build_model_card(run.path, "someone/pirate-dpo")
    assert "preference-tuned with DPO" in card and "beta 0.2" in card and "loss `rpo`" in card
    assert "chosen = `chosen`" in card and "--set objective=dpo --set beta=0.2" in card
    # Publish works as for SFT: the adapter, the run's own card (not a library's draft) in one commit.
    push_run(run.path, "alice/pirate-dpo", token=GOOD)
    repo = hub.repos["alice/pirate-dpo"]
    assert repo.files["adapter_model.safetensors"] == (run.path / "adapter_model.safetensors").read_bytes()
    assert "preference-tuned with DPO" in repo.files["README.md"].decode() and len(repo.commits) == 1


def test_orpo_trains_with_lora_and_logs_rewards(tiny_model_dir, tmp_path):
    run = train(preference_config(tiny_model_dir, pairs_file(tmp_path), objective="orpo", max_steps=4))
    logs = logged(run)
    assert len(logs) == 4 and all(all(key in e for key in REWARDS) for e in logs), logs
    assert logs[-1]["loss"] < logs[0]["loss"], logs  # ORPO's loss includes the SFT term: it falls from the start
    assert (run.path / "adapter_model.safetensors").is_file()


def test_kto_trains_on_unpaired_rows_with_boolean_labels_and_logs_kl(tiny_model_dir, tmp_path):
    rows = [
        {"prompt": f"Question {i}?", "completion": CHOSEN if i % 2 else REJECTED, "label": bool(i % 2)}
        for i in range(16)
    ]
    dataset = write_jsonl(tmp_path / "kto.jsonl", rows)
    run = train(preference_config(tiny_model_dir, dataset, objective="kto", max_steps=4))
    logs = logged(run)
    assert len(logs) == 4 and all(isinstance(e.get("kl"), float) for e in logs), logs
    assert any("rewards_chosen" in e for e in logs) and any("rewards_rejected" in e for e in logs), logs
    (objective,) = run.read_events(("objective",))
    assert objective["columns"] == {"prompt": "prompt", "completion": "completion", "label": "label"}


def test_full_fine_tuning_dpo_compares_against_a_frozen_copy(tiny_model_dir, tmp_path):
    run = train(preference_config(tiny_model_dir, pairs_file(tmp_path), method="full", max_steps=3, learning_rate=1e-3))
    (objective,) = run.read_events(("objective",))
    assert objective["reference"] == "copy"
    logs = logged(run)
    # Step 1: policy == reference, so both rewards are 0; the trained policy then moves away from the copy.
    assert logs[0]["rewards_chosen"] == pytest.approx(0, abs=1e-6) and logs[0]["rewards_margin"] == pytest.approx(
        0, abs=1e-6
    )
    assert logs[-1]["rewards_margin"] > 0, logs
    assert (run.path / "model.safetensors").is_file() and not (run.path / "adapter_config.json").exists()


@pytest.mark.parametrize(
    "overrides",
    [{"method": "qlora"}, {"zero_stage": 3}, {"loss_type": "sigmoid"}],
    ids=["qlora", "lora-zero3", "sigmoid"],
)
def test_dpo_trains_with_qlora_through_zero3_and_with_the_original_loss(tiny_model_dir, tmp_path, overrides):
    """QLoRA (a 4-bit base, its adapter switched off for the reference), ZeRO-3 through the Trainer, and the
    original DPO loss (sigmoid, without the default rpo's SFT term)."""
    run = train(preference_config(tiny_model_dir, pairs_file(tmp_path), max_steps=3, **overrides))
    logs = logged(run)
    assert logs[0]["rewards_margin"] == pytest.approx(0, abs=1e-6) and logs[-1]["rewards_margin"] > 0.5, logs
    assert (run.path / "adapter_model.safetensors").is_file()
    assert (run.path / "ds_config.json").is_file() == ("zero_stage" in overrides)


# ----------------------------------------------------------------------------- stop and resume
def test_a_stopped_dpo_run_resumes_exactly(tiny_model_dir, tmp_path, monkeypatch):
    """Stop at step 3, resume: the resumed process trains steps 4-6 only, with the losses and rewards of an
    uninterrupted run (the optimizer, scheduler and reference all came back)."""
    config = preference_config(tiny_model_dir, pairs_file(tmp_path), lr_scheduler_type="linear", warmup_steps=1)
    reference = {e["step"]: e for e in raw_events(train(config).path)}

    before, after = stop_then_resume(monkeypatch, config, step=3)
    for event in before + after:
        want = reference[event["step"]]
        for key in ("loss", "learning_rate", "rewards_margin"):
            assert event[key] == pytest.approx(want[key], rel=1e-3, abs=1e-5), (key, event, want)


def test_objective_cannot_change_on_resume(tiny_model_dir, tmp_path):
    from finetune.errors import ConfigError
    from finetune.runs.preflight import check_resume_overrides

    config = preference_config(tiny_model_dir, pairs_file(tmp_path))
    with pytest.raises(ConfigError, match="objective: cannot change on resume"):
        check_resume_overrides(config, TrainConfig.from_dict({**config.to_dict(), "objective": "orpo"}), step=3)


# ----------------------------------------------------------------------------- bad data, before a run exists
PAIR = {"prompt": "Where?", "chosen": CHOSEN, "rejected": REJECTED}
BAD_ROWS: list[tuple[str, list[dict], dict[str, Any], list[str]]] = [
    ("missing_side", [PAIR, {"prompt": "Why?", "chosen": CHOSEN}], {}, ["dataset: row 2", "'rejected' is empty"]),
    ("empty_answer", [PAIR, {**PAIR, "chosen": "  "}], {}, ["dataset: row 2", "'chosen' is empty"]),
    ("same_answers", [PAIR, {**PAIR, "rejected": CHOSEN}], {}, ["dataset: row 2", "same as column 'chosen'"]),
    (
        "number_among_answers",
        [PAIR, PAIR, {**PAIR, "chosen": 42}],
        {},
        ["dataset: row 3", "column 'chosen': 42 is a number but the other rows hold text"],
    ),
    (
        "answer_not_text",
        [PAIR, {**PAIR, "rejected": {"text": "no"}}],
        {},
        ["dataset: row 2", "column 'rejected': expected text or a list of {role, content} messages, got an object"],
    ),
    (
        "no_assistant_turn",
        [PAIR, {**PAIR, "chosen": [{"role": "user", "content": "hm"}]}],
        {},
        ["dataset: row 2", "'chosen'", "no assistant message"],
    ),
    (
        "kto_label_not_boolean",
        [{"prompt": "a", "completion": "b", "label": True}, {"prompt": "c", "completion": "d", "label": "maybe"}],
        {"objective": "kto"},
        ["dataset: row 2", "'label'", "not true or false"],
    ),
    ("no_pairs", [{"prompt": "a", "completion": "b"}], {}, ["dataset: ", "not preference data", "chosen and rejected"]),
    ("chosen_column_missing", [PAIR], {"chosen_column": "better"}, ["chosen_column: column 'better' is not in"]),
]


@pytest.mark.parametrize(("name", "rows", "overrides", "parts"), BAD_ROWS, ids=[case[0] for case in BAD_ROWS])
def test_bad_preference_rows_are_refused_before_a_run_exists(tiny_model_dir, tmp_path, name, rows, overrides, parts):
    dataset = write_jsonl(tmp_path / f"{name}.jsonl", rows)
    config = preference_config(tiny_model_dir, dataset, **overrides)
    assert_refused_before_a_run(config, tmp_path / "runs", parts)


def test_an_sft_set_for_a_preference_objective_points_to_the_bundled_pairs(tiny_model_dir, tmp_path):
    config = tiny_config(tiny_model_dir, objective="dpo", dataset="bundled:pirate")
    message = assert_refused_before_a_run(config, tmp_path / "runs", ["dataset: bundled:pirate"])
    assert "bundled:pirate-pairs" in message


def test_pairs_for_sft_say_to_choose_a_preference_objective(tiny_model_dir, tmp_path):
    config = tiny_config(tiny_model_dir, dataset="bundled:pirate-pairs")
    assert_refused_before_a_run(config, tmp_path / "runs", ["objective: ", "preference pairs", "dpo, orpo or kto"])


# ----------------------------------------------------------------------------- what the user sees before training
def test_conversations_and_text_preview_as_the_model_reads_them(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    from ui.formatting import preview_html

    conversation = {
        "prompt": [{"role": "system", "content": "Be a pirate."}, {"role": "user", "content": "Hi?"}],
        "chosen": [{"role": "assistant", "content": "Ahoy!"}],
        "rejected": [{"role": "assistant", "content": "Hello."}],
    }
    dataset = write_jsonl(tmp_path / "chat-pairs.jsonl", [conversation, PAIR])  # one shape per column after reading
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    shown = data.preview(preference_config(tiny_model_dir, dataset), tokenizer, n=2)
    first, second = ({s["name"]: s for s in ex["sides"]} for ex in shown["examples"])
    assert (
        first["prompt"]["text"]
        == "<|im_start|>system\nBe a pirate.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert first["chosen"]["text"] == "Ahoy!<|im_end|>\n" and first["rejected"]["text"] == "Hello.<|im_end|>\n"
    assert second["prompt"]["text"].endswith("user\nWhere?<|im_end|>\n<|im_start|>assistant\n")
    assert all(side["tokens"] > 0 for side in first.values())
    html = preview_html(shown)
    assert "Chosen (preferred)" in html and "Rejected" in html and "Ahoy!" in html

    with pytest.raises(UserError, match="prompt_column: no prompt column"):
        data.load_raw(
            preference_config(tiny_model_dir, write_jsonl(tmp_path / "np.jsonl", [{"chosen": "a", "rejected": "b"}]))
        )
    assert json.loads(json.dumps(shown))  # the preview is plain data (the UI receives it as JSON)
