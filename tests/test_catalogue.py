"""Popular models without a download: bundled configs of the published sizes, offline estimates, fast offline errors."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from finetune import memory
from finetune.config import EMBEDDED_MODEL, TrainConfig
from finetune.errors import UserError
from finetune.model import catalogue, loading
from finetune.plan import plan_for
from finetune.studio import Studio

# Published parameter counts (model cards / safetensors metadata), in billions.
PUBLISHED = {
    "meta-llama/Llama-3.1-8B": 8.03,
    "meta-llama/Llama-3.1-8B-Instruct": 8.03,
    "meta-llama/Llama-3.1-70B": 70.55,
    "meta-llama/Llama-3.1-70B-Instruct": 70.55,
    "meta-llama/Llama-3.2-1B": 1.236,
    "meta-llama/Llama-3.2-1B-Instruct": 1.236,
    "meta-llama/Llama-3.2-3B": 3.213,
    "meta-llama/Llama-3.2-3B-Instruct": 3.213,
    "Qwen/Qwen2.5-0.5B-Instruct": 0.494,
    "Qwen/Qwen2.5-1.5B-Instruct": 1.54,
    "Qwen/Qwen2.5-3B-Instruct": 3.09,
    "Qwen/Qwen2.5-7B-Instruct": 7.61,
    "Qwen/Qwen2.5-14B-Instruct": 14.7,
    "Qwen/Qwen2.5-32B-Instruct": 32.5,
    "Qwen/Qwen2.5-72B-Instruct": 72.7,
    "Qwen/Qwen3-0.6B": 0.6,
    "Qwen/Qwen3-1.7B": 1.72,
    "Qwen/Qwen3-4B": 4.02,
    "Qwen/Qwen3-8B": 8.19,
    "Qwen/Qwen3-14B": 14.8,
    "Qwen/Qwen3-32B": 32.8,
    "mistralai/Mistral-7B-v0.3": 7.25,
    "mistralai/Mistral-7B-Instruct-v0.3": 7.25,
    "mistralai/Mistral-Nemo-Base-2407": 12.2,
    "mistralai/Mistral-Nemo-Instruct-2407": 12.2,
    "google/gemma-2-2b-it": 2.61,
    "google/gemma-2-9b-it": 9.24,
    "google/gemma-2-27b-it": 27.2,
    "google/gemma-3-1b-it": 1.0,
    "google/gemma-3-4b-it": 4.3,
    "google/gemma-3-12b-it": 12.2,
    "google/gemma-3-27b-it": 27.4,
    "microsoft/Phi-3.5-mini-instruct": 3.82,
    "microsoft/phi-4": 14.7,
    "HuggingFaceTB/SmolLM2-135M-Instruct": 0.1345,
    "HuggingFaceTB/SmolLM2-360M-Instruct": 0.362,
    "HuggingFaceTB/SmolLM2-1.7B-Instruct": 1.71,
    # Vision-language models: the whole model (vision tower, projector, language model), as the Hub counts it.
    "HuggingFaceTB/SmolVLM-256M-Instruct": 0.2565,
    "HuggingFaceTB/SmolVLM-500M-Instruct": 0.5075,
    "HuggingFaceTB/SmolVLM-Instruct": 2.246,
    "HuggingFaceTB/SmolVLM2-2.2B-Instruct": 2.247,
    "Qwen/Qwen2.5-VL-3B-Instruct": 3.755,
    "Qwen/Qwen2.5-VL-7B-Instruct": 8.292,
    "Qwen/Qwen3-VL-8B-Instruct": 8.767,
}
# The vision-language entries: config.json's model_type, and the tokens one image becomes at an `image_longest_side`
# (SmolVLM: 64 or 81 a tile, its tiles plus one global view when the image is split; Qwen2.5-VL: H·W / 28²; Qwen3-VL:
# H·W / 32²; Gemma 3: always 256).
VISION = {
    "HuggingFaceTB/SmolVLM-256M-Instruct": ("idefics3", 1024, (2 * 2 + 1) * 64),
    "HuggingFaceTB/SmolVLM-500M-Instruct": ("idefics3", 512, 64),
    "HuggingFaceTB/SmolVLM-Instruct": ("idefics3", 768, (2 * 2 + 1) * 81),
    "HuggingFaceTB/SmolVLM2-2.2B-Instruct": ("smolvlm", 384, 81),
    "Qwen/Qwen2.5-VL-3B-Instruct": ("qwen2_5_vl", 448, 448 * 448 // 28**2),
    "Qwen/Qwen2.5-VL-7B-Instruct": ("qwen2_5_vl", 448, 448 * 448 // 28**2),
    "Qwen/Qwen3-VL-8B-Instruct": ("qwen3_vl", 448, 448 * 448 // 32**2),
    "google/gemma-3-4b-it": ("gemma3", 448, 256),
    "google/gemma-3-12b-it": ("gemma3", 0, 256),
}


def test_every_bundled_model_is_checked_and_listed():
    assert sorted(catalogue.names()) == sorted(PUBLISHED)
    popular = Studio.popular_models()
    assert popular[0] == EMBEDDED_MODEL and popular[1:] == catalogue.names()
    for path in catalogue.BUNDLED_MODELS.glob("*.json"):
        assert path.stat().st_size < 8 * 1024  # config.json only, kilobytes each
        assert "model_type" in json.loads(path.read_text())


@pytest.mark.parametrize("model_id", sorted(PUBLISHED))
def test_bundled_config_builds_the_published_size(model_id):
    import torch
    import transformers
    from transformers.models.auto import modeling_auto

    config = catalogue.load_config(model_id)
    vision = hasattr(config, "vision_config")  # the class a vision-language run loads: tower and projector included
    names = (
        modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
        if vision
        else modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    )
    cls = getattr(transformers, names[config.model_type])
    with torch.device("meta"):
        model = cls._from_config(config)
    billions = sum(p.numel() for p in model.parameters()) / 1e9
    assert billions == pytest.approx(PUBLISHED[model_id], rel=0.01), f"{model_id}: {billions:.4f}B"


@pytest.mark.parametrize("model_id", sorted(VISION))
def test_a_bundled_vision_language_model_is_planned_and_estimated_as_one_offline(model_id):
    """Detected from the bundled config alone (no Hub: conftest), loaded as an image-text-to-text model, and the
    estimate says how many tokens its images make, counted by the family's image processor."""
    from finetune.memory.estimator import estimate_core
    from finetune.plan import vision_family

    family, side, tokens = VISION[model_id]
    assert vision_family(model_id) == family
    plan = plan_for(TrainConfig(model=model_id, max_seq_length=512, image_longest_side=side), "cuda")
    assert plan.model_class == "AutoModelForImageTextToText" and plan.vision.family == family
    est = estimate_core(plan, trace_it=False)  # the formula: the replay of an 8B model takes a minute here
    note = next(n for n in est.notes if n.startswith("images:"))
    assert f": {tokens} tokens each" in note, note
    assert est.total_bytes > 2 * PUBLISHED[model_id] * 1e9  # at least its 16-bit weights


