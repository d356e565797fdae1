"""DeepSpeed on the CPU (its CPU accelerator with gloo): the explicit engine loop with ZeRO-2/3 for LoRA and full
fine-tuning in one process and under `torchrun --nproc_per_node 2`, the Trainer path with ZeRO-2 + CPU optimizer
offload, stop and resume.

Tolerance of one process vs two: both runs see the same examples in every optimizer step (global batch 4: one process
with micro 4 × accumulation 1 (full) or micro 2 × accumulation 2 (LoRA) vs two processes with micro 2 × 1;
DistributedSampler with the same seed; every row has the same number of answer tokens, so a mean of per-batch means is
the token mean), and LoRA dropout is 0. The two runs then differ only by floating-point summation order. LoRA must
agree within 1e-5 relative (docs/multi-gpu.md says about 1e-6); full fine-tuning at this learning rate drifts to
about 0.2% by step 8, so it is held to 1% (+1e-3 absolute).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from finetune.atomic import read_json
from finetune.engines.world import free_port
from finetune.plan import plan_for
from finetune.runs.launch import launch_commands
from finetune.runs.manager import RunManager
from finetune.runs.progress import Progress
from finetune.runs.rundir import RunDir
from tests.helpers import (
    assert_loss_falls,
    assert_resumed_exactly,
    events_size,
    losses,
    mini_dataset,
    raw_events,
    tiny_config,
    wait_for_file,
    wait_until_gone,
)

REPO = Path(__file__).resolve().parents[1]
REL_TOL, ABS_TOL = 0.01, 1e-3  # full fine-tuning
LORA_REL_TOL = 1e-5  # LoRA: README says the two-process losses match "to about 1e-6"
STEPS = 8
TORCHRUN_CASES = [(3, "lora"), (2, "full"), (3, "full")]  # and (2, "lora"): the killed-then-resumed run
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

    patch.setattr(data, "heldout_samples", lambda config, limit=5: [])


def assert_world_torn_down() -> None:
    """A one-process run leaves no process group and no launcher variables behind (the next run starts clean)."""
    import torch.distributed as dist

    assert not dist.is_initialized()
    assert not {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"} & set(os.environ)


def assert_close(a: list[tuple[int, float]], b: list[tuple[int, float]], method: str = "full") -> float:
    """Same steps, every loss within the method's tolerance; returns the largest relative difference."""
    assert [s for s, _ in a] == [s for s, _ in b], (a, b)
    rel, abs_ = (LORA_REL_TOL, 0.0) if method == "lora" else (REL_TOL, ABS_TOL)
    for (step, x), (_, y) in zip(a, b, strict=True):
        assert abs(x - y) <= rel * abs(x) + abs_, f"step {step}: {x} vs {y} (tolerance {rel:g})\n{a}\n{b}"
    return max(abs(x - y) / abs(x) for (_, x), (_, y) in zip(a, b, strict=True))


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


BUILD_OP = "from deepspeed.comm.torch import build_shm_op; op = build_shm_op(); assert callable(op.initialize)"


def launcher_python() -> str:
    """The interpreter the launchers next to this one (torchrun, deepspeed) start ranks with: their #! line. Another
    path than this process's when the virtualenv is reached through a symlink; a build names that path."""
    script = Path(sys.executable).parent / "torchrun"
    if not script.is_file():  # the launchers live elsewhere (not a virtualenv): nothing to compare
        return sys.executable
    return script.read_text(encoding="utf-8").splitlines()[0].removeprefix("#!")


# The first test here: DeepSpeed compiles this op on first use (once per virtualenv; minutes on a loaded 2-core
# machine), so it does so under this test's own deadline instead of inside the first timed training run below.
@pytest.mark.timeout(1800)
def test_deepspeeds_cpu_communication_op_compiles_and_loads():
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator
    from deepspeed.comm.torch import build_shm_op

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        pytest.skip("DeepSpeed uses no compiled communication op on this machine")
    op = build_shm_op()  # as deepspeed.init_distributed does on the CPU
    assert callable(op.initialize) and callable(op.vector_kernel_level)  # what init_distributed calls on it
    ranks = launcher_python().strip()
    if ranks != sys.executable:  # launched ranks build (and load) their own
        done = subprocess.run([ranks, "-c", BUILD_OP], cwd=REPO, capture_output=True, text=True, timeout=1500)
        assert done.returncode == 0, done.stderr[-3000:]


