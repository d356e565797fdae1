"""LoRA variants through the run plan alone: DoRA, rsLoRA and PiSSA / OLoRA starts train, and what they save loads
with plain PEFT (a PiSSA adapter on the unchanged base)."""

from __future__ import annotations

import json

import pytest
import torch
from peft import PeftModel, set_peft_model_state_dict
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from finetune.engines.common import INITIAL_ADAPTER
from finetune.model import loading
from finetune.plan import plan_for
from finetune.runs.rundir import RunDir
from tests.helpers import tiny_config, train

INPUT = torch.tensor([[1, 5, 9, 14, 3, 7, 2, 11]])


def adapter_config(run: RunDir) -> dict:
    return json.loads((run.path / "adapter_config.json").read_text())


def test_dora_and_rslora_reach_the_trained_model_and_its_saved_adapter(tiny_model_dir, tmp_path):
    config = tiny_config(tiny_model_dir, max_steps=4, use_dora=True, use_rslora=True, output_dir=str(tmp_path / "r"))
    model = loading.load_model(plan_for(config))
    assert any("lora_magnitude_vector" in name for name, _ in model.named_parameters())  # DoRA's magnitudes
    saved = adapter_config(train(config))
    assert saved["use_dora"] is True and saved["use_rslora"] is True


@pytest.mark.parametrize("init", ["pissa", "olora"])
def test_a_pissa_or_olora_adapter_loads_on_the_unchanged_base_and_gives_the_trained_models_outputs(
    tiny_model_dir, tmp_path, init
):
    config = tiny_config(tiny_model_dir, max_steps=4, save_steps=4, init_lora_weights=init, output_dir=str(tmp_path))
    run = train(config)
    assert (run.path / INITIAL_ADAPTER / "adapter_model.safetensors").is_file()
    saved = adapter_config(run)
    assert saved["init_lora_weights"] is True and saved["r"] == 2 * config.lora_r  # converted to plain LoRA

    # The model as it trained: the base rewritten by the PiSSA/OLoRA start, plus the trained adapter weights.
    trained = loading.load_model(plan_for(config))
    weights = load_file(str(run.path / "checkpoint-4" / "adapter_model.safetensors"))
    set_peft_model_state_dict(trained, weights)
    trained.eval()

    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    with torch.no_grad():
        base_logits = base(INPUT).logits
        published = PeftModel.from_pretrained(base, str(run.path)).eval()
        assert torch.allclose(published(INPUT).logits, trained(INPUT).logits, atol=1e-4)
        assert not torch.allclose(published(INPUT).logits, base_logits, atol=1e-3)  # it learned something


def test_chat_with_a_qlora_run_puts_its_adapter_on_the_4_bit_base_it_trained_on(tiny_model_dir, tmp_path):
    import bitsandbytes as bnb

    from finetune.model.inference import load_for_chat

    config = tiny_config(tiny_model_dir, method="qlora", max_steps=2, output_dir=str(tmp_path / "q"))
    run = train(config)
    model, _ = load_for_chat(run.load_plan(), run.path)
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())
    assert isinstance(model, PeftModel)


def test_the_model_card_names_the_variants():
    from finetune.config import TrainConfig
    from finetune.publish.model_card import _method_text

    text = _method_text(TrainConfig(use_dora=True, use_rslora=True, init_lora_weights="pissa", lora_r=4))
    assert "DoRA" in text and "rsLoRA" in text and "PiSSA start" in text and "rank 8" in text
    assert "DoRA" not in _method_text(TrainConfig())
