"""The generated DeepSpeed JSON, the refused combinations and the launch commands (no training: fast)."""

from __future__ import annotations

import json
import shlex

import pytest

from finetune.config import TrainConfig
from finetune.engines.deepspeed_config import (
    SCHEDULERS,
    deepspeed_config,
    trainer_deepspeed_config,
    use_torch_adam,
    write_ds_config,
)
from finetune.errors import ConfigError, UserError
from finetune.plan import plan_for
from finetune.runs.launch import launch_commands


def cfg(**values) -> TrainConfig:
    return TrainConfig(model="m", dataset="d.jsonl", **values)


def plan(device: str = "cpu", world: int = 1, **values):
    """The plan of `cfg(**values)` on `device` with `world` processes: what the DeepSpeed config is built from."""
    return plan_for(cfg(**values), device=device, world_size=world)


@pytest.mark.parametrize("micro, accumulation, world", [(1, 1, 1), (4, 2, 1), (2, 3, 4), (8, 1, 16)])
def test_train_batch_size_is_micro_times_accumulation_times_world(micro, accumulation, world):
    ds = deepspeed_config(
        plan(world=world, zero_stage=2, per_device_train_batch_size=micro, gradient_accumulation_steps=accumulation)
    )
    assert ds["train_batch_size"] == micro * accumulation * world
    assert ds["train_micro_batch_size_per_gpu"] == micro
    assert ds["gradient_accumulation_steps"] == accumulation


def test_optimizer_clipping_and_precision_sections():
    values = {"zero_stage": 1, "learning_rate": 2e-4, "weight_decay": 0.1, "max_grad_norm": 0.5}
    ds = deepspeed_config(plan("cuda", precision="fp16", **values), torch_adam=False)
    assert ds["optimizer"] == {
        "type": "AdamW",
        "params": {"lr": 2e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.1},
    }
    assert ds["gradient_clipping"] == 0.5
    # fp16 with dynamic loss scaling (loss_scale 0 = dynamic), and no bf16 section.
    assert ds["fp16"] == {
        "enabled": True,
        "loss_scale": 0,
        "initial_scale_power": 16,
        "loss_scale_window": 1000,
        "hysteresis": 2,
        "min_loss_scale": 1,
    }
    assert "bf16" not in ds
    bf16 = deepspeed_config(plan("cuda", precision="bf16", **values), torch_adam=False)
    assert bf16["bf16"] == {"enabled": True} and "fp16" not in bf16
    cpu = plan("cpu", precision="bf16", **values)  # a CPU plan is fp32 whatever the config asks
    fp32 = deepspeed_config(cpu)
    assert "fp16" not in fp32 and "bf16" not in fp32
    # On the CPU DeepSpeed steps torch's AdamW instead of compiling its C++ Adam.
    assert fp32["optimizer"]["params"]["torch_adam"] is True and use_torch_adam(cpu)


def test_fp16_and_bf16_together_cannot_be_expressed():
    """One `precision` field: a config asking for both (the Trainer's `fp16: true` + `bf16: true` keys, or both in
    `precision`) is refused in one line naming the key; each precision turns on exactly its own DeepSpeed section."""
    for text, field in (("fp16: true\nbf16: true\n", "fp16"), ("precision: fp16,bf16\n", "precision")):
        with pytest.raises(ConfigError) as refused:
            TrainConfig.from_yaml("model: m\ndataset: d.jsonl\n" + text)
        assert refused.value.field == field and str(refused.value).startswith(f"{field}: ")
        assert "\n" not in str(refused.value)
    for precision, sections in (("fp32", set()), ("fp16", {"fp16"}), ("bf16", {"bf16"})):
        ds = deepspeed_config(plan("cuda", zero_stage=2, precision=precision), torch_adam=False)
        assert {k for k in ("fp16", "bf16") if ds.get(k, {}).get("enabled")} == sections, (precision, ds)


