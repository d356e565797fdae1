"""Write a Transformers model folder (Llama family) as one self-contained GGUF file, and its Ollama Modelfile.

    check_gguf_support(model_dir) -> str                 the GGUF architecture, or a UserError naming the model type
    write_gguf(model_dir, target, quant, name, say)      weights + hyperparameters + tokenizer + chat template
    modelfile_text(model_dir, gguf_name) -> str          FROM / TEMPLATE / PARAMETER stop / temperature

Built on the `gguf` package (GGUFWriter, TensorNameMap, SpecialVocab, quants.quantize), as llama.cpp's own
convert_hf_to_gguf.py is. Only what transformers can read back and we test is accepted: llama, mistral and qwen2
shapes with a byte-level BPE tokenizer (SmolLM2, Llama 3, Qwen2). torch / gguf are imported inside the functions.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from finetune.errors import UserError

# model_type -> llama.cpp architecture. Mistral is written as llama, as llama.cpp does (transformers reads it back as
# a Llama: the same computation within the context length, as llama.cpp has no sliding window for it either).
GGUF_ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2"}
QUANTS = ("f16", "q8_0")
# The llama.cpp pre-tokenizer names for the byte-level splits we recognise (a wrong one silently mis-tokenizes).
_LLAMA3_REGEX_START = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+"
DEFAULT_TEMPERATURE = 0.7
CHATML_TEMPLATE = (
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n"
)
FALLBACK_TEMPLATE = "{{ if .System }}{{ .System }}\n\n{{ end }}{{ .Prompt }}"

Say = Callable[[str], None]


def read_model_config(model_dir: Path) -> dict[str, Any]:
    """The model folder's config.json as a dict."""
    return json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))


def check_gguf_support(model_dir: Path) -> str:
    """The llama.cpp architecture for this model, or a one-line UserError naming what is not supported."""
    config = read_model_config(model_dir)
    model_type = config.get("model_type", "unknown")
    if model_type not in GGUF_ARCHITECTURES:
        raise UserError(
            f"format: gguf export supports the llama, mistral and qwen2 architectures, not {model_type!r}; "
            "export --format merged instead",
            field="format",
        )
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    if rope_type != "default":
        raise UserError(f"format: gguf export does not support rope scaling {rope_type!r} yet", field="format")
    _tokenizer_pre(model_dir, model_type)  # refuses a tokenizer we cannot describe
    return GGUF_ARCHITECTURES[model_type]


def write_gguf(model_dir: Path, target: Path, quant: str, name: str, say: Say) -> None:
    """Write `model_dir` (a merged Transformers model) as one GGUF file at `target` with `quant` (f16 or q8_0)."""
    import gguf

    arch_name = check_gguf_support(model_dir)
    config = read_model_config(model_dir)
    arch = gguf.MODEL_ARCH.LLAMA if arch_name == "llama" else gguf.MODEL_ARCH.QWEN2
    writer = gguf.GGUFWriter(target, arch_name)
    say("Writing the hyperparameters and the tokenizer…")
    _add_hyperparameters(writer, config, name, quant)
    _add_tokenizer(writer, model_dir, config)
    say(f"Converting the weights to {quant}…")
    _add_tensors(writer, model_dir, config, arch, quant)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _add_hyperparameters(writer: Any, config: dict[str, Any], name: str, quant: str) -> None:
    import gguf

    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    rope = config.get("rope_parameters") or {}
    writer.add_name(name)
    writer.add_context_length(config.get("max_position_embeddings", 2048))
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config.get("num_key_value_heads") or heads)
    writer.add_layer_norm_rms_eps(config.get("rms_norm_eps", 1e-6))
    writer.add_rope_freq_base(float(config.get("rope_theta") or rope.get("rope_theta") or 10000.0))
    writer.add_rope_dimension_count(head_dim)
    if head_dim != config["hidden_size"] // heads:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if quant == "f16" else gguf.LlamaFileType.MOSTLY_Q8_0)


# ------------------------------------------------------------------------------------------------- tokenizer


def _tokenizer_json(model_dir: Path) -> dict[str, Any]:
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise UserError("format: gguf export needs a tokenizer.json (a fast tokenizer) in the model", field="format")
    return json.loads(path.read_text(encoding="utf-8"))


def _tokenizer_pre(model_dir: Path, model_type: str) -> str:
    """llama.cpp's name for how this byte-level BPE tokenizer splits text before merging, or a UserError."""
    data = _tokenizer_json(model_dir)
    if (data.get("model") or {}).get("type") != "BPE" or "ByteLevel" not in json.dumps(data.get("pre_tokenizer")):
        raise UserError(
            "format: gguf export supports byte-level BPE tokenizers (SmolLM2, Llama 3, Qwen2) only", field="format"
        )
    pre = data.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    kinds = [step.get("type") for step in steps]
    if model_type == "qwen2":
        return "qwen2"
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        return "gpt2"
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits"):
        return "smollm"
    if kinds[:1] == ["Split"] and _LLAMA3_REGEX_START in json.dumps(steps[0].get("pattern")):
        return "llama-bpe"
    raise UserError(
        f"format: gguf export does not know this tokenizer's pre-tokenizer ({' + '.join(map(str, kinds))})",
        field="format",
    )


