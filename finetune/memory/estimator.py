"""The estimator's core: the peak memory of one training step of a run plan, explained, with the fit verdict.

How: the model is built from its config on fake tensors (no weights, no memory) and one steady training step is
replayed exactly as the engine runs it (Trainer + PEFT + bitsandbytes), counting live tensor storages
(`finetune.memory.trace`). That peak is `tensor_bytes`. The analytic model (`finetune.memory.analytic`) explains it
component by component, prices the advice, and is the fallback where a replay cannot run (DeepSpeed ZeRO, offload).
For a GPU, the CUDA context and the caching allocator's slack are added on top (`overheads`).

Light to import: torch and transformers are imported only when an estimate is computed.
"""

from __future__ import annotations

import json
import math
import os
import threading
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from finetune.config import TrainConfig
from finetune.errors import UserError

if TYPE_CHECKING:
    from finetune.plan import RunPlan

GiB = 2**30
MiB = 2**20

# ----- What a GPU holds beyond live tensors (the fit verdict compares the device total with the card's memory).
# Calibrated on the lent H200 (torch 2.11+cu130, transformers 5.24, peft 0.21.2, bitsandbytes 0.50.2;
# docs/memory.md): the project's CLI trained 0.5B-3B Llama shapes while the device's used memory (total - free of
# torch.cuda.mem_get_info, what nvidia-smi shows) was polled. On a machine with a GPU the context is measured there
# instead (`measured_cuda_overhead`); these figures stand for a card that is not present.
CUDA_CONTEXT = 1144 * MiB  # device memory used right after torch.cuda.init(): driver context + CUDA runtime (H200)
CUDA_KERNELS = 240 * MiB  # device use minus the allocator's reserve was 1384 MiB in the runs: 1384 - 1144 = 240 MiB of
# kernel modules and library handles (cuBLAS/cuBLASLt, cuDNN, bitsandbytes) loaded lazily by the first steps
ALLOCATOR_SLACK = {  # the caching allocator's reserve above tensor_bytes (block rounding, fragmentation), by class
    # Neither checkpointing nor 4-bit: reserved was 9% above max_memory_allocated, and tensor_bytes ran up to 0.7%
    # under max_memory_allocated (10 configurations): 1.09 / 0.993 = 9.8% of tensor_bytes; +2 points of margin.
    "steady": 0.12,
    # Gradient checkpointing and/or QLoRA: reserved was 23% and 24% above max_memory_allocated (recomputed blocks and
    # per-layer 4-bit dequantisation free and re-allocate many differently sized blocks). Against this estimator's own
    # tensor_bytes the worst run (3B QLoRA, seq 2048, batch 4, checkpointing: 24.2 GiB used, 18.17 GiB of tensors
    # replayed) reserved (24.2 GiB - 1384 MiB) / 18.17 GiB = 25.8% more; +2 points of margin.
    # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is meant to cut this; unmeasured, so it does not lower these.
    "fragmenting": 0.28,
}
# What each total is compared with, in words the UI can show beside the figures.
COMPARED_WITH_CUDA = {
    "tensor_bytes": "allocated tensors at the peak (torch.cuda.max_memory_allocated)",
    "total_bytes": "the whole device as nvidia-smi shows it (torch.cuda.mem_get_info): tensors, the caching "
    "allocator's reserve, the CUDA context and kernels",
}
COMPARED_WITH_CPU = {
    "tensor_bytes": "live tensors at the peak",
    "total_bytes": "live tensors at the peak (the process's resident memory adds Python, libraries and caches)",
}

COMPONENT_ORDER = (
    "weights", "reference_model", "quant_constants", "lora", "master_weights", "optimizer", "gradients", "ddp_buckets",
    "activations", "logits_loss", "reference_forward", "backward_temporaries", "optimizer_temporaries",
    "generation_cache",
)  # fmt: skip
PHASE_NAMES = {
    "forward": "end of the forward pass",
    "forward_head": "end of the forward pass (logits and loss)",
    "backward_head": "start of backward (logits and loss gradients)",
    "backward_top_block": "backward through the last block",
    "backward_blocks": "backward through the blocks",
    "backward_bottom_block": "backward through the first block",
    "backward_tail": "end of backward (embedding gradients)",
    "optimizer": "optimizer step",
    "kl": "KL pass (KTO, no gradients)",
    "reference": "reference pass (no gradients)",
    "generation": "sampling the answers (KV cache)",
}


