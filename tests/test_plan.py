"""The run plan decides once: device, precision and dtypes, model class, quantisation, LoRA (variants included),
DeepSpeed, optimizer and batch."""

from __future__ import annotations

import pytest

from finetune.config import TrainConfig
from finetune.errors import ConfigError
from finetune.plan import lora_targets, plan_for


def test_a_cpu_plan_is_fp32_whatever_the_config_asks():
    for precision in ("auto", "bf16", "fp16", "fp32"):
        plan = plan_for(TrainConfig(precision=precision), device="cpu")
        assert (plan.precision, plan.weight_dtype, plan.autocast_dtype) == ("fp32", "float32", None)


@pytest.mark.parametrize(
    ("method", "weight", "quantized"),
    [("full", "float32", False), ("lora", "bfloat16", False), ("qlora", "float32", True)],
)
def test_a_gpu_plan_puts_lora_on_a_16_bit_base_and_keeps_full_and_qlora_weights_fp32(method, weight, quantized):
    plan = plan_for(TrainConfig(method=method), device="cuda", world_size=1)
    assert plan.precision == "bf16" and plan.compute_dtype == "bfloat16"
    assert plan.weight_dtype == weight
    assert (plan.quantization is not None) == quantized
    if quantized:
        assert plan.quantization.compute_dtype == "bfloat16" and plan.quantization.quant_type == "nf4"
    assert (plan.lora is None) == (method == "full")


def test_all_and_all_linear_are_the_same_targets():
    assert lora_targets("all") == lora_targets("all-linear") == "all-linear"
    assert lora_targets(" q_proj, v_proj ,") == ("q_proj", "v_proj")
    a = plan_for(TrainConfig(lora_target_modules="all"), device="cpu")
    b = plan_for(TrainConfig(lora_target_modules="all-linear"), device="cpu")
    assert a.lora == b.lora


def test_lora_variants_reach_peft_unchanged():
    config = TrainConfig(use_dora=True, use_rslora=True, init_lora_weights="pissa", lora_r=4, lora_alpha=8)
    lc = plan_for(config, device="cpu").lora_config()
    assert (lc.use_dora, lc.use_rslora, lc.init_lora_weights, lc.r, lc.lora_alpha) == (True, True, "pissa", 4, 8)
    assert plan_for(TrainConfig(), device="cpu").lora_config().init_lora_weights is True


def test_the_task_picks_the_model_class_and_peft_task():
    plan = plan_for(TrainConfig(task="sequence_classification"), device="cpu")
    assert plan.model_class == "AutoModelForSequenceClassification" and plan.lora.task_type == "SEQ_CLS"
    assert plan_for(TrainConfig(), device="cpu").auto_class().__name__ == "AutoModelForCausalLM"


def test_deepspeed_use_optimizer_and_effective_batch():
    plan = plan_for(
        TrainConfig(zero_stage=2, optim="adamw_8bit", per_device_train_batch_size=4, gradient_accumulation_steps=2),
        device="cuda",
        world_size=8,
    )
    assert plan.deepspeed and plan.trainer_optim == "adamw_bnb_8bit" and plan.effective_batch == 64
    assert not plan_for(TrainConfig(), device="cpu", world_size=1).deepspeed
    assert plan_for(TrainConfig(backend="deepspeed"), device="cpu").deepspeed


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"method": "full", "use_dora": True}, "use_dora"),
        ({"method": "full", "use_rslora": True}, "use_rslora"),
        ({"method": "full", "init_lora_weights": "gaussian"}, "init_lora_weights"),
        ({"method": "qlora", "init_lora_weights": "pissa"}, "init_lora_weights"),
        ({"init_lora_weights": "loftq"}, "init_lora_weights"),
    ],
)
def test_variants_that_cannot_apply_are_refused_naming_the_field(values, field):
    with pytest.raises(ConfigError) as info:
        TrainConfig(**values)
    assert info.value.field == field and str(info.value).startswith(f"{field}: ")


def test_bf16_on_a_gpu_without_it_is_refused(monkeypatch):
    import finetune.plan as plan_module

    monkeypatch.setattr(plan_module, "_cuda_available", lambda: True)
    monkeypatch.setattr(plan_module, "_bf16_supported", lambda: False)
    with pytest.raises(ConfigError, match="precision: bf16 is not supported by this GPU"):
        plan_for(TrainConfig(precision="bf16"))
    assert plan_for(TrainConfig(precision="auto")).precision == "fp32"
