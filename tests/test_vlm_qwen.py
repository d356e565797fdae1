"""Qwen-VL fine-tuning on a tiny random Qwen2.5-VL built in code (its processor files as the Hub ships them): the
processor loads for images on a machine without torchvision, only the answer is trained, a LoRA run from the CLI
leaves the vision tower alone, the estimate counts the processor's image tokens, chat answers a picture, and the merged
export loads back in plain transformers. One test runs Qwen3-VL through the same path."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from finetune.config import TrainConfig
from finetune.plan import plan_for
from tests.tiny import build_qwen_vl, write_image_rows
from tests.vlm_support import chat_with_a_picture, cli_run, prepared, trained_text, vlm_config

HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None
IMAGE_TOKENS = 16  # a 64 × 64 image on the tiny tower's 8-pixel patches (an 8 × 8 grid) merged 2 × 2


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory) -> Path:
    return build_qwen_vl(tmp_path_factory.mktemp("tiny-qwen2.5-vl"))


@pytest.fixture(scope="module")
def image_data(tmp_path_factory) -> Path:
    return write_image_rows(tmp_path_factory.mktemp("qwen-image-data"), rows=4)


def qwen_config(model: Path, dataset: Path | str, **overrides) -> TrainConfig:
    return vlm_config(model, dataset, **{"max_steps": 3, "max_seq_length": 96, "save_steps": 3, **overrides})


@pytest.fixture(scope="module")
def lora_run(qwen_dir, image_data, tmp_path_factory):
    """Three LoRA steps through `python -m finetune train`."""
    return cli_run(qwen_config(qwen_dir, image_data), tmp_path_factory.mktemp("qwen-run"))


# ----------------------------------------------------------------------------- the processor
def test_the_qwen_processor_loads_for_images_and_saves_as_the_real_one(qwen_dir, image_data, tmp_path):
    from transformers import AutoProcessor

    from finetune.model import loading

    plan = plan_for(qwen_config(qwen_dir, image_data))
    assert plan.vision.family == "qwen2_5_vl" and plan.model_class == "AutoModelForImageTextToText"
    processor = loading.load_processor(plan)
    if HAS_TORCHVISION:  # the real processor, unchanged
        assert type(processor).__name__ == "Qwen2_5_VLProcessor"
        return
    with pytest.raises(ImportError, match="(?i)torchvision"):  # why the image-only processor exists
        AutoProcessor.from_pretrained(qwen_dir)
    assert type(processor).__name__ == "ImageOnlyQwen2_5_VLProcessor"
    assert processor.image_token == "<|image_pad|>" and processor.tokenizer.padding_side == "right"
    processor.save_pretrained(tmp_path)  # as a run saves it: the full processor's files, video settings included
    saved = json.loads((tmp_path / "processor_config.json").read_text(encoding="utf-8"))
    assert saved["processor_class"] == "Qwen2_5_VLProcessor"
    assert saved["video_processor"]["video_processor_type"] == "Qwen2VLVideoProcessor"
    assert saved["image_processor"]["patch_size"] == 8
    (tmp_path / "config.json").write_bytes((qwen_dir / "config.json").read_bytes())
    again = loading.load_processor(plan_for(qwen_config(tmp_path, image_data)))  # and reads back the same way
    assert again.video_processor_settings == saved["video_processor"]
    assert again.chat_template == processor.chat_template


def test_only_a_missing_torchvision_falls_back_and_only_for_qwen(qwen_dir, image_data, monkeypatch):
    import transformers

    from finetune.model import loading

    plan = plan_for(qwen_config(qwen_dir, image_data))

    def broken(*args, **kwargs):
        raise ImportError("SomeProcessor requires the sentencepiece library")

    monkeypatch.setattr(transformers.AutoProcessor, "from_pretrained", broken)
    with pytest.raises(ImportError, match="sentencepiece"):  # another missing package is the user's to install
        loading.load_processor(plan)

    def no_torchvision(*args, **kwargs):
        raise ImportError("Idefics3VideoProcessor requires the Torchvision library")

    monkeypatch.setattr(transformers.AutoProcessor, "from_pretrained", no_torchvision)
    smolvlm = dataclasses.replace(plan, vision=dataclasses.replace(plan.vision, family="idefics3"))
    with pytest.raises(ImportError, match="Torchvision"):  # no image-only stand-in for other families
        loading.load_processor(smolvlm)
    assert type(loading.load_processor(plan)).__name__ == "ImageOnlyQwen2_5_VLProcessor"


# ----------------------------------------------------------------------------- data
def test_only_the_answer_is_trained_and_image_tokens_never(qwen_dir, image_data):
    from finetune.data.images import ImageCollator

    processor, data = prepared(qwen_config(qwen_dir, image_data))
    assert data.format.kind == "images" and len(data.train) == 4
    row = data.train[0]
    ids, labels = row["input_ids"], row["labels"]
    assert trained_text(processor.tokenizer, row) == "It is red.<|im_end|>\n"
    trained = [i for i, label in zip(ids, labels, strict=True) if label != -100]
    assert labels[-len(trained) :] == trained  # one trained piece, at the end: the answer
    image_id = processor.image_token_id
    positions = [i for i, t in enumerate(ids) if t == image_id]
    assert len(positions) == IMAGE_TOKENS and positions == list(range(positions[0], positions[0] + IMAGE_TOKENS))
    assert all(labels[i] == -100 for i in range(positions[-1] + 2))  # the image, its markers and the prompt
    from finetune.data.stats import data_stats  # the Start tab's lengths count the image tokens too

    assert data_stats(qwen_config(qwen_dir, image_data)).max == max(len(i) for i in data.train["input_ids"])
    batch = ImageCollator(processor, "qwen2_5_vl")([data.train[0], data.train[1]])
    assert batch["image_grid_thw"].tolist() == [[1, 8, 8], [1, 8, 8]]
    assert torch.equal(batch["mm_token_type_ids"], (batch["input_ids"] == image_id).long())


# ----------------------------------------------------------------------------- training, export
def test_a_lora_run_trains_the_language_model_only_and_its_merged_export_loads_in_plain_transformers(
    lora_run, qwen_dir, image_data, tmp_path, monkeypatch
):
    from peft import PeftModel
    from safetensors.torch import load_file

    from finetune.data.images import load_image
    from finetune.model import loading
    from finetune.publish.export import export_run

    assert lora_run.read_status()["status"] == "completed"
    steps = [e for e in lora_run.read_events(("log",)) if "loss" in e]
    assert [e["step"] for e in steps] == [1, 2, 3] and all(e["loss"] > 0 for e in steps)
    adapter = load_file(lora_run.path / "adapter_model.safetensors")
    assert adapter and all(".language_model.layers." in name for name in adapter)  # nothing on the vision tower
    pattern = json.loads((lora_run.path / "adapter_config.json").read_text())["target_modules"]
    assert not re.fullmatch(pattern, "model.visual.blocks.0.attn.qkv")
    assert not re.fullmatch(pattern, "model.visual.merger.mlp.0")
    saved = json.loads((lora_run.path / "processor_config.json").read_text())
    assert saved["processor_class"] == "Qwen2_5_VLProcessor"  # loads as the real processor where torchvision is

    # The run's answer to a picture, through the studio's processor: the base plus the adapter.
    plan = plan_for(qwen_config(qwen_dir, image_data))
    processor = loading.load_processor(plan)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    picture = load_image(str(image_data.parent / "img0_0.png"))
    batch = processor(text=[text], images=[[picture]], return_tensors="pt")
    merged = export_run(lora_run.path, "merged", out=tmp_path / "merged").folder
    with torch.no_grad():
        tuned_model = PeftModel.from_pretrained(loading.load_base(plan), lora_run.path).eval()
        tuned = tuned_model(**batch).logits
        with tuned_model.disable_adapter():
            assert not torch.allclose(tuned_model(**batch).logits, tuned, atol=1e-4)  # the adapter changed something

    # The export as a CPU user without torchvision loads it: the snippet in docs/data.md, run as written.
    (tmp_path / "picture.png").write_bytes((image_data.parent / "img0_0.png").read_bytes())
    monkeypatch.chdir(tmp_path)
    snippet = docs_snippet().replace('"runs/my-run/merged"', repr(str(merged)))
    namespace: dict = {}
    exec(compile(snippet, "docs-data-md", "exec"), namespace)  # noqa: S102 - the docs' own code, as a reader runs it
    inputs, pixels = namespace["inputs"], namespace["pixels"]
    assert torch.equal(inputs["input_ids"], batch["input_ids"])  # the same tokens as the studio's processor
    with torch.no_grad():
        again = namespace["model"](**inputs, **pixels).logits
    torch.testing.assert_close(again, tuned, atol=1e-4, rtol=1e-4)
    before, after = load_file(qwen_dir / "model.safetensors"), load_file(merged / "model.safetensors")
    tower = [n for n in before if n.startswith("visual.")]  # (saved without the "model." its module path has)
    assert tower and all(torch.equal(before[n], after[n]) for n in tower)  # the vision tower exactly as it was


def docs_snippet() -> str:
    """The Python block of docs/data.md that loads a Qwen-VL export without torchvision."""
    text = (Path(__file__).parents[1] / "docs" / "data.md").read_text(encoding="utf-8")
    section = text.split("Qwen-VL on a machine without torchvision", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_chat_answers_a_picture_from_the_tuned_run_and_the_base(lora_run, qwen_dir, image_data):
    chat_with_a_picture(lora_run.path, qwen_dir, str(image_data.parent / "img0_0.png"))


# ----------------------------------------------------------------------------- memory
@pytest.mark.parametrize(("side", "tokens"), [(0, IMAGE_TOKENS), (32, 4)])
def test_the_estimate_counts_the_image_tokens_the_processor_makes(qwen_dir, image_data, side, tokens):
    """`image_longest_side` is Qwen's max_pixels (its square): 32 resizes a 64 × 64 image to 32 × 32, 4 tokens."""
    from finetune import memory

    config = qwen_config(qwen_dir, image_data, image_longest_side=side)
    processor, data = prepared(config)
    if side:
        assert processor.image_processor.size["longest_edge"] == side * side
    made = data.train[0]["input_ids"].count(processor.image_token_id)
    assert made == tokens
    estimate = memory.estimate(plan_for(config, "cpu"))
    assert estimate.method == "traced", estimate.notes
    assert f"64 × 64 (the data's largest): {made} tokens each, {made} a row" in " ".join(estimate.notes)
    if not side:  # the lever: half the side, a quarter of the pixels and of the tokens
        assert "lever: image_longest_side: 32 would make each image 4 tokens instead of 16 (12 fewer a row)" in (
            estimate.notes
        )


