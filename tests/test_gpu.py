"""What only a CUDA GPU can show: 16-bit training really runs in 16 bits, and QLoRA trains on a 4-bit base there.

Each test looks at the model the Trainer really steps (a hook on `Trainer.training_step` and on one frozen base
layer's forward), never at the code's own decision recomputed. Marked `gpu`: skipped on CPU machines (here and in
CI), run on the lent GPU machine with `pytest -m gpu`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from finetune.runs.manager import RunManager
from finetune.runs.rundir import RunDir
from tests.helpers import assert_loss_falls, tiny_config

pytestmark = pytest.mark.gpu


def record_training_steps(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """At each Trainer step: where the model sits, its frozen weights' dtypes, its 4-bit layers, and the dtype that
    a frozen base projection (layer 0's q_proj) computes its output in during that step."""
    from transformers import Trainer

    steps: list[dict[str, Any]] = []
    original = Trainer.training_step

    def training_step(self, model, *args, **kwargs):
        import bitsandbytes as bnb

        seen: dict[str, torch.dtype] = {}

        def on_forward(module, inputs, output) -> None:  # returns None: the output is left as it is
            seen.setdefault("output", output.dtype)

        base = next(m for n, m in model.named_modules() if n.endswith("layers.0.self_attn.q_proj.base_layer"))
        handle = base.register_forward_hook(on_forward)
        try:
            return original(self, model, *args, **kwargs)
        finally:
            handle.remove()
            steps.append(
                {
                    "cuda": all(p.is_cuda for p in model.parameters()),
                    "frozen_dtypes": {p.dtype for p in model.parameters() if not p.requires_grad},
                    "trainable_dtypes": {p.dtype for p in model.parameters() if p.requires_grad},
                    "four_bit": sum(isinstance(m, bnb.nn.Linear4bit) for m in model.modules()),
                    "computes_in": seen.get("output"),
                }
            )

    monkeypatch.setattr(Trainer, "training_step", training_step)
    return steps


def test_bf16_lora_trains_on_the_gpu_in_bf16(tiny_model_dir, monkeypatch):
    steps = record_training_steps(monkeypatch)
    state = RunManager().start(tiny_config(tiny_model_dir, precision="bf16", max_steps=10), background=False)
    assert state.status == "completed", state.error
    run = RunDir(Path(state.run_dir))
    messages = " ".join(e["text"] for e in run.read_events(("message",)))
    assert "needs a GPU" not in messages
    assert len(steps) == 10 and all(s["cuda"] for s in steps)
    # The frozen base is stored in bf16 and its layers compute in bf16; the adapters keep fp32 master weights.
    assert steps[0]["frozen_dtypes"] == {torch.bfloat16} and steps[0]["computes_in"] == torch.bfloat16
    assert steps[0]["trainable_dtypes"] == {torch.float32}
    assert state.device != "cpu" and state.memory_bytes > 0
    assert_loss_falls(run.path)


def test_auto_precision_trains_in_bf16_on_an_ampere_or_newer_gpu(tiny_model_dir, monkeypatch):
    """`precision: auto` means bf16 where the card has bf16 units (compute capability 8.0, Ampere, and newer: the
    lent H200 is 9.0), else fp32: checked by the dtype a base layer computes in during the real step."""
    steps = record_training_steps(monkeypatch)
    state = RunManager().start(tiny_config(tiny_model_dir, precision="auto", max_steps=2), background=False)
    assert state.status == "completed", state.error
    ampere_or_newer = torch.cuda.get_device_capability(0) >= (8, 0)
    assert steps[0]["computes_in"] == (torch.bfloat16 if ampere_or_newer else torch.float32), steps[0]


def test_qlora_trains_on_a_4bit_base_on_the_gpu(tiny_model_dir, monkeypatch):
    steps = record_training_steps(monkeypatch)
    config = tiny_config(tiny_model_dir, method="qlora", optim="paged_adamw_8bit", precision="bf16", max_steps=10)
    state = RunManager().start(config, background=False)
    assert state.status == "completed", state.error
    assert len(steps) == 10 and all(s["cuda"] for s in steps)
    assert steps[0]["four_bit"] == 2 * 7  # q k v o gate up down of both blocks, in the model that trains
    assert torch.uint8 in steps[0]["frozen_dtypes"]  # the packed 4-bit weights
    assert_loss_falls(state.run_dir)


def test_a_gpu_run_logs_the_loss_on_a_cadence_and_counts_tokens_as_trainer_does(tiny_model_dir, monkeypatch):
    """No host-device sync every step: after the first steps the loss is logged at most about once a second (the
    last step always), and the token count kept on the device until read equals the per-batch count Trainer would
    make."""
    from finetune.engines.hf_trainer import GPU_LOG_EVERY_S, GPU_LOG_FIRST_STEPS, StudioTrainer

    per_batch: list[int] = []
    track = StudioTrainer._track_num_input_tokens

    def counting(self, inputs):
        per_batch.append(int(inputs["attention_mask"].sum()))
        track(self, inputs)

    monkeypatch.setattr(StudioTrainer, "_track_num_input_tokens", counting)
    config = tiny_config(tiny_model_dir, precision="bf16", max_steps=60, save_steps=30)
    state = RunManager().start(config, background=False)
    assert state.status == "completed", state.error
    assert len(per_batch) == 60 and state.tokens_seen == sum(per_batch)
    logs = RunDir(Path(state.run_dir)).read_events(("log",))
    steps, times = [e["step"] for e in logs], [e["time"] for e in logs]
    first = GPU_LOG_FIRST_STEPS
    assert steps[:first] == list(range(1, first + 1)) and steps[-1] == 60
    cadence = times[first:-1]  # the points after the first steps, the last one aside
    gaps = [b - a for a, b in zip(cadence, cadence[1:], strict=False)]
    assert all(g >= 0.9 * GPU_LOG_EVERY_S for g in gaps), gaps
    elapsed = times[-1] - times[first - 1]
    assert len(steps) - first <= elapsed / GPU_LOG_EVERY_S + 2, (steps, elapsed)