def test_the_model_lists_group_text_and_vision_language_models_by_family_smallest_first():
    names = catalogue.names()
    assert names.index("HuggingFaceTB/SmolLM2-1.7B-Instruct") < names.index("HuggingFaceTB/SmolVLM-256M-Instruct")
    assert names.index("HuggingFaceTB/SmolVLM-500M-Instruct") < names.index("HuggingFaceTB/SmolVLM-Instruct")
    qwen = [n for n in names if n.startswith("Qwen/")]
    assert qwen[-3:] == ["Qwen/Qwen2.5-VL-3B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct", "Qwen/Qwen3-VL-8B-Instruct"]


def test_estimate_answers_for_a_popular_model_offline_in_seconds():
    """conftest sets HF_HUB_OFFLINE=1: the bundled config answers (any case of the id), no Hub call."""
    started = time.monotonic()
    config = memory.model_config_of(TrainConfig(model="META-LLAMA/llama-3.1-8b"))
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (4096, 32, 128256)
    assert config.name_or_path == "meta-llama/Llama-3.1-8B"
    est = memory.estimate(plan_for(TrainConfig(model="Qwen/Qwen2.5-0.5B-Instruct", max_seq_length=256), "cuda"))
    assert est.total_bytes > 2 * 0.494e9  # at least its 16-bit weights
    assert time.monotonic() - started < 60