@dataclass
class Advice:
    """One set of changes that makes the run use less memory, keeping the effective batch size."""

    title: str
    changes: dict[str, Any]
    new_total_bytes: int
    cost: str  # what it costs, in words: speed, quality, data
    fits: bool | None = None  # fits with headroom
    kind: str = ""  # the lever when one; "combine" for several
    slowdown: float = 0.0  # estimated extra training time (0.3 = +30%; negative = faster)
    data_lost: float | None = 0.0  # share of training tokens cut off (None: the data's lengths are unknown)
    score: float = 0.0  # the ranking cost in points (lower first)
    kinds: list[str] = field(default_factory=list)  # every lever it pulls
    replayed: bool = False  # new_total_bytes comes from a replay of these settings (else: formulas scaled)
    tight: bool = False  # within the card but inside the headroom margin: listed, never pre-selected
    headroom_bytes: int = 0  # what it leaves of the card (negative: short by)
    cut: str = ""  # how many rows lose how many tokens, in words ("" when no row is cut)

    @property
    def keeps_data(self) -> bool:
        """No training token is cut off (within 0.1%)."""
        return self.data_lost is not None and self.data_lost <= 0.001


@dataclass
class Needed:
    """When nothing fits: the smallest hardware on which the best combination fits, and that combination."""

    line: str  # one line for the user
    gpu_gib: float  # memory per GPU
    gpus: int
    cards: list[str]  # the common cards of that size (GPU_CARDS names); empty for a count of the asked card
    changes: dict[str, Any]  # the combination, as changes to the settings searched
    total_bytes: int  # its estimate per GPU
    title: str = ""  # the combination in words


