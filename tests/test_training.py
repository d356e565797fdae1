"""End-to-end training on a tiny random model: full, LoRA, QLoRA, classification; save, reload, stop and resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from finetune.runs.manager import RunManager
from finetune.runs.rundir import RunDir
from tests.helpers import (
    assert_loss_falls,
    assert_resumed_exactly,
    events_size,
    hold_at_step,
    raw_events,
    tiny_config,
    train,
    write_jsonl,
)


def test_lora_trains_saves_an_adapter_that_reloads_with_the_same_logits(tiny_model_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run = train(tiny_config(tiny_model_dir, max_steps=10))
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
    run = train(tiny_config(tiny_model_dir, method="full", max_steps=10))
    assert_loss_falls(run.path)
    assert (run.path / "model.safetensors").is_file() and not (run.path / "adapter_config.json").exists()


def test_qlora_trains_linear4bit_layers_nf4_double_quant_with_a_paged_8bit_optimizer(tiny_model_dir, monkeypatch):
    """The model the Trainer steps has bitsandbytes 4-bit layers (the very ones loaded with NF4 + double quantisation),
    only LoRA weights train, and the optimizer is bitsandbytes' paged 8-bit AdamW: a silent fallback to plain LoRA
    or to a 32-bit optimizer fails here."""
    import bitsandbytes as bnb
    from transformers import Trainer

    from finetune.model import loading

    loaded: dict[int, tuple] = {}
    trained: list[dict] = []
    original_load, original_step = loading.load_model, Trainer.training_step

    def load_model(*args, **kwargs):
        model = original_load(*args, **kwargs)
        for m in model.modules():
            if isinstance(m, bnb.nn.Linear4bit):  # before any forward pass (CPU inference may repack the weights)
                loaded[id(m)] = (m.weight.quant_state.quant_type, m.weight.quant_state.nested)
        return model

    def training_step(self, model, *args, **kwargs):
        four_bit = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
        inner = getattr(self.optimizer, "optimizer", self.optimizer)
        trained.append(
            {
                "layers": {id(m) for m in four_bit},
                "packed": all(m.weight.dtype == torch.uint8 and not m.weight.requires_grad for m in four_bit),
                "trainable": {_lora_part(n) for n, p in model.named_parameters() if p.requires_grad},
                "optimizer": (
                    isinstance(inner, bnb.optim.optimizer.Optimizer8bit),
                    getattr(getattr(inner, "args", None), "optim_bits", 32),
                ),
                "paged": getattr(inner, "is_paged", False),
            }
        )
        return original_step(self, model, *args, **kwargs)

    monkeypatch.setattr(loading, "load_model", load_model)
    monkeypatch.setattr(Trainer, "training_step", training_step)
    config = tiny_config(tiny_model_dir, method="qlora", optim="paged_adamw_8bit", max_steps=10)
    run = train(config)
    assert_loss_falls(run.path)
    assert len(trained) == 10
    step = trained[0]
    assert len(step["layers"]) == 2 * 7, "expected q k v o gate up down of both blocks as Linear4bit"
    assert step["layers"] == set(loaded) and all(s["layers"] == step["layers"] for s in trained)
    assert set(loaded.values()) == {("nf4", True)}  # NF4 with the constants quantised again (double quant)
    assert step["packed"] and step["trainable"] == {"lora_A", "lora_B"}
    assert step["optimizer"] == (True, 8) and step["paged"]  # bitsandbytes AdamW, 8-bit states, paged
    adapter = json.loads((run.path / "adapter_config.json").read_text())
    assert adapter["r"] == 8


def _lora_part(name: str) -> str:
    """'lora_A' / 'lora_B' for an adapter weight's name, else the name itself."""
    return next((part for part in ("lora_A", "lora_B") if f".{part}." in name), name)


def test_sequence_classification_trains(tiny_model_dir, tmp_path):
    rows = [{"sentence1": f"the {w} is good", "sentence2": f"the {w} is fine", "label": 1} for w in "abcdefgh"]
    rows += [{"sentence1": f"the {w} is good", "sentence2": f"no {w} at all", "label": 0} for w in "abcdefgh"]
    f = write_jsonl(tmp_path / "mrpc.jsonl", rows)
    config = tiny_config(
        tiny_model_dir, dataset=str(f), task="sequence_classification", max_steps=12, learning_rate=1e-2, lora_r=4
    )
    run = train(config)
    assert_loss_falls(run.path, k=3)
    assert (run.path / "adapter_model.safetensors").is_file()


