"""The fast path on a GPU: the Liger switch, a Trainer that does not stall a GPU every step, no generation of
step-0 answers already known, and the training process's CUDA allocator setting.

On this CPU machine: the switch's decision and its refusals (one line naming liger_kernel, before a run directory
exists), the Trainer arguments it produces, that Liger's module patches are undone after a run, and the loss curve's
one-second cadence on a GPU. Marked `gpu` (skipped here): Liger on vs off on a small Llama trains to the same loss
with less peak memory, and our model-family list agrees with liger-kernel's own table.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from finetune.config import EMBEDDED_MODEL, TrainConfig
from finetune.errors import ConfigError
from finetune.plan import LIGER_MODEL_TYPES, liger_model_type, plan_for, uses_liger
from finetune.runs.manager import RunManager
from tests.helpers import tiny_config, write_jsonl


def model_dir_of_type(tmp_path: Path, model_type: str) -> Path:
    """A folder whose config.json names `model_type` (all the family check reads)."""
    path = tmp_path / f"model-{model_type}"
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": model_type}), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- the decision


def test_model_family_is_read_from_the_config_file_without_loading(tiny_model_dir, tmp_path):
    assert liger_model_type(str(tiny_model_dir)) == "llama"
    assert liger_model_type(EMBEDDED_MODEL) == "llama"  # SmolLM2
    assert liger_model_type(str(model_dir_of_type(tmp_path, "gpt2"))) == "gpt2"
    assert liger_model_type(str(tmp_path / "missing")) is None
    assert liger_model_type("nobody/not-in-the-cache") is None  # a Hub id whose config was never fetched


def test_a_cpu_run_never_uses_liger_whatever_the_switch_says(tiny_model_dir):
    for switch in ("auto", "on", "off"):
        config = tiny_config(tiny_model_dir, liger_kernel=switch)
        assert plan_for(config, device="cpu").liger is False, switch


def test_on_a_gpu_auto_needs_the_package_and_on_plans_it_for_supported_causal_lms(tiny_model_dir, tmp_path):
    import importlib.util

    installed = importlib.util.find_spec("liger_kernel") is not None
    llama = tiny_config(tiny_model_dir)
    assert plan_for(llama, device="cuda").liger is installed  # auto: where it can run here
    assert plan_for(llama.replace(liger_kernel="on"), device="cuda").liger is True  # the GPU run installs it
    assert plan_for(llama.replace(liger_kernel="off"), device="cuda").liger is False
    gpt2 = llama.replace(model=str(model_dir_of_type(tmp_path, "gpt2")), liger_kernel="on")
    assert plan_for(gpt2, device="cuda").liger is False  # a family Liger does not patch
    classifier = llama.replace(task="sequence_classification", liger_kernel="on")
    assert plan_for(classifier, device="cuda").liger is False  # its fused loss is a language-model head's
    assert plan_for(llama.replace(objective="dpo", liger_kernel="on"), device="cuda").liger is False  # SFT only
    zero2 = llama.replace(zero_stage=2, liger_kernel="on")
    assert plan_for(zero2, device="cuda").liger is True  # the Trainer with ZeRO applies it
    assert plan_for(zero2.replace(backend="deepspeed"), device="cuda").liger is False  # the explicit loop does not


@pytest.mark.parametrize(
    ("device", "changes", "words"),
    [
        ("cpu", {}, "need a CUDA GPU"),
        ("cuda", {"task": "sequence_classification"}, "serve causal_lm only"),
        ("cuda", {"objective": "dpo"}, "the dpo trainer does not use Liger's kernels"),
        ("cuda", {"backend": "deepspeed", "zero_stage": 2}, "the DeepSpeed engine loop does not apply Liger"),
        ("cuda", {"model": "gpt2-dir"}, "model family ('gpt2') is not one Liger patches"),
    ],
)
def test_on_where_liger_cannot_run_is_one_line_naming_the_field(tiny_model_dir, tmp_path, device, changes, words):
    if changes.get("model") == "gpt2-dir":
        changes = {"model": str(model_dir_of_type(tmp_path, "gpt2"))}
    config = tiny_config(tiny_model_dir, liger_kernel="on", **changes)
    with pytest.raises(ConfigError) as info:
        uses_liger(config, device, strict=True)
    assert info.value.field == "liger_kernel"
    message = str(info.value)
    assert message.startswith("liger_kernel: on, but ") and words in message and "\n" not in message
    assert "choose auto or off" in message


def test_on_with_the_package_missing_names_how_to_install_it(tiny_model_dir):
    import importlib.util

    if importlib.util.find_spec("liger_kernel") is not None:
        pytest.skip("liger-kernel is installed here")
    with pytest.raises(ConfigError, match="liger-kernel package is not installed .*requirements-gpu.txt"):
        uses_liger(tiny_config(tiny_model_dir, liger_kernel="on"), "cuda", strict=True)


def test_starting_a_run_with_liger_on_on_a_cpu_is_refused_before_a_run_directory_exists(tiny_model_dir, studio_home):
    config = tiny_config(tiny_model_dir, liger_kernel="on", output_dir=str(studio_home / "runs" / "liger-on"))
    with pytest.raises(ConfigError) as info:
        RunManager().start(config, background=False)
    assert info.value.field == "liger_kernel"
    assert not (studio_home / "runs" / "liger-on").exists()


def test_the_cli_refuses_liger_on_on_a_cpu_in_one_line(tiny_model_dir, studio_home, capsys):
    from finetune.cli import main

    code = main(["train", "--set", f"model={tiny_model_dir}", "--set", "liger_kernel=on", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: liger_kernel: on, but ") and "\n" not in err, err
    assert not (studio_home / "runs").exists() or not any((studio_home / "runs").iterdir())


def test_liger_auto_and_off_start_normally_on_a_cpu(tiny_model_dir):
    for switch in ("auto", "off"):
        RunManager().check_start(tiny_config(tiny_model_dir, liger_kernel=switch))  # no refusal


# ----------------------------------------------------------------------------- the Trainer side


def test_the_trainer_gets_liger_only_from_the_plan_and_cpu_arguments_stay_as_they_were(tiny_model_dir, tmp_path):
    from finetune.engines.hf_trainer import training_arguments

    config = tiny_config(tiny_model_dir)
    plain = training_arguments(plan_for(config, device="cpu"), tmp_path / "a", has_eval=False)
    assert plain.use_liger_kernel is False
    assert plain.logging_nan_inf_filter is True  # a CPU has no device to stall: Trainer's default filter stays
    assert plain.include_num_input_tokens_seen == "non_padding"
    liger = dataclasses.replace(plan_for(config, device="cpu"), liger=True)
    assert training_arguments(liger, tmp_path / "b", has_eval=False).use_liger_kernel is True


def test_liger_patches_of_the_model_module_are_undone_after_the_run(tiny_model_dir):
    """Liger replaces module-level names (RMSNorm and MLP classes, the rotary function); after the run a model built
    in the same process (liger_kernel off, or on a CPU) must get plain PyTorch again."""
    from transformers import AutoModelForCausalLM
    from transformers.models.llama import modeling_llama

    from finetune.engines.hf_trainer import liger_patches_undone

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    norm, rotary = modeling_llama.LlamaRMSNorm, modeling_llama.apply_rotary_pos_emb
    with liger_patches_undone(model, liger=True):
        modeling_llama.LlamaRMSNorm = type("StandInNorm", (norm,), {})  # what liger's apply function does
        modeling_llama.apply_rotary_pos_emb = lambda *a, **k: None
        modeling_llama.added_by_a_patch = True
    assert modeling_llama.LlamaRMSNorm is norm and modeling_llama.apply_rotary_pos_emb is rotary
    assert not hasattr(modeling_llama, "added_by_a_patch")
    fresh = AutoModelForCausalLM.from_config(model.config)
    assert type(fresh.model.norm) is norm


def test_the_loss_curve_keeps_a_point_a_second_on_a_gpu_and_every_step_on_a_cpu(tiny_model_dir, tmp_path):
    """On a GPU each logged loss is a host-device sync: after the first steps, points at most once a second (each the
    mean of its window), the last step always. A CPU keeps every step (the tests compare per-step losses)."""
    from transformers import TrainerControl, TrainerState

    from finetune.engines.hf_trainer import GPU_LOG_EVERY_S, GPU_LOG_FIRST_STEPS, ProgressCallback
    from finetune.runs.progress import Progress
    from finetune.runs.rundir import RunDir

    every = 0.1  # the cadence under test, shortened so the test takes about 2 s

    def logged_steps(device: str, step_seconds: float, max_steps: int = 30, world_size: int = 1) -> list[int]:
        run = RunDir(tmp_path / f"run-{device}-{step_seconds}-{max_steps}-{world_size}")
        run.path.mkdir()
        plan = SimpleNamespace(device=device, world_size=world_size)
        callback = ProgressCallback(Progress(run, "r"), SimpleNamespace(plan=plan, prompts=[], tokenizer=None))
        cadence = device == "cuda" and world_size == 1
        assert callback.log_every_s == (GPU_LOG_EVERY_S if cadence else 0.0)
        if cadence:
            callback.log_every_s = every
        state, logged = TrainerState(max_steps=max_steps), []
        for step in range(1, max_steps + 1):
            state.global_step = step
            control = TrainerControl(should_log=True)  # logging_steps 1: Trainer's flow asks for every step
            callback.on_step_end(None, state, control)
            if control.should_log:
                logged.append(step)
            time.sleep(step_seconds)
        return logged

    assert GPU_LOG_EVERY_S == 1.0 and GPU_LOG_FIRST_STEPS == 10
    assert logged_steps("cpu", 0.0) == list(range(1, 31))
    # Several GPU processes: each point gathers the loss from every rank, so no rank may skip one by its own clock.
    assert logged_steps("cuda", 0.0, world_size=2) == list(range(1, 31))
    fast = logged_steps("cuda", every / 8)  # 8 steps per cadence
    first, middle = fast[:10], fast[10:-1]
    assert first == list(range(1, 11)) and fast[-1] == 30 and 2 <= len(middle) <= 4, fast
    assert logged_steps("cuda", 0.0, max_steps=10) == list(range(1, 11))  # a short run keeps its whole curve
    slow = logged_steps("cuda", every * 1.1, max_steps=14)  # steps slower than the cadence: every one
    assert slow == list(range(1, 15))


# ----------------------------------------------------------------------------- a run's fixed costs


def test_step0_answers_are_reused_while_the_base_and_its_settings_stay_the_same(tiny_model_dir, monkeypatch):
    """At step 0 the model is the base (the adapter starts as the identity): its answers are generated once and the
    next run shows the same ones without generating; a changed base file generates them again."""
    import os

    from finetune.engines import hf_trainer
    from finetune.runs.rundir import RunDir

    calls: list[int] = []
    generate = hf_trainer.generate_answers

    def counting(model, tokenizer, prompts, **kwargs):
        calls.append(len(prompts))
        return generate(model, tokenizer, prompts, **kwargs)

    monkeypatch.setattr(hf_trainer, "generate_answers", counting)

    def step0_answers() -> list[dict]:
        state = RunManager().start(tiny_config(tiny_model_dir, max_steps=1, save_steps=10), background=False)
        assert state.status == "completed", state.error
        (event,) = [e for e in RunDir(Path(state.run_dir)).read_events(("samples",)) if e["step"] == 0]
        return event["samples"]

    first = step0_answers()
    assert len(calls) == 1 and first
    assert step0_answers() == first and len(calls) == 1  # the second run did not generate
    weights = next(tiny_model_dir.glob("*.safetensors"))
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert step0_answers() == first and len(calls) == 2  # a base file changed: generated again (same weights here)


def test_step0_answers_are_not_reused_where_step_0_is_not_the_base(tiny_model_dir):
    from finetune.engines.hf_trainer import step0_answers_path

    config = tiny_config(tiny_model_dir)
    prompts = ["Hello?"]
    assert step0_answers_path(plan_for(config, device="cpu"), prompts) is not None
    assert step0_answers_path(plan_for(config.replace(method="full"), device="cpu"), prompts) is not None
    for changes in ({"init_lora_weights": "pissa"}, {"init_lora_weights": "gaussian"}, {"use_dora": True}):
        assert step0_answers_path(plan_for(config.replace(**changes), device="cpu"), prompts) is None, changes
    assert step0_answers_path(plan_for(config, device="cpu", world_size=2), prompts) is None  # ranks must agree
    key = step0_answers_path(plan_for(config, device="cpu"), prompts)
    assert step0_answers_path(plan_for(config, device="cpu"), ["Other?"]) != key
    assert step0_answers_path(plan_for(config.replace(method="full"), device="cpu"), prompts) != key


# ----------------------------------------------------------------------------- the training process's allocator


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        ({}, "expandable_segments:True"),  # less allocator slack on a GPU
        ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}, "max_split_size_mb:128"),  # the user's own wins
        ({"PYTORCH_ALLOC_CONF": "backend:native"}, None),  # torch's newer name counts as the user's setting too
    ],
)
def test_the_cli_entry_sets_expandable_segments_unless_the_user_configured_the_allocator(preset, expected):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    # finetune/__main__.py's top (what `python -m finetune` runs before main), then the variable it leaves
    code = "import os, runpy; runpy.run_module('finetune', run_name='x'); print(os.getenv('PYTORCH_CUDA_ALLOC_CONF'))"
    done = subprocess.run([sys.executable, "-c", code], env={**env, **preset}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(expected)


# ----------------------------------------------------------------------------- on a GPU


def long_rows_dataset(path: Path) -> Path:
    """Rows of about 200 tokens: the logits (and what Liger saves) dominate a tiny model's memory."""
    text = " ".join(f"word{i % 37}" for i in range(120))
    return write_jsonl(path, [{"prompt": f"Question {i}?", "completion": text} for i in range(32)])


