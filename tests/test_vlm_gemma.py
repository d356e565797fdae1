"""Gemma 3 fine-tuning on a tiny random Gemma 3 built in code (a SigLIP tower pooled into 4 soft tokens an image, its
processor with the PIL image processor): the plan adapts the language model only, only the answer is trained and the
image tokens never (the batch marks them for the bidirectional image attention), the estimate counts the processor's
image tokens, a LoRA run from the CLI leaves the vision tower alone, chat answers a picture, and the merged export
loads back in plain transformers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from finetune.config import TrainConfig
from finetune.plan import plan_for
from tests.tiny import GEMMA3_IMAGE_TOKENS, build_gemma3, write_image_rows
from tests.vlm_support import cli_run, prepared, vlm_config


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory) -> Path:
    return build_gemma3(tmp_path_factory.mktemp("tiny-gemma3"))


@pytest.fixture(scope="module")
def image_data(tmp_path_factory) -> Path:
    return write_image_rows(tmp_path_factory.mktemp("gemma-image-data"), rows=4)


def gemma_config(model: Path, dataset: Path | str, **overrides) -> TrainConfig:
    return vlm_config(model, dataset, **{"max_steps": 3, "max_seq_length": 64, "save_steps": 3, **overrides})


@pytest.fixture(scope="module")
def lora_run(gemma_dir, image_data, tmp_path_factory):
    """Three LoRA steps through `python -m finetune train`."""
    return cli_run(gemma_config(gemma_dir, image_data), tmp_path_factory.mktemp("gemma-run"))


# ----------------------------------------------------------------------------- plan
def test_the_plan_sees_gemma_3_and_adapts_its_language_model_only(gemma_dir, image_data):
    from finetune.model.loading import build_model

    plan = plan_for(gemma_config(gemma_dir, image_data))
    assert plan.model_class == "AutoModelForImageTextToText" and plan.vision.family == "gemma3"
    assert plan.vision.freeze_vision_tower and plan.vision.freeze_projector and not plan.packing
    model = build_model(plan)
    adapted = {n.rsplit(".lora_A", 1)[0] for n, _ in model.named_parameters() if ".lora_A" in n}
    assert adapted and all(".language_model.layers." in n for n in adapted)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and not [n for n in trainable if "vision_tower" in n or "multi_modal_projector" in n]


# ----------------------------------------------------------------------------- data
def test_only_the_answer_is_trained_and_image_tokens_never(gemma_dir, image_data):
    from finetune.data.images import ImageCollator
    from finetune.model import loading

    processor, data = prepared(gemma_config(gemma_dir, image_data))
    assert type(processor).__name__ == "Gemma3Processor" and data.format.kind == "images" and len(data.train) == 4
    row = data.train[0]
    ids, labels = row["input_ids"], row["labels"]
    trained = [i for i, label in zip(ids, labels, strict=True) if label != -100]
    assert processor.tokenizer.decode(trained) == "It is red.<end_of_turn>\n"
    assert labels[-len(trained) :] == trained  # one trained piece, at the end: the answer
    assert ids[0] == processor.tokenizer.bos_token_id and ids.count(ids[0]) == 1  # the template's BOS, only
    tokenizer = processor.tokenizer
    soft, boi, eoi = tokenizer.convert_tokens_to_ids(["<image_soft_token>", "<start_of_image>", "<end_of_image>"])
    positions = [i for i, t in enumerate(ids) if t == soft]
    start = positions[0]
    assert positions == list(range(start, start + GEMMA3_IMAGE_TOKENS))  # one image: its soft tokens in a block
    assert ids[start - 1] == boi and ids[start + GEMMA3_IMAGE_TOKENS] == eoi
    assert all(label == -100 for label in labels[: start + GEMMA3_IMAGE_TOKENS + 1])  # the image and the prompt

    # The batch marks the soft tokens (not the <start_of_image> the processor calls its image token) for the
    # bidirectional attention over each image, as the processor itself does, and brings the pixels.
    batch = ImageCollator(processor, "gemma3")([data.train[0], data.train[1]])
    assert torch.equal(batch["token_type_ids"], (batch["input_ids"] == soft).long())
    assert batch["token_type_ids"].sum().item() == 2 * GEMMA3_IMAGE_TOKENS
    assert batch["pixel_values"].shape == (2, 3, 32, 32)
    assert "mm_token_type_ids" not in batch

    # Gemma 3's images are always resized to the tower's square (its token count is fixed): the cap leaves them.
    capped = loading.load_processor(plan_for(gemma_config(gemma_dir, image_data, image_longest_side=16)))
    assert capped.image_processor.size == {"height": 32, "width": 32}


# ----------------------------------------------------------------------------- memory
def test_the_estimate_counts_the_image_tokens_the_processor_makes(gemma_dir, image_data):
    from finetune import memory

    config = gemma_config(gemma_dir, image_data)
    processor, data = prepared(config)
    made = data.train[0]["input_ids"].count(processor.tokenizer.convert_tokens_to_ids("<image_soft_token>"))
    assert made == GEMMA3_IMAGE_TOKENS == processor.image_seq_length
    estimate = memory.estimate(plan_for(config, "cpu"))
    assert estimate.method == "traced", estimate.notes
    assert f"{made} tokens each, {made} a row" in " ".join(estimate.notes)


# ----------------------------------------------------------------------------- training, export
def test_a_lora_run_trains_the_language_model_only_and_its_merged_export_loads_in_plain_transformers(
    lora_run, gemma_dir, image_data, tmp_path
):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from finetune.data.images import load_image
    from finetune.model import loading
    from finetune.publish.export import export_run

    assert lora_run.read_status()["status"] == "completed"
    steps = [e for e in lora_run.read_events(("log",)) if "loss" in e]
    assert [e["step"] for e in steps] == [1, 2, 3] and all(e["loss"] > 0 for e in steps)
    adapter = load_file(lora_run.path / "adapter_model.safetensors")
    assert adapter and all(".language_model.layers." in name for name in adapter)  # nothing on the vision tower
    pattern = json.loads((lora_run.path / "adapter_config.json").read_text())["target_modules"]
    assert not re.fullmatch(pattern, "model.vision_tower.vision_model.encoder.layers.0.self_attn.q_proj")
    assert not re.fullmatch(pattern, "model.multi_modal_projector")

    # The run's answer to a picture, through the studio's processor: the base plus the adapter.
    plan = plan_for(gemma_config(gemma_dir, image_data))
    processor = loading.load_processor(plan)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    picture = load_image(str(image_data.parent / "img0_0.png"))
    batch = processor(text=[text], images=[[picture]], add_special_tokens=False, return_tensors="pt")
    assert batch["token_type_ids"].sum().item() == GEMMA3_IMAGE_TOKENS
    merged = export_run(lora_run.path, "merged", out=tmp_path / "merged").folder
    with torch.no_grad():
        tuned_model = PeftModel.from_pretrained(loading.load_base(plan), lora_run.path).eval()
        tuned = tuned_model(**batch).logits
        with tuned_model.disable_adapter():
            assert not torch.allclose(tuned_model(**batch).logits, tuned, atol=1e-4)  # the adapter changed something

        # The export in plain transformers: its own processor makes the same inputs, its model the same logits.
        again_processor = AutoProcessor.from_pretrained(merged)
        inputs = again_processor(text=[text], images=[[picture]], add_special_tokens=False, return_tensors="pt")
        assert torch.equal(inputs["input_ids"], batch["input_ids"])
        plain = AutoModelForImageTextToText.from_pretrained(merged).eval()
        assert type(plain).__name__ == "Gemma3ForConditionalGeneration"
        torch.testing.assert_close(plain(**inputs).logits, tuned, atol=1e-4, rtol=1e-4)
    before, after = load_file(gemma_dir / "model.safetensors"), load_file(merged / "model.safetensors")
    frozen = [n for n in before if "vision_tower" in n or "multi_modal_projector" in n]
    assert frozen and all(torch.equal(before[n], after[n]) for n in frozen)  # the vision tower exactly as it was
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert changed and all(n.startswith("language_model.model.layers.") for n in changed)  # the adapter merged in


def test_chat_answers_a_picture_from_the_tuned_run_and_the_base(lora_run, gemma_dir, image_data):
    from transformers import AutoProcessor

    from finetune.errors import UserError
    from finetune.model.inference import GenerationSettings, image_chat_inputs
    from finetune.studio import Studio

    studio = Studio(runs_root=lora_run.path.parent)
    messages = [{"role": "user", "content": "<image>What colour?"}]
    settings = GenerationSettings(max_new_tokens=4)
    picture = str(image_data.parent / "img0_0.png")
    # The prompt as the run was trained: one BOS (the template's; Gemma's tokenizer would add a second), the image.
    processor = AutoProcessor.from_pretrained(lora_run.path)
    inputs = image_chat_inputs(processor, messages, [picture])
    ids = inputs["input_ids"][0].tolist()
    assert ids.count(processor.tokenizer.bos_token_id) == 1 and ids[0] == processor.tokenizer.bos_token_id
    assert inputs["token_type_ids"].sum().item() == GEMMA3_IMAGE_TOKENS and "pixel_values" in inputs
    tuned = list(studio.chat(lora_run.path.name, messages, settings, images=[picture]))
    base = list(studio.chat("base", messages, settings, base_values={"model": str(gemma_dir)}, images=[picture]))
    assert tuned and base  # both generate from the image (random tiny models: the words themselves mean nothing)
    # A system prompt: Gemma's template folds it into the first user turn, the image still in its place.
    system = GenerationSettings(max_new_tokens=2, system_prompt="Answer in one word.")
    assert list(studio.chat(lora_run.path.name, messages, system, images=[picture]))
    with pytest.raises(UserError, match=r"images: 0 image\(s\) for 1 <image> tag") as caught:
        list(studio.chat(lora_run.path.name, messages, settings))
    assert caught.value.field == "images"
