"""DeepSpeed on the CPU (its CPU accelerator with gloo): the explicit engine loop with ZeRO-2/3 for LoRA and full
fine-tuning in one process and under `torchrun --nproc_per_node 2`, the Trainer path with ZeRO-2 + CPU optimizer
offload, stop and resume.

Tolerance of one process vs two: both runs see the same examples in every optimizer step (global batch 4: one process
with micro 4 × accumulation 1 (full) or micro 2 × accumulation 2 (LoRA) vs two processes with micro 2 × 1;
DistributedSampler with the same seed; every row has the same number of answer tokens, so a mean of per-batch means is
the token mean), and LoRA dropout is 0. The two runs then differ only by
floating-point summation order, so every logged loss must agree within 1% (+1e-3 absolute). Measured: LoRA agrees to
about 1e-6 relative; full fine-tuning at this learning rate drifts to about 0.2% by step 8.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from finetune.atomic import read_json
from finetune.launch import launch_commands
from finetune.progress import Progress
from finetune.rundir import RunDir
from finetune.runs import RunManager
from tests.helpers import assert_loss_falls, losses, mini_dataset, tiny_config

REPO = Path(__file__).resolve().parents[1]
REL_TOL, ABS_TOL = 0.01, 1e-3
STEPS = 8
CASES = [(2, "lora"), (3, "lora"), (2, "full"), (3, "full")]
_single_runs: dict[tuple[int, str], tuple[Path, list[tuple[int, float]]]] = {}


def ds_config(model_dir: Path, stage: int, method: str, **overrides):
    values = {
        "backend": "deepspeed",
        "zero_stage": stage,
        "method": method,
        "lora_dropout": 0.0,
        "max_steps": STEPS,
        "save_steps": 4,
        "eval_split": str(mini_dataset()),  # the training rows again: an eval pass over all ranks at steps 4 and 8
        "eval_steps": 4,
        **overrides,
    }
    return tiny_config(model_dir, **values)


def single_process_run(model_dir: Path, stage: int, method: str) -> tuple[Path, list[tuple[int, float]]]:
    """The one-process reference run of a case (trained once per test session)."""
    if (stage, method) not in _single_runs:
        with pytest.MonkeyPatch.context() as patch:
            if (stage, method) != (2, "lora"):
                no_sample_answers(patch)  # sample answers: checked once (generation under ZeRO-3 is slow on a CPU)
            # LoRA cases reach the global batch of 4 by accumulation (2 × 2), full cases by the micro batch (4 × 1).
            shape = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2} if method == "lora" else {}
            state = RunManager().start(ds_config(model_dir, stage, method, **shape), background=False)
        assert state.status == "completed", (state.status, state.error)
        _single_runs[stage, method] = (Path(state.run_dir), losses(state.run_dir))
    return _single_runs[stage, method]


def no_sample_answers(patch: pytest.MonkeyPatch) -> None:
    """No held-out prompts: the run skips its sample answers."""
    from finetune import data

    patch.setattr(data, "heldout_prompts", lambda config, limit=5: [])


def assert_world_torn_down() -> None:
    """A one-process run leaves no process group and no launcher variables behind (the next run starts clean)."""
    import torch.distributed as dist

    assert not dist.is_initialized()
    assert not {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"} & set(os.environ)


def assert_close(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> None:
    assert [s for s, _ in a] == [s for s, _ in b], (a, b)
    for (step, x), (_, y) in zip(a, b, strict=True):
        assert abs(x - y) <= REL_TOL * abs(x) + ABS_TOL, f"step {step}: {x} vs {y}\n{a}\n{b}"


def final_model_loss(run_dir: Path, model_dir: Path, config) -> float:
    """Mean loss over the training rows of the model saved in the run directory (a normal adapter / HF model)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from finetune import data

    tokenizer = AutoTokenizer.from_pretrained(run_dir)
    if (run_dir / "adapter_config.json").is_file():
        from peft import PeftModel

        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), run_dir)
    else:
        model = AutoModelForCausalLM.from_pretrained(run_dir)
    rows = data.prepare(config, tokenizer).train
    batch = data.collator(config, tokenizer)([rows[i] for i in range(len(rows))])
    with torch.no_grad():
        return float(model.eval()(**batch).loss)


