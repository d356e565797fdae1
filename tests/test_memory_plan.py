"""The estimator replays the engine's own model: `finetune.model.loading.build_model`, called on fake tensors, trains
the same parameters as the model the engine loads, for every method and LoRA variant; `all` means `all-linear` in both;
the preference objectives and Liger change the estimate the way the step changes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from finetune import memory
from finetune.config import TrainConfig
from finetune.memory import analytic as ma
from finetune.memory import trace
from finetune.model import loading
from finetune.plan import plan_for
from tests.helpers import measured_peak

MATRIX = {
    "full": {"method": "full"},
    "lora": {"method": "lora"},
    "qlora": {"method": "qlora"},
    "classification-lora": {"method": "lora", "task": "sequence_classification", "num_labels": 3},
    "classification-full": {"method": "full", "task": "sequence_classification", "num_labels": 3},
    "dora": {"method": "lora", "use_dora": True},
    "qlora-dora": {"method": "qlora", "use_dora": True},
    "rslora": {"method": "lora", "use_rslora": True, "lora_r": 16},
    "pissa": {"method": "lora", "init_lora_weights": "pissa"},
    "olora": {"method": "lora", "init_lora_weights": "olora"},
    "gaussian": {"method": "lora", "init_lora_weights": "gaussian"},
    "targets": {"method": "lora", "lora_target_modules": "q_proj,v_proj"},
    "all": {"method": "lora", "lora_target_modules": "all"},
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.tiny import build_llama

    return build_llama(tmp_path_factory.mktemp("plan-tiny"))


def trainable(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(p.shape) for name, p in model.named_parameters() if p.requires_grad}


def replayed(config: TrainConfig) -> torch.nn.Module:
    """The model the estimator replays for `config`, built exactly as `trace_once` builds it (fake tensors)."""
    plan = plan_for(config, device="cpu")
    with trace.fake_tensors(plan):
        return trace.build(memory.model_config_of(config), plan)


@pytest.mark.parametrize("case", MATRIX, ids=list(MATRIX))
def test_the_replayed_model_trains_the_parameters_the_engine_trains(tiny, case):
    config = TrainConfig(model=str(tiny), **MATRIX[case])
    engine = loading.load_model(plan_for(config, "cpu"), num_labels=config.num_labels or None)
    fake = replayed(config)
    assert trainable(fake) == trainable(engine)
    assert trainable(engine)  # something trains
    assert all(isinstance(p, torch._subclasses.fake_tensor.FakeTensor) for p in fake.parameters())


GPU_CASES = ["full", "lora", "qlora", "classification-lora", "dora", "qlora-dora"]


def dtypes(model: torch.nn.Module) -> dict[str, tuple]:
    """The dtype of every parameter and buffer, and of each 4-bit weight's quantisation state (the dtype it
    dequantises to, the dtype its layer computes in, its absmax / code / nested-state tensors)."""
    out: dict[str, tuple] = {f"parameter {n}": (p.dtype,) for n, p in model.named_parameters()}
    out |= {f"buffer {n}": (b.dtype,) for n, b in model.named_buffers()}
    for name, p in model.named_parameters():
        state = getattr(p, "quant_state", None)
        if state is not None:
            layer = model.get_submodule(name.rpartition(".")[0])  # the bitsandbytes Linear4bit holding the weight
            tensors = tuple(t.dtype for t in trace._quant_state_tensors(state))
            out[f"quantisation state {name}"] = (state.dtype, layer.compute_dtype, *tensors)
    return out


@pytest.mark.parametrize("case", GPU_CASES)
def test_the_replay_for_a_gpu_builds_every_tensor_in_the_dtype_the_engine_loads(tiny, case):
    """The estimate for a GPU is of the plan made for it (bf16 where the card has it); the engine loads
    the model from that same plan. A CPU plan would not do: every CPU plan is fp32, so a replay that ignored the plan's
    dtype would look right there (the model is loaded on this CPU; moving it to the card keeps its dtypes)."""
    config = TrainConfig(model=str(tiny), **MATRIX[case])
    plan = plan_for(config, "cuda", world_size=1)
    assert plan.precision == "bf16" and plan.compute_dtype == "bfloat16"
    # The 4-bit load goes to the CPU here (no card); every dtype it uses comes from the GPU plan.
    engine = loading.build_model(dataclasses.replace(plan, device="cpu"), num_labels=config.num_labels or None)
    with trace.fake_tensors(plan):
        fake = trace.build(memory.model_config_of(config), plan)
    assert dtypes(fake) == dtypes(engine)
    loaded = {d for kinds in dtypes(engine).values() for d in kinds}
    assert torch.bfloat16 in loaded or plan.weight_dtype == "float32", loaded  # LoRA's base is in bf16


def test_qlora_replays_the_4bit_storage_a_load_holds(tiny):
    config = TrainConfig(model=str(tiny), method="qlora")
    engine = loading.load_model(plan_for(config, "cpu"))
    fake = replayed(config)
    frozen = {n: (p.dtype, p.numel()) for n, p in engine.named_parameters() if not p.requires_grad}
    assert {n: (p.dtype, p.numel()) for n, p in fake.named_parameters() if not p.requires_grad} == frozen
    assert any(dtype == torch.uint8 for dtype, _ in frozen.values())  # packed 4-bit weights


def test_all_and_all_linear_give_the_same_estimate(tiny):
    a = memory.estimate(plan_for(TrainConfig(model=str(tiny), lora_target_modules="all"), "cpu"))
    b = memory.estimate(plan_for(TrainConfig(model=str(tiny), lora_target_modules="all-linear"), "cpu"))
    assert a.method == b.method == "traced"
    assert a.tensor_bytes == b.tensor_bytes and a.components == b.components


def test_dora_costs_more_and_the_estimate_follows_the_measured_peak(tiny):
    values = {"model": str(tiny), "per_device_train_batch_size": 2, "max_seq_length": 128, "max_steps": 2}
    lora, dora = TrainConfig(**values), TrainConfig(**values, use_dora=True)
    measured = measured_peak(dora)
    estimated = memory.estimate(plan_for(dora, "cpu")).tensor_bytes
    assert abs(estimated - measured) <= 0.10 * measured, (estimated, measured)
    assert estimated > memory.estimate(plan_for(lora, "cpu")).tensor_bytes  # the weight norm is recomputed each step


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_formulas_price_dora_as_the_replay_does(tiny, device):
    """Advice prices changes with the formulas: DoRA's rescaled outputs are in them (within 5% of the replay)."""
    est = memory.estimate(plan_for(TrainConfig(model=str(tiny), use_dora=True, max_seq_length=256), device))
    assert est.method == "traced"
    assert abs(est.analytic_tensor_bytes - est.tensor_bytes) <= 0.05 * est.tensor_bytes, est


