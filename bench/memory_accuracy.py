"""How right is the memory estimator? Estimate vs the measured peak of live tensors of real training steps.

For each configuration: build a random-initialised model from a config, save it, load and train it exactly as the
engine does (`finetune.model.loading.load_model` + `finetune.engines.hf_trainer.training_arguments` + `Trainer`, 3
optimizer
steps), count live tensor storages with a TorchDispatchMode (`finetune.memory.trace.LiveBytes`: every storage any op
creates, and every weight, buffer and quantisation constant that exists before), and print the peak beside
`finetune.memory.estimate(plan)`, accelerate's `estimate-memory` figure and the "about 5x the model" rule of thumb.

    .venv/bin/python bench/memory_accuracy.py                 # CPU, 16 small configurations, a few minutes
    .venv/bin/python bench/memory_accuracy.py --only llama    # configurations whose name contains "llama"
    .venv/bin/python bench/memory_accuracy.py --device cuda   # on a GPU: 0.5B-8B Llama shapes, bf16, LoRA / QLoRA,
                                                              # against torch.cuda.max_memory_allocated()

The last printed line is the headline: median and worst error of our estimate.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from finetune.data.kinds import DataKind  # noqa: E402 (after the path set-up above)
from finetune.plan import plan_for  # noqa: E402

MiB = 2**20


@dataclass
class Case:
    """One configuration: an architecture (a transformers config) and the run settings (TrainConfig fields)."""

    name: str
    arch: str
    settings: dict[str, Any] = field(default_factory=dict)


def arch_config(arch: str) -> Any:
    """Small random-init model configs for CPU, and realistic Llama shapes for the GPU mode."""
    from transformers import GPT2Config, LlamaConfig

    common = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
    if arch == "gpt2":  # GPT-2 style: LayerNorm, GELU MLP, learned positions, fused qkv Conv1D, dropout 0.1
        return GPT2Config(n_embd=256, n_layer=4, n_head=4, vocab_size=8192, n_positions=1024, **common)
    if arch == "llama":  # Llama style: RMSNorm, SwiGLU MLP, RoPE, grouped-query attention (8 heads, 2 KV heads)
        return LlamaConfig(
            hidden_size=256,
            intermediate_size=688,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=2,
            vocab_size=8192,
            max_position_embeddings=2048,
            tie_word_embeddings=False,
            **common,
        )
    if arch == "bigvocab":  # a large vocabulary (Llama-3 size) on a small body: logits and loss dominate
        return LlamaConfig(
            hidden_size=128,
            intermediate_size=344,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=128256,
            max_position_embeddings=2048,
            tie_word_embeddings=True,
            **common,
        )
    sizes = {  # GPU mode: (hidden, intermediate, layers, heads, kv heads, vocab, tied)
        "llama-0.5b": (1024, 2816, 24, 16, 16, 151936, True),
        "llama-1b": (2048, 8192, 16, 32, 8, 128256, True),
        "llama-3b": (3072, 8192, 28, 24, 8, 128256, True),
        "llama-8b": (4096, 14336, 32, 32, 8, 128256, False),
    }
    h, i, n, a, kv, v, tied = sizes[arch]
    return LlamaConfig(
        hidden_size=h,
        intermediate_size=i,
        num_hidden_layers=n,
        num_attention_heads=a,
        num_key_value_heads=kv,
        vocab_size=v,
        max_position_embeddings=8192,
        tie_word_embeddings=tied,
        **common,
    )


CPU_CASES = [
    Case("gpt2 full s128 adamw", "gpt2", {"method": "full", "max_seq_length": 128}),
    Case(
        "gpt2 full s512 adamw ckpt", "gpt2", {"method": "full", "max_seq_length": 512, "gradient_checkpointing": True}
    ),
    Case("gpt2 lora s512 adamw", "gpt2", {"method": "lora", "max_seq_length": 512}),
    Case("gpt2 qlora s128 sgd", "gpt2", {"method": "qlora", "max_seq_length": 128, "optim": "sgd"}),
    Case("llama full s128 adamw", "llama", {"method": "full", "max_seq_length": 128}),
    Case("llama full s512 sgd", "llama", {"method": "full", "max_seq_length": 512, "optim": "sgd"}),
    Case(
        "llama full s512 adamw8bit ckpt",
        "llama",
        {"method": "full", "max_seq_length": 512, "optim": "adamw_8bit", "gradient_checkpointing": True},
    ),
    Case("llama lora s128 adamw", "llama", {"method": "lora", "max_seq_length": 128}),
    Case(
        "llama lora s512 adamw ckpt", "llama", {"method": "lora", "max_seq_length": 512, "gradient_checkpointing": True}
    ),
    Case(
        "llama lora s512 paged8bit accum2",
        "llama",
        {
            "method": "lora",
            "max_seq_length": 512,
            "optim": "paged_adamw_8bit",
            "per_device_train_batch_size": 2,
            "gradient_accumulation_steps": 2,
        },
    ),
    Case("llama qlora s512 adamw", "llama", {"method": "qlora", "max_seq_length": 512}),
    Case(
        "llama qlora s512 sgd ckpt fp4",
        "llama",
        {
            "method": "qlora",
            "max_seq_length": 512,
            "optim": "sgd",
            "gradient_checkpointing": True,
            "quant_type": "fp4",
            "double_quant": False,
        },
    ),
    Case(
        "llama lora s256 q,v r16 nodrop",
        "llama",
        {
            "method": "lora",
            "max_seq_length": 256,
            "lora_target_modules": "q_proj,v_proj",
            "lora_r": 16,
            "lora_dropout": 0.0,
        },
    ),
    Case("llama dora s256 adamw", "llama", {"method": "lora", "max_seq_length": 256, "use_dora": True}),
    Case("llama dpo lora s256 adamw", "llama", {"method": "lora", "max_seq_length": 256, "objective": "dpo"}),
    Case(
        "llama dpo lora s256 ckpt",
        "llama",
        {"method": "lora", "max_seq_length": 256, "objective": "dpo", "gradient_checkpointing": True},
    ),
    Case("llama dpo full s128 adamw", "llama", {"method": "full", "max_seq_length": 128, "objective": "dpo"}),
    Case("llama kto lora s256 adamw", "llama", {"method": "lora", "max_seq_length": 256, "objective": "kto"}),
    Case("llama orpo lora s256 adamw", "llama", {"method": "lora", "max_seq_length": 256, "objective": "orpo"}),
    Case("bigvocab full s128 adamw", "bigvocab", {"method": "full", "max_seq_length": 128}),
    Case("bigvocab lora s256 adamw", "bigvocab", {"method": "lora", "max_seq_length": 256}),
    Case(
        "bigvocab qlora s256 sgd ckpt",
        "bigvocab",
        {"method": "qlora", "max_seq_length": 256, "optim": "sgd", "gradient_checkpointing": True},
    ),
]
CPU_BATCH = 4
CPU_BIGVOCAB_BATCH = 2


def gpu_cases() -> list[Case]:
    """24+ realistic configurations for the lent GPU: 0.5B-8B Llama shapes, bf16, LoRA and QLoRA 4-bit."""
    cases = []
    for arch in ("llama-0.5b", "llama-1b", "llama-3b", "llama-8b"):
        for method in ("lora", "qlora"):
            for seq, ckpt in ((512, False), (1024, True), (2048, True)):
                settings = {
                    "method": method,
                    "max_seq_length": seq,
                    "gradient_checkpointing": ckpt,
                    "precision": "bf16",
                    "per_device_train_batch_size": 4 if seq < 2048 else 2,
                }
                cases.append(Case(f"{arch} {method} s{seq}{' ckpt' if ckpt else ''}", arch, settings))
    cases.append(
        Case(
            "llama-0.5b full s512",
            "llama-0.5b",
            {"method": "full", "max_seq_length": 512, "precision": "bf16", "per_device_train_batch_size": 4},
        )
    )
    cases.append(
        Case(
            "llama-1b full s1024 ckpt 8bit",
            "llama-1b",
            {
                "method": "full",
                "max_seq_length": 1024,
                "gradient_checkpointing": True,
                "optim": "adamw_8bit",
                "precision": "bf16",
                "per_device_train_batch_size": 4,
            },
        )
    )
    return cases


# ----------------------------------------------------------------------------- one configuration


def train_config(case: Case, model_dir: Path, device: str) -> Any:
    """The TrainConfig of a case (3 optimizer steps, no eval, no checkpoints)."""
    from finetune.config import TrainConfig

    batch = CPU_BIGVOCAB_BATCH if case.arch == "bigvocab" else CPU_BATCH
    values = {
        "model": str(model_dir),
        "per_device_train_batch_size": batch,
        "max_steps": 3,
        "save_steps": 1000,
        "eval_split": "",
        "warmup_steps": 0,
        "precision": "fp32" if device == "cpu" else "auto",
        # The measured step trains full max_seq_length rows (`dataset`), not the default data packed: the estimate
        # must price the same batch (packing is on by default and would price the bundled set's short rows).
        "packing": False,
    }
    values.update(case.settings)
    return TrainConfig(**values)


def save_random_model(case: Case, where: Path) -> Path:
    """Random-initialise the architecture and save it (weights in fp32 on CPU, bf16 for the GPU shapes)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = arch_config(case.arch)
    path = where / case.arch
    if not (path / "config.json").is_file():
        small = case.arch in ("gpt2", "llama", "bigvocab")
        device = "cpu" if small or not torch.cuda.is_available() else "cuda"  # random init of 8B params: on the GPU
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32 if small else torch.bfloat16)
        model.save_pretrained(path)
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    return path