@pytest.mark.parametrize(
    "scheduler, kind, warmup, expected",
    [
        ("constant", "WarmupLR", 5, {"warmup_min_lr": 1e-3, "warmup_max_lr": 1e-3, "warmup_num_steps": 1}),
        ("constant_with_warmup", "WarmupLR", 5, {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-3, "warmup_num_steps": 5}),
        ("linear", "WarmupDecayLR", 3, {"warmup_min_lr": 0.0, "total_num_steps": 50, "warmup_num_steps": 3}),
        ("linear", "WarmupDecayLR", 0, {"warmup_min_lr": 1e-3, "warmup_max_lr": 1e-3}),
        ("cosine", "WarmupCosineLR", 4, {"total_num_steps": 50, "warmup_min_ratio": 0.0, "warmup_num_steps": 4}),
    ],
)
def test_scheduler_follows_lr_scheduler_type(scheduler, kind, warmup, expected):
    values = {"lr_scheduler_type": scheduler, "warmup_steps": warmup, "learning_rate": 1e-3, "max_steps": 50}
    section = deepspeed_config(plan(backend="deepspeed", **values))["scheduler"]
    assert section["type"] == kind and section["params"]["warmup_type"] == "linear"
    assert expected.items() <= section["params"].items()


def test_zero_sections_by_stage_with_offload_and_buckets():
    z0 = deepspeed_config(plan(backend="deepspeed"))["zero_optimization"]
    assert z0 == {"stage": 0}

    z2 = deepspeed_config(plan("cuda", zero_stage=2, offload_optimizer="cpu"), hidden_size=1024, torch_adam=False)[
        "zero_optimization"
    ]
    assert z2["stage"] == 2 and z2["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert z2["overlap_comm"] is True and z2["contiguous_gradients"] is True
    assert z2["reduce_bucket_size"] == 1024 * 1024 and z2["allgather_bucket_size"] == 1024 * 1024
    assert "offload_param" not in z2 and "stage3_gather_16bit_weights_on_model_save" not in z2

    c3 = {"zero_stage": 3, "offload_optimizer": "nvme", "offload_param": "nvme", "nvme_path": "/local_nvme"}
    ds3 = deepspeed_config(plan("cuda", **c3), hidden_size=1024, torch_adam=False)
    z3 = ds3["zero_optimization"]
    assert z3["offload_optimizer"] == {"device": "nvme", "pin_memory": True, "nvme_path": "/local_nvme"}
    assert z3["offload_param"] == {"device": "nvme", "pin_memory": True, "nvme_path": "/local_nvme"}
    assert z3["stage3_gather_16bit_weights_on_model_save"] is True  # else ZeRO-3 saves no usable weights
    assert z3["stage3_prefetch_bucket_size"] == int(0.9 * 1024 * 1024)
    assert z3["stage3_param_persistence_threshold"] == 10 * 1024
    assert ds3["aio"]["block_size"] > 0  # NVMe offload needs the async I/O settings

    # Without a GPU there is no page-locked memory to use nor streams to overlap.
    cpu = deepspeed_config(plan(zero_stage=3, offload_param="cpu"))["zero_optimization"]
    assert cpu["offload_param"] == {"device": "cpu", "pin_memory": False} and cpu["overlap_comm"] is False


def test_the_config_is_the_plans_device_precision_and_world_never_a_probe_of_this_machine(monkeypatch):
    """A GPU plan made on this CPU machine (an estimate's what-if, an exported config) gets the GPU's settings; a CPU
    plan the CPU's; torch is never asked whether a GPU is here."""
    import deepspeed.git_version_info  # noqa: F401 - what `use_torch_adam` reads, imported before the probe is barred
    import torch
    import torch.utils.cpp_extension  # noqa: F401

    def probe() -> bool:
        raise AssertionError("the DeepSpeed config asked torch whether a GPU is here")

    monkeypatch.setattr(torch.cuda, "is_available", probe)
    values = {"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu", "per_device_train_batch_size": 2}
    gpu, cpu = plan("cuda", world=8, **values), plan("cpu", world=2, **values)
    on_gpu, on_cpu = deepspeed_config(gpu), deepspeed_config(cpu)
    assert on_gpu["bf16"] == {"enabled": True} and "bf16" not in on_cpu  # precision auto: bf16 on the GPU, CPU fp32
    assert on_gpu["train_batch_size"] == 2 * 8 and on_cpu["train_batch_size"] == 2 * 2
    zero_gpu, zero_cpu = on_gpu["zero_optimization"], on_cpu["zero_optimization"]
    assert zero_gpu["overlap_comm"] is True and zero_gpu["offload_param"]["pin_memory"] is True
    assert zero_cpu["overlap_comm"] is False and zero_cpu["offload_optimizer"]["pin_memory"] is False
    assert on_cpu["optimizer"]["params"]["torch_adam"] is True
    assert trainer_deepspeed_config(gpu)["zero_optimization"]["overlap_comm"] is True
    assert trainer_deepspeed_config(cpu)["zero_optimization"]["overlap_comm"] is False


def test_generated_config_is_accepted_by_deepspeed():
    from deepspeed.runtime.config import DeepSpeedConfig

    values = {"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu", "gradient_accumulation_steps": 2}
    parsed = DeepSpeedConfig(deepspeed_config(plan(**values), hidden_size=64))
    assert parsed.train_batch_size == 8 and parsed.gradient_accumulation_steps == 2
    assert parsed.zero_optimization_stage == 3 and parsed.zero_config.gather_16bit_weights_on_model_save


def test_trainer_config_uses_auto_where_trainer_fills_values():
    ds = trainer_deepspeed_config(plan(zero_stage=3, offload_optimizer="cpu", offload_param="cpu"))
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        assert ds[key] == "auto"
    assert ds["gradient_clipping"] == "auto" and ds["fp16"]["enabled"] == "auto" and ds["bf16"]["enabled"] == "auto"
    assert {k: v for k, v in ds["optimizer"]["params"].items() if k != "torch_adam"} == dict.fromkeys(
        ("lr", "betas", "eps", "weight_decay"), "auto"
    )
    assert "scheduler" not in ds  # Trainer's own lr_scheduler_type applies
    zero = ds["zero_optimization"]
    assert zero["reduce_bucket_size"] == zero["stage3_prefetch_bucket_size"] == "auto"
    assert zero["stage3_gather_16bit_weights_on_model_save"] is True
    # Another optimizer (no offload) is created by Trainer, so the config has no optimizer section.
    assert "optimizer" not in trainer_deepspeed_config(plan(zero_stage=2, optim="adamw_8bit"))


def test_ds_config_json_is_written(tmp_path):
    ds = deepspeed_config(plan(world=2, zero_stage=2))
    path = write_ds_config(ds, tmp_path)
    assert path.name == "ds_config.json" and json.loads(path.read_text()) == ds


REFUSED = [
    ({"zero_stage": 4}, "zero_stage: 4 is out of range; allowed: 0 to 3"),
    ({"zero_stage": -1}, "zero_stage: -1 is out of range; allowed: 0 to 3"),
    ({"zero_stage": 2, "offload_param": "cpu"}, "offload_param: 'cpu' needs zero_stage: 3"),
    ({"offload_optimizer": "cpu"}, "offload_optimizer: 'cpu' needs zero_stage 1, 2 or 3"),
    ({"zero_stage": 3, "offload_param": "nvme"}, "nvme_path: NVMe offload needs nvme_path"),
    ({"zero_stage": 3, "offload_optimizer": "nvme"}, "nvme_path: NVMe offload needs nvme_path"),
    (
        {"zero_stage": 2, "offload_optimizer": "nvme", "nvme_path": "/nvme"},
        "offload_optimizer: 'nvme' needs zero_stage: 3",
    ),
    ({"zero_stage": 2, "offload_optimizer": "cpu", "optim": "adamw_8bit"}, "optim: 'adamw_8bit' cannot be offloaded"),
    ({"backend": "deepspeed", "optim": "sgd"}, "optim: 'sgd' is not available with backend: deepspeed"),
    ({"backend": "deepspeed", "method": "qlora"}, "method: qlora is not supported with backend: deepspeed"),
    ({"zero_stage": 3, "method": "qlora"}, "zero_stage: ZeRO-3 cannot shard 4-bit QLoRA weights"),
    (
        {"backend": "deepspeed", "lr_scheduler_type": "polynomial"},
        "lr_scheduler_type: 'polynomial' is not available with backend: deepspeed",
    ),
    ({"backend": "megatron"}, "backend: 'megatron' is not allowed"),
    ({"offload_param": "disk"}, "offload_param: 'disk' is not allowed"),
]


@pytest.mark.parametrize(
    "values, message", REFUSED, ids=[m.split(":")[0] + "-" + str(i) for i, (_, m) in enumerate(REFUSED)]
)
def test_each_contradiction_is_refused_with_one_clear_error(values, message):
    with pytest.raises(ConfigError) as info:
        cfg(**values)
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value) and info.value.field == str(info.value).split(":")[0]