@dataclass
class MemoryEstimate:
    """Peak memory of one training step on one device, explained."""

    components: dict[str, int]  # what is live at the peak, by kind (sums to tensor_bytes)
    tensor_bytes: int  # peak of live tensors: compare with torch.cuda.max_memory_allocated (see compared_with)
    overheads: dict[str, int]  # cuda_context, cuda_kernels, allocator (GPU only)
    total_bytes: int  # tensor_bytes + overheads: the whole device as nvidia-smi shows it; decides the fit verdict
    comparisons: dict[str, int]  # rule_of_thumb, accelerate (other ways of estimating; not used)
    gpu_gib: float | None = None
    fits: bool | None = None  # fits with headroom (at least margin_bytes left)
    headroom_bytes: int | None = None
    advice: list[Advice] = field(default_factory=list)
    verdict: str = ""  # fits | tight (within the card, inside the margin) | does not fit ("" without gpu_gib)
    margin_bytes: int | None = None  # the headroom a fit keeps: max(5% of the card, 1 GiB)
    needed: Needed | None = None  # when nothing fits: the smallest hardware on which the best combination fits
    sizes: dict[str, int] = field(default_factory=dict)  # each component's full size (analytic), live or not
    method: str = "traced"  # traced: fake-tensor replay; analytic: formulas only
    peak_phase: str = ""
    analytic_tensor_bytes: int = 0
    device: str = "cuda"
    gpus: int = 1
    notes: list[str] = field(default_factory=list)
    # What tensor_bytes and total_bytes are each compared with (a measurement a user can take), for the UI.
    compared_with: dict[str, str] = field(default_factory=dict)
    allocator_class: str = ""  # steady, or fragmenting (checkpointing / QLoRA): which ALLOCATOR_SLACK applies
    overhead_source: str = ""  # where cuda_context and cuda_kernels come from: measured here, or calibrated

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (advice as dicts)."""
        return asdict(self)

    def render_text(self) -> str:
        """A readable table for the terminal."""
        where = f"{self.device}" + (f" x {self.gpus} GPUs (per GPU)" if self.gpus > 1 else "")
        lines = [f"Memory estimate ({where}; {self.method}; peak at the {self.peak_phase})", ""]
        lines.append(f"  {'component':<24}{'at peak':>12}{'full size':>12}")
        for name in [n for n in COMPONENT_ORDER if self.components.get(n) or self.sizes.get(n)]:
            at_peak, full = size_text(self.components.get(name, 0)), size_text(self.sizes.get(name, 0))
            lines.append(f"  {name:<24}{at_peak:>12}{full:>12}")
        lines.append(f"  {'tensors at peak':<24}{size_text(self.tensor_bytes):>12}")
        for name, value in self.overheads.items():
            lines.append(f"  {name + ' (overhead)':<24}{size_text(value):>12}")
        lines.append(f"  {'total':<24}{size_text(self.total_bytes):>12}")
        if self.compared_with:
            lines += ["", f"  tensors at peak: compare with {self.compared_with.get('tensor_bytes', '?')}"]
            lines.append(f"  total: compare with {self.compared_with.get('total_bytes', '?')}")
        if self.overheads:
            slack = ALLOCATOR_SLACK.get(self.allocator_class, 0.0)
            reserve = f"allocator reserve {slack:.0%} of tensors ({self.allocator_class})"
            lines.append(f"  overheads: {self.overhead_source}; {reserve}")
        if self.comparisons:
            others = ", ".join(f"{k.replace('_', ' ')} {size_text(v)}" for k, v in self.comparisons.items())
            lines += ["", f"For comparison (not used): {others}"]
        if self.gpu_gib:
            verdict = {"fits": "fits", "tight": "TIGHT (inside the margin)"}.get(self.verdict, "does NOT fit")
            lines += [
                "",
                f"On {self.gpu_gib:g} GiB: {verdict} (headroom {size_text(self.headroom_bytes or 0, signed=True)}; a "
                f"fit keeps {size_text(self.margin_bytes or 0)})",
            ]
        for i, a in enumerate(self.advice, start=1):
            changes = ", ".join(f"{k}={v}" for k, v in a.changes.items())
            tight = " [tight]" if a.tight else ""
            lines.append(f"  {i}. {a.title}: {changes} -> {size_text(a.new_total_bytes)}{tight} ({a.cost})")
        if self.needed is not None:
            lines.append(self.needed.line)
        lines += [f"Note: {n}" for n in self.notes]
        return "\n".join(lines)


def size_text(n: int | float, signed: bool = False) -> str:
    """Bytes as GiB / MiB text."""
    sign = "-" if n < 0 else ("+" if signed else "")
    n = abs(n)
    return f"{sign}{n / GiB:.2f} GiB" if n >= GiB else f"{sign}{n / MiB:.1f} MiB"


# ----------------------------------------------------------------------------- the estimate


def check_args(plan: RunPlan, gpu_gib: float | None) -> None:
    """Refuse bad arguments with one clear line."""
    if plan.device not in ("cpu", "cuda"):
        raise UserError(f"device: {plan.device!r} is not allowed; choose cpu or cuda", field="device")
    if not isinstance(plan.world_size, int) or plan.world_size < 1:
        raise UserError(f"gpus: {plan.world_size!r} must be a whole number >= 1", field="gpus")
    if gpu_gib is not None and not (isinstance(gpu_gib, (int, float)) and math.isfinite(gpu_gib) and gpu_gib > 0):
        raise UserError(f"gpu_gib: {gpu_gib!r} must be a positive number of GiB", field="gpu_gib")


def estimate_core(plan: RunPlan, trace_it: bool = True) -> MemoryEstimate:
    """The breakdown and totals of one step of `plan` per process (no fit verdict)."""
    from finetune.memory import analytic as ma

    config, device, gpus = plan.config, plan.device, plan.world_size
    model_config = model_config_of(config)
    shape, census = ma.shape_of(model_config), census_of(plan, model_config)
    settings = ma.settings_for(plan)
    notes: list[str] = []
    segments = packed_segments(plan, notes)
    if segments:
        settings = replace(settings, packed_tokens=sum(segments))
    images = None
    if plan.vision is not None:  # the images of a row and their tokens, from the model's image processor
        images = image_load_of(plan, model_config)
        notes.append(images.note())
        lever = _smaller_side_note(plan, images) if trace_it else None  # not while the search prices
        if lever:
            notes.append(lever)
        # A row is at least as long as its images' tokens (a run never cuts them): the formulas price that length,
        # so a smaller image side is priced by the search as the replay would measure it.
        settings = replace(settings, seq=images.row_length(settings.seq))
    analytic = ma.analyse(shape, census, settings)
    liger = ma.logits_loss_bytes(shape, census, settings) if settings.loss_kernel == "liger" else None
    if liger is not None:
        notes.append(
            "Liger's fused linear cross-entropy holds the logits one chunk at a time (its formula: a Triton "
            "kernel cannot be replayed)"
        )
    generation = analytic.components.get("generation_cache", 0)
    traceable_here = trace_it and traceable(plan)
    traced = _traced(plan, model_config, census, notes, liger, generation, segments, images) if traceable_here else None
    if traced is not None:
        tensor_bytes, split, phase = traced
        method = "traced"
    else:
        tensor_bytes, phase, method = analytic.peak, analytic.peak_phase, "analytic"
        split = _analytic_split(analytic)
        if settings.deepspeed:
            notes.append("DeepSpeed ZeRO / offload is estimated with formulas (a replay covers one process only)")
    extra = analytic.components.get("ddp_buckets", 0) if method == "traced" else 0
    if extra:
        split["ddp_buckets"] = extra
        tensor_bytes += extra
    if device == "cuda" and config.optim == "paged_adamw_8bit":
        notes.append("paged_adamw_8bit: optimizer states can move to CPU RAM when the GPU runs short")
    overheads = cuda_overheads(tensor_bytes, plan) if device == "cuda" else {}
    components = {name: int(split.get(name, 0)) for name in COMPONENT_ORDER}
    return MemoryEstimate(
        components=components,
        tensor_bytes=int(tensor_bytes),
        overheads=overheads,
        total_bytes=int(tensor_bytes + sum(overheads.values())),
        comparisons=_comparisons(census, settings),
        sizes={k: int(v) for k, v in analytic.components.items()},
        method=method,
        peak_phase=PHASE_NAMES.get(phase, phase),
        analytic_tensor_bytes=int(analytic.peak),
        device=device,
        gpus=gpus,
        notes=notes,
        compared_with=dict(COMPARED_WITH_CUDA if device == "cuda" else COMPARED_WITH_CPU),
        allocator_class=allocator_class(plan) if device == "cuda" else "",
        overhead_source=_context()[1] if device == "cuda" else "",
    )


def allocator_class(plan: RunPlan) -> str:
    """Which measured allocator slack applies: `fragmenting` with gradient checkpointing or a 4-bit base."""
    return "fragmenting" if (plan.config.gradient_checkpointing or plan.quantization is not None) else "steady"


def cuda_overheads(tensor_bytes: int, plan: RunPlan) -> dict[str, int]:
    """What a GPU needs beyond live tensors: the CUDA context, loaded kernels, and the caching allocator's reserve."""
    measured, _ = _context()
    return {
        "cuda_context": measured["cuda_context"],
        "cuda_kernels": measured["cuda_kernels"],
        "allocator": math.ceil(ALLOCATOR_SLACK[allocator_class(plan)] * tensor_bytes),
    }


