"""What every engine does before and after its loop: tokenizer, data, model, sample prompts, final save."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from finetune import data
from finetune.atomic import write_json
from finetune.config import TrainConfig
from finetune.errors import UserError
from finetune.model import loading
from finetune.model.inference import LABELS_FILE
from finetune.plan import RunPlan
from finetune.runs.progress import Progress

INITIAL_ADAPTER = "initial-adapter"  # PiSSA / OLoRA: the adapter as initialised, for the final conversion


@dataclass
class Prepared:
    """Everything a training loop needs, built from the config."""

    tokenizer: Any
    model: Any
    data: data.PreparedData
    collator: Any
    prompts: list[str]
    precision: str
    plan: RunPlan
    references: list[str | None] = field(default_factory=list)  # each held-out prompt's reference answer, if known


def prepare_run(plan: RunPlan, progress: Progress) -> Prepared:
    """Load tokenizer, data and model as the plan says, reporting each stage to the user."""
    import torch

    config = plan.config
    precision = plan.precision
    if config.precision in ("fp16", "bf16") and precision == "fp32":
        progress.message(f"precision: {config.precision} needs a GPU; none found, so this run uses fp32")
    device = torch.cuda.get_device_name(0) if plan.device == "cuda" else "cpu"
    progress.update(device=device)
    if config.trust_remote_code:
        progress.message("warning: trust_remote_code is on: Python code from the model repository runs on this machine")
    progress.set_status("loading", message="loading the tokenizer and data")
    # A vision-language model reads its data through its processor (tokenizer + image processor).
    tokenizer = loading.load_processor(plan) if plan.vision is not None else loading.load_tokenizer(config)
    check_sequence_length(config)
    prepared_data = data.prepare(config, tokenizer)
    check_vision_data(plan, prepared_data.format.kind)
    progress.message(
        f"data: {prepared_data.format.describe()}, {len(prepared_data.train)} training rows"
        + (f", {len(prepared_data.eval)} eval rows" if prepared_data.eval is not None else ", no eval split")
    )
    progress.event("dataset", dataset=config.dataset, **data.fingerprint(config))
    for note in prepared_data.notes:
        progress.message(note)
    progress.message(f"loading the model ({config.method}, {precision}) on {device}")
    model = loading.load_model(plan, num_labels=prepared_data.num_labels or None)
    if prepared_data.label_names:
        model.config.id2label = dict(enumerate(prepared_data.label_names))
        model.config.label2id = {name: i for i, name in enumerate(prepared_data.label_names)}
        if progress.write_files:  # a LoRA classifier saves only its adapter: keep the class names beside it
            write_json(progress.run.path / LABELS_FILE, prepared_data.label_names)
    save_initial_adapter(model, plan, progress)
    trainable, total = loading.parameter_counts(model)
    progress.message(
        f"model: {total / 1e6:.1f}M parameters, {trainable / 1e6:.2f}M trainable ({trainable / total:.2%})"
    )
    heldout = data.heldout_samples(config)
    plan = packed_plan(model, plan, progress)
    return Prepared(
        tokenizer=tokenizer,
        model=model,
        data=prepared_data,
        collator=data.collator(config, tokenizer, packing=plan.packing, kind=prepared_data.format.kind),
        prompts=[prompt for prompt, _ in heldout],
        precision=precision,
        plan=plan,
        references=[reference for _, reference in heldout],
    )


def samples_event(prepared: Prepared, answers: list[str]) -> dict[str, Any]:
    """The "samples" event of the held-out answers: each prompt, answer, reference answer (where known) and images
    (an image prompt's files). Their
    scores against the references are computed by whoever reads them (`Studio.held_out_scores`): ROUGE-L's library
    costs a second of imports that a training process should not pay."""
    references = prepared.references or [None] * len(prepared.prompts)
    samples = [
        {
            "prompt": str(p),
            "answer": a,
            **({"reference": r} if r is not None else {}),
            # An image prompt's pictures (files, one per <image> tag of the prompt), for the page to show beside it.
            **({"images": list(p.images)} if getattr(p, "images", None) else {}),
        }
        for p, a, r in zip(prepared.prompts, answers, references, strict=True)
    ]
    return {"samples": samples}


def packed_plan(model: Any, plan: RunPlan, progress: Progress) -> RunPlan:
    """The plan as it runs: its packing decision stands once the model has shown that its attention keeps packed
    examples apart (`finetune.model.packing.enable`); otherwise packing is vetoed here, the one place that can, and
    the vetoed plan is recorded as the run's plan.json. The run log's line is the plan's `packing_line`."""
    if plan.packing:
        from finetune.model import packing

        problem = packing.enable(model)
        if problem is not None:
            plan = plan.without_packing(problem)
            if progress.write_files:
                progress.run.write_plan(plan)
    if plan.config.packing:
        progress.message(plan.packing_line)
    return plan


def check_vision_data(plan: RunPlan, kind: data.DataKind) -> None:
    """A vision-language model trains here on image data (images with a conversation, a prompt and answer or a
    caption), and image data needs one: either mismatch is refused in one line (docs/data.md lists the formats)."""
    if plan.vision is None and kind == data.DataKind.IMAGES:
        raise UserError(
            f"model: {plan.config.model} is not a vision-language model this app knows (SmolVLM / Idefics3, Qwen2-VL, "
            "Qwen2.5-VL, Qwen3-VL, Gemma 3 with its vision part), but the data has images; choose such a model",
            field="model",
        )
    if plan.vision is not None and kind != data.DataKind.IMAGES:
        raise UserError(
            f"dataset: {plan.config.model} is a vision-language model; give data with an images column (messages + "
            "images, ShareGPT conversations with <image> tags + images, or image + caption), e.g. bundled:shapes",
            field="dataset",
        )


def check_sequence_length(config: TrainConfig) -> None:
    """Refuse a max_seq_length beyond what the model's position embeddings support."""
    limit = loading.max_positions(loading.load_model_config(config.model, config.trust_remote_code))
    if limit and config.max_seq_length > limit:
        raise UserError(
            f"max_seq_length: {config.max_seq_length} is beyond this model's limit of {limit} tokens; use ≤ {limit}",
            field="max_seq_length",
        )


def save_initial_adapter(model: Any, plan: RunPlan, progress: Progress) -> None:
    """PiSSA / OLoRA move part of each base weight into the adapter. Keep the adapter as it starts, so the final
    save can turn the trained one into a plain LoRA adapter that loads on the unchanged base (PEFT's conversion)."""
    if plan.lora is None or not plan.lora.rewrites_base or not progress.write_files:
        return
    target = progress.run.path / INITIAL_ADAPTER
    if (target / "adapter_config.json").is_file():
        return  # a resume rebuilds the same start (the SVD / QR of the same base); the first one stays
    adapter = model.peft_config["default"]
    adapter.init_lora_weights = True  # as PEFT asks: the saved start must not be re-initialised when read back
    try:
        model.save_pretrained(str(target))
    finally:
        adapter.init_lora_weights = plan.lora.init_lora_weights


def write_used_ds_config(args: Any, progress: Progress) -> None:
    """Trainer path with DeepSpeed: the DeepSpeed config as the Trainer filled it in ("auto" resolved) goes into the
    run directory as ds_config.json, as the DeepSpeed engine writes its own (rank 0 only)."""
    used = getattr(getattr(args, "hf_deepspeed_config", None), "config", None)
    if used and progress.write_files:
        from finetune.engines.deepspeed_config import write_ds_config

        write_ds_config(used, progress.run.path)


def save_final(
    model: Any, tokenizer: Any, progress: Progress, trainer: Any = None, plan: RunPlan | None = None
) -> None:
    """Save the adapter (or full model) and tokenizer into the run directory."""
    target = progress.run.path
    if plan is not None and plan.lora is not None and plan.lora.rewrites_base:
        if progress.write_files:
            unwrapped = trainer.accelerator.unwrap_model(trainer.model) if trainer is not None else model
            # The difference to the saved start, as a plain LoRA adapter of rank 2r on the unchanged base.
            unwrapped.save_pretrained(
                str(target), path_initial_model_for_weight_conversion=str(target / INITIAL_ADAPTER)
            )
    elif trainer is not None:
        trainer.save_model(str(target))  # handles DeepSpeed gathering and rank-0-only writes
    elif progress.write_files:
        model.save_pretrained(str(target))
    if progress.write_files:
        tokenizer.save_pretrained(str(target))
        progress.event("saved", path=str(target))