def run_cli(command: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """A launch command as printed by `launch_commands`, run with this venv's launcher.

    PATH is left as it is: DeepSpeed JIT-builds a small C++ op on first use, and a different `ninja` on PATH (the
    venv's vs the system's) would make every switch between this process and the launched ones rebuild it."""
    argv = shlex.split(command) + ["--no-progress"]
    argv[0] = str(Path(sys.executable).parent / argv[0])
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


@pytest.mark.parametrize("stage, method", CASES, ids=[f"zero{s}-{m}" for s, m in CASES])
def test_engine_loop_one_process_and_torchrun_two_processes(tiny_model_dir, tmp_path, stage, method):
    # One process, in this process: a world of size 1 set up and torn down around the run.
    single_dir, single = single_process_run(tiny_model_dir, stage, method)
    assert_world_torn_down()
    assert_loss_falls(single_dir)
    assert [s for s, _ in single] == list(range(1, STEPS + 1))
    ds = read_json(single_dir / "ds_config.json")
    accumulation = 2 if method == "lora" else 1
    assert ds["train_batch_size"] == 4 and ds["gradient_accumulation_steps"] == accumulation
    assert ds["zero_optimization"]["stage"] == stage
    assert RunDir(single_dir).has_final_model() and RunDir(single_dir).read_status()["status"] == "completed"
    assert [p.name for p in RunDir(single_dir).checkpoints()] == ["checkpoint-4", "checkpoint-8"]
    if (stage, method) == (2, "lora"):  # sample answers to held-out prompts at step 0 and evaluations, as on Trainer
        samples = RunDir(single_dir).read_events(("samples",))
        assert samples and samples[0]["step"] == 0 and samples[0]["samples"][0]["prompt"]

    # Two processes under torchrun, same global batch: micro 2 × 2 ranks. The command is the one we print.
    config = ds_config(tiny_model_dir, stage, method, per_device_train_batch_size=2, output_dir=str(tmp_path / "two"))
    config.save(tmp_path / "run.yaml")
    run_cli(launch_commands(config, tmp_path / "run.yaml", gpus=2)["torchrun"])
    two_dir = tmp_path / "two"
    two = losses(two_dir)
    assert_loss_falls(two_dir)
    assert read_json(two_dir / "ds_config.json")["train_batch_size"] == 2 * 1 * 2
    assert RunDir(two_dir).read_status()["status"] == "completed"
    shards = sorted(p.name for p in (two_dir / "checkpoint-8").glob("zero_pp_rank_*_optim_states.pt"))
    assert len(shards) == 2, shards  # each rank saved its own ZeRO partition
    assert read_json(two_dir / "checkpoint-8" / "trainer_state.json")["world_size"] == 2
    assert_close(single, two)
    evals = [[(e["step"], e["eval_loss"]) for e in RunDir(d).read_events(("eval",))] for d in (single_dir, two_dir)]
    assert [s for s, _ in evals[0]] == [4, 8] and evals[0][1][1] < evals[0][0][1]
    assert_close(*evals)
    assert RunDir(two_dir).read_status()["tokens_per_second"] > 0

    # The saved results are a normal adapter / HF model (ZeRO-3 gathered on rank 0), trained and equal.
    first_loss = single[0][1]
    loss_one, loss_two = (
        final_model_loss(single_dir, tiny_model_dir, config),
        final_model_loss(two_dir, tiny_model_dir, config),
    )
    assert loss_one < 0.3 * first_loss and abs(loss_one - loss_two) <= REL_TOL * loss_one + ABS_TOL
    expected = "adapter_model.safetensors" if method == "lora" else "model.safetensors"
    assert (single_dir / expected).is_file() and (two_dir / expected).is_file()


def test_stop_saves_a_deepspeed_checkpoint_and_resume_continues_exactly(tiny_model_dir, monkeypatch):
    """ZeRO-3 + LoRA: the stop flag ends the run with a checkpoint; --resume (RunManager.resume) loads it through
    engine.load_checkpoint and continues with the same losses as an uninterrupted run."""
    reference_dir, reference = single_process_run(tiny_model_dir, 3, "lora")

    original = Progress.on_step

    def stop_at_two(self, step, *args, **kwargs):
        original(self, step, *args, **kwargs)
        if step == 2:
            self.stop_requested.set()  # as the Stop button / Ctrl-C do

    monkeypatch.setattr(Progress, "on_step", stop_at_two)
    no_sample_answers(monkeypatch)
    config = ds_config(
        tiny_model_dir, 3, "lora", save_steps=100, per_device_train_batch_size=2, gradient_accumulation_steps=2
    )
    stopped = RunManager().start(config, background=False)
    assert stopped.status == "stopped" and 2 <= stopped.step < STEPS, (stopped.status, stopped.error)
    run = RunDir(Path(stopped.run_dir))
    checkpoint = run.last_checkpoint()
    assert checkpoint is not None and checkpoint.name == f"checkpoint-{stopped.step}"
    state = read_json(checkpoint / "trainer_state.json")
    assert state["global_step"] == stopped.step and state["backend"] == "deepspeed" and state["zero_stage"] == 3
    assert (checkpoint / "zero_to_fp32.py").is_file() and not (run.path / "zero_to_fp32.py").exists()
    assert not run.has_final_model()
    assert_world_torn_down()

    monkeypatch.setattr(Progress, "on_step", original)
    resumed = RunManager().resume(run.path, background=False)
    assert resumed.status == "completed" and resumed.step == STEPS, (resumed.status, resumed.error)
    assert run.has_final_model()
    after = losses(run.path)
    assert [s for s, _ in after] == list(range(1, STEPS + 1))  # same step numbering, no step repeated
    assert_close(reference, after)
    assert_world_torn_down()


def test_trainer_path_zero2_with_cpu_optimizer_offload(tiny_model_dir, monkeypatch):
    """backend: trainer with zero_stage 2 and offload_optimizer: cpu runs TrainingArguments(deepspeed=...)."""
    no_sample_answers(monkeypatch)
    config = tiny_config(tiny_model_dir, zero_stage=2, offload_optimizer="cpu", max_steps=STEPS)
    state = RunManager().start(config, background=False)
    assert state.status == "completed", (state.status, state.error)
    run = RunDir(Path(state.run_dir))
    assert_loss_falls(run.path)
    assert (run.path / "adapter_model.safetensors").is_file()
    # The DeepSpeed checkpoint records the config DeepSpeed ran with, after Trainer filled the "auto" values.
    (optim_states,) = (run.path / f"checkpoint-{STEPS}").glob("global_step*/zero_pp_rank_0_mp_rank_00_optim_states.pt")
    used = torch.load(optim_states, weights_only=False)["ds_config"]
    assert used["zero_optimization"]["stage"] == 2
    assert used["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert used["train_batch_size"] == 4 and used["optimizer"]["params"]["lr"] == config.learning_rate
    assert_world_torn_down()

    # The process-wide DeepSpeed state is gone: a plain Trainer run in the same process is not affected.
    from transformers.integrations import is_deepspeed_zero3_enabled

    assert not is_deepspeed_zero3_enabled()
    plain = RunManager().start(tiny_config(tiny_model_dir, max_steps=2, save_steps=2), background=False)
    assert plain.status == "completed", plain.error
    assert not list((Path(plain.run_dir) / "checkpoint-2").glob("global_step*"))  # no DeepSpeed this time
