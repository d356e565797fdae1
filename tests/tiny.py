"""Tiny random models and tokenizers the tests build themselves (2 layers, hidden 64); nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = [
    "Arr matey, the capital of France be Paris! Ahoy, what is two plus two? It be four, says the pirate.",
    "The quick brown fox jumps over the lazy dog. Sentence one and sentence two are paraphrases.",
    "user assistant system You are a helpful assistant. Explain why the sky is blue in one sentence.",
]


def build_tokenizer(path: Path):
    """A byte-level BPE tokenizer (vocab 384) with a ChatML chat template, saved to `path`."""
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_end|>", bos_token="<|im_start|>"
    )
    fast.chat_template = CHATML
    fast.model_max_length = 512
    fast.save_pretrained(path)
    return fast


# The shape every tiny test model shares: 2 layers, hidden 64, GQA 4 heads / 2 KV heads.
TINY_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}


def save_embedded_tokenizer(path: Path) -> Path:
    """SmolLM2's own tokenizer (49152 tokens, a vocabulary llama.cpp knows), read from the embedded model's GGUF
    (about 8 s) and saved to `path`: for tiny models whose GGUF export llama.cpp must load."""
    from transformers import AutoTokenizer

    from finetune.model.loading import embedded_gguf_path

    gguf = embedded_gguf_path()
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(path)
    return path


def copy_tokenizer(source: Path, path: Path):
    """The tokenizer saved in `source`, saved again to `path` (created)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(source))
    tokenizer.save_pretrained(path)
    return tokenizer


def build_llama(path: Path, vocab_size: int = 384, tokenizer_dir: Path | None = None, **overrides):
    """A random 2-layer, hidden-64 Llama (GQA 4 heads / 2 KV heads) with its tokenizer, saved to `path`; the
    tokenizer is the tests' 384-token one, or the one saved in `tokenizer_dir`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tokenizer = copy_tokenizer(tokenizer_dir, path) if tokenizer_dir else build_tokenizer(path)
    config = LlamaConfig(
        vocab_size=max(vocab_size, len(tokenizer)),
        **TINY_SHAPE,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=True,
        # Wider than the default 0.02 so the tied output head can express confident predictions: a LoRA on a
        # random base then learns a short pattern within a few steps (with 0.02 the logits stay near uniform).
        initializer_range=0.3,
        **overrides,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    return path


# SmolVLM's chat template (Idefics3 layout): "User:<image>question<end_of_utterance>\nAssistant: answer...".
SMOLVLM_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
SMOLVLM_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"] + [
    f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)
]
# The tiny vision tower: 32-pixel tiles of 8-pixel patches (16 patches), merged 2 × 2: 4 image tokens per tile.
TINY_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
TINY_TILE = 32
TINY_IMAGE_SEQ_LEN = 4


def build_smolvlm(path: Path, longest_edge: int = 64, text: dict | None = None, vision: dict | None = None):
    """A random tiny SmolVLM (Idefics3: 2-layer vision tower on 32-pixel tiles, 4 tokens per tile, the tiny Llama as
    its language model) and its processor (the PIL image processor: no torchvision), saved to `path`; `text` and
    `vision` change the shapes of its two parts."""
    import torch
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3 import Idefics3ImageProcessorPil

    torch.manual_seed(0)
    tokenizer = build_tokenizer(path)
    tokenizer.add_special_tokens({"additional_special_tokens": SMOLVLM_TOKENS})
    images = Idefics3ImageProcessorPil(size={"longest_edge": longest_edge}, max_image_size={"longest_edge": TINY_TILE})
    vision = {**TINY_VISION, "image_size": TINY_TILE, "patch_size": 8, **(vision or {})}
    per_tile = (TINY_TILE // vision["patch_size"]) ** 2 // 4  # patches merged 2 × 2 (scale_factor 2)
    processor = Idefics3Processor(
        image_processor=images, tokenizer=tokenizer, image_seq_len=per_tile, chat_template=SMOLVLM_TEMPLATE
    )
    config = Idefics3Config(
        text_config={
            "model_type": "llama",
            "vocab_size": len(tokenizer),
            **TINY_SHAPE,
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "initializer_range": 0.3,
            **(text or {}),
        },
        vision_config=vision,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        scale_factor=2,
    )
    model = Idefics3ForConditionalGeneration(config)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


def write_image_rows(folder: Path, rows: int = 8, images_per_row: int = 1, size: int = 64) -> Path:
    """A small image data set: PNG squares of a colour and messages asking for it (`data.jsonl` in `folder`)."""
    import json

    from PIL import Image

    colours = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (230, 220, 20)}
    names = list(colours)
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for r in range(rows):
        files, parts = [], []
        for k in range(images_per_row):
            name = names[(r + k) % len(names)]
            file = f"img{r}_{k}.png"
            Image.new("RGB", (size, size - 8 * k), colours[name]).save(folder / file)
            files.append(file)
            parts.append({"type": "image"})
        answer = " and ".join(names[(r + k) % len(names)] for k in range(images_per_row))
        messages = [
            {"role": "user", "content": [*parts, {"type": "text", "text": "What colour?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": f"It is {answer}."}]},
        ]
        lines.append(json.dumps({"messages": messages, "images": files}))
    path = folder / "data.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
