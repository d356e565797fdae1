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


def test_the_plan_names_the_engine_that_runs_the_step():
    from finetune.plan import RunPlan

    def engine(**values):
        return plan_for(TrainConfig(**values), device="cpu").engine

    assert engine() == engine(task="sequence_classification") == engine(zero_stage=2) == "hf_trainer"
    assert engine(objective="dpo") == engine(objective="kto") == "preference"
    assert engine(objective="grpo", rewards="number_match") == "grpo"
    assert engine(backend="deepspeed") == "deepspeed_engine"
    # A plan.json written before the plan named its engine reads back with the engine its config runs on.
    config = TrainConfig(backend="deepspeed")
    old = {k: v for k, v in plan_for(config, device="cpu").to_dict().items() if k != "engine"}
    assert RunPlan.from_dict(old, config).engine == "deepspeed_engine"


def test_bf16_on_a_gpu_without_it_is_refused(monkeypatch):
    import finetune.plan as plan_module

    monkeypatch.setattr(plan_module, "_cuda_available", lambda: True)
    monkeypatch.setattr(plan_module, "_bf16_supported", lambda: False)
    with pytest.raises(ConfigError, match="precision: bf16 is not supported by this GPU"):
        plan_for(TrainConfig(precision="bf16"))
    assert plan_for(TrainConfig(precision="auto")).precision == "fp32"


# ----------------------------------------------------------------------------- the plan a run records
@pytest.mark.parametrize(
    "config",
    [
        TrainConfig(),
        TrainConfig(method="qlora", objective="dpo", beta=0.3),
        TrainConfig(task="sequence_classification"),
    ],
    ids=["lora-sft", "qlora-dpo", "classification"],
)
def test_a_plan_reads_back_from_its_json_as_it_was(config):
    import json

    from finetune.plan import RunPlan

    for device in ("cpu", "cuda"):
        plan = plan_for(config, device=device, world_size=2)
        data = json.loads(json.dumps(plan.to_dict()))
        assert RunPlan.from_dict(data, config) == plan
        assert data["objective"] == plan.objective.name and "config" not in data


def test_every_run_records_its_plan_and_chat_and_export_load_by_it(tiny_model_dir, tmp_path, monkeypatch):
    """Start makes the plan once (config -> plan -> preflight(plan)) and plan.json, beside config.yaml, is that plan;
    chat and export act on what it says, not on a plan made again here."""
    import json

    from finetune.errors import UserError
    from finetune.model.inference import load_for_chat
    from finetune.publish.export import export_run
    from finetune.runs import manager
    from finetune.runs.preflight import preflight
    from finetune.runs.rundir import RunDir
    from tests.helpers import tiny_config

    made, checked = [], []
    monkeypatch.setattr(manager, "plan_for", lambda config: made.append(plan_for(config)) or made[-1])
    monkeypatch.setattr(manager, "preflight", lambda plan: checked.append(plan) or preflight(plan))
    config = tiny_config(tiny_model_dir, max_steps=2, output_dir=str(tmp_path / "run"))
    state = manager.RunManager().start(config, background=False)
    assert state.status == "completed", state.error
    assert len(made) == 1 and checked == made  # the plan preflight checked is the one the run ran
    run = RunDir(tmp_path / "run")
    recorded = json.loads(run.plan_path.read_text(encoding="utf-8"))
    assert recorded == made[0].to_dict() == plan_for(config, device="cpu", world_size=1).to_dict()
    assert recorded["engine"] == "hf_trainer" and recorded["packing"] is True
    # A run whose plan loaded its base in bfloat16 (a GPU run, say) is chatted with in bfloat16 here too.
    run.plan_path.write_text(json.dumps({**recorded, "weight_dtype": "bfloat16"}), encoding="utf-8")
    model, _ = load_for_chat(run.load_plan(), run.path)
    assert {str(p.dtype) for n, p in model.named_parameters() if "lora_" not in n} == {"torch.bfloat16"}
    # Export reads it too: a plan that says the run trained a classifier is refused as one.
    run.plan_path.write_text(json.dumps({**recorded, "objective": "classification"}), encoding="utf-8")
    with pytest.raises(UserError, match="format: export supports causal_lm runs"):
        export_run(run.path, "merged")
    run.plan_path.write_text("{not json", encoding="utf-8")
    assert run.load_plan() == plan_for(config)  # a damaged or missing plan.json: planned again (older runs)


# ----------------------------------------------------------------------------- config -> plan -> preflight(plan)
def test_preflight_judges_the_plan_not_a_probe_of_this_machine(tiny_model_dir, tmp_path):
    """NVMe offload is refused for a plan on the CPU and passes for a plan on a GPU, on the same machine; Liger asked
    for on a CPU plan is refused naming the plan's device."""
    from finetune.runs.preflight import preflight
    from tests.helpers import tiny_config

    nvme = tiny_config(tiny_model_dir, zero_stage=3, offload_optimizer="nvme", nvme_path=str(tmp_path))
    with pytest.raises(ConfigError, match="offload_optimizer: NVMe offload needs a GPU; this machine has none"):
        preflight(plan_for(nvme, device="cpu"))
    preflight(plan_for(nvme, device="cuda"))
    with pytest.raises(ConfigError, match="liger_kernel: on, but Liger's kernels need a CUDA GPU"):
        preflight(plan_for(tiny_config(tiny_model_dir, liger_kernel="on"), device="cpu"))
