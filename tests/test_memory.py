"""Memory estimator: components against hand-computed values, the replay against a measured CPU step, advice, CLI."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from finetune import memory
from finetune.cli import memory as cli_memory
from finetune.config import TrainConfig
from finetune.errors import UserError
from finetune.memory import analytic as ma
from finetune.plan import plan_for

# The tiny test Llama (tests/tiny.py): hidden 64, MLP 128, 2 layers, 4 heads of 16, 2 KV heads, vocab 384, tied.
H, MLP, LAYERS, HEADS, KV, V = 64, 128, 2, 4, 2, 384
KV_DIM = KV * (H // HEADS)  # 32
LAYER_LINEARS = [H * H, H * KV_DIM, H * KV_DIM, H * H, H * MLP, H * MLP, MLP * H]  # q k v o gate up down
PARAMS = V * H + LAYERS * (sum(LAYER_LINEARS) + 2 * H) + H  # embeddings (tied head) + blocks + final norm
LORA_PER_LAYER = 8 * ((H + H) + 2 * (H + KV_DIM) + (H + H) + 2 * (H + MLP) + (MLP + H))  # r * (in + out) per module


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny model directory (built once for this module)."""
    from tests.tiny import build_llama

    return build_llama(tmp_path_factory.mktemp("mem-tiny"))


def cfg(tiny: Path, **kw) -> TrainConfig:
    """A TrainConfig on the tiny model (batch 4 x 256 tokens unless changed)."""
    return TrainConfig(model=str(tiny), **kw)


def parts(tiny: Path, device: str = "cpu", **kw):
    """(shape, census, settings) for a config."""
    c = cfg(tiny, **kw)
    mc = memory.model_config_of(c)
    plan = plan_for(c, device)
    return ma.shape_of(mc), ma.census(mc, plan), ma.settings_for(plan)


# ----------------------------------------------------------------------------- light import


def test_import_does_not_load_torch():
    code = "import sys, finetune.memory; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# ----------------------------------------------------------------------------- components by hand


def test_shape_and_parameter_census(tiny):
    sh, c, _ = parts(tiny, method="full")
    assert (sh.hidden, sh.intermediate, sh.layers, sh.heads, sh.kv_heads, sh.vocab) == (H, MLP, LAYERS, HEADS, KV, V)
    assert c.total == PARAMS == 98624
    assert sum(c.trainable) == PARAMS
    assert sorted(c.quantized) == sorted(LAYER_LINEARS * LAYERS)  # tied embedding / head stays unquantised


def test_weights_lora_gradients_optimizer(tiny):
    _, full, s_full = parts(tiny, method="full")
    assert ma.weights_bytes(full, s_full) == 4 * PARAMS
    assert ma.gradients_bytes(full, s_full) == 4 * PARAMS
    assert ma.optimizer_bytes(full, s_full) == 8 * PARAMS + 4 * len(full.trainable)
    _, lora, s_lora = parts(tiny, method="lora", lora_r=8)
    assert sum(lora.trainable) == LAYERS * LORA_PER_LAYER == 16384
    assert ma.lora_bytes(lora, s_lora) == 4 * 16384
    assert ma.gradients_bytes(lora, s_lora) == 4 * 16384
    assert ma.optimizer_bytes(lora, s_lora) == 8 * 16384 + 4 * 28  # 7 modules x (A, B) x 2 layers step counters
    # LoRA on a GPU keeps a 16-bit base under fp32 adapters
    _, _, s_gpu = parts(tiny, device="cuda", method="lora")
    assert ma.weights_bytes(lora, s_gpu) == 2 * PARAMS


def test_optimizer_variants_by_hand():
    c = ma.Census(total=10100, trainable=[10000, 100])
    s = ma.Settings(optim="adamw_8bit")
    assert ma.optimizer_bytes(c, s) == (2 * 10000 + 8 * math.ceil(10000 / 256)) + 8 * 100  # small tensors stay fp32
    assert ma.optimizer_bytes(c, ma.Settings(optim="paged_adamw_8bit")) == ma.optimizer_bytes(c, s)
    assert ma.optimizer_bytes(c, ma.Settings(optim="sgd")) == 0
    assert ma.optimizer_bytes(c, ma.Settings(optim="sgd"), momentum=True) == 4 * 10100
    assert ma.optimizer_bytes(c, ma.Settings(optim="adamw_torch")) == 8 * 10100 + 4 * 2
    c.no_decay = 100
    assert ma.optimizer_temporaries_bytes(c, ma.Settings(device="cuda")) == 4 * 10000  # foreach: the decay group
    assert ma.optimizer_temporaries_bytes(c, ma.Settings(device="cpu")) == 8 * 10000  # one tensor at a time