def test_unknown_hub_id_offline_fails_fast_with_one_line_in_estimate_check_and_start(tmp_path):
    started = time.monotonic()
    with pytest.raises(UserError) as caught:
        memory.estimate(plan_for(TrainConfig(model="someone/not-a-popular-model"), "cuda"))
    assert caught.value.field == "model" and "not reachable" in str(caught.value) and "\n" not in str(caught.value)
    values = {**Studio.default_values(), "model": "someone/not-a-popular-model"}
    config, problems = Studio(runs_root=tmp_path / "runs").verify(values)  # Check, with Start's own checks
    assert config is None and list(problems) == ["model"] and "not reachable" in problems["model"]
    # A Hub dataset as well: both lines at once, not one per click of Check.
    config, problems = Studio(runs_root=tmp_path / "runs").verify({**values, "dataset": "someone/pirate-chats"})
    assert config is None and sorted(problems) == ["dataset", "model"]
    assert "is a Hub dataset, this machine cannot reach the Hugging Face Hub" in problems["dataset"]
    assert time.monotonic() - started < 15


def test_an_unreachable_hub_is_noticed_in_seconds_without_the_offline_setting(monkeypatch):
    """No HF_HUB_OFFLINE, but no network: the reachability probe answers within its timeout and the load is
    limited to the local cache, instead of the Hub client's ~25 s of retries."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    for name in catalogue.PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(catalogue, "HUB_HOST", "hub.invalid")  # a name that never resolves (RFC 2606)
    catalogue.forget_reachability()
    try:
        started = time.monotonic()
        assert catalogue.hub_reachable() is False
        with pytest.raises(UserError) as caught:
            loading.load_model_config("someone/not-a-popular-model")
        assert "not reachable" in str(caught.value) and time.monotonic() - started < 10
    finally:
        catalogue.forget_reachability()


def test_the_probe_asks_the_endpoint_the_hub_client_uses(monkeypatch):
    """HF_ENDPOINT (a mirror) is the address probed: a listening port answers, a closed one does not."""
    import socket

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for name in catalogue.PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
        catalogue.forget_reachability()
        assert catalogue.hub_reachable() is True
    catalogue.forget_reachability()
    assert catalogue.hub_reachable() is False  # the port is closed now
    catalogue.forget_reachability()


def test_online_only_config_json_is_fetched(monkeypatch, tmp_path):
    """A Hub id not in the catalogue, with the Hub reachable: the only file asked for is config.json."""
    import transformers.utils.hub as hub
    from huggingface_hub import constants

    source = catalogue.bundled_path("HuggingFaceTB/SmolLM2-135M-Instruct")
    asked: list[str] = []

    def fake_download(repo_id: str, filename: str, cache_dir: str | None = None, **kwargs) -> str:
        """Put the file where huggingface_hub's cache keeps a downloaded file (snapshots/COMMIT/, refs/main)."""
        asked.append(filename)
        if filename != "config.json":
            raise AssertionError(f"asked for {filename}")
        repo = Path(cache_dir or constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}"
        commit = "0" * 40
        (repo / "snapshots" / commit).mkdir(parents=True, exist_ok=True)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(commit)
        target = repo / "snapshots" / commit / filename
        target.write_text(Path(source).read_text())
        return str(target)

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "hf_hub_download", fake_download)
    monkeypatch.setattr(catalogue, "hub_reachable", lambda timeout=0: True)
    config = loading.load_model_config("someone/a-small-llama")
    assert config.hidden_size == 576 and asked == ["config.json"]
