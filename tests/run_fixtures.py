"""Finished run directories for tests that read runs (publish, chat) without training one.

`build_run` writes what the training engine leaves behind (see finetune/rundir.py): a LoRA adapter saved with
PEFT on the tiny Llama, its tokenizer, config.yaml, status.json, events.jsonl, and a checkpoint folder with an
optimizer state that must never be published. Swap it for a really trained tiny run once the engine exists.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from finetune.config import TrainConfig
from finetune.rundir import RunDir

PROMPTS = ("What is the capital of France?", "What is two plus two?")


def build_run(
    run_dir: Path,
    base_model_dir: Path,
    *,
    status: str = "completed",
    steps: int = 10,
    seed: int = 0,
    **config_overrides,
) -> Path:
    """A finished LoRA run on `base_model_dir` in `run_dir` (created); returns `run_dir`."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(str(base_model_dir))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    with torch.no_grad():  # "training": move the LoRA B matrices off zero so the adapter changes the output
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.05)
    model.save_pretrained(str(run_dir))
    AutoTokenizer.from_pretrained(str(base_model_dir)).save_pretrained(str(run_dir))

    config = TrainConfig(
        model=str(base_model_dir), lora_r=4, lora_alpha=8, max_steps=steps, output_dir=str(run_dir), **config_overrides
    )
    rd = RunDir(run_dir)
    rd.write_config(config)

    # A checkpoint with optimizer state, as the Trainer leaves it: it must never be pushed.
    checkpoint = run_dir / f"checkpoint-{steps}"
    checkpoint.mkdir(exist_ok=True)
    (checkpoint / "optimizer.pt").write_bytes(b"\0" * 64)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": steps}), encoding="utf-8")

    t0 = time.time() - 30
    losses = [round(3.2 * (0.85**i) + 0.1, 4) for i in range(1, steps + 1)]
    events = [{"time": t0, "type": "status", "status": "running"}]
    events.append(
        {
            "time": t0 + 0.5,
            "type": "samples",
            "step": 0,
            "samples": [{"prompt": p, "answer": f"I do not know about {p.split()[-1]}"} for p in PROMPTS],
        }
    )
    for step, loss in enumerate(losses, start=1):
        events.append({"time": t0 + step, "type": "log", "step": step, "loss": loss, "learning_rate": 5e-4})
        if step % 5 == 0:
            events.append({"time": t0 + step, "type": "eval", "step": step, "eval_loss": round(loss + 0.2, 4)})
    events.append(
        {
            "time": t0 + steps + 1,
            "type": "samples",
            "step": steps,
            "samples": [
                {"prompt": PROMPTS[0], "answer": "Arr, the capital o' France be Paris, matey!"},
                {"prompt": PROMPTS[1], "answer": "Two plus two be four, ye landlubber."},
            ],
        }
    )
    events.append({"time": t0 + steps + 2, "type": "status", "status": status})
    rd.events_path.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    rd.write_status(
        {
            "status": status,
            "step": steps,
            "max_steps": steps,
            "loss": losses[-1],
            "eval_loss": round(losses[-1] + 0.2, 4),
            "runtime_s": 31.4,
            "device": "cpu",
            "started_at": t0,
            "updated_at": t0 + steps + 2,
        }
    )
    return run_dir
