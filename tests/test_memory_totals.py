"""The fit verdict's device total against what the lent H200 measured (docs/memory.md): never under, at most 15% over.

The measured figures: the CUDA context + kernels took 1384 MiB of device memory; the caching allocator reserved 9%
(neither checkpointing nor QLoRA) and 23-24% (checkpointing / QLoRA) more than torch.cuda.max_memory_allocated; the
estimator's tensor_bytes was 0.3-0.7% under max_memory_allocated. The worst run, 3B QLoRA, seq 2048, batch 4,
checkpointing, used 24.2 GiB of the device (the issue's "GB" are GiB: its "fits on a 22 GB card" is the 22.0 GiB of
an L4 / A10G in GPU_CARDS, and the estimator of that day said 20.4 against 20.0 GiB from today's formula).
No GPU is needed: the estimate of a CUDA run is replayed on fake tensors on the CPU.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from finetune import memory
from finetune.config import TrainConfig
from finetune.memory import estimator
from finetune.plan import plan_for

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GiB, MiB = memory.GiB, memory.MiB
WORST_USED = 24.2 * GiB  # device memory in use at the peak of the 3B QLoRA seq 2048 batch 4 checkpointing run
WORST_OLD_TOTAL = 20.4 * GiB  # what the estimator said for it (context 500 MiB + 64 MiB + 7% of tensors)
MEASURED_CONTEXT = 1384 * MiB  # context + kernels in the project's CLI runs
TENSOR_UNDER = 0.993  # tensor_bytes / max_memory_allocated, the lowest of 10 configurations
MEASURED_SLACK = {"steady": 0.09, "fragmenting": 0.24}  # reserved / max_memory_allocated - 1, the highest per class
OVER_LIMIT = 1.15  # the estimate may be at most 15% above the device use


@pytest.fixture(autouse=True)
def calibrated(monkeypatch):
    """The calibrated figures, as on a machine without a GPU (a GPU machine would measure its own context)."""
    monkeypatch.setenv("FINETUNE_MEASURE_CUDA_CONTEXT", "0")
    monkeypatch.setattr(estimator, "_MEASURED", {})


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    """config.json only (no weights) of bench/memory_accuracy.py's GPU shapes: the estimate needs nothing else."""
    from bench.memory_accuracy import arch_config

    out = {}
    for arch in ("llama-1b", "llama-3b"):
        path = tmp_path_factory.mktemp(arch)
        arch_config(arch).save_pretrained(path)
        out[arch] = path
    return out


def gpu_run(path: Path, **kw) -> TrainConfig:
    """A bf16 GPU run of a model directory (LoRA r=8 all-linear, the defaults), padded rows of max_seq_length tokens
    as measured (bench/gpu/memory_totals.py runs packing: false)."""
    return TrainConfig(model=str(path), precision="bf16", packing=False, **kw)


def device_use(est: memory.MemoryEstimate, slack: float) -> float:
    """The device use the measurements predict for an estimate's tensors: context + reserve of the allocations."""
    return MEASURED_CONTEXT + (1 + slack) * est.tensor_bytes / TENSOR_UNDER


# ----------------------------------------------------------------------------- the totals


def test_the_worst_measured_run_is_not_under_counted(shapes):
    config = gpu_run(
        shapes["llama-3b"],
        method="qlora",
        max_seq_length=2048,
        per_device_train_batch_size=4,
        gradient_checkpointing=True,
    )
    est = memory.estimate(plan_for(config, "cuda"), gpu_gib=memory.GPU_CARDS["L4 (24 GB)"])
    assert est.method == "traced" and est.allocator_class == "fragmenting"
    # The same configuration as measured: the old formula on today's tensors gives the old figure (within 3%).
    old = est.tensor_bytes * 1.07 + 564 * MiB
    assert abs(old - WORST_OLD_TOTAL) / WORST_OLD_TOTAL < 0.03, old / GiB
    assert WORST_USED <= est.total_bytes <= OVER_LIMIT * WORST_USED, est.total_bytes / GiB
    assert est.fits is False  # the mistake the issue reports: it does not fit a 22 GiB card


@pytest.mark.parametrize(
    "settings, klass",
    [
        ({"method": "lora", "max_seq_length": 512}, "steady"),
        ({"method": "lora", "max_seq_length": 1024, "gradient_checkpointing": True}, "fragmenting"),
        ({"method": "qlora", "max_seq_length": 512}, "fragmenting"),
        ({"method": "full", "max_seq_length": 512, "optim": "adamw_8bit"}, "steady"),
    ],
    ids=["lora", "lora-checkpointing", "qlora", "full-8bit"],
)
def test_each_class_covers_its_measured_allocator_reserve(shapes, settings, klass):
    est = memory.estimate(plan_for(gpu_run(shapes["llama-1b"], per_device_train_batch_size=4, **settings), "cuda"))
    assert est.allocator_class == klass
    used = device_use(est, MEASURED_SLACK[klass])
    assert used <= est.total_bytes <= OVER_LIMIT * used, (est.total_bytes / GiB, used / GiB)


