"""Held-out image prompts while a vision-language run trains, and the evaluation of image rows, base against tuned,
on a tiny random SmolVLM that learns one fixed caption in a few steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from finetune.config import TrainConfig
from finetune.errors import UserError
from finetune.runs.events import SamplesEvent
from tests.helpers import train, write_jsonl
from tests.tiny import build_smolvlm

ANSWER = "A red square."  # every row's caption: what the tiny model learns to say whatever the picture
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (230, 220, 20)}


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory) -> Path:
    """The tiny SmolVLM, its answers ending where its chat template ends a turn (as SmolVLM's generation config)."""
    from transformers import AutoTokenizer, GenerationConfig

    path = build_smolvlm(tmp_path_factory.mktemp("tiny-smolvlm"))
    config = GenerationConfig.from_pretrained(path)
    config.eos_token_id = [
        AutoTokenizer.from_pretrained(path).convert_tokens_to_ids("<end_of_utterance>"),
        config.eos_token_id,
    ]
    config.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def caption_data(tmp_path_factory) -> Path:
    """Image + caption rows (train.jsonl, 8 rows) and held-out ones (heldout.jsonl, 3 rows) beside their PNGs."""
    from PIL import Image

    folder = tmp_path_factory.mktemp("captions")
    for number, (name, colour) in enumerate([*COLOURS.items(), *COLOURS.items()]):
        Image.new("RGB", (64, 56 + 8 * (number % 2)), colour).save(folder / f"{name}-{number}.png")
    files = sorted(p.name for p in folder.glob("*.png"))
    write_jsonl(folder / "heldout.jsonl", [{"image": f"pictures/{n}", "caption": ANSWER} for n in files[:3]])
    (folder / "pictures").mkdir()
    for name in files[:3]:
        (folder / "pictures" / name).write_bytes((folder / name).read_bytes())
    return write_jsonl(folder / "train.jsonl", [{"image": n, "caption": ANSWER} for n in files])


@pytest.fixture(scope="module")
def run(vlm_dir, caption_data, tmp_path_factory):
    """A LoRA run on the captions, evaluated on the held-out rows at its last step (its own studio home)."""
    values = {
        "model": str(vlm_dir),
        "dataset": str(caption_data),
        "eval_split": str(caption_data.parent / "heldout.jsonl"),
        "eval_steps": 8,
        "max_steps": 8,
        "learning_rate": 3e-2,
        "warmup_steps": 0,
        "lr_scheduler_type": "constant",
        "max_seq_length": 128,
        "image_longest_side": 32,  # one 32-pixel tile a picture (4 image tokens): a quick step
        "per_device_train_batch_size": 4,
        "save_steps": 8,
    }
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FINETUNE_STUDIO_HOME", str(tmp_path_factory.mktemp("vlm-eval-home")))
        return train(TrainConfig.from_dict(values))


def test_a_vlm_run_answers_its_held_out_image_prompts_before_and_after_training(run, caption_data):
    events = [e for e in run.events() if isinstance(e, SamplesEvent)]
    first, last = events[0], events[-1]
    assert first.step == 0 and last.step == 8
    for event in (first, last):
        assert [s.prompt for s in event.samples] == ["<image>Describe the image."] * 3
        assert [s.reference for s in event.samples] == [ANSWER] * 3
        assert all(len(s.images) == 1 and Path(s.images[0]).is_file() for s in event.samples)
        assert all(Path(s.images[0]).parent.name == "pictures" for s in event.samples)  # relative to the data file
    assert [s.answer for s in last.samples] == [ANSWER] * 3  # learned
    assert [s.answer for s in first.samples] != [ANSWER] * 3  # the random base says something else
    # The Train tab shows each prompt with its picture's file name where the <image> tag stands.
    from ui.formatting import sample_rows

    headers, rows = sample_rows(run.events(), active=False)
    assert headers[1:] == ["Answer before training (step 0)", "Answer at step 8"]
    name = Path(first.samples[0].images[0]).name
    assert rows[0][0] == f"[{name}] Describe the image." and rows[0][2] == ANSWER
    # The model card shows each prompt with its picture's name, before and after.
    from finetune.publish.model_card import build_model_card

    card = build_model_card(run.path, "me/tiny-vlm")
    assert card.count(f"**Prompt:** [{name}] Describe the image.") == 1 and "at step 8 (after training)" in card
    # ...and scores the held-out answers against their references, as for text runs.
    from finetune.studio import Studio

    scores = Studio(runs_root=run.path.parent).held_out_scores(run.path.name)
    assert [s["step"] for s in scores] == [0, 8] and scores[0]["rouge_l"] < scores[1]["rouge_l"] == 1.0


def test_evaluation_scores_image_rows_base_against_tuned(run, caption_data, capsys):
    from finetune.cli import main
    from finetune.evaluation.evaluate import EvalOptions, evaluate_run
    from finetune.evaluation.report import answer_table

    result, path = evaluate_run(run, EvalOptions(base=True, max_new_tokens=12))
    assert result["data"]["kind"] == "images" and result["rows"] == 3 and path.is_file()
    assert result["tuned"]["exact_match"] == 1.0 and result["base"]["exact_match"] < 1.0
    assert result["tuned"]["rouge_l"] > result["base"]["rouge_l"]
    # The loss is taken with the pictures, on the tokens training counts: the run's own last eval loss, on these rows.
    eval_loss = [e["eval_loss"] for e in run.read_events(("eval",))][-1]
    assert result["tuned"]["loss"] == pytest.approx(eval_loss, rel=1e-3) and result["base"]["loss"] > 10 * eval_loss
    rows = answer_table(result)
    assert [r[1] for r in rows] == [ANSWER] * 3 and [r[3] for r in rows] == [ANSWER] * 3
    names = [Path(a["images"][0]).name for a in result["answers"]]
    assert [r[0] for r in rows] == [f"[{n}] Describe the image." for n in names]

    # Other image data through the CLI: the terminal report lists the rows with their pictures' names.
    assert main(["eval", str(run.path), "--data", str(caption_data), "--limit", "2", "--no-progress"]) == 0
    shown = capsys.readouterr().out
    assert "exact match" in shown.lower() and "prompt: [" in shown and f"tuned: {ANSWER}" in shown


def test_a_missing_image_in_the_evaluation_data_is_refused_naming_the_row(run, caption_data):
    from finetune.evaluation.evaluate import EvalOptions, evaluate_run

    before = sorted((run.path / "eval").glob("*.json"))
    bad = write_jsonl(
        caption_data.parent / "bad.jsonl",
        [
            {"image": "pictures/" + p.name, "caption": ANSWER}
            for p in sorted((caption_data.parent / "pictures").iterdir())
        ]
        + [{"image": "pictures/gone.png", "caption": ANSWER}],
    )
    with pytest.raises(UserError) as caught:
        evaluate_run(run, EvalOptions(data=str(bad)))
    message = str(caught.value)
    assert caught.value.field == "data" and "\n" not in message
    assert "row 4 of bad.jsonl" in message and "'pictures/gone.png' not found" in message
    assert sorted((run.path / "eval").glob("*.json")) == before  # refused before any model loads: nothing written
    with pytest.raises(UserError, match="lm_eval: the harness's tasks are text tasks") as caught:
        evaluate_run(run, EvalOptions(lm_eval=["pirate_quiz"]))
    assert caught.value.field == "lm_eval"