def assert_one_process_run(single_dir: Path, single: list[tuple[int, float]], stage: int, method: str) -> None:
    """A one-process run of a case: trained (the loss falls), every step logged, the DeepSpeed config of the case,
    checkpoints at 4 and 8, the final model, and nothing of its process group left behind."""
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


def assert_two_processes_match_one(
    two_dir: Path, two: list[tuple[int, float]], case: tuple[int, str], model_dir: Path, config
) -> None:
    """A two-process run (micro batch 2 on each of 2 ranks) ended as the case's one-process run did: every loss and
    evaluation within the method's tolerance, each rank's own ZeRO partition saved, and a normal adapter / HF model
    (ZeRO-3 gathered on rank 0) as good as the one-process one."""
    stage, method = case
    single_dir, single = single_process_run(model_dir, stage, method)
    assert_loss_falls(two_dir)
    assert read_json(two_dir / "ds_config.json")["train_batch_size"] == 2 * 1 * 2
    assert RunDir(two_dir).read_status()["status"] == "completed"
    shards = sorted(p.name for p in (two_dir / "checkpoint-8").glob("zero_pp_rank_*_optim_states.pt"))
    assert len(shards) == 2, shards  # each rank saved its own ZeRO partition
    assert read_json(two_dir / "checkpoint-8" / "trainer_state.json")["world_size"] == 2
    worst = assert_close(single, two, method)
    print(f"zero{stage}-{method}: largest relative loss difference, 1 vs 2 processes: {worst:.1e}")
    evals = [[(e["step"], e["eval_loss"]) for e in RunDir(d).read_events(("eval",))] for d in (single_dir, two_dir)]
    assert [s for s, _ in evals[0]] == [4, 8] and evals[0][1][1] < evals[0][0][1]
    assert_close(*evals, method)
    assert RunDir(two_dir).read_status()["tokens_per_second"] > 0
    first_loss = single[0][1]
    loss_one, loss_two = final_model_loss(single_dir, model_dir, config), final_model_loss(two_dir, model_dir, config)
    assert loss_one < 0.3 * first_loss
    assert abs(loss_one - loss_two) <= (LORA_REL_TOL * loss_one if method == "lora" else REL_TOL * loss_one + ABS_TOL)
    expected = "adapter_model.safetensors" if method == "lora" else "model.safetensors"
    assert (single_dir / expected).is_file() and (two_dir / expected).is_file()


# ZeRO-2 + LoRA in two processes is the killed-then-resumed run below: that one run answers the same questions.
@pytest.mark.parametrize("stage, method", TORCHRUN_CASES, ids=[f"zero{s}-{m}" for s, m in TORCHRUN_CASES])
def test_engine_loop_one_process_and_torchrun_two_processes(tiny_model_dir, tmp_path, stage, method):
    # One process, in this process: a world of size 1 set up and torn down around the run.
    single_dir, single = single_process_run(tiny_model_dir, stage, method)
    assert_one_process_run(single_dir, single, stage, method)

    # Two processes under torchrun, same global batch: micro 2 × 2 ranks. The command is the one we print.
    config = ds_config(tiny_model_dir, stage, method, per_device_train_batch_size=2, output_dir=str(tmp_path / "two"))
    config.save(tmp_path / "run.yaml")
    run_cli(launch_commands(plan_for(config), tmp_path / "run.yaml", gpus=2)["torchrun"])
    assert_two_processes_match_one(tmp_path / "two", losses(tmp_path / "two"), (stage, method), tiny_model_dir, config)


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
    mark = events_size(run.path)
    resumed = RunManager().resume(run.path, background=False)
    assert resumed.status == "completed" and resumed.step == STEPS, (resumed.status, resumed.error)
    assert run.has_final_model()
    before, after = assert_resumed_exactly(run.path, mark, checkpoint_step=stopped.step, max_steps=STEPS)
    assert_close(reference, [(e["step"], e["loss"]) for e in before + after], "lora")
    assert_world_torn_down()