def dataset(config: Any, vocab: int, rows: int) -> list[dict[str, Any]]:
    """Rows of `max_seq_length` random tokens (the worst case: no padding), labels on every token."""
    import torch

    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(rows):
        ids = torch.randint(3, vocab, (config.max_seq_length,), generator=g)
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()})
    return out


def engine_trainer(plan: Any, model: Any, train_dataset: Any, data_collator: Any, out: Path) -> Any:
    """A Trainer as the engine builds one (its training arguments for `plan`, writing to `out`), logging off: the
    step the memory benches measure."""
    from transformers import Trainer

    from finetune.engines.hf_trainer import training_arguments

    args = training_arguments(plan, out, has_eval=False)
    args.logging_strategy = "no"
    return Trainer(model=model, args=args, train_dataset=train_dataset, data_collator=data_collator)


def measure(config: Any, device: str, memtracker: bool = False) -> dict[str, int]:
    """Train 3 optimizer steps as the engine does; the peak of live tensor bytes (and the allocator's on CUDA).

    `memtracker`: measure with torch's MemTracker instead of our counter (an independent check; it hooks every
    parameter, so full fine-tuning only).
    """
    import torch
    from transformers import default_data_collator

    from finetune.memory.trace import LiveBytes, _quant_state_tensors
    from finetune.model import loading

    plan = plan_for(config)
    if plan.objective.engine == "preference":
        return measure_preference(config, device)
    model = loading.load_model(plan)
    rows = config.per_device_train_batch_size * config.gradient_accumulation_steps * config.max_steps
    with tempfile.TemporaryDirectory() as out:
        rows_in = dataset(config, model.config.vocab_size, rows)
        trainer = engine_trainer(plan, model, rows_in, default_data_collator, Path(out))
        if memtracker:
            result = {"peak": _memtracker_peak(trainer)}
        elif device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            trainer.train()
            torch.cuda.synchronize()
            result = {"peak": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.max_memory_reserved()}
        else:
            counter = LiveBytes()
            for t in [*model.parameters(), *model.buffers()]:
                counter.track(t)
                for q in _quant_state_tensors(getattr(t, "quant_state", None) or object()):
                    counter.track(q)
            counter.reset("train")
            with counter:
                trainer.train()
            result = {"peak": counter.peak}
        trainer.model = trainer.model_wrapped = trainer.optimizer = trainer.lr_scheduler = None
    del model, trainer
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return result