def _add_tokenizer(writer: Any, model_dir: Path, config: dict[str, Any]) -> None:
    """Vocabulary, token types, merges, special token ids and the chat template: the file needs nothing else."""
    import gguf
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    n_vocab = max(config["vocab_size"], tokenizer.get_vocab_size(with_added_tokens=True))
    by_id = {index: token for token, index in tokenizer.get_vocab(with_added_tokens=True).items()}
    added = tokenizer.get_added_tokens_decoder()
    tokens, types = [], []
    for index in range(n_vocab):
        if index not in by_id:  # embedding rows beyond the tokenizer: llama.cpp's placeholder names
            tokens.append(f"[PAD{index}]")
            types.append(gguf.TokenType.UNUSED)
        elif index in added:
            tokens.append(by_id[index])
            types.append(gguf.TokenType.CONTROL if added[index].special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(by_id[index])
            types.append(gguf.TokenType.NORMAL)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(_tokenizer_pre(model_dir, config["model_type"]))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    # Merges, bos/eos/pad ids, add_bos flags and the chat template, read as llama.cpp's converter reads them.
    gguf.SpecialVocab(model_dir, load_merges=True, n_vocab=n_vocab).add_to_gguf(writer, quiet=True)


# --------------------------------------------------------------------------------------------------- tensors


def llama_permute(weights: Any, n_head: int, n_head_kv: int) -> Any:
    """llama.cpp's Q/K row order (rotary pairs interleaved); transformers undoes it when it reads the file."""
    if n_head != n_head_kv:
        n_head = n_head_kv
    rows = weights.shape[0]
    return weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def _load_tensors(model_dir: Path) -> dict[str, Any]:
    """Every weight of the folder's safetensors files as float32 numpy arrays (bf16 has no numpy type)."""
    import torch
    from safetensors.torch import load_file

    tensors: dict[str, Any] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        for key, value in load_file(str(path)).items():
            tensors[key] = value.to(torch.float32).numpy()
    return tensors


def _add_tensors(writer: Any, model_dir: Path, config: dict[str, Any], arch: Any, quant: str) -> None:
    import gguf

    names = gguf.TensorNameMap(arch, config["num_hidden_layers"])
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    tied = config.get("tie_word_embeddings", True)
    for hf_name, data in _load_tensors(model_dir).items():
        if hf_name.endswith("rotary_emb.inv_freq") or (tied and hf_name == "lm_head.weight"):
            continue  # recomputed by the runtime / the output head is the embedding when tied
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise UserError(f"format: gguf export cannot place the tensor {hf_name} of this model", field="format")
        if arch == gguf.MODEL_ARCH.LLAMA and hf_name.endswith("q_proj.weight"):
            data = llama_permute(data, heads, heads)
        elif arch == gguf.MODEL_ARCH.LLAMA and hf_name.endswith("k_proj.weight"):
            data = llama_permute(data, heads, kv_heads)
        _add_one(writer, name, data, quant)


def _add_one(writer: Any, name: str, data: Any, quant: str) -> None:
    """Norms and biases stay float32; matrices become f16, or q8_0 when their rows split into 32-value blocks."""
    import gguf
    import numpy as np

    if data.ndim < 2:
        writer.add_tensor(name, data.astype(np.float32))
    elif quant == "q8_0" and data.shape[-1] % gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0][0] == 0:
        qtype = gguf.GGMLQuantizationType.Q8_0
        writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    else:
        writer.add_tensor(name, data.astype(np.float16))


# --------------------------------------------------------------------------------------------------- Ollama


def modelfile_text(model_dir: Path, gguf_name: str) -> str:
    """An Ollama Modelfile for the GGUF beside it: its chat template in Go-template form, stop tokens, temperature."""
    config = json.loads((Path(model_dir) / "tokenizer_config.json").read_text(encoding="utf-8"))
    template = _chat_template(model_dir, config)
    chatml = "<|im_start|>" in template and "<|im_end|>" in template
    stops = ["<|im_end|>", "<|im_start|>"] if chatml else []
    eos = config.get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    if eos and eos not in stops:
        stops.append(eos)
    lines = [f"FROM ./{gguf_name}", ""]
    if chatml:
        lines.append(f'TEMPLATE """{CHATML_TEMPLATE}"""')
    else:
        lines += [
            "# The chat template is not ChatML, which is the form this exporter translates; this plain template",
            "# sends the prompt as is. Replace it with the Go-template form of the model's chat template (the",
            "# original Jinja template is embedded in the GGUF as tokenizer.chat_template).",
            f'TEMPLATE """{FALLBACK_TEMPLATE}"""',
        ]
    lines += [f"PARAMETER stop {json.dumps(stop)}" for stop in stops]
    lines.append(f"PARAMETER temperature {_temperature(model_dir)}")
    return "\n".join(lines) + "\n"


def _chat_template(model_dir: Path, tokenizer_config: dict[str, Any]) -> str:
    jinja = Path(model_dir) / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = tokenizer_config.get("chat_template") or ""
    return template if isinstance(template, str) else json.dumps(template)


def _temperature(model_dir: Path) -> float:
    """The model's own sampling temperature when it sets one, else a common default."""
    try:
        data = json.loads((Path(model_dir) / "generation_config.json").read_text(encoding="utf-8"))
        return float(data.get("temperature") or DEFAULT_TEMPERATURE)
    except (OSError, ValueError, TypeError):
        return DEFAULT_TEMPERATURE