# ----------------------------------------------------------------------------- the CUDA context (measured on a GPU)

CALIBRATED_SOURCE = "calibrated on an H200 (torch 2.11, CUDA 13): CUDA context 1144 MiB + kernels 240 MiB"
CONTEXT_RANGE = (128 * MiB, 8 * GiB)  # a measured context outside this is a disturbed reading: keep the calibration
_MEASURED: dict[str, Any] = {}
_MEASURE_LOCK = threading.Lock()

# Run in a child process: create the CUDA context, print the device's used memory; then either hold the context until
# stdin closes ("hold"), or do what a training step's first iterations load (16-bit and fp32 GEMMs with backward,
# attention, cross-entropy, a foreach AdamW step) and print the used memory again with the allocator's reserve.
_PROBE = r"""
import json, sys
import torch
free, total = torch.cuda.mem_get_info()
print(json.dumps({"used": total - free}), flush=True)
if sys.argv[1] == "hold":
    sys.stdin.read()
    raise SystemExit(0)
dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
x = torch.randn(256, 512, device="cuda", requires_grad=True)
w = torch.nn.Linear(512, 512).cuda()
opt = torch.optim.AdamW(w.parameters(), foreach=True)
with torch.autocast("cuda", dtype=dtype):
    q = w(x).view(4, 8, 64, 64)
    a = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).reshape(256, 512)
    loss = torch.nn.functional.cross_entropy(a.float(), torch.randint(0, 512, (256,), device="cuda"))
loss.backward()
opt.step()
(x.detach() @ x.detach().T).sum().item()
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info()
print(json.dumps({"used": total - free, "reserved": torch.cuda.memory_reserved()}), flush=True)
"""