@pytest.mark.gpu
def test_liger_kernel_table_holds_every_family_we_plan_it_for():
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    assert LIGER_MODEL_TYPES <= set(MODEL_TYPE_TO_APPLY_LIGER_FN)


@pytest.mark.gpu
def test_liger_on_trains_to_the_same_loss_with_less_peak_memory(tmp_path, monkeypatch):
    import torch
    from transformers import Trainer
    from transformers.models.llama import modeling_llama

    from tests.helpers import losses
    from tests.tiny import build_llama

    model_dir = build_llama(tmp_path / "llama-32k", vocab_size=32000)
    data = long_rows_dataset(tmp_path / "long.jsonl")
    forwards: list[str] = []
    original = Trainer.training_step

    def training_step(self, model, *args, **kwargs):
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        forwards.append(getattr(base.forward, "__module__", ""))
        return original(self, model, *args, **kwargs)

    monkeypatch.setattr(Trainer, "training_step", training_step)
    plain_norm = modeling_llama.LlamaRMSNorm
    results = {}
    for switch in ("off", "on"):
        forwards.clear()
        config = TrainConfig.from_dict(
            {
                **tiny_config(model_dir).to_dict(),
                "dataset": str(data),
                "liger_kernel": switch,
                "precision": "fp32",
                "max_seq_length": 256,
                "per_device_train_batch_size": 8,
                "max_steps": 10,
                "learning_rate": 1e-3,
                "output_dir": str(tmp_path / f"run-{switch}"),
            }
        )
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        state = RunManager().start(config, background=False)
        assert state.status == "completed", state.error
        results[switch] = (losses(state.run_dir), torch.cuda.max_memory_allocated(), list(forwards))
    (off_losses, off_peak, off_fwd), (on_losses, on_peak, on_fwd) = results["off"], results["on"]
    assert all(m.startswith("liger_kernel") for m in on_fwd) and not any(m.startswith("liger") for m in off_fwd)
    assert modeling_llama.LlamaRMSNorm is plain_norm  # the patches were undone after the Liger run
    assert [s for s, _ in on_losses] == [s for s, _ in off_losses]
    for (step, on), (_, off) in zip(on_losses, off_losses, strict=True):
        assert on == pytest.approx(off, rel=0.02), (step, on, off)
    assert on_peak < 0.8 * off_peak, (on_peak / 2**20, off_peak / 2**20)