def test_qlora_weights_and_quant_constants(tiny):
    _, c, s = parts(tiny, method="qlora")
    quantized = LAYERS * sum(LAYER_LINEARS)
    assert ma.weights_bytes(c, s) == quantized // 2 + 4 * (PARAMS - quantized)
    blocks = [n // 64 for n in LAYER_LINEARS]
    per_linear_dq = [b + 4 * 1 + 256 * 4 + 4 + 64 for b in blocks]  # 8-bit absmax, nested fp32, code books, offset
    assert ma.quant_constants_bytes(c, s) == LAYERS * sum(per_linear_dq) == 16496
    _, c, s = parts(tiny, method="qlora", double_quant=False)
    assert ma.quant_constants_bytes(c, s) == LAYERS * sum(4 * b + 64 for b in blocks) == 5504


def test_activations_by_hand(tiny):
    sh, c, s = parts(tiny, method="full")  # CPU: fp32, sdpa, no dropout
    norms = 2 * (4 * H + 4 + 4 * H)  # fp32 input, 1/rms, x/rms (the norm weight trains)
    attention = 4 * (2 * H + 2 * KV_DIM) + 4 * HEADS  # q, k after RoPE, v, output; log-sum-exp
    mlp = 3 * 4 * MLP  # gate, silu(gate), up
    linear_inputs = 4 * H + 4 * H + 4 * MLP  # q/k/v input, gate/up input, down input (o's is attention's output)
    assert ma.layer_activation_bytes(sh, c, s) == norms + attention + mlp + linear_inputs == 4376
    tokens = 4 * 256
    head = 4 * H + 4 + 8 + 4 * H + 4 * H  # final norm input, 1/rms, ids, x/rms, lm_head input
    assert ma.activations_bytes(sh, c, s) == tokens * (LAYERS * 4376 + head)
    assert ma.logits_loss_bytes(sh, c, s) == 12 * tokens * V
    s_ckpt = ma.settings_for(plan_for(cfg(tiny, method="full", gradient_checkpointing=True), "cpu"))
    assert ma.activations_bytes(sh, c, s_ckpt) == tokens * (LAYERS * 4 * H + head)  # only block inputs kept


def test_lora_dropout_costs_per_adapter(tiny):
    sh, c, s = parts(tiny, method="lora", lora_dropout=0.05)
    _, _, s0 = parts(tiny, method="lora", lora_dropout=0.0)
    adapters_in = 3 * H + H + 2 * H + MLP  # q k v read the normed input, o, gate up, down
    shared_inputs = H + H + MLP  # with no dropout the adapters read inputs that are kept once
    assert ma.layer_activation_bytes(sh, c, s) - ma.layer_activation_bytes(sh, c, s0) == 4 * (
        2 * adapters_in - shared_inputs
    )  # CPU dropout keeps an fp32 noise tensor and its output per adapter


def test_zero_sharding_by_hand():
    c = ma.Census(total=1000, trainable=[1000])
    s = ma.Settings(method="full", half=2, deepspeed=True, zero_stage=1, gpus=4)
    z = ma.zero_split(c, s)
    assert z == {"weights": 2000, "master_weights": 1000, "optimizer": (8 * 1000 + 4) // 4, "gradients": 2000}
    c10 = ma.Census(total=1000, trainable=[100] * 10)
    s3 = ma.Settings(method="full", half=2, deepspeed=True, zero_stage=3, gpus=4, offload_optimizer=True)
    z3 = ma.zero_split(c10, s3)
    assert z3 == {"weights": 2000 // 4 + 2 * 100 * 2, "master_weights": 0, "optimizer": 0, "gradients": 500 + 400}


# ----------------------------------------------------------------------------- replay vs formulas vs a real step


@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
def test_replay_agrees_with_formulas(tiny, method):
    est = memory.estimate(plan_for(cfg(tiny, method=method), "cpu"))
    assert est.method == "traced"
    assert sum(est.components.values()) == est.tensor_bytes
    assert abs(est.analytic_tensor_bytes - est.tensor_bytes) / est.tensor_bytes < 0.05
    assert est.components["weights"] > 0 and est.components["logits_loss"] > 0
    if method == "qlora":
        assert est.components["quant_constants"] == est.sizes["quant_constants"]


@pytest.mark.parametrize("objective", ["sft", "dpo", "kto"])
def test_deep_models_are_extrapolated_exactly(tiny, objective):
    """Two shallow replays give the deep one, also with the preference passes (KL, reference) in the step."""
    from transformers import LlamaConfig

    from finetune.memory import trace as mt

    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=7,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
    )
    plan = plan_for(cfg(tiny, method="lora", max_seq_length=64, objective=objective), device="cpu")
    deep, shallow = mt.trace_once(config, plan), mt.trace(config, plan)
    assert shallow.layers_traced < 7
    assert abs(shallow.peak - deep.peak) <= 0.001 * deep.peak


@pytest.mark.parametrize("packing", [False, True])
def test_estimate_matches_a_measured_cpu_step(tiny, packing):
    """Real Trainer steps as the engine runs them, live tensor storages counted: within 3%, never under 2%. Packed:
    the data's longest rows in one packed micro batch (tests/helpers.measured_peak)."""
    from tests.helpers import measured_peak

    config = cfg(
        tiny, method="lora", per_device_train_batch_size=2, max_seq_length=128, max_steps=2, eval_split="",
        packing=packing,
    )  # fmt: skip
    measured = measured_peak(config)
    est = memory.estimate(plan_for(config, "cpu"))
    err = (est.tensor_bytes - measured) / measured
    assert -0.02 <= err <= 0.03, (est.tensor_bytes, measured)


class _NoHook:
    """Stands in for a gradient-hook handle on a frozen parameter (MemTracker hooks every parameter, and torch
    refuses a hook on one that needs no gradient)."""

    def remove(self) -> None:
        pass


@pytest.mark.parametrize("method", ["full", "lora"])
def test_estimate_matches_torchs_own_memtracker_on_a_real_step(tiny, method):
    """An independent measurement: torch's MemTracker (torch.distributed._tools.mem_tracker) follows the second of
    two real Trainer steps, as the engine configures them, with its own categories. The estimate's tensor peak agrees
    within 1 %, its optimizer state exactly and its weights (+ LoRA) to the buffers' few bytes."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker
    from transformers import Trainer, TrainerCallback, default_data_collator

    from finetune.engines.hf_trainer import training_arguments
    from finetune.model import loading

    class TrackSecondStep(TrainerCallback):
        tracker: MemTracker | None = None

        def on_step_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
            if state.global_step == 1:  # step 1 has created the optimizer state: step 2 is the steady-state step
                self.tracker = MemTracker()
                for p in model.parameters():
                    if not p.requires_grad:
                        self.tracker._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())
                self.tracker.track_external(model, optimizer)
                self.tracker.__enter__()

        def on_step_end(self, args, state, control, **kwargs):
            if self.tracker is not None and state.global_step == 2:
                self.tracker.__exit__(None, None, None)

    config = cfg(
        tiny, method=method, per_device_train_batch_size=2, max_seq_length=128, max_steps=2, eval_split="",
        packing=False,  # full rows of random ids, as measured here
    )  # fmt: skip
    model = loading.load_model(plan_for(config, "cpu"))
    ids = torch.randint(3, 300, (4, 128), generator=torch.Generator().manual_seed(0))
    rows = [{"input_ids": r, "attention_mask": torch.ones_like(r), "labels": r.clone()} for r in ids]
    track = TrackSecondStep()
    with tempfile.TemporaryDirectory() as out:
        args = training_arguments(plan_for(config, "cpu"), Path(out), has_eval=False)
        args.logging_strategy, args.save_strategy = "no", "no"
        trainer = Trainer(
            model=model, args=args, train_dataset=rows, data_collator=default_data_collator, callbacks=[track]
        )
        trainer.train()
    peak = {
        str(k.value) if hasattr(k, "value") else k: v
        for k, v in track.tracker.get_tracker_snapshot("peak")[torch.device("cpu")].items()
    }
    est = memory.estimate(plan_for(config, "cpu"))
    assert abs(est.tensor_bytes - peak["Total"]) <= 0.01 * peak["Total"], (est.tensor_bytes, peak)
    assert est.components["optimizer"] == peak["Optstate"], (est.components, peak)
    weights = est.components["weights"] + est.components["lora"]
    assert 0 <= weights - peak["Parameter"] <= peak["Buffer"] + 1024, (est.components, peak)


# ----------------------------------------------------------------------------- GPU figures, fit and advice


def test_gpu_estimate_adds_overheads_and_verdict(tiny):
    est = memory.estimate(plan_for(cfg(tiny, method="lora"), "cuda"), gpu_gib=80)
    assert est.overheads["cuda_context"] > 0 and est.overheads["allocator"] > 0
    assert est.total_bytes == est.tensor_bytes + sum(est.overheads.values())
    assert est.fits is True and est.headroom_bytes == int(80 * memory.GiB) - est.total_bytes and est.advice == []
    cpu = memory.estimate(plan_for(cfg(tiny, method="lora"), "cpu"))
    assert cpu.overheads == {} and cpu.fits is None and cpu.total_bytes == cpu.tensor_bytes
    assert set(cpu.comparisons) == {"rule_of_thumb", "accelerate"}
    assert all(v > 0 for v in memory.GPU_CARDS.values()) and any("T4" in k for k in memory.GPU_CARDS)


def test_advice_keeps_effective_batch_and_fits(tiny):
    config = cfg(tiny, method="full", per_device_train_batch_size=8, gradient_accumulation_steps=2, max_seq_length=512)
    base = memory.estimate(plan_for(config, "cpu"))
    capacity_gib = 0.6 * base.total_bytes / memory.GiB
    est = memory.estimate(plan_for(config, "cpu"), gpu_gib=capacity_gib)
    assert est.fits is False and est.advice
    order = [(not a.keeps_data, a.score) for a in est.advice]
    assert order == sorted(order)  # options that keep the data whole first, then the cheapest (memory/advice.py)
    for a in est.advice:
        new = config.replace(**a.changes)
        assert new.effective_batch_size == config.effective_batch_size
        assert a.new_total_bytes < base.total_bytes and a.fits
        assert a.cost and a.title
    first = est.advice[0]
    exact = memory.estimate(plan_for(config.replace(**first.changes), "cpu"))
    assert first.new_total_bytes == exact.total_bytes  # the top suggestion is replayed, not guessed


def test_advice_text_names_a_change(tiny):
    text = memory.advice_text(plan_for(cfg(tiny, method="full"), "cpu"))
    assert text.startswith("Out of memory.") and "Change first:" in text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"device": "tpu"}, "device: 'tpu' is not allowed; choose cpu or cuda"),
        ({"gpus": 0}, "gpus: 0 must be a whole number >= 1"),
        ({"gpu_gib": -1}, "gpu_gib: -1 must be a positive number of GiB"),
    ],
)
def test_bad_arguments_are_user_errors_naming_the_argument(tiny, kwargs, message):
    plan_kwargs = {"device": kwargs.get("device", "cpu"), "world_size": kwargs.get("gpus", 1)}
    with pytest.raises(UserError) as caught:
        memory.estimate(plan_for(cfg(tiny), **plan_kwargs), gpu_gib=kwargs.get("gpu_gib"))
    assert str(caught.value) == message and caught.value.field == next(iter(kwargs))


# ----------------------------------------------------------------------------- command line


def run(argv: list[str]) -> int:
    """Parse like `python -m finetune` does, with only the memory sub-commands (propose, estimate)."""
    parser = argparse.ArgumentParser(prog="finetune")
    cli_memory.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_json_has_the_keys(tiny, capsys):
    assert run(["estimate", "--set", f"model={tiny}", "--set", "method=qlora", "--device", "cpu", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"components", "tensor_bytes", "total_bytes", "advice", "overheads", "comparisons"} <= set(data)
    assert data["components"]["weights"] > 0 and data["tensor_bytes"] == sum(data["components"].values())


def test_cli_text_with_a_card_and_config_file(tiny, capsys, tmp_path):
    path = tmp_path / "run.yaml"
    cfg(tiny, method="full", max_seq_length=512).save(path)
    assert run(["estimate", "--config", str(path), "--gpu-gib", "t4"]) == 0
    out = capsys.readouterr().out
    assert "On 14.7 GiB: fits" in out and "cuda_context" in out and "total" in out
    assert run(["estimate", "--config", str(path), "--gpu-gib", "0.25"]) == 0
    assert "does NOT fit" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpus", "0"], "--gpus: must be 1 or more"),
        (["--gpu-gib", "lots"], "--gpu-gib: 'lots' is not a number of GiB or a known card (RTX 4060 (8 GB)"),
        (["--device", "tpu"], "--device: 'tpu' is not allowed; choose cpu or cuda"),
        (["--set", "no_such_key=1"], "--set: no_such_key: unknown config key; valid keys: model,"),
        (["--config", "nope.yml"], "--config: file not found: nope.yml"),
    ],
)
def test_cli_bad_input_is_one_user_error_naming_the_option(tiny, argv, message):
    with pytest.raises(UserError) as caught:
        run(["estimate", "--set", f"model={tiny}", *argv])
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value), str(caught.value)