def measured_cuda_overhead(timeout: float = 30.0) -> dict[str, int] | None:
    """This machine's CUDA context and kernel bytes, measured once per process in child processes; None without a
    CUDA GPU (then nothing touches CUDA), when FINETUNE_MEASURE_CUDA_CONTEXT=0, or when a reading is implausible.

    The first call on a GPU machine takes a few seconds (two Python processes import torch); a caller that minds can
    make it early in a background thread."""
    import os

    with _MEASURE_LOCK:  # concurrent estimates (the UI) measure once
        if "value" not in _MEASURED:
            value = None
            if os.environ.get("FINETUNE_MEASURE_CUDA_CONTEXT", "1") != "0" and _cuda_present():
                try:
                    value = _measure_context(timeout)
                except Exception:  # noqa: BLE001 - a failed measurement falls back to the calibrated figures
                    value = None
            _MEASURED["value"] = value
        return _MEASURED["value"]


def _cuda_present() -> bool:
    """A CUDA GPU is visible, checked without creating a CUDA context here (a CPU build of torch answers at once)."""
    import torch

    return torch.version.cuda is not None and torch.cuda.is_available()


def _context() -> tuple[dict[str, int], str]:
    """(cuda_context and cuda_kernels bytes, where they come from): measured on this GPU, else the calibration."""
    measured = measured_cuda_overhead()
    if measured is not None:
        mib = {k: round(v / MiB) for k, v in measured.items()}
        return measured, f"measured on this machine's GPU: CUDA context {mib['cuda_context']} MiB + kernels " + (
            f"{mib['cuda_kernels']} MiB"
        )
    return {"cuda_context": CUDA_CONTEXT, "cuda_kernels": CUDA_KERNELS}, CALIBRATED_SOURCE


def _measure_context(timeout: float) -> dict[str, int] | None:
    """Create a CUDA context in a child and read the device's used memory before and after, with mem_get_info.

    The device may hold other processes' memory, so the "before" reading comes from a process that already holds a
    context: this one if it has CUDA initialised, else a second child that holds its own while the probe starts.
    """
    import subprocess
    import sys

    import torch

    def start(mode: str) -> subprocess.Popen:
        cmd = [sys.executable, "-c", _PROBE, mode]
        pipe = subprocess.PIPE
        return subprocess.Popen(cmd, stdin=pipe, stdout=pipe, stderr=subprocess.DEVNULL, text=True)

    holder = None
    try:
        if torch.cuda.is_initialized():
            free, total = torch.cuda.mem_get_info()
            before = total - free
        else:
            holder = start("hold")
            before = _reading(holder, timeout)["used"]
        probe = start("probe")
        try:
            after_init = _reading(probe, timeout)["used"]
            warm = _reading(probe, timeout)
        finally:
            probe.kill()
            probe.wait()
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
    return context_from_readings(before, after_init, warm["used"], warm["reserved"])


