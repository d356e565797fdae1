"""A run's LoRA adapter alone as a llama.cpp LoRA GGUF, for `llama-cli -m BASE.gguf --lora ADAPTER.gguf`.

    check_lora_support(adapter_dir) -> None                  a UserError naming what llama.cpp cannot apply
    write_lora_gguf(adapter_dir, base_config, target, quant, name, say)

The file holds what llama.cpp's convert_lora_to_gguf.py writes: `general.type = adapter`, `adapter.type = lora`,
`adapter.lora.alpha`, and for each adapted matrix `<gguf name>.weight.lora_a` (rank x in) and `.lora_b` (out x rank).
llama.cpp scales each pair by alpha / rank (the rank read from the tensors), as PEFT does; rsLoRA's alpha / sqrt(rank)
is written as the alpha that gives the same scale. Q and K rows are permuted as in the base GGUF. DoRA, per-module
alphas and adapted embeddings have no llama.cpp form and are refused. gguf / safetensors are imported inside.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from finetune.errors import UserError
from finetune.publish.gguf_writer import GGUF_ARCHITECTURES, add_weight, llama_permute

Say = Callable[[str], None]
_LORA_KEY = (".lora_A.weight", ".lora_B.weight")


def adapter_config(adapter_dir: Path) -> dict[str, Any]:
    """The run's adapter_config.json as a dict."""
    return json.loads((Path(adapter_dir) / "adapter_config.json").read_text(encoding="utf-8"))


def check_lora_support(adapter_dir: Path, base_config: dict[str, Any]) -> None:
    """Refuse, in one line, an adapter or base that llama.cpp cannot apply as a LoRA GGUF."""
    if not (Path(adapter_dir) / "adapter_config.json").is_file():
        raise UserError("format: gguf-lora needs a LoRA run (this run has no adapter); use --format gguf", "format")
    model_type = base_config.get("model_type", "unknown")
    if model_type not in GGUF_ARCHITECTURES:
        raise UserError(
            f"format: gguf-lora supports the llama, mistral and qwen2 architectures, not {model_type!r}", "format"
        )
    config = adapter_config(adapter_dir)
    if config.get("use_dora"):
        raise UserError("format: llama.cpp has no DoRA adapters; export --format gguf (merged) instead", "format")
    if config.get("alpha_pattern"):
        raise UserError("format: llama.cpp takes one LoRA alpha per adapter, this one has several", "format")
    if config.get("modules_to_save") or config.get("trainable_token_indices"):
        raise UserError("format: this adapter trains whole modules or tokens, which a llama.cpp LoRA cannot", "format")


def write_lora_gguf(
    adapter_dir: Path, base_config: dict[str, Any], target: Path, quant: str, name: str, say: Say
) -> None:
    """Write the adapter in `adapter_dir` (PEFT) as a llama.cpp LoRA GGUF at `target` (f16 or q8_0 matrices)."""
    import gguf

    check_lora_support(adapter_dir, base_config)
    arch_name = GGUF_ARCHITECTURES[base_config["model_type"]]
    arch = gguf.MODEL_ARCH.LLAMA if arch_name == "llama" else gguf.MODEL_ARCH.QWEN2
    writer = gguf.GGUFWriter(target, arch_name)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_name(name)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, _alpha(adapter_config(adapter_dir)))
    say(f"Converting the adapter to {quant}…")
    for gguf_name, data in _lora_tensors(adapter_dir, base_config, arch):
        add_weight(writer, gguf_name, data, quant)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _alpha(config: dict[str, Any]) -> float:
    """The alpha llama.cpp divides by each pair's rank to get PEFT's scale."""
    alpha, rank = float(config["lora_alpha"]), int(config["r"])
    if config.get("use_rslora"):  # PEFT scales by alpha / sqrt(r); llama.cpp by alpha / r
        return alpha * math.sqrt(rank)
    return alpha


def _lora_tensors(adapter_dir: Path, base_config: dict[str, Any], arch: Any) -> list[tuple[str, Any]]:
    """(gguf tensor name, float32 array) for every lora_a / lora_b pair, Q/K rows permuted for llama."""
    import gguf
    import torch
    from safetensors.torch import load_file

    names = gguf.TensorNameMap(arch, base_config["num_hidden_layers"])
    heads = base_config["num_attention_heads"]
    kv_heads = base_config.get("num_key_value_heads") or heads
    out = []
    weights = load_file(str(Path(adapter_dir) / "adapter_model.safetensors"))
    for key, value in sorted(weights.items()):
        if not key.endswith(_LORA_KEY):
            raise UserError(f"format: a llama.cpp LoRA cannot hold the adapter tensor {key}", "format")
        base_name = key.replace("base_model.model.", "", 1).rsplit(".lora_", 1)[0] + ".weight"
        gguf_name = names.get_name(base_name, try_suffixes=(".weight",))
        if gguf_name is None:
            raise UserError(f"format: gguf-lora cannot place the adapted layer {base_name}", "format")
        data = value.to(torch.float32).numpy()
        side = "a" if key.endswith(".lora_A.weight") else "b"
        if side == "b" and arch == gguf.MODEL_ARCH.LLAMA and base_name.endswith(("q_proj.weight", "k_proj.weight")):
            data = llama_permute(data, heads, heads if base_name.endswith("q_proj.weight") else kv_heads)
        out.append((f"{gguf_name}.lora_{side}", data))
    return out
