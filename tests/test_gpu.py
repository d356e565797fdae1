"""What only a CUDA GPU can show: 16-bit training really runs in 16 bits, and QLoRA trains on a 4-bit base there.

Marked `gpu`: skipped on CPU machines (here and in CI), run on the lent GPU machine with `pytest -m gpu`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from finetune.rundir import RunDir
from finetune.runs import RunManager
from tests.helpers import assert_loss_falls, tiny_config

pytestmark = pytest.mark.gpu


def test_bf16_lora_trains_on_the_gpu_without_falling_back(tiny_model_dir):
    state = RunManager().start(tiny_config(tiny_model_dir, precision="bf16", max_steps=10), background=False)
    assert state.status == "completed", state.error
    run = RunDir(Path(state.run_dir))
    messages = " ".join(e["text"] for e in run.read_events(("message",)))
    assert "needs a GPU" not in messages and "(lora, bf16)" in messages
    assert state.device != "cpu" and state.memory_bytes > 0
    assert_loss_falls(run.path)


def test_auto_precision_picks_bf16_where_supported(tiny_model_dir):
    import torch

    from finetune.models import compute_dtype_name

    expected = "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    assert compute_dtype_name(tiny_config(tiny_model_dir, precision="auto")) == expected


def test_qlora_trains_on_a_4bit_base_on_the_gpu(tiny_model_dir):
    import bitsandbytes as bnb

    from finetune import models

    config = tiny_config(tiny_model_dir, method="qlora", optim="paged_adamw_8bit", max_steps=10)
    model = models.load_model(config)
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())
    assert next(model.parameters()).is_cuda
    del model
    state = RunManager().start(config, background=False)
    assert state.status == "completed", state.error
    assert_loss_falls(state.run_dir)