def test_overheads_are_the_measured_context_and_the_class_reserve(shapes):
    est = memory.estimate(plan_for(gpu_run(shapes["llama-1b"], max_seq_length=512), "cuda"))
    assert est.overheads["cuda_context"] + est.overheads["cuda_kernels"] == MEASURED_CONTEXT
    assert est.overheads["allocator"] == pytest.approx(memory.ALLOCATOR_SLACK["steady"] * est.tensor_bytes, abs=1)
    assert est.total_bytes == est.tensor_bytes + sum(est.overheads.values())
    assert est.overhead_source == memory.CALIBRATED_SOURCE


# ----------------------------------------------------------------------------- what each figure is compared with


def test_the_estimate_says_what_each_figure_is_compared_with(shapes, tmp_path):
    from tests.tiny import build_llama

    tiny = build_llama(tmp_path / "tiny")
    gpu = memory.estimate(plan_for(TrainConfig(model=str(tiny)), "cuda"))
    assert "max_memory_allocated" in gpu.compared_with["tensor_bytes"]
    assert "nvidia-smi" in gpu.compared_with["total_bytes"]
    data = json.loads(json.dumps(gpu.to_dict()))
    assert {"compared_with", "allocator_class", "overhead_source"} <= set(data)
    text = gpu.render_text()
    assert "compare with the whole device as nvidia-smi shows it" in text and "calibrated on an H200" in text
    cpu = memory.estimate(plan_for(TrainConfig(model=str(tiny)), "cpu"))
    assert "live tensors" in cpu.compared_with["tensor_bytes"] and cpu.overheads == {}
    assert cpu.allocator_class == "" and cpu.overhead_source == ""


# ----------------------------------------------------------------------------- measuring the context on a GPU


def test_context_from_readings():
    other = 10 * GiB  # another process on the device: only differences count
    got = memory.context_from_readings(other, other + 1144 * MiB, other + 1144 * MiB + 400 * MiB, 20 * MiB)
    assert got == {"cuda_context": 1144 * MiB, "cuda_kernels": 380 * MiB}
    # a short warm-up loads fewer kernels than a run: never below the calibration
    got = memory.context_from_readings(0, 600 * MiB, 700 * MiB, 20 * MiB)
    assert got == {"cuda_context": 600 * MiB, "cuda_kernels": memory.CUDA_KERNELS}
    assert memory.context_from_readings(5 * GiB, 4 * GiB, 5 * GiB, 0) is None  # someone freed memory meanwhile


FAKE_PROBE = """
import json, sys
base = 7 << 30  # what other processes hold
ctx = {context}
if sys.argv[1] == "hold":
    print(json.dumps({{"used": base + ctx}}), flush=True)
    sys.stdin.read()
    raise SystemExit(0)
print(json.dumps({{"used": base + 2 * ctx}}), flush=True)
print(json.dumps({{"used": base + 2 * ctx + (300 << 20) + (2 << 20), "reserved": 2 << 20}}), flush=True)
"""


def test_a_gpu_machine_measures_its_own_context(shapes, monkeypatch):
    """The holder/probe children and their readings, with stand-in children (no CUDA here)."""
    monkeypatch.setenv("FINETUNE_MEASURE_CUDA_CONTEXT", "1")
    monkeypatch.setattr(estimator, "_cuda_present", lambda: True)
    monkeypatch.setattr(estimator, "_PROBE", textwrap.dedent(FAKE_PROBE.format(context=600 * MiB)))
    assert memory.measured_cuda_overhead() == {"cuda_context": 600 * MiB, "cuda_kernels": 300 * MiB}
    est = memory.estimate(plan_for(gpu_run(shapes["llama-1b"], max_seq_length=512), "cuda"))
    assert est.overheads["cuda_context"] == 600 * MiB and est.overheads["cuda_kernels"] == 300 * MiB
    assert est.overhead_source.startswith("measured on this machine's GPU")


def test_an_implausible_measurement_keeps_the_calibration(monkeypatch):
    monkeypatch.setenv("FINETUNE_MEASURE_CUDA_CONTEXT", "1")
    monkeypatch.setattr(estimator, "_cuda_present", lambda: True)
    monkeypatch.setattr(estimator, "_PROBE", textwrap.dedent(FAKE_PROBE.format(context=1 << 20)))
    assert memory.measured_cuda_overhead() is None
    assert estimator._context()[1] == memory.CALIBRATED_SOURCE


def test_without_a_gpu_nothing_touches_cuda(shapes, monkeypatch):
    import subprocess

    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: it measures its context")
    monkeypatch.setenv("FINETUNE_MEASURE_CUDA_CONTEXT", "1")

    used = []

    def refuse(*args, **kwargs):
        used.append(args)
        raise AssertionError("CUDA or a probe was used on a machine without a GPU")

    for name in ("init", "mem_get_info", "is_initialized"):
        monkeypatch.setattr(torch.cuda, name, refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    est = memory.estimate(plan_for(gpu_run(shapes["llama-1b"], max_seq_length=512), "cuda"))
    assert est.overhead_source == memory.CALIBRATED_SOURCE and used == []