def test_a_two_process_run_killed_then_resumed_with_the_deepspeed_launcher(tiny_model_dir, tmp_path):
    """README: `--resume` works for a multi-process run, and the printed `deepspeed` launcher command runs.
    ZeRO-2 + LoRA under `torchrun --nproc_per_node 2`, held at step 5 (checkpoint-4 written by both ranks), every
    process killed with SIGKILL; then the printed `deepspeed --num_gpus 2 ... --module finetune` with `train --resume`
    finishes it: the resumed processes train steps 5-8 only, and every loss is the one-process run's. The run it ends
    with is also ZeRO-2 + LoRA's two-process case of the test above: it must match the one-process run as those do."""
    import signal

    import psutil

    single_dir, reference = single_process_run(tiny_model_dir, 2, "lora")
    assert_one_process_run(single_dir, reference, 2, "lora")
    out = tmp_path / "two"
    config = ds_config(tiny_model_dir, 2, "lora", per_device_train_batch_size=2, output_dir=str(out))
    config.save(tmp_path / "run.yaml")
    commands = launch_commands(plan_for(config), tmp_path / "run.yaml", gpus=2)
    marker = tmp_path / "held"
    torchrun = shlex.split(commands["torchrun"])
    module = torchrun.index("finetune")
    torchrun[module : module + 1] = ["tests.hold", "5", str(marker)]
    torchrun[0] = str(Path(sys.executable).parent / "torchrun")
    proc = subprocess.Popen(
        [*torchrun, "--no-progress"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    pids = []
    try:
        for rank in (0, 1):
            wait_for_file(Path(f"{marker}.rank{rank}"), proc)
            pids.append(int(Path(f"{marker}.rank{rank}").read_text()))
    finally:
        with contextlib.suppress(psutil.Error):  # ranks not held yet (a failed wait): still torchrun's children
            pids += [p.pid for p in psutil.Process(proc.pid).children(recursive=True) if p.pid not in pids]
        for pid in pids:  # torchrun starts each rank in a session of its own: kill them one by one
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    wait_until_gone(pids)  # killed ranks are orphans now: reaped by init, not by us
    run = RunDir(out)
    assert run.effective_status() == "interrupted"
    assert [p.name for p in run.checkpoints()] == ["checkpoint-4"]
    assert len(list((out / "checkpoint-4").glob("zero_pp_rank_*_optim_states.pt"))) == 2

    mark = events_size(out)
    launcher = shlex.split(commands["deepspeed"])
    launcher = launcher[: launcher.index("finetune") + 1] + ["train", "--resume", str(out)]
    launcher[1:1] = ["--master_port", str(free_port())]  # not the default 29500, which another job may hold
    run_cli(shlex.join(launcher))
    assert run.read_status()["status"] == "completed" and run.has_final_model()
    before, after = assert_resumed_exactly(out, mark, checkpoint_step=4, max_steps=STEPS)
    trained = [(e["step"], e["loss"]) for e in before if e["step"] <= 4] + [(e["step"], e["loss"]) for e in after]
    assert [e["step"] for e in raw_events(out, types=("eval",))] == [4, 8]  # each evaluation once, as trained
    assert_two_processes_match_one(out, trained, (2, "lora"), tiny_model_dir, config)


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
    # The same config sits in the run directory, as the DeepSpeed engine writes its own (docs/multi-gpu.md).
    assert read_json(run.path / "ds_config.json") == used
    assert_world_torn_down()

    # The process-wide DeepSpeed state is gone: a plain Trainer run in the same process is not affected.
    from transformers.integrations import is_deepspeed_zero3_enabled

    assert not is_deepspeed_zero3_enabled()
    plain = RunManager().start(tiny_config(tiny_model_dir, max_steps=2, save_steps=2), background=False)
    assert plain.status == "completed", plain.error
    assert not list((Path(plain.run_dir) / "checkpoint-2").glob("global_step*"))  # no DeepSpeed this time


def test_deepspeed_checkpoints_keep_each_ranks_random_state_for_resume(tmp_path):
    """What a resumed DeepSpeed run draws (dropout masks) is what the run would have drawn had it not stopped."""
    import random

    import numpy as np

    from finetune.engines.deepspeed_engine import load_rng_state, save_rng_state

    torch.manual_seed(1), random.seed(1), np.random.seed(1)
    save_rng_state(tmp_path, rank=1)
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(2), random.seed(2), np.random.seed(2)  # a new process starts elsewhere
    assert not load_rng_state(tmp_path, rank=0)  # another rank's state is not taken
    assert load_rng_state(tmp_path, rank=1)
    again = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(expected[0], again[0]) and expected[1:] == again[1:]