def test_a_classification_estimate_leaves_the_next_one_intact(tiny):
    """PEFT copies a classification head (modules_to_save); copying a fake tensor used to corrupt the heap."""
    first = memory.estimate(plan_for(TrainConfig(model=str(tiny), task="sequence_classification"), "cpu"))
    again = memory.estimate(plan_for(TrainConfig(model=str(tiny), max_seq_length=200), "cuda"))
    assert first.method == again.method == "traced" and again.tensor_bytes > 0


# ----------------------------------------------------------------------------- objectives


def components(config: TrainConfig, device: str = "cpu") -> memory.MemoryEstimate:
    est = memory.estimate(plan_for(config, device))
    assert est.method == "traced", est.notes
    return est


def test_dpo_scores_two_sequences_and_lora_needs_no_reference_copy(tiny):
    sft = components(TrainConfig(model=str(tiny)))
    dpo = components(TrainConfig(model=str(tiny), objective="dpo"))
    assert dpo.components["reference_model"] == 0  # adapters off: the same weights
    # chosen + rejected in one batch: twice the activations of the same batch of SFT rows (TRL's fused head keeps
    # the logits out; its fixed tile shows as logits_loss)
    assert dpo.components["activations"] >= 1.5 * sft.components["activations"]
    assert dpo.tensor_bytes > sft.tensor_bytes


