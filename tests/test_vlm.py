"""Vision-language fine-tuning on a tiny random SmolVLM built in code: detection and plan, image data (formats,
masking, bad rows), training (LoRA and full), the frozen vision tower, save / reload / merged export."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from finetune.config import TrainConfig
from finetune.errors import UserError
from finetune.plan import plan_for
from tests.helpers import train, write_jsonl
from tests.tiny import TINY_IMAGE_SEQ_LEN, build_smolvlm, write_image_rows
from tests.vlm_support import PICTURE_QUESTION, chat_with_a_picture, prepared, trained_text, vlm_config


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory) -> Path:
    """A tiny SmolVLM: 64-pixel images become 4 tiles + 1 global view of 4 tokens each (20 image tokens)."""
    return build_smolvlm(tmp_path_factory.mktemp("tiny-smolvlm"))


@pytest.fixture(scope="module")
def image_data(tmp_path_factory) -> Path:
    return write_image_rows(tmp_path_factory.mktemp("image-data"), rows=8)


# ----------------------------------------------------------------------------- plan
def test_the_plan_sees_a_vlm_and_puts_adapters_on_its_language_model_only(vlm_dir, image_data, tiny_model_dir):
    from finetune.model.loading import build_model

    plan = plan_for(vlm_config(vlm_dir, image_data))
    assert plan.model_class == "AutoModelForImageTextToText" and plan.vision.family == "idefics3"
    assert plan.vision.freeze_vision_tower and plan.vision.freeze_projector
    assert not plan.packing and "image rows are padded" in plan.to_dict()["packing_note"]
    model = build_model(plan)
    adapted = {n.rsplit(".lora_A", 1)[0] for n, _ in model.named_parameters() if ".lora_A" in n}
    assert adapted and all(".text_model.layers." in n for n in adapted)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert not [n for n in trainable if "vision_model" in n or "connector" in n]

    # The vision tower unfrozen gets adapters of its own; the projector unfrozen trains in full.
    plan = plan_for(vlm_config(vlm_dir, image_data, freeze_vision_tower=False, freeze_projector=False))
    trainable = [n for n, p in build_model(plan).named_parameters() if p.requires_grad]
    assert any("vision_model" in n and "lora_A" in n for n in trainable)
    assert any("connector" in n and "lora" not in n for n in trainable)
    qlora = plan_for(vlm_config(vlm_dir, image_data, method="qlora"))
    assert qlora.quantization_config().llm_int8_skip_modules == ["model.vision_model", "model.connector", "lm_head"]
    import bitsandbytes as bnb

    packed = [n for n, m in build_model(qlora).named_modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert packed and all(".text_model.layers." in n for n in packed)  # the vision tower stays in full precision
    assert plan_for(vlm_config(tiny_model_dir, image_data)).vision is None  # a text model


# ----------------------------------------------------------------------------- data
def test_only_the_answer_is_trained_and_image_tokens_never(vlm_dir, image_data):
    processor, data = prepared(vlm_config(vlm_dir, image_data))
    assert data.format.kind == "images" and len(data.train) == 8
    row = data.train[0]
    ids, labels = row["input_ids"], row["labels"]
    assert trained_text(processor.tokenizer, row) == " It is red.<end_of_utterance>\n"
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    positions = [i for i, t in enumerate(ids) if t == image_id]
    assert len(positions) == 5 * TINY_IMAGE_SEQ_LEN  # 4 tiles + the global view
    assert all(labels[i] == -100 for i in positions)

    from finetune.data.stats import data_stats  # the Start tab's lengths count the image tokens too

    stats = data_stats(vlm_config(vlm_dir, image_data))
    assert stats.max == max(len(ids) for ids in data.train["input_ids"])


def test_sharegpt_tags_and_image_caption_pairs_are_read(vlm_dir, image_data, tmp_path):
    folder = image_data.parent
    share = write_jsonl(
        folder / "share.jsonl",
        [
            {
                "conversations": [
                    {"from": "human", "value": "<image>\n<image>\nWhich colours?"},
                    {"from": "gpt", "value": "Red and green."},
                ],
                "images": ["img0_0.png", "img1_0.png"],
            }
        ]
        * 2,
    )
    processor, data = prepared(vlm_config(vlm_dir, share))
    ids = data.train[0]["input_ids"]
    assert ids.count(processor.tokenizer.convert_tokens_to_ids("<image>")) == 2 * 5 * TINY_IMAGE_SEQ_LEN
    captions = write_jsonl(folder / "captions.jsonl", [{"image": "img2_0.png", "caption": "A blue square."}] * 2)
    processor, data = prepared(vlm_config(vlm_dir, captions))
    trained = [i for i, label in zip(data.train[0]["input_ids"], data.train[0]["labels"], strict=True) if label >= 0]
    assert processor.tokenizer.decode(trained).startswith(" A blue square.")


@pytest.mark.parametrize(
    ("row", "field", "words"),
    [
        ({"images": ["img0_0.png", "missing.png"]}, "dataset", ["row 2", "'images'", "'missing.png' not found"]),
        ({"images": ["img0_0.png", "not-an-image.png"]}, "dataset", ["row 2", "cannot be read as an image"]),
        ({"images": []}, "dataset", ["row 2", "1 <image> tags", "0 image(s)"]),
    ],
)
def test_bad_image_rows_are_refused_in_one_line_naming_the_row(vlm_dir, image_data, row, field, words):
    from finetune import data

    folder = image_data.parent
    (folder / "not-an-image.png").write_text("this is text", encoding="utf-8")
    good = json.loads(image_data.read_text(encoding="utf-8").splitlines()[0])
    second = {**good, "images": row["images"][1:] if len(row["images"]) > 1 else row["images"]}
    path = write_jsonl(folder / "bad.jsonl", [good, second])
    with pytest.raises(UserError) as caught:
        data.load_raw(vlm_config(vlm_dir, path))
    message = str(caught.value)
    assert caught.value.field == field and "\n" not in message
    assert all(w in message for w in words), message


def test_image_tokens_are_never_cut_and_the_model_must_see_images(vlm_dir, image_data, tiny_model_dir):
    with pytest.raises(UserError, match=r"max_seq_length: row 1 .* last image") as caught:
        prepared(vlm_config(vlm_dir, image_data, max_seq_length=16))
    assert caught.value.field == "max_seq_length"
    from finetune.runs.manager import RunManager

    with pytest.raises(UserError, match="model: .* is not a vision-language model") as caught:
        RunManager().start(vlm_config(tiny_model_dir, image_data, max_steps=1), background=False)
    assert caught.value.field == "model"
    with pytest.raises(UserError, match="is a vision-language model; give data with an images column") as caught:
        RunManager().start(vlm_config(vlm_dir, "bundled:pirate", max_steps=1), background=False)
    assert caught.value.field == "dataset"


# ----------------------------------------------------------------------------- training, saving, exporting
@pytest.fixture(scope="module")
def lora_run(vlm_dir, image_data, tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:  # the run outlives one test: its own studio home
        patch.setenv("FINETUNE_STUDIO_HOME", str(tmp_path_factory.mktemp("vlm-home")))
        return train(vlm_config(vlm_dir, "bundled:shapes"))  # the bundled pictures: no download


def _image_batch(model_dir: Path, image_data: Path):
    from PIL import Image
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    image = Image.open(image_data.parent / "img0_0.png").convert("RGB")
    return processor(text=[text], images=[[image]], return_tensors="pt")


def test_a_lora_run_saves_an_adapter_that_reloads_and_merges_into_a_plain_transformers_vlm(
    lora_run, vlm_dir, image_data
):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    from finetune.publish.export import export_run

    assert lora_run.read_status()["status"] == "completed"
    saved = load_file(lora_run.path / "adapter_model.safetensors")
    assert saved and all(".text_model.layers." in name for name in saved)  # nothing on the vision tower
    pattern = json.loads((lora_run.path / "adapter_config.json").read_text())["target_modules"]
    assert not re.fullmatch(pattern, "model.vision_model.encoder.layers.0.self_attn.q_proj")
    assert (lora_run.path / "processor_config.json").is_file()

    batch = _image_batch(lora_run.path, image_data)
    with torch.no_grad():
        base = AutoModelForImageTextToText.from_pretrained(vlm_dir).eval()
        reloaded = PeftModel.from_pretrained(base, lora_run.path).eval()
        tuned = reloaded(**batch).logits
        with reloaded.disable_adapter():
            assert not torch.allclose(reloaded(**batch).logits, tuned, atol=1e-4)  # the adapter changed something
        merged = export_run(lora_run.path, "merged").folder
        plain = AutoModelForImageTextToText.from_pretrained(merged).eval()
        again = plain(**_image_batch(merged, image_data)).logits
    torch.testing.assert_close(again, tuned, atol=1e-4, rtol=1e-4)
    with pytest.raises(UserError, match="format: gguf of a vision-language model .* --format merged") as caught:
        export_run(lora_run.path, "gguf")
    assert caught.value.field == "format" and "\n" not in str(caught.value)


def test_full_fine_tuning_from_the_cli_keeps_the_vision_tower_and_projector_as_they_were(
    vlm_dir, image_data, tmp_path, capsys
):
    from safetensors.torch import load_file

    from finetune.cli import main

    config = vlm_config(vlm_dir, image_data, method="full", max_steps=2, learning_rate=1e-3)
    run_dir = tmp_path / "full-run"
    config.replace(output_dir=str(run_dir)).save(tmp_path / "vlm.yaml")
    assert main(["train", "--config", str(tmp_path / "vlm.yaml")]) == 0, capsys.readouterr().err
    assert "packing: off: image rows are padded" in capsys.readouterr().out
    before, after = load_file(vlm_dir / "model.safetensors"), load_file(run_dir / "model.safetensors")
    frozen = [n for n in before if "vision_model" in n or "connector" in n]
    assert frozen and all(torch.equal(before[n], after[n]) for n in frozen)
    assert any(not torch.equal(before[n], after[n]) for n in before if "text_model.layers" in n)


# ----------------------------------------------------------------------------- memory
@pytest.mark.parametrize("side", [0, 32])
def test_the_estimate_counts_the_image_tokens_the_processor_makes(vlm_dir, image_data, side):
    from finetune import memory

    config = vlm_config(vlm_dir, image_data, image_longest_side=side)
    processor, data = prepared(config)
    made = data.train[0]["input_ids"].count(processor.tokenizer.convert_tokens_to_ids("<image>"))
    assert made == (5 if side == 0 else 1) * TINY_IMAGE_SEQ_LEN  # 4 tiles + a global view, or one 32-pixel tile
    estimate = memory.estimate(plan_for(config, "cpu"))
    assert estimate.method == "traced"
    assert f"64 × 64 (the data's largest): {made} tokens each, {made} a row" in " ".join(estimate.notes)
    if side == 0:  # the lever: half the side, a quarter of the tiles
        assert (
            "lever: image_longest_side: 32 would make each image 4 tokens instead of 20 (16 fewer a row)"
            in estimate.notes
        )


def test_the_proposal_offers_smaller_images_with_the_tokens_they_save(vlm_dir, tmp_path, monkeypatch):
    """On a card between the run and the run with half-size images, "Smaller images" is an option that fits: it
    names the side and the tokens an image becomes, and applying it gives the figure it promised."""
    from finetune import memory
    from finetune.memory import search

    monkeypatch.setattr(search, "MIN_IMAGE_SIDE", 16)  # the tiny model's images are 64 pixels (real ones: ≥ 224)
    data = write_image_rows(tmp_path, rows=4, images_per_row=2)
    config = vlm_config(vlm_dir, data, max_seq_length=16, per_device_train_batch_size=4)  # rows: their images
    plan = plan_for(config, "cpu")
    base = memory.estimate(plan)
    halved = memory.estimate(plan.replanned(image_longest_side=32))
    capacity = (base.total_bytes + halved.total_bytes) // 2
    found = search.search(plan, capacity, base)
    option = next((a for a in found.options if a.changes == {"image_longest_side": 32}), None)
    assert option is not None, [a.title for a in found.options]
    assert option.fits and option.title == (
        "Smaller images (longest image side 32 px: 4 tokens an image instead of 20)"
    )
    # Its figure: the formulas scaled by the replay (only the first fitting option is replayed to confirm it).
    assert option.new_total_bytes == pytest.approx(halved.total_bytes, rel=0.15)


def test_image_data_lengths_without_the_models_processor_count_the_text_and_say_so(monkeypatch):
    """A catalogue VLM offline (no processor here): the Start tab's lengths are the text's, with a note, never a
    refusal of the data."""
    from finetune.data.stats import data_stats

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    stats = data_stats(TrainConfig(model="Qwen/Qwen2.5-VL-3B-Instruct", dataset="bundled:shapes"))
    assert stats.rows == 20 and 0 < min(stats.lengths) <= max(stats.lengths) < 64
    assert any("the images' tokens are not in these lengths" in note for note in stats.notes), stats.notes


# ----------------------------------------------------------------------------- chat
def test_chat_answers_with_an_image_from_the_base_and_the_tuned_run(lora_run, vlm_dir, image_data):
    from finetune.model.inference import GenerationSettings

    picture = str(image_data.parent / "img0_0.png")
    studio = chat_with_a_picture(lora_run.path, vlm_dir, picture)
    settings = GenerationSettings(max_new_tokens=4)
    pair = list(studio.chat_pair(lora_run.path.name, PICTURE_QUESTION, PICTURE_QUESTION, settings, images=[picture]))
    assert {side for side, _, error in pair if error is None} == {"run", "base"}, pair


def test_stop_and_resume_continue_a_vlm_run_exactly(lora_run, vlm_dir, monkeypatch):
    """Stopped at step 2 of the LoRA run's settings and resumed: steps 3-4 only, the losses and the adapter of the
    uninterrupted run (`lora_run`)."""
    from safetensors.torch import load_file

    from finetune.runs.manager import RunManager
    from finetune.runs.rundir import RunDir
    from tests.helpers import assert_resumed_exactly, events_size, hold_at_step, raw_events

    expected = {e["step"]: e for e in raw_events(lora_run.path)}
    manager = RunManager()
    held = hold_at_step(monkeypatch, 2)
    manager.start(vlm_config(vlm_dir, "bundled:shapes"))
    assert held.wait(120), manager.state()
    assert manager.stop()
    stopped = manager.wait(120)
    assert stopped.status == "stopped" and stopped.step == 2, (stopped.status, stopped.error)
    run = RunDir(Path(stopped.run_dir))
    mark = events_size(run.path)
    resumed = manager.resume(run.path, background=False)
    assert resumed.status == "completed" and resumed.step == 4, (resumed.status, resumed.error)
    _, after = assert_resumed_exactly(run.path, mark, checkpoint_step=2, max_steps=4)
    for event in after:
        assert event["loss"] == pytest.approx(expected[event["step"]]["loss"], rel=1e-4), event
    ours, theirs = (load_file(d / "adapter_model.safetensors") for d in (run.path, lora_run.path))
    assert ours.keys() == theirs.keys()
    for name, tensor in ours.items():
        torch.testing.assert_close(tensor, theirs[name], rtol=1e-4, atol=1e-6, msg=name)


def test_kill_9_of_a_vlm_run_resumes_from_its_last_checkpoint(lora_run, vlm_dir, tmp_path, studio_home):
    """`python -m finetune train` killed with SIGKILL while it holds step 3 (a checkpoint at 2): `train --resume`
    trains steps 3-4 only, with the losses of the uninterrupted run."""
    from finetune.runs.rundir import RunDir
    from tests.helpers import assert_resumed_exactly, cli, events_size, raw_events, wait_for_file
    from tests.test_cli import held_train

    out = tmp_path / "run"
    vlm_config(vlm_dir, "bundled:shapes", save_steps=2, output_dir=str(out)).save(tmp_path / "run.yaml")
    marker = tmp_path / "held"
    proc = held_train(["train", "--config", str(tmp_path / "run.yaml"), "--no-progress"], 3, marker, studio_home)
    try:
        wait_for_file(marker, proc)
    finally:
        proc.kill()  # no handler runs: no checkpoint, no status update
        proc.communicate()
    run = RunDir(out)
    assert run.effective_status() == "interrupted" and run.last_checkpoint().name == "checkpoint-2"
    mark = events_size(out)
    done = cli("train", "--resume", str(out), "--no-progress", home=studio_home)
    assert done.returncode == 0, done.stderr[-2000:]
    _, after = assert_resumed_exactly(out, mark, checkpoint_step=2, max_steps=4)
    expected = {e["step"]: e["loss"] for e in raw_events(lora_run.path)}
    assert [e["loss"] for e in after] == pytest.approx([expected[3], expected[4]], rel=1e-4)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_a_qwen_vl_estimate_replays_its_step_with_its_image_tokens(family, tmp_path, image_data):
    """Qwen-VL (no processor files here: its family's image processor from the config): a 64 x 64 image on 8-pixel
    patches merged 2 x 2 is 16 tokens; the replay runs its position-id arithmetic on known values."""
    import transformers

    from finetune import memory
    from tests.tiny import TINY_SHAPE

    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
    vision = {"depth": 2, "num_heads": 2, "patch_size": 8, "spatial_merge_size": 2}
    if family == "qwen2_vl":
        vision.update(embed_dim=32, hidden_size=64, mlp_ratio=2)
        cls, cfg = transformers.Qwen2VLForConditionalGeneration, transformers.Qwen2VLConfig
    else:
        vision.update(
            hidden_size=32, intermediate_size=64, out_hidden_size=64, window_size=32, fullatt_block_indexes=[1]
        )
        cls, cfg = transformers.Qwen2_5_VLForConditionalGeneration, transformers.Qwen2_5_VLConfig
    config = cfg(
        text_config={"vocab_size": 400, **TINY_SHAPE, "rope_parameters": rope},
        vision_config=vision,
        image_token_id=390,
        video_token_id=391,
        vision_start_token_id=392,
    )
    cls(config).save_pretrained(tmp_path)
    plan = plan_for(vlm_config(tmp_path, image_data, max_seq_length=64), "cpu")
    assert plan.vision.family == family and plan.lora.target_modules.count("language_model") == 1
    estimate = memory.estimate(plan)
    assert estimate.method == "traced", estimate.notes
    assert "64 × 64 (the data's largest): 16 tokens each" in " ".join(estimate.notes)


def test_images_may_come_in_a_zip_beside_the_data_file(vlm_dir, image_data, tmp_path):
    import zipfile

    from finetune import data

    folder = tmp_path / "upload"
    folder.mkdir()
    with zipfile.ZipFile(folder / "pictures.zip", "w") as zipped:
        zipped.write(image_data.parent / "img0_0.png", "pics/red.png")
    write_jsonl(folder / "d.jsonl", [{"image": "pics/red.png", "caption": "Red."}] * 2)
    train_raw, _ = data.load_raw(vlm_config(vlm_dir, folder / "d.jsonl"))
    unpacked = Path(train_raw[0]["image"][0])
    assert unpacked.is_file() and unpacked.read_bytes() == (image_data.parent / "img0_0.png").read_bytes()
    write_jsonl(folder / "bad.jsonl", [{"image": "../pics/red.png", "caption": "Red."}])
    with pytest.raises(UserError, match="not found .* and its .zip files"):
        data.load_raw(vlm_config(vlm_dir, folder / "bad.jsonl"))


def test_gemma_3_from_the_offline_catalogue_is_estimated_by_replay_with_256_tokens_an_image(image_data):
    from finetune import memory

    config = TrainConfig(model="google/gemma-3-4b-it", dataset=str(image_data), eval_split="", max_seq_length=300)
    plan = plan_for(config.replace(per_device_train_batch_size=1), "cuda")
    assert plan.vision.family == "gemma3" and plan.model_class == "AutoModelForImageTextToText"
    estimate = memory.estimate(plan)
    assert estimate.method == "traced", estimate.notes
    assert "256 tokens each" in " ".join(estimate.notes)
    assert estimate.tensor_bytes > 2 * 4.3e9  # at least its 16-bit weights


def test_the_model_card_says_it_reads_images_and_its_snippet_answers_a_picture(
    lora_run, image_data, tmp_path, monkeypatch, capsys
):
    """The card of a vision-language run names the family and its image settings, and its "Use it" code, run as a
    reader would run it against the merged export, loads the model with its processor and answers a picture."""
    import shutil

    from finetune.publish.export import export_run
    from finetune.publish.model_card import build_model_card

    merged = export_run(lora_run.path, "merged", out=tmp_path / "merged").folder
    card = build_model_card(lora_run.path, str(merged), merged=True)
    assert "pipeline_tag: image-text-to-text" in card
    assert "| Vision-language model | " in card and "| Images | longest side " in card
    assert "vision tower frozen, projector frozen" in card
    snippet = card.split("## Use it", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert "AutoModelForImageTextToText" in snippet and "AutoProcessor" in snippet
    shutil.copy(image_data.parent / "img0_0.png", tmp_path / "picture.png")
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet, "model-card-snippet", "exec"), {})  # noqa: S102 - the card's own code, as a reader runs it
    assert capsys.readouterr().out.endswith("\n")  # it printed its answer