def _reading(proc: Any, timeout: float) -> dict[str, int]:
    """The next JSON line a probe prints (within `timeout` seconds)."""
    import threading

    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not box or not box[0].strip():
        raise TimeoutError("the CUDA probe printed nothing")
    return json.loads(box[0])


def context_from_readings(before: int, after_init: int, after_warmup: int, reserved: int) -> dict[str, int] | None:
    """Context and kernel bytes from device-used readings (before a new context, after it, after a warm-up step and
    the allocator's reserve then). Kernels never go below the calibration: a short warm-up loads fewer modules than
    a whole run does. None when the context is outside CONTEXT_RANGE (another process changed the device meanwhile)."""
    context = after_init - before
    if not CONTEXT_RANGE[0] <= context <= CONTEXT_RANGE[1]:
        return None
    kernels = max(CUDA_KERNELS, after_warmup - after_init - reserved)
    return {"cuda_context": int(context), "cuda_kernels": int(kernels)}


def traceable(plan: RunPlan) -> bool:
    """A single-process step we can replay: no DeepSpeed sharding or offload."""
    return not plan.deepspeed


_TRACE_CACHE: dict[tuple, tuple[int, dict[str, int], str]] = {}
CACHE_SIZE = 256  # entries per cache (the UI re-estimates the same few configs)


def _traced(
    plan: RunPlan,
    model_config: Any,
    census: Any,
    notes: list[str],
    liger: int | None = None,
    generation: int = 0,
    segments: list[int] | None = None,
    images: Any = None,
) -> tuple[int, dict[str, int], str] | None:
    """Replay the step on fake tensors: (peak bytes, live bytes by component at the peak, phase); None on failure.
    `liger`: the bytes of Liger's fused loss, which take the place of the replayed logits. `generation`: the bytes of
    sampling the answers before the step (GRPO; `generate` is not replayed): a phase of its own on top of the state
    the replay holds before its forward pass. `segments`: the example lengths of a packed micro batch."""
    from finetune.memory import analytic as ma
    from finetune.memory import trace as mt

    config, device = plan.config, plan.device
    key = (
        _model_key(config),
        device,
        plan.precision,
        plan.liger,
        _shape_settings(config),
        tuple(segments or ()),
        images,
    )
    if key not in _TRACE_CACHE:
        try:
            result = mt.trace(model_config, plan, segments=segments, images=images)
        except Exception as exc:  # noqa: BLE001 - an architecture the replay cannot run: formulas instead
            notes.append(f"replay failed ({type(exc).__name__}: {str(exc)[:120]}); using the formulas")
            return None
        peaks = dict(result.phase_peak)
        splits = {p: dict(s) for p, s in result.phase_split.items()}
        if device == "cpu" and config.optim in ("adamw_8bit", "paged_adamw_8bit") and "optimizer" in peaks:
            extra = ma.cpu_8bit_temporaries(census)  # inside one bitsandbytes CPU kernel: invisible to a replay
            peaks["optimizer"] += extra
            splits["optimizer"]["optimizer_temporaries"] = splits["optimizer"].get("optimizer_temporaries", 0) + extra
        if liger is not None:
            _with_liger_head(peaks, splits, liger)
        if generation and "setup" in peaks:
            peaks["generation"] = peaks["setup"] + generation
            splits["generation"] = {**splits["setup"], "generation_cache": generation}
        phase = max(peaks, key=peaks.get)
        _bounded(_TRACE_CACHE)[key] = (peaks[phase], _merge_split(splits[phase]), phase)
    peak, split, phase = _TRACE_CACHE[key]
    return peak, dict(split), phase


def packed_segments(plan: RunPlan, notes: list[str]) -> list[int] | None:
    """A packed run's largest micro batch: the lengths of the data's longest rows, one per example of a micro batch
    (each cut at max_seq_length), priced as one row of their real tokens. None for padded rows. When the lengths are
    not known here (a Hub dataset not counted yet) every example counts as max_seq_length long: the worst case."""
    if not plan.packing:
        return None
    config = plan.config
    rows, seq = config.per_device_train_batch_size, config.max_seq_length
    stats = stats_for(config)
    if stats is None or not stats.lengths:
        notes.append(
            f"packing: the data's lengths are not counted yet (that needs no download and the model's tokenizer at "
            f"hand), so a micro batch counts as the most it can hold: {rows} x {seq} tokens"
        )
        return [seq] * rows
    segments = [min(n, seq) for n in reversed(stats.lengths[-rows:])]
    notes.append(
        f"packing: a micro batch holds at most {sum(segments)} real tokens (the data's {len(segments)} longest rows), "
        f"not {rows} x {seq} padded" + (f" ({stats.notes[0]})" if stats.notes else "")
    )
    return segments