def test_every_deepspeed_scheduler_name_is_a_config_choice():
    from finetune.config import SCHEDULERS as CHOICES

    assert set(SCHEDULERS) <= set(CHOICES)


# --------------------------------------------------------------------------- launch commands
def test_launch_commands_one_machine():
    c = cfg(backend="deepspeed", zero_stage=2, output_dir="/runs/a")
    commands = launch_commands(plan_for(c), "conf/run.yaml", gpus=4)
    assert commands["single"] == "python -m finetune train --config conf/run.yaml"
    assert commands["torchrun"] == ("torchrun --standalone --nproc_per_node 4 -m finetune train --config conf/run.yaml")
    assert commands["deepspeed"] == (
        "deepspeed --num_gpus 4 --no_local_rank --module finetune train --config conf/run.yaml"
    )
    assert "multinode" not in commands


def test_launch_commands_fix_the_output_dir_for_several_processes_and_quote_paths(studio_home):
    c = cfg(zero_stage=0)  # plain Trainer: no deepspeed launcher command
    commands = launch_commands(plan_for(c), "my runs/run.yaml", gpus=2, sets=["learning_rate=1e-4"])
    assert "deepspeed" not in commands
    argv = shlex.split(commands["torchrun"])
    assert argv[argv.index("--config") + 1] == "my runs/run.yaml"
    assert "learning_rate=1e-4" in argv
    output = [a for a in argv if a.startswith("output_dir=")]
    assert len(output) == 1 and output[0].startswith(f"output_dir={studio_home / 'runs'}")
    assert "output_dir" not in commands["single"]  # one process picks its own run folder


