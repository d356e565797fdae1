"""The baseline: a LoRA fine-tune written the way a user writes it with Hugging Face Trainer + PEFT, no Finetune Studio.

Prompt/completion JSON lines → chat template → loss on the answer only → Trainer → save the adapter. The bench
scripts run this against `python -m finetune train` with the same model, rows and hyperparameters.

    .venv/bin/python bench/plain_trainer.py --model DIR --data rows.jsonl --output-dir out --max-steps 30

`--timing FILE` adds one small callback (not something a user would write) that records when training begins, when
each logged step ends (with the real tokens seen so far) and when training ends, so in-loop tokens/s is measured the
same way for both. `--peak-memory`
prints the peak memory at the end (CUDA max allocated on a GPU, max RSS on a CPU).
"""

from __future__ import annotations

import argparse
import json
import time


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True, help="JSON lines with prompt and completion")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--lora-r", type=int, default=8)
    parser.add_argument("--method", choices=("lora", "qlora"), default="lora")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--timing", help="write step timestamps to this JSON file")
    parser.add_argument("--peak-memory", action="store_true")
    args = parser.parse_args(argv)

    import torch
    from datasets import load_dataset
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        BitsAndBytesConfig,
        DataCollatorForSeq2Seq,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    dtype = torch.bfloat16 if args.bf16 else torch.float32
    if args.method == "qlora":
        quant = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=dtype,
        )
        device = 0 if torch.cuda.is_available() else "cpu"
        model = AutoModelForCausalLM.from_pretrained(
            args.model, quantization_config=quant, dtype=dtype, device_map={"": device}
        )
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=args.gradient_checkpointing)
    else:
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
    lora = LoraConfig(
        r=args.lora_r, lora_alpha=16, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM"
    )
    model = get_peft_model(model, lora)
    model.print_trainable_parameters()

    def tokenize(row):
        # Loss on the answer only: the prompt's tokens get label -100.
        messages = [{"role": "user", "content": row["prompt"]}]
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(
            messages + [{"role": "assistant", "content": row["completion"]}], tokenize=False
        )
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        answer_ids = tokenizer(full[len(prompt) :], add_special_tokens=False)["input_ids"]
        input_ids = (prompt_ids + answer_ids)[: args.max_seq_length]
        labels = ([-100] * len(prompt_ids) + answer_ids)[: args.max_seq_length]
        return {"input_ids": input_ids, "attention_mask": [1] * len(input_ids), "labels": labels}

    dataset = load_dataset("json", data_files=args.data, split="train")
    dataset = dataset.map(tokenize, remove_columns=dataset.column_names)

    training_args = TrainingArguments(
        output_dir=args.output_dir,
        per_device_train_batch_size=args.batch_size,
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        logging_steps=1,
        report_to="none",
        bf16=args.bf16,
        gradient_checkpointing=args.gradient_checkpointing,
        seed=42,
        # Measurement only (--timing): Trainer counts the real (non-padding) tokens, as ours does.
        include_num_input_tokens_seen="non_padding" if args.timing else "no",
    )

    callbacks = []
    timing: dict = {"steps": []}
    if args.timing:

        class Timing(TrainerCallback):  # measurement only
            def on_train_begin(self, a, state, control, **kw):
                timing["train_begin"] = time.time()

            def on_log(self, a, state, control, logs=None, **kw):
                if logs and "loss" in logs:
                    tokens = state.num_input_tokens_seen
                    timing["steps"].append([state.global_step, time.time(), float(logs["loss"]), tokens])

            def on_train_end(self, a, state, control, **kw):
                timing["train_end"] = time.time()

        callbacks.append(Timing())

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=dataset,
        data_collator=DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100, padding=True),
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    trainer.train()
    trainer.save_model(args.output_dir)

    if args.peak_memory:
        timing["peak_memory_bytes"] = peak_memory()
        print(f"peak memory: {timing['peak_memory_bytes'] / 2**20:.0f} MiB")
    if args.timing:
        timing["saved"] = time.time()
        with open(args.timing, "w", encoding="utf-8") as fh:
            json.dump(timing, fh)
    return timing


def peak_memory() -> int:
    """CUDA max allocated on a GPU, else the process's max resident set size."""
    import resource

    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


if __name__ == "__main__":
    main()
