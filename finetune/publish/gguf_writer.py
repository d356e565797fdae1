"""Write a Transformers model folder (Llama family) as one self-contained GGUF file, and its Ollama Modelfile.

    check_gguf_support(model_dir) -> str                 the GGUF architecture, or a UserError naming the model type
    write_gguf(model_dir, target, quant, name, say)      weights + hyperparameters + tokenizer + chat template
    tokenizer_pre(model_dir) -> str                      llama.cpp's pre-tokenizer name, found as its converter does

Built on the `gguf` package (GGUFWriter, TensorNameMap, SpecialVocab, quants.quantize), as llama.cpp's own
convert_hf_to_gguf.py is. Only what llama.cpp loads and tokenizes as the original, and we test, is accepted: llama,
mistral and qwen2 shapes with a byte-level BPE tokenizer llama.cpp knows (SmolLM2, Llama 3, Qwen2, GPT-2). The Ollama
Modelfile is `finetune.publish.modelfile`. torch / gguf / transformers are imported inside the functions.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from finetune.errors import UserError

# model_type -> llama.cpp architecture. Mistral is written as llama, as llama.cpp does (transformers reads it back as
# a Llama: the same computation within the context length, as llama.cpp has no sliding window for it either).
GGUF_ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2"}
QUANTS = ("f16", "q8_0")
# llama.cpp's converter identifies a BPE pre-tokenizer by the token ids the tokenizer gives for this check text
# (sha256 of their Python list form) and writes the matching name as `tokenizer.ggml.pre`; llama.cpp refuses a name
# it does not know, and a wrong known name silently mis-tokenizes. The text and the hashes are the converter's; only
# the names we support and test are listed (a different vocabulary gives a different hash, so is refused).
CHECK_TEXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n\U0001f680 (normal) "
    "\U0001f636\u200d\U0001f32b\ufe0f (multiple emojis concatenated) \u2705 \U0001f999\U0001f999 "
    "3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 "
    "\u1780\u17b6\u1793\u17cb\u178f\u17c2\u1796\u17b7\u179f\u17c1\u179f\u17a2\u17b6\u1785\U0001f601 "
    "?\u6211\u60f3\u5728apple\u5de5\u4f5c1314151\u5929\uff5e ------======= "
    "\u043d\u0435\u0449\u043e \u043d\u0430 \u0411\u044a\u043b\u0433\u0430\u0440\u0441\u043a\u0438 "
    "''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, "
    "'D you like some tea? We'Ve a'lL"
)
KNOWN_PRE_TOKENIZERS = {
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",  # SmolLM, SmolLM2
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",  # Llama 3
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",  # Qwen1.5, Qwen2, Qwen2.5
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c": "qwen2",  # Qwen3 tokenizer
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": "gpt-2",  # GPT-2
    "0fe1cf6eda062318a1af7270f3331a85c539a01778ff948e24388e949c5282f4": "gpt-2",  # ruGPT3XL
}

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
    tokenizer_pre(model_dir)  # refuses a tokenizer llama.cpp would not know
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
    # What llama.cpp's converter also writes: the size ("135M", from the tensors written) and the quant version.
    writer.add_size_label(gguf.size_label(*writer.get_total_parameter_count()))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _add_hyperparameters(writer: Any, config: dict[str, Any], name: str, quant: str) -> None:
    import gguf

    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    rope = config.get("rope_parameters") or {}
    writer.add_type(gguf.GGUFType.MODEL)
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


def tokenizer_pre(model_dir: Path, tokenizer: Any = None) -> str:
    """llama.cpp's name for this tokenizer's pre-tokenizer, identified as its converter does, or a UserError.
    `tokenizer`: the folder's tokenizer when already loaded (AutoTokenizer, as training and the converter load it)."""
    data = _tokenizer_json(model_dir)
    if (data.get("model") or {}).get("type") != "BPE" or "ByteLevel" not in json.dumps(data.get("pre_tokenizer")):
        raise UserError(
            "format: gguf export supports byte-level BPE tokenizers (SmolLM2, Llama 3, Qwen2) only", field="format"
        )
    tokenizer = tokenizer or _load_tokenizer(model_dir)
    digest = hashlib.sha256(str(tokenizer.encode(CHECK_TEXT)).encode()).hexdigest()
    if digest not in KNOWN_PRE_TOKENIZERS:
        raise UserError(
            f"format: llama.cpp does not know this tokenizer ({_describe(tokenizer, data)}: its check-text hash "
            f"{digest[:12]}… is not smollm, llama-bpe, qwen2 or gpt-2), so a GGUF would fail to load or mis-tokenize; "
            "export --format merged instead",
            field="format",
        )
    return KNOWN_PRE_TOKENIZERS[digest]


def _load_tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def _describe(tokenizer: Any, data: dict[str, Any]) -> str:
    """A short name for a tokenizer in a message: its class, size and pre-tokenizer steps."""
    pre = data.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    kinds = "+".join(str(step.get("type")) for step in steps)
    return f"{type(tokenizer).__name__}, {len(tokenizer)} tokens, {kinds} pre-tokenizer"


def _adds_special(tokenizer: Any) -> tuple[bool, bool]:
    """(adds BOS, adds EOS) when encoding plain text: llama.cpp reads them from the file, Ollama defaults BOS to on."""
    ids = tokenizer("a")["input_ids"]
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    return bos is not None and ids[:1] == [bos], eos is not None and ids[-1:] == [eos]


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
    loaded = _load_tokenizer(model_dir)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(tokenizer_pre(model_dir, loaded))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    # Merges, bos/eos/pad ids and the chat template, read as llama.cpp's converter reads them; the add-BOS/EOS flags
    # from what the tokenizer really does (its config may not say, and a missing flag means "add BOS" to Ollama).
    special = gguf.SpecialVocab(model_dir, load_merges=True, n_vocab=n_vocab)
    special.add_special_token["bos"], special.add_special_token["eos"] = _adds_special(loaded)
    special.add_to_gguf(writer, quiet=True)


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
        add_weight(writer, name, data, quant)


def add_weight(writer: Any, name: str, data: Any, quant: str) -> None:
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