def stats_for(config: TrainConfig) -> Any:
    """The data's token lengths when they cost no download and no conversion of the embedded model, or None (then a
    cut's cost is unknown and cuts rank after every option that keeps the data; a packed micro batch counts as full
    rows). The search and the estimate's packed micro batch read the same lengths here."""
    from finetune.data.stats import cached_or_local

    try:
        return cached_or_local(config)
    except Exception:  # noqa: BLE001 - advice without the data's lengths still helps: cuts are ranked last
        return None


# Settings that do not change what a step allocates: left out of the replay cache key (the UI re-estimates often).
_NOT_MEMORY = ("dataset", "output_dir", "run_name", "learning_rate", "num_train_epochs", "max_steps", "seed")


def _shape_settings(config: TrainConfig) -> tuple:
    """The config's values that can change the replayed step."""
    values = asdict(config)
    return tuple(sorted((k, repr(v)) for k, v in values.items() if k not in _NOT_MEMORY))


HEAD_PHASES = ("forward_head", "backward_head")  # where the logits and the loss's buffers are alive


def _with_liger_head(peaks: dict[str, int], splits: dict[str, dict[str, int]], liger: int) -> None:
    """The replay with Liger's loss: a Triton kernel cannot run on fake tensors, so the replay ran transformers' loss.
    Around the head its logits and loss buffers (the `logits_loss` tensors) give way to Liger's term; later phases
    keep theirs (the hidden states' gradient, which Liger holds too)."""
    for phase in HEAD_PHASES:
        if phase in peaks:
            eager = splits[phase].get("logits_loss", 0)
            peaks[phase] += liger - eager
            splits[phase]["logits_loss"] = liger


def _merge_split(split: dict[str, int]) -> dict[str, int]:
    """Trace categories as component names."""
    out: dict[str, int] = {}
    for cat, v in split.items():
        name = {"other": "activations"}.get(cat, cat)
        out[name] = out.get(name, 0) + max(0, int(v))
    return out


def _analytic_split(a: Any) -> dict[str, int]:
    """What the formulas say is live at their peak phase."""
    from finetune.memory import analytic as ma

    c = a.components
    static = ("weights", "reference_model", "quant_constants", "lora", "optimizer", "master_weights", "ddp_buckets")
    live = {k: c.get(k, 0) for k in static}
    phase = a.peak_phase
    if phase == ma.GENERATION_PHASE:
        live["generation_cache"] = c["generation_cache"]
        return live
    if phase == "optimizer step":
        live["gradients"] = c["gradients"]
        live["optimizer_temporaries"] = c["optimizer_temporaries"]
        return live
    live["activations"] = c["activations"]
    live["gradients"] = c["gradients"] if a.phases[phase] - sum(live.values()) >= c["gradients"] > 0 else 0
    rest = a.phases[phase] - sum(live.values())
    live["logits_loss" if phase.startswith("start of backward") else "backward_temporaries"] = max(0, rest)
    return live


def _comparisons(census: Any, s: Any) -> dict[str, int]:
    """The rule of thumb (about 5x the model's size) and accelerate's estimate-memory training figure."""
    from finetune.memory import analytic as ma

    model_bytes = ma.weights_bytes(census, s) + ma.quant_constants_bytes(census, s)
    out = {"rule_of_thumb": 5 * model_bytes}
    try:
        from accelerate.commands.estimate import estimate_training_usage

        usage = estimate_training_usage(4 * census.total, "bfloat16" if s.amp else "float32")
        out["accelerate"] = int(max(usage.values()))
    except Exception:  # noqa: BLE001 - accelerate missing or changed: leave the comparison out
        pass
    return out


