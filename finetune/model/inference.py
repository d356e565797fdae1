"""Generation and classification: sample answers during training, streaming chat with the base model or a run's
adapter, and a sequence-classification run's labels and scores for a text."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from finetune.config import TrainConfig
from finetune.errors import UserError

if TYPE_CHECKING:
    from finetune.plan import RunPlan
MAX_NEW_TOKENS = 1024  # the longest reply chat generates (the app and the CLI alike)


@dataclass
class GenerationSettings:
    """What the Chat tab lets the user change."""

    max_new_tokens: int = 128
    temperature: float = 0.0  # 0 = greedy: the same prompt gives the same answer, easiest to compare
    top_p: float = 1.0
    system_prompt: str = ""

    def generate_kwargs(self) -> dict[str, Any]:
        if self.temperature <= 0:
            return {"max_new_tokens": self.max_new_tokens, "do_sample": False}
        return {
            "max_new_tokens": self.max_new_tokens,
            "do_sample": True,
            "temperature": self.temperature,
            "top_p": self.top_p,
        }


def chat_input_ids(tokenizer: Any, messages: list[dict[str, str]]) -> Any:
    """Token ids of a conversation ready for the assistant's turn (chat template, or plain text without one)."""
    return tokenizer(prompt_text(tokenizer, messages), add_special_tokens=False, return_tensors="pt")