def test_the_dpo_estimate_follows_the_measured_peak(tiny):
    """Two real DPO steps through the preference engine's TRL trainer, live storages counted: within 10%."""
    from bench.memory_accuracy import measure_preference

    values = {"per_device_train_batch_size": 2, "max_seq_length": 64, "max_steps": 2, "warmup_steps": 0}
    config = TrainConfig(model=str(tiny), objective="dpo", eval_split="", save_steps=1000, **values)
    measured = measure_preference(config, "cpu")["peak"]
    estimated = components(config).tensor_bytes
    assert abs(estimated - measured) <= 0.10 * measured, (estimated, measured)


def test_full_dpo_holds_a_frozen_copy_of_the_weights(tiny):
    full = components(TrainConfig(model=str(tiny), method="full", objective="dpo"))
    assert full.components["reference_model"] == full.components["weights"] > 0
    kto = components(TrainConfig(model=str(tiny), method="full", objective="kto"))
    assert kto.components["reference_model"] == kto.components["weights"]
    orpo = components(TrainConfig(model=str(tiny), method="full", objective="orpo"))
    assert orpo.components["reference_model"] == 0  # ORPO has no reference


def test_kto_replays_its_kl_and_reference_passes(tiny):
    plan = plan_for(TrainConfig(model=str(tiny), objective="kto"), device="cpu")
    result = trace.trace(memory.model_config_of(plan.config), plan)
    assert {"kl", "reference", "forward", "backward_head"} <= set(result.phase_peak)
    # one sequence per example: its activations are those of an SFT step's batch, not twice them
    sft = trace.trace(memory.model_config_of(plan.config), plan_for(plan.config.replace(objective="sft"), "cpu"))
    assert result.phase_peak["reference"] < result.peak
    assert result.phase_split["forward"]["activations"] <= 1.1 * sft.phase_split["forward"]["activations"]


# ----------------------------------------------------------------------------- Liger


def test_liger_keeps_one_chunk_of_logits(tiny):
    """On a GPU with Liger, the logits never exist whole: the estimate takes Liger's chunk instead (CPU plans never
    use Liger, so the plan is made for cuda)."""
    values = {"model": str(tiny), "max_seq_length": 256, "per_device_train_batch_size": 4}
    eager = components(TrainConfig(**values, liger_kernel="off"), device="cuda")
    liger = components(TrainConfig(**values, liger_kernel="on"), device="cuda")
    assert plan_for(TrainConfig(**values, liger_kernel="on"), device="cuda").liger
    assert liger.tensor_bytes < eager.tensor_bytes
    assert liger.components["logits_loss"] < eager.components["logits_loss"]
    assert any("Liger" in note for note in liger.notes)


def test_liger_chunk_rule():
    # liger-kernel 0.8.5: inc_factor = ceil(V / H); rows = next_power_of_2(ceil(BT / inc_factor)), at most BT
    assert ma.liger_chunk_rows(tokens=8192, hidden=2048, vocab=128256) == 256  # 63 -> ceil(8192/63)=131 -> 256
    assert ma.liger_chunk_rows(tokens=100, hidden=64, vocab=64) == 100  # one chunk covers every token
    s = ma.Settings(method="lora", batch=4, seq=2048, half=2, loss_kernel="liger")
    sh = ma.Shape(hidden=2048, vocab=128256)
    assert (
        ma.logits_loss_bytes(sh, ma.Census(), s)
        < ma.logits_loss_bytes(sh, ma.Census(), dataclasses.replace(s, loss_kernel="eager")) / 20
    )