def test_image_tokens_follow_the_processor_at_any_size_and_about_one_per_784_pixels():
    """The estimator's count is the processor's for odd sizes; Qwen2.5-VL's own settings (14-pixel patches merged
    2 × 2) give one token per 28 × 28 pixels."""
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    from finetune.memory.images import blank, image_tokens

    real = Qwen2VLImageProcessorPil()  # Qwen2-VL / Qwen2.5-VL: patch 14, merge 2
    assert image_tokens(real, None, "qwen2_5_vl", 448, 448) == 448 * 448 // 784
    for width, height in [(100, 60), (640, 480), (1000, 333)]:
        out = real(images=[[blank(width, height)]], return_tensors="pt")
        made = int(out["image_grid_thw"].prod()) // 4
        assert image_tokens(real, None, "qwen2_5_vl", width, height) == made
        assert made == pytest.approx(width * height / 784, rel=0.2)


# ----------------------------------------------------------------------------- Qwen3-VL
def test_qwen3_vl_trains_on_images_through_the_same_path(image_data, tmp_path):
    """Qwen3-VL (16-pixel patches: a 64 × 64 image is 4 tokens; deep-stack mergers): the same processor fallback,
    masking and LoRA on its language model only."""
    from safetensors.torch import load_file

    from tests.helpers import train

    model = build_qwen_vl(tmp_path / "tiny-qwen3-vl", family="qwen3_vl")
    config = qwen_config(model, image_data, max_steps=2, save_steps=2)
    processor, data = prepared(config)
    ids, labels = data.train[0]["input_ids"], data.train[0]["labels"]
    assert ids.count(processor.image_token_id) == 4
    assert processor.tokenizer.decode([i for i, label in zip(ids, labels, strict=True) if label != -100]) == (
        "It is red.<|im_end|>\n"
    )
    run = train(config)
    adapter = load_file(run.path / "adapter_model.safetensors")
    assert adapter and all(".language_model.layers." in name for name in adapter)
