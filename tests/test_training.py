"""End-to-end training on a tiny random model: full, LoRA, QLoRA, classification; save, reload, stop and resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from finetune.rundir import RunDir
from finetune.runs import RunManager
from tests.helpers import assert_loss_falls, losses, tiny_config, write_jsonl


def train(config, **kwargs):
    state = RunManager().start(config, background=False, **kwargs)
    assert state.status == "completed", (state.status, state.error)
    return RunDir(Path(state.run_dir)), state


def test_lora_trains_saves_an_adapter_that_reloads_with_the_same_logits(tiny_model_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run, state = train(tiny_config(tiny_model_dir, max_steps=10))
    assert_loss_falls(run.path)
    assert (run.path / "adapter_config.json").is_file() and (run.path / "adapter_model.safetensors").is_file()
    assert (run.path / "tokenizer.json").is_file() and run.config_path.is_file()
    assert run.read_status()["status"] == "completed" and run.read_status()["step"] == 10
    samples = run.read_events(("samples",))
    assert [e["step"] for e in samples][0] == 0 and len(samples[0]["samples"]) == 3

    # The saved adapter, loaded by PEFT on a fresh base model, gives the logits of the trained model.
    ids = torch.tensor([[5, 17, 42, 99, 7]])
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), run.path).eval()
    again = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), run.path).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        a, b, c = reloaded(ids).logits, again(ids).logits, base(ids).logits
    assert torch.allclose(a, b, atol=1e-6)
    assert not torch.allclose(a, c, atol=1e-3)  # the adapter really changed the model


def test_full_fine_tuning_saves_a_full_model(tiny_model_dir):
    run, _ = train(tiny_config(tiny_model_dir, method="full", max_steps=10))
    assert_loss_falls(run.path)
    assert (run.path / "model.safetensors").is_file() and not (run.path / "adapter_config.json").exists()


def test_qlora_4bit_nf4_with_double_quant_and_paged_optimizer(tiny_model_dir):
    config = tiny_config(tiny_model_dir, method="qlora", optim="paged_adamw_8bit", max_steps=10)
    run, _ = train(config)
    assert_loss_falls(run.path)
    adapter = json.loads((run.path / "adapter_config.json").read_text())
    assert adapter["r"] == 8


def test_sequence_classification_trains(tiny_model_dir, tmp_path):
    rows = [{"sentence1": f"the {w} is good", "sentence2": f"the {w} is fine", "label": 1} for w in "abcdefgh"]
    rows += [{"sentence1": f"the {w} is good", "sentence2": f"no {w} at all", "label": 0} for w in "abcdefgh"]
    f = write_jsonl(tmp_path / "mrpc.jsonl", rows)
    config = tiny_config(
        tiny_model_dir, dataset=str(f), task="sequence_classification", max_steps=12, learning_rate=1e-2, lora_r=4
    )
    run, _ = train(config)
    assert_loss_falls(run.path, k=3)
    assert (run.path / "adapter_model.safetensors").is_file()


def test_fp16_on_a_cpu_falls_back_to_fp32_and_says_so(tiny_model_dir):
    run, _ = train(tiny_config(tiny_model_dir, precision="fp16", max_steps=2))
    messages = [e["text"] for e in run.read_events(("message",))]
    assert any("fp16 needs a GPU" in m and "uses fp32" in m for m in messages)


def test_stop_saves_a_checkpoint_and_resume_continues_at_the_same_step(tiny_model_dir):
    manager = RunManager()
    config = tiny_config(tiny_model_dir, max_steps=40, save_steps=100)
    manager.start(config)
    while (manager.state().step or 0) < 3:
        assert manager.is_active(), manager.state().error
        manager.wait(0.05)
    manager.stop()
    stopped = manager.wait(60)
    assert stopped.status == "stopped"
    run = RunDir(Path(stopped.run_dir))
    checkpoint = run.last_checkpoint()
    assert checkpoint is not None and int(checkpoint.name.split("-")[1]) == stopped.step

    resumed = manager.resume(run.path, background=False)
    assert resumed.status == "completed" and resumed.step == 40
    steps = [s for s, _ in losses(run.path)]
    after = [s for s in steps if s > stopped.step]
    assert after[0] == stopped.step + 1 and after[-1] == 40  # same numbering, no restart from 1


def test_a_second_start_while_training_is_refused_naming_the_run(tiny_model_dir):
    from finetune.errors import BusyError

    manager = RunManager()
    first = manager.start(tiny_config(tiny_model_dir, max_steps=30), owner="alice")
    try:
        with pytest.raises(BusyError, match=f"busy: run {first.run_id} started by alice at"):
            manager.start(tiny_config(tiny_model_dir), owner="bob")
        with pytest.raises(BusyError, match="started by alice"):  # another process (the CLI) is refused too
            RunManager().start(tiny_config(tiny_model_dir), owner="bob")
    finally:
        manager.stop()
        manager.wait(60)
