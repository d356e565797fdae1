"""The estimator and the engine read the same run plan: the model the estimator replays trains the same parameters as
the one the engine loads, for every method and LoRA variant, and `all` means `all-linear` in both."""

from __future__ import annotations

import pytest
import torch

from finetune import memory, models
from finetune.config import TrainConfig
from finetune.memory import trace
from tests.helpers import measured_peak

MATRIX = {
    "full": {"method": "full"},
    "lora": {"method": "lora"},
    "qlora": {"method": "qlora"},
    "classification": {"method": "lora", "task": "sequence_classification", "num_labels": 3},
    "dora": {"method": "lora", "use_dora": True},
    "rslora": {"method": "lora", "use_rslora": True, "lora_r": 16},
    "pissa": {"method": "lora", "init_lora_weights": "pissa"},
    "targets": {"method": "lora", "lora_target_modules": "q_proj,v_proj"},
    "all": {"method": "lora", "lora_target_modules": "all"},
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.tiny import build_llama

    return build_llama(tmp_path_factory.mktemp("plan-tiny"))


def trainable(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(p.shape) for name, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("case", MATRIX, ids=list(MATRIX))
def test_the_replayed_model_trains_the_parameters_the_engine_trains(tiny, case):
    config = TrainConfig(model=str(tiny), **MATRIX[case])
    engine = models.load_model(config, num_labels=config.num_labels or None)
    replayed = trace.build_model(models.load_model_config(str(tiny)), trace.plan_for(config, device="cpu"))
    assert trainable(replayed) == trainable(engine)
    assert trainable(engine)  # something trains


def test_all_and_all_linear_give_the_same_estimate(tiny):
    a = memory.estimate(TrainConfig(model=str(tiny), lora_target_modules="all"), device="cpu")
    b = memory.estimate(TrainConfig(model=str(tiny), lora_target_modules="all-linear"), device="cpu")
    assert a.tensor_bytes == b.tensor_bytes and a.components == b.components


def test_dora_costs_more_and_the_estimate_follows_the_measured_peak(tiny):
    values = {"model": str(tiny), "per_device_train_batch_size": 2, "max_seq_length": 128, "max_steps": 2}
    lora, dora = TrainConfig(**values), TrainConfig(**values, use_dora=True)
    measured = measured_peak(dora)
    estimated = memory.estimate(dora, device="cpu").tensor_bytes
    assert abs(estimated - measured) <= 0.10 * measured, (estimated, measured)
    assert estimated > memory.estimate(lora, device="cpu").tensor_bytes  # the weight norm is recomputed each step