def generate_answers(
    model: Any,
    tokenizer: Any,
    prompts: list[str] | list[list[dict[str, str]]],
    max_new_tokens: int = 40,
    temperature: float = 0.0,
    top_p: float = 1.0,
    images: list[list[str]] | None = None,
) -> list[str]:
    """Answers to prompts (a text is one user turn; a list of messages is a conversation), batched with left padding;
    greedy unless `temperature` > 0. A vision-language model's processor as `tokenizer` reads each prompt's `images`
    (files, one per `<image>` tag; default: a held-out `ImagePrompt`'s own). The model is left as it was found."""
    import torch

    if not prompts:
        return []
    if hasattr(tokenizer, "image_processor"):
        settings = GenerationSettings(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
        pictures = images if images is not None else [list(getattr(p, "images", ())) for p in prompts]
        return image_answers(model, tokenizer, prompts, pictures, settings)
    was_training = model.training
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        texts = [prompt_text(tokenizer, p) for p in prompts]
        batch = tokenizer(texts, add_special_tokens=False, return_tensors="pt", padding=True)
        device = next(model.parameters()).device
        batch = {k: v.to(device) for k, v in batch.items()}
        settings = GenerationSettings(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
        model.eval()
        with torch.no_grad():
            out = model.generate(
                **batch, pad_token_id=tokenizer.pad_token_id, use_cache=True, **settings.generate_kwargs()
            )
        new = out[:, batch["input_ids"].shape[1] :]
        return [tokenizer.decode(row, skip_special_tokens=True).strip() for row in new]
    finally:
        tokenizer.padding_side = side
        if was_training:
            model.train()


def image_answers(
    model: Any,
    processor: Any,
    prompts: list[str] | list[list[dict[str, str]]],
    images: list[list[str]],
    settings: GenerationSettings,
) -> list[str]:
    """A vision-language model's answer to each prompt with its images, one prompt at a time (rows differ in their
    image tiles, and held-out or evaluation prompts are few). The model is left as it was found."""
    import torch

    was_training = model.training
    device = next(model.parameters()).device
    tokenizer = processor.tokenizer
    out = []
    model.eval()
    try:
        for prompt, pictures in zip(prompts, images, strict=True):
            messages = [{"role": "user", "content": str(prompt)}] if isinstance(prompt, str) else prompt
            inputs = image_chat_inputs(processor, messages, list(pictures)).to(device)
            with torch.no_grad():
                produced = model.generate(
                    **inputs, pad_token_id=tokenizer.pad_token_id, use_cache=True, **settings.generate_kwargs()
                )
            new = produced[0, inputs["input_ids"].shape[1] :]
            out.append(tokenizer.decode(new, skip_special_tokens=True).strip())
    finally:
        if was_training:
            model.train()
    return out


def prompt_text(tokenizer: Any, prompt: str | list[dict[str, str]]) -> str:
    """The text a model answers: the chat template with the assistant's turn opened, or without a template the
    prompt and a new line (as training renders a prompt)."""
    if isinstance(prompt, str):
        if not tokenizer.chat_template:
            return prompt + "\n"
        prompt = [{"role": "user", "content": prompt}]
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return "\n".join(m["content"] for m in prompt).rstrip() + "\n"


def adapter_dir(run_path: Path) -> Path | None:
    """The newest loadable weights of a run: the final adapter/model, else the latest complete checkpoint."""
    from finetune.runs.rundir import RunDir

    run = RunDir(Path(run_path))
    if run.has_final_model():
        return run.path
    return run.last_checkpoint()


LABELS_FILE = "labels.json"  # a classification run's class names, in head order (written when the run starts)


@dataclass(frozen=True)
class Classification:
    """A classifier's answer: every label with its probability, most likely first."""

    scores: list[tuple[str, float]]

    @property
    def label(self) -> str:
        """The most likely label."""
        return self.scores[0][0]


def label_names(run_path: Path, config: TrainConfig) -> list[str]:
    """A classification run's class names: the names saved when it started, else the saved model's own
    `id2label` (a full fine-tune), else LABEL_0.. for as many classes as the saved head has."""
    from finetune.atomic import read_json

    names = read_json(Path(run_path) / LABELS_FILE)
    if isinstance(names, list) and names and all(isinstance(n, str) for n in names):
        return names
    weights = adapter_dir(run_path)
    saved = read_json(weights / "config.json") if weights is not None else None
    if isinstance(saved, dict) and isinstance(saved.get("id2label"), dict) and saved["id2label"]:
        return [str(saved["id2label"][k]) for k in sorted(saved["id2label"], key=int)]
    count = head_size(weights) if weights is not None else None
    return [f"LABEL_{i}" for i in range(count or config.num_labels or 2)]


def head_size(weights: Path) -> int | None:
    """The number of classes of the classifier head saved with a LoRA adapter (PEFT keeps the head whole)."""
    import re

    try:
        from safetensors import safe_open

        with safe_open(str(weights / "adapter_model.safetensors"), framework="pt") as fh:
            for key in fh.keys():
                if re.search(r"(score|classifier)[^/]*\.weight$", key) and "lora_" not in key:
                    return int(fh.get_slice(key).get_shape()[0])
    except (OSError, ValueError):  # no adapter file, or not safetensors: the caller falls back
        return None
    return None


def load_classifier(plan: RunPlan, run_path: Path, weights: Path | None = None) -> tuple[Any, Any, list[str]]:
    """(model, tokenizer, label names) of a sequence-classification run, built as its plan (plan.json) trained it
    (`weights`: a checkpoint of the run; default its newest)."""
    from finetune.model import loading

    config = plan.config
    weights = weights or adapter_dir(run_path)
    if weights is None:
        raise UserError(f"run: {Path(run_path).name} has no saved weights yet (no checkpoint so far)", field="run")
    if not plan.is_classifier:
        raise UserError("run: this run tunes a chat model; talk to it in the chat instead", field="run")
    names = label_names(run_path, config)
    tokenizer = loading.load_tokenizer(config)
    if (weights / "adapter_config.json").is_file():
        from peft import PeftModel

        model = PeftModel.from_pretrained(loading.load_base(plan, num_labels=len(names)), str(weights))
    else:
        model = plan.auto_class().from_pretrained(str(weights), dtype=plan.torch_dtype(plan.compute_dtype))
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    model.eval()
    return _place(model, plan), tokenizer, names


def classify(
    model: Any, tokenizer: Any, names: list[str], text: str, text_pair: str = "", max_length: int = 512
) -> Classification:
    """Every label's probability for one text (or a text pair), read as the run was trained to read it (the same
    tokenisation and truncation)."""
    import torch

    encoded = tokenizer(text, text_pair or None, truncation=True, max_length=max_length, return_tensors="pt")
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(**{k: v.to(device) for k, v in encoded.items()}).logits[0].float()
    probs = torch.softmax(logits, dim=-1).tolist()
    labelled = [(names[i] if i < len(names) else f"LABEL_{i}", p) for i, p in enumerate(probs)]
    return Classification(sorted(labelled, key=lambda item: item[1], reverse=True))


def load_for_chat(plan: RunPlan, run_path: Path | None = None, weights: Path | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) for chat, built as the plan says (a run's own plan.json, or the plan of the base model's
    settings): the base (4-bit for QLoRA) plus the run's adapter, or a full fine-tune's own weights (`weights`: a
    checkpoint of the run; default its newest)."""
    from finetune.model import loading

    base = plan.config
    if run_path is not None and weights is None:
        weights = adapter_dir(run_path)
        if weights is None:
            raise UserError(f"run: {Path(run_path).name} has no saved weights yet (no checkpoint so far)", field="run")
    if plan.is_classifier:
        raise UserError("run: a sequence-classification run answers with labels: classify a text instead", field="run")
    # A vision-language model answers through its processor (its tokenizer and image processor).
    tokenizer = loading.load_processor(plan) if plan.vision is not None else loading.load_tokenizer(base)
    if weights is not None and not (weights / "adapter_config.json").is_file():
        # A full fine-tune: its own weights, in the dtype its matmuls ran in.
        model = plan.auto_class().from_pretrained(str(weights), dtype=plan.torch_dtype(plan.compute_dtype))
    else:
        model = loading.load_base(plan)
        if weights is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(weights))
    model.eval()
    return _place(model, plan), tokenizer


def _place(model: Any, plan: RunPlan) -> Any:
    # A 4-bit model is placed by bitsandbytes when it loads; moving it again is refused.
    if plan.placement() == "cuda" and plan.quantization is None:
        return model.to("cuda")
    return model


def image_chat_inputs(processor: Any, messages: list[dict[str, str]], images: list[str]) -> Any:
    """A conversation with images for a vision-language model: each `<image>` tag in a message's text takes the next
    of `images` (files), as image data's ShareGPT rows do; the processor's chat template and image processor make the
    model's inputs, ready for the assistant's turn. A tag count that differs from the images is refused in one line."""
    from finetune.data.images import IMAGE_TAG, conversation, load_image
    from finetune.data.kinds import DataFormat, DataKind

    row = {"conversations": [dict(m) for m in messages], "images": list(images)}
    parts = conversation(row, DataFormat(DataKind.IMAGES, {"messages": "conversations", "images": "images"}))
    tags = sum(1 for m in parts for p in m["content"] if p["type"] == "image")
    if tags != len(images):
        raise UserError(
            f"images: {len(images)} image(s) for {tags} {IMAGE_TAG} tag(s) in the conversation; one image per tag",
            field="images",
        )
    text = processor.apply_chat_template(parts, add_generation_prompt=True)
    pictures = [load_image(path) for path in images]
    # The template wrote the special tokens (Gemma's BOS among them): the tokenizer adds none, as in training.
    pictures_in = [pictures] if pictures else None
    return processor(text=[text], images=pictures_in, add_special_tokens=False, return_tensors="pt")


def stream_reply(
    model: Any,
    tokenizer: Any,
    messages: list[dict[str, str]],
    settings: GenerationSettings,
    images: list[str] | None = None,
) -> Iterator[str]:
    """Yield the reply as it grows (the whole text so far each time), from a generate() running in a thread. A
    vision-language model's processor takes `images` (files), one for each `<image>` tag in the messages, in order."""
    import torch
    from transformers import TextIteratorStreamer

    if settings.system_prompt:
        messages = [{"role": "system", "content": settings.system_prompt}, *messages]
    if hasattr(tokenizer, "image_processor"):
        inputs = image_chat_inputs(tokenizer, messages, images or [])
        text_tokenizer = tokenizer.tokenizer
    else:
        inputs = chat_input_ids(tokenizer, messages)
        text_tokenizer = tokenizer
    inputs = inputs.to(next(model.parameters()).device)
    streamer = TextIteratorStreamer(text_tokenizer, skip_prompt=True, skip_special_tokens=True, timeout=300)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with torch.no_grad():
                model.generate(
                    **inputs, streamer=streamer, pad_token_id=text_tokenizer.pad_token_id, **settings.generate_kwargs()
                )
        except BaseException as exc:  # surfaced to the caller below instead of dying silently in the thread
            errors.append(exc)
            streamer.end()

    thread = threading.Thread(target=run, name="generate", daemon=True)
    thread.start()
    text = ""
    for piece in streamer:
        text += piece
        yield text
    thread.join()
    if errors:
        raise errors[0]