def test_launch_commands_several_machines():
    c = cfg(backend="deepspeed", zero_stage=3, output_dir="/shared/run1")
    commands = launch_commands(plan_for(c), "run.yaml", gpus=8, nodes=2, hostfile="hosts.txt", master_addr="10.0.0.1")
    assert commands["multinode"] == (
        "deepspeed --hostfile hosts.txt --num_nodes 2 --num_gpus 8 --master_port 29500 --master_addr 10.0.0.1 "
        "--no_local_rank --module finetune train --config run.yaml"
    )
    assert commands["multinode_torchrun"] == (
        "torchrun --nnodes 2 --nproc_per_node 8 --node_rank $NODE_RANK --master_addr 10.0.0.1 --master_port 29500 "
        "-m finetune train --config run.yaml"
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [({"gpus": 0}, "--gpus: 0 must be"), ({"nodes": 0}, "--nodes: 0 must be"), ({"master_port": 0}, "--master-port")],
)
def test_launch_commands_refuse_bad_counts(kwargs, message):
    with pytest.raises(UserError, match=message):
        launch_commands(plan_for(cfg()), **kwargs)


def test_launch_command_cli_prints_commands_and_writes_the_ds_config(tmp_path, capsys):
    from finetune.cli import main

    path = tmp_path / "run.yaml"
    cfg(backend="deepspeed", zero_stage=3, offload_param="cpu", per_device_train_batch_size=2).save(path)
    out_json = tmp_path / "exported.json"
    argv = ["launch-command", "--config", str(path), "--gpus", "4", "--nodes", "2", "--ds-config", str(out_json)]
    assert main([*argv, "--set", "gradient_accumulation_steps=3"]) == 0
    printed = capsys.readouterr().out
    assert f"torchrun --standalone --nproc_per_node 4 -m finetune train --config {path}" in printed
    assert "--set gradient_accumulation_steps=3" in printed and "deepspeed --hostfile /job/hostfile" in printed
    exported = json.loads(out_json.read_text())
    assert (
        exported["train_batch_size"] == 2 * 3 * 8 and exported["zero_optimization"]["offload_param"]["device"] == "cpu"
    )
    # Planned for the GPUs it launches on, wherever the command is printed: bf16 for precision auto, page-locked
    # host memory for the offload, communication overlapped.
    assert exported["bf16"] == {"enabled": True} and "fp16" not in exported
    assert exported["zero_optimization"]["offload_param"]["pin_memory"] is True
    assert exported["zero_optimization"]["overlap_comm"] is True

    assert main(["launch-command", "--config", str(path), "--gpus", "-2"]) == 2
    assert capsys.readouterr().err.strip() == "error: --gpus: -2 must be a whole number ≥ 1"