# ----------------------------------------------------------------------------- model config + census (cached)

_CONFIG_CACHE: dict[tuple, Any] = {}
_IMAGE_CACHE: dict[tuple, Any] = {}
_CENSUS_CACHE: dict[tuple, Any] = {}


def model_config_of(config: TrainConfig) -> Any:
    """The model's transformers config (no weights): the bundled catalogue for popular Hub ids (offline, gated repos,
    instant), else a local dir, a Hub id (its config.json only; fails in seconds when the Hub is unreachable) or the
    embedded default."""
    key = _model_key(config)
    if key not in _CONFIG_CACHE:
        from finetune.model import catalogue
        from finetune.model.loading import load_model_config

        bundled = catalogue.load_config(config.model) if catalogue.is_hub_id(config.model) else None
        loaded = bundled or load_model_config(config.model, trust_remote_code=config.trust_remote_code)
        _bounded(_CONFIG_CACHE)[key] = loaded
    return _CONFIG_CACHE[key]


def _bounded(cache: dict) -> dict:
    """The cache, emptied first when it is full."""
    if len(cache) >= CACHE_SIZE:
        cache.clear()
    return cache


def _model_key(config: TrainConfig) -> tuple:
    """What identifies the model's shape (a local directory's config.json may be rewritten: its mtime counts)."""
    try:
        stamp = os.stat(os.path.join(config.model, "config.json")).st_mtime_ns
    except OSError:
        stamp = 0
    return (config.model, config.trust_remote_code, stamp)


def image_load_of(plan: RunPlan, model_config: Any = None) -> Any:
    """The images of `plan`'s rows and their tokens (`finetune.memory.images.image_load`), cached by everything that
    changes them: the search prices many image sides, and building a processor takes milliseconds each time."""
    from finetune.memory.images import image_load

    config = plan.config
    data = os.path.expanduser(config.dataset)
    try:
        data_stamp = os.stat(data).st_mtime_ns
    except OSError:
        data_stamp = 0
    columns = tuple(getattr(config, f) for f in ("messages_column", "prompt_column", "completion_column"))
    key = (_model_key(config), plan.vision, config.dataset, config.dataset_split, columns, data_stamp)
    if key not in _IMAGE_CACHE:
        model_config = model_config if model_config is not None else model_config_of(config)
        _bounded(_IMAGE_CACHE)[key] = image_load(plan, model_config)
    return _IMAGE_CACHE[key]


def _smaller_side_note(plan: RunPlan, images: Any) -> str | None:
    """The lever a smaller image side gives, for the notes: `image_longest_side` at half the images' side now, and
    the tokens a row it saves (None when it saves none: Gemma 3's images are always 256 tokens)."""
    half = images.longest_side(plan.vision.image_longest_side) // 2
    if half < 16 or not images.images_per_row:
        return None
    tokens = image_load_of(plan.replanned(image_longest_side=half)).tokens_per_image
    saved = (images.tokens_per_image - tokens) * images.images_per_row
    if saved <= 0:
        return None
    return (
        f"lever: image_longest_side: {half} would make each image {tokens} tokens instead of "
        f"{images.tokens_per_image} ({saved} fewer a row)"
    )


def census_of(plan: RunPlan, model_config: Any = None) -> Any:
    """Parameter counts for the plan's method (cached: the UI estimates the same model many times)."""
    from finetune.memory import analytic as ma

    config = plan.config
    model_config = model_config if model_config is not None else model_config_of(config)

    key = (
        _model_key(config),
        config.method,
        config.lora_r,
        config.lora_target_modules,
        config.task,
        config.num_labels,
        config.use_dora,
    )
    if key not in _CENSUS_CACHE:
        try:
            _bounded(_CENSUS_CACHE)[key] = ma.census(model_config, plan)
        except ValueError as exc:
            from finetune.model.loading import raise_if_no_target

            raise_if_no_target(exc, config)
            raise
    return _CENSUS_CACHE[key]