def preference_rows(config: Any, rows: int) -> list[dict[str, Any]]:
    """Preference rows whose every sequence (prompt + answer) runs past `max_seq_length`: TRL cuts each to exactly
    that length (the worst case, as for SFT). DPO / ORPO pairs; KTO rows with alternating good / bad labels."""
    long = " ".join(["Arr matey, the capital of France be Paris! The quick brown fox jumps over the lazy dog."] * 40)
    if DataKind.UNPAIRED in plan_for(config).objective.data_kinds:
        return [{"prompt": f"Question {i}?\n", "completion": long, "label": i % 2 == 0} for i in range(rows)]
    return [{"prompt": f"Question {i}?\n", "chosen": long, "rejected": long[::-1]} for i in range(rows)]


def measure_preference(config: Any, device: str) -> dict[str, int]:
    """Train 3 optimizer steps of a preference objective as the engine does (`finetune.engines.preference`: TRL's
    trainer with the run's arguments and reference); the peak of live tensor bytes."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer

    from finetune.engines import preference
    from finetune.memory.trace import LiveBytes
    from finetune.model import loading

    if not (Path(config.model) / "tokenizer.json").is_file():
        from tests.tiny import build_tokenizer

        build_tokenizer(Path(config.model))  # byte-level BPE, vocabulary 384: ids fit every bench model
    tokenizer = AutoTokenizer.from_pretrained(config.model)
    plan = plan_for(config)
    model = loading.load_model(plan)
    reference = None
    if plan.reference == "copy":
        reference = loading.load_base(plan)
        reference.requires_grad_(False)
        reference.eval()
    rows = config.per_device_train_batch_size * config.gradient_accumulation_steps * config.max_steps
    with tempfile.TemporaryDirectory() as out:
        args = preference.preference_arguments(plan, Path(out), has_eval=False)
        args.logging_strategy, args.save_strategy, args.report_to = "no", "no", []
        kwargs = {"ref_model": reference} if plan.objective.reference != "none" else {}
        trainer = preference.trainer_class(plan.objective)(
            model=model,
            args=args,
            train_dataset=Dataset.from_list(preference_rows(config, rows)),
            processing_class=tokenizer,
            **kwargs,
        )
        preference.drop_reference_adapter(trainer, plan)
        result = {"peak": LiveBytes().training_peak(trainer, *([reference] if reference is not None else []))}
        trainer.model = trainer.model_wrapped = trainer.optimizer = trainer.lr_scheduler = None
    del model, trainer, reference
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return result


def measure_grpo(config: Any, device: str, prompts: list[str]) -> dict[str, int]:
    """Train optimizer steps of learning from rewards as the engine does (`finetune.engines.grpo`: TRL's GRPOTrainer
    with the run's arguments, sampling included); the peak of live tensor bytes. A reward that is 1 for every answer
    keeps the step's work what it is whatever the answers say."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer

    from finetune.engines import grpo, preference
    from finetune.memory.trace import LiveBytes
    from finetune.model import loading

    tokenizer = AutoTokenizer.from_pretrained(config.model)
    plan = plan_for(config)
    model = loading.load_model(plan)
    rows = [{"prompt": [{"role": "user", "content": text}]} for text in prompts]

    def constant(prompts: list, completions: list, **_: Any) -> list[float]:
        return [1.0] * len(completions)

    with tempfile.TemporaryDirectory() as out:
        args = grpo.grpo_arguments(plan, Path(out), has_eval=False)
        args.logging_strategy, args.save_strategy, args.report_to = "no", "no", []
        trainer_class = type("MeasuredGRPO", (preference.StudioTRL, preference.load_class(plan.objective.trainer)), {})
        trainer = trainer_class(
            model=model, reward_funcs=[constant], args=args, train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
        )  # fmt: skip
        preference.drop_reference_adapter(trainer, plan)
        held = [trainer.ref_model] if trainer.ref_model is not None else []
        result = {"peak": LiveBytes().training_peak(trainer, *held)}
        trainer.model = trainer.model_wrapped = trainer.optimizer = trainer.lr_scheduler = trainer.ref_model = None
    del model, trainer
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return result


def _memtracker_peak(trainer: Any) -> int:
    """Peak bytes of a Trainer run by torch.distributed._tools.mem_tracker.MemTracker (stats reset every step)."""
    from torch.distributed._tools.mem_tracker import MemTracker
    from transformers import TrainerCallback

    trainer.create_optimizer_and_scheduler(num_training_steps=trainer.args.max_steps)
    tracker = MemTracker()
    tracker.track_external(trainer.model, trainer.optimizer)

    class Reset(TrainerCallback):
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            tracker.reset_mod_stats()

    trainer.add_callback(Reset())
    with tracker:
        trainer.train()
    return int(sum(v.get("Total", 0) for v in tracker.get_tracker_snapshot("peak").values()))


def crosscheck(where: Path, only: str) -> None:
    """Our counter vs torch's MemTracker on the full fine-tuning configurations (MemTracker needs trainable params)."""
    for case in [c for c in CPU_CASES if c.settings.get("method") == "full" and only in c.name]:
        config = train_config(case, save_random_model(case, where), "cpu")
        ours, theirs = measure(config, "cpu")["peak"], measure(config, "cpu", memtracker=True)["peak"]
        print(f"{case.name:<36} LiveBytes {ours / MiB:9.1f} MiB  MemTracker {theirs / MiB:9.1f} MiB", flush=True)


def run_case(case: Case, where: Path, device: str) -> dict[str, Any]:
    """Estimate, measure, compare one configuration."""
    from finetune import memory

    model_dir = save_random_model(case, where)
    config = train_config(case, model_dir, device)
    t0 = time.perf_counter()
    est = memory.estimate(plan_for(config, device))
    est_s = time.perf_counter() - t0
    measured = measure(config, device)
    return {
        "name": case.name,
        "estimate": est.tensor_bytes,
        "analytic": est.analytic_tensor_bytes,
        "measured": measured["peak"],
        "reserved": measured.get("reserved"),
        "total": est.total_bytes,
        "accelerate": est.comparisons.get("accelerate", 0),
        "rule": est.comparisons.get("rule_of_thumb", 0),
        "method": est.method,
        "est_s": est_s,
    }


# ----------------------------------------------------------------------------- report


def pct(estimate: float, measured: float) -> float:
    """Signed error of an estimate in percent of the measurement (negative = under-prediction)."""
    return 100.0 * (estimate - measured) / measured


def table(rows: list[dict[str, Any]], device: str) -> str:
    """Markdown table of estimate vs measured, with the comparisons."""
    head = "| configuration | measured MiB | ours MiB | ours err | analytic err | accelerate err | rule-of-thumb err |"
    if device == "cuda":
        head = head[:-1] + " reserved MiB | ours total MiB |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        m = r["measured"]
        line = (
            f"| {r['name']} | {m / MiB:,.1f} | {r['estimate'] / MiB:,.1f} | {pct(r['estimate'], m):+.1f}% "
            f"| {pct(r['analytic'], m):+.1f}% | {pct(r['accelerate'], m):+.1f}% | {pct(r['rule'], m):+.1f}% |"
        )
        if device == "cuda":
            line += f" {(r['reserved'] or 0) / MiB:,.1f} | {r['total'] / MiB:,.1f} |"
        lines.append(line)
    return "\n".join(lines)


def headline(rows: list[dict[str, Any]]) -> str:
    """One line: median and worst error of ours (and of the comparisons)."""
    ours = [pct(r["estimate"], r["measured"]) for r in rows]
    worst = max(ours, key=abs)
    under = min(ours)
    acc = [abs(pct(r["accelerate"], r["measured"])) for r in rows]
    rule = [abs(pct(r["rule"], r["measured"])) for r in rows]
    ok = all(abs(e) <= 10 for e in ours) and abs(statistics.median(ours)) <= 3 and under >= -5
    return (
        f"HEADLINE: ours median {statistics.median(ours):+.2f}%, worst {worst:+.2f}%, most under {under:+.2f}% "
        f"over {len(rows)} configurations ({'meets' if ok else 'MISSES'} ±10% / median ±3% / under ≥-5%); "
        f"accelerate median |err| {statistics.median(acc):.0f}%, "
        f"rule of thumb median |err| {statistics.median(rule):.0f}%"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the configurations, print the table and the headline."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--only", default="", help="run configurations whose name contains this text")
    parser.add_argument("--out", default="", help="also write the markdown table to this file")
    parser.add_argument("--crosscheck", action="store_true", help="only compare our counter with torch's MemTracker")
    args = parser.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA GPU here", file=sys.stderr)
        return 2
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    if args.crosscheck:
        with tempfile.TemporaryDirectory() as where:
            crosscheck(Path(where), args.only)
        return 0
    cases = [c for c in (CPU_CASES if args.device == "cpu" else gpu_cases()) if args.only in c.name]
    rows = []
    started = time.time()
    with tempfile.TemporaryDirectory() as where:
        for case in cases:
            r = run_case(case, Path(where), args.device)
            rows.append(r)
            print(
                f"{r['name']:<36} measured {r['measured'] / MiB:9.1f} MiB  ours {r['estimate'] / MiB:9.1f} MiB "
                f"({pct(r['estimate'], r['measured']):+6.2f}%, {r['method']}, {r['est_s']:.2f}s)  "
                f"analytic {pct(r['analytic'], r['measured']):+6.1f}%  "
                f"accelerate {pct(r['accelerate'], r['measured']):+6.1f}%  "
                f"rule {pct(r['rule'], r['measured']):+6.1f}%",
                flush=True,
            )
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else f"{platform.processor() or 'cpu'}"
    python = os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(str(ROOT)) else "python"
    command = f"{python} bench/memory_accuracy.py " + " ".join(argv if argv is not None else sys.argv[1:])
    report = (
        f"# Memory estimator accuracy ({args.device})\n\n"
        f"- date: {time.strftime('%Y-%m-%d')}; machine: {platform.node()} ({device}, {os.cpu_count()} CPU cores); "
        f"torch {torch.__version__}; {time.time() - started:.0f} s\n"
        f"- command: `{command.strip()}`\n"
        f"- measured: peak of live tensor storages over 3 real Trainer steps "
        f"({'torch.cuda.max_memory_allocated' if args.device == 'cuda' else 'TorchDispatchMode counter'}); "
        f"ours: `finetune.memory.estimate(plan_for(config, {args.device!r})).tensor_bytes`\n"
        f"- batch {CPU_BATCH} ({CPU_BIGVOCAB_BATCH} for bigvocab) unless the name says; "
        f"errors are (estimate - measured) / measured\n\n{table(rows, args.device)}\n\n{headline(rows)}\n"
    )
    if args.out:
        Path(args.out).write_text(report, encoding="utf-8")
    print()
    print(table(rows, args.device))
    print()
    print(headline(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
