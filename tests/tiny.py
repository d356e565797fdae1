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


# Qwen-VL's chat template (as its models ship it, shortened): a default system turn, each image part as
# "<|vision_start|><|image_pad|><|vision_end|>" (the processor expands the pad into the image's tokens).
QWEN_VL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QWEN_VL_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
QWEN_PATCH = {"qwen2_5_vl": 8, "qwen3_vl": 16}  # the tiny towers' patch sides (Qwen3-VL's as its models use)


def build_qwen_vl(path: Path, family: str = "qwen2_5_vl"):
    """A random tiny Qwen2.5-VL (or Qwen3-VL: `family`) with its processor files as its models ship them on the Hub
    (preprocessor_config.json naming the processor class, chat_template.json, the tokenizer), saved to `path`: a
    2-layer vision tower on 8-pixel patches (Qwen3-VL: 16) merged 2 × 2, so a 64 × 64 image is 16 tokens (Qwen3-VL
    4), and the tiny language model. Built without the processor class, whose video part needs torchvision."""
    import json

    import torch
    import transformers
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    torch.manual_seed(0)
    tokenizer = build_tokenizer(path)
    tokenizer.add_special_tokens({"additional_special_tokens": QWEN_VL_TOKENS})
    tokenizer.chat_template = QWEN_VL_TEMPLATE
    tokenizer.save_pretrained(path)
    patch = QWEN_PATCH[family]
    images = Qwen2VLImageProcessorPil(
        patch_size=patch, merge_size=2, temporal_patch_size=2, min_pixels=(2 * patch) ** 2, max_pixels=128 * 128
    )
    images.save_pretrained(path)
    settings = json.loads((path / "preprocessor_config.json").read_text(encoding="utf-8"))
    processor_class = {"qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor"}[family]
    settings["processor_class"] = processor_class
    (path / "preprocessor_config.json").write_text(json.dumps(settings, indent=2), encoding="utf-8")
    (path / "chat_template.json").write_text(json.dumps({"chat_template": QWEN_VL_TEMPLATE}), encoding="utf-8")
    ids = {f"{name}_token_id": tokenizer.convert_tokens_to_ids(f"<|{name}_pad|>") for name in ("image", "video")}
    ids["vision_start_token_id"] = tokenizer.convert_tokens_to_ids("<|vision_start|>")
    ids["vision_end_token_id"] = tokenizer.convert_tokens_to_ids("<|vision_end|>")
    text = {
        "vocab_size": len(tokenizer),
        **TINY_SHAPE,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "initializer_range": 0.3,
        "tie_word_embeddings": True,
    }
    vision = {"depth": 2, "num_heads": 2, "patch_size": patch, "spatial_merge_size": 2, "hidden_size": 32}
    vision.update(intermediate_size=64, out_hidden_size=64)
    if family == "qwen2_5_vl":
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
        vision.update(window_size=32, fullatt_block_indexes=[1])
        config = transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, **ids)
        model = transformers.Qwen2_5_VLForConditionalGeneration(config)
    else:
        text["head_dim"] = 16
        text["rope_parameters"] = {
            "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3], "mrope_interleaved": True
        }  # fmt: skip
        vision.update(num_position_embeddings=64, deepstack_visual_indexes=[0])
        config = transformers.Qwen3VLConfig(text_config=text, vision_config=vision, **ids)
        model = transformers.Qwen3VLForConditionalGeneration(config)
    model.save_pretrained(path)
    return path


# Gemma 3's chat template (as its models ship it, shortened): "model" for the assistant's turns, a system message
# folded into the first user turn, each image part as "<start_of_image>" (the processor expands it into
# "\n\n<start_of_image>" + the image's soft tokens + "<end_of_image>\n\n").
GEMMA3_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set first = messages[0]['content'] %}"
    "{% if first is not string %}{% set first = first[0]['text'] %}{% endif %}{% set prefix = first + '\n\n' %}"
    "{% set messages = messages[1:] %}{% else %}{% set prefix = '' %}{% endif %}"
    "{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + (prefix if loop.first else '') }}"
    "{% if message['content'] is string %}{{ message['content'] | trim }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<start_of_image>' }}{% elif part['type'] == 'text' %}{{ part['text'] | trim }}"
    "{% endif %}{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
GEMMA3_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
GEMMA3_IMAGE_TOKENS = 4  # a 32-pixel image on 8-pixel patches (a 4 × 4 grid) pooled 2 × 2


def build_gemma3(path: Path):
    """A random tiny Gemma 3 (a 2-layer SigLIP tower on 32-pixel images of 8-pixel patches, pooled into 4 soft tokens
    an image, and a tiny Gemma 3 language model) with its processor (the PIL image processor: no torchvision) and a
    tokenizer that names Gemma's image tokens, saved to `path`."""
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3Processor, PreTrainedTokenizerFast
    from transformers.models.gemma3 import Gemma3ImageProcessorPil

    torch.manual_seed(0)
    build_tokenizer(path)
    # Gemma's tokenizer puts its BOS before every text it tokenises (`add_bos_token`), and its template writes it too.
    tokenizer = PreTrainedTokenizerFast.from_pretrained(
        path, eos_token="<end_of_turn>", add_bos_token=True, extra_special_tokens={**GEMMA3_TOKENS}
    )
    tokenizer.add_special_tokens(
        {"additional_special_tokens": ["<start_of_turn>", "<end_of_turn>", *GEMMA3_TOKENS.values()]},
        replace_extra_special_tokens=False,
    )
    images = Gemma3ImageProcessorPil(size={"height": TINY_TILE, "width": TINY_TILE})
    processor = Gemma3Processor(
        image_processor=images, tokenizer=tokenizer, image_seq_length=GEMMA3_IMAGE_TOKENS, chat_template=GEMMA3_TEMPLATE
    )
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in GEMMA3_TOKENS.items()}
    text = {
        "vocab_size": len(tokenizer),
        **TINY_SHAPE,
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "sliding_window": 64,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "initializer_range": 0.3,
    }
    vision = {**TINY_VISION, "image_size": TINY_TILE, "patch_size": 8}
    config = Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=GEMMA3_IMAGE_TOKENS,
        boi_token_index=ids["boi_token"],
        eoi_token_index=ids["eoi_token"],
        image_token_index=ids["image_token"],
    )
    model = Gemma3ForConditionalGeneration(config)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path