def test_fp16_on_a_cpu_falls_back_to_fp32_and_says_so(tiny_model_dir):
    run = train(tiny_config(tiny_model_dir, precision="fp16", max_steps=2))
    messages = [e["text"] for e in run.read_events(("message",))]
    assert any("fp16 needs a GPU" in m and "uses fp32" in m for m in messages)


def test_trust_remote_code_puts_a_warning_in_the_run_log(tiny_model_dir):
    """README (Security): turning trust_remote_code on puts a warning in the run log."""
    run = train(tiny_config(tiny_model_dir, trust_remote_code=True, max_steps=1))
    messages = [e["text"] for e in run.read_events(("message",))]
    assert any(m.startswith("warning: trust_remote_code is on") and "runs on this machine" in m for m in messages)


def test_the_same_config_trains_the_same_adapter(tiny_model_dir):
    """`seed` covers "data order and initialisation": two runs of one config give the same adapter, whatever ran
    before them in the process."""
    from safetensors.torch import load_file

    config = tiny_config(tiny_model_dir, max_steps=3)
    torch.manual_seed(1)  # whatever the process did before
    first = train(config)
    torch.manual_seed(2)
    second = train(config)
    a, b = (load_file(run.path / "adapter_model.safetensors") for run in (first, second))
    for name, tensor in a.items():
        torch.testing.assert_close(tensor, b[name], rtol=0, atol=0, msg=name)


def test_stop_saves_a_checkpoint_and_resume_continues_exactly(tiny_model_dir, monkeypatch):
    """Stop at step 5 (the Stop button's call), resume: the resumed process trains steps 6-12 only, with the learning
    rate of a decaying schedule, the losses and the final adapter of an uninterrupted run. A resume that restarts at
    step 1, or that reloads the weights but not the optimizer or scheduler state, fails here."""
    from safetensors.torch import load_file

    config = tiny_config(tiny_model_dir, max_steps=12, save_steps=100, lr_scheduler_type="linear", warmup_steps=2)
    torch.manual_seed(config.seed)  # the adapter's initialisation is not seeded by the run itself (see below)
    reference = train(config)
    expected = {e["step"]: e for e in raw_events(reference.path)}

    manager = RunManager()
    held = hold_at_step(monkeypatch, 5)
    torch.manual_seed(config.seed)
    manager.start(config)
    assert held.wait(120), manager.state()
    assert manager.state().status == "running"
    assert manager.stop()
    stopped = manager.wait(120)
    assert stopped.status == "stopped" and stopped.step == 5, (stopped.status, stopped.step, stopped.error)
    run = RunDir(Path(stopped.run_dir))
    assert [p.name for p in run.checkpoints()] == ["checkpoint-5"] and not run.has_final_model()

    mark = events_size(run.path)
    resumed = manager.resume(run.path, background=False)
    assert resumed.status == "completed" and resumed.step == 12, (resumed.status, resumed.error)
    before, after = assert_resumed_exactly(run.path, mark, checkpoint_step=5, max_steps=12)
    for event in before + after:
        want = expected[event["step"]]
        assert event["learning_rate"] == pytest.approx(want["learning_rate"], rel=1e-9), (event, want)
        assert event["loss"] == pytest.approx(want["loss"], rel=1e-4), (event, want)
    assert len({e["learning_rate"] for e in after}) == len(after)  # the schedule really moves at every step
    ours, theirs = (load_file(d / "adapter_model.safetensors") for d in (run.path, reference.path))
    assert ours.keys() == theirs.keys()
    for name, tensor in ours.items():
        torch.testing.assert_close(tensor, theirs[name], rtol=1e-4, atol=1e-6, msg=name)


def test_a_second_start_while_training_is_refused_naming_the_run(tiny_model_dir, monkeypatch):
    from finetune.errors import BusyError

    manager = RunManager()
    held = hold_at_step(monkeypatch, 1)
    first = manager.start(tiny_config(tiny_model_dir, max_steps=3), owner="alice")
    try:
        assert held.wait(120), manager.state()  # certainly still training
        with pytest.raises(BusyError, match=f"busy: run {first.run_id} started by alice at"):
            manager.start(tiny_config(tiny_model_dir), owner="bob")
        with pytest.raises(BusyError, match="started by alice"):  # another process (the CLI) is refused too
            RunManager().start(tiny_config(tiny_model_dir), owner="bob")
    finally:
        manager.stop()
        manager.wait(120)
    assert manager.state().status == "stopped" and manager.state().step == 1
