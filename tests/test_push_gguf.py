"""Publish can push the run as GGUF too: the .gguf and its Ollama Modelfile land in the same commit, the card says how
to run them and which system prompt the Modelfile sends, and what arrives on the Hub reads back with transformers and
loads in llama.cpp. The run is on the tiny Llama with SmolLM2's tokenizer (a vocabulary llama.cpp knows)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from finetune.errors import UserError
from finetune.publish.hub import push_run
from tests import llama_cpp_support as llama
from tests.run_fixtures import build_run
from tests.test_hub import GOOD, REPO, hub  # noqa: F401 - fixture shared with the push tests


@pytest.fixture
def run_dir(tiny_smollm_dir, studio_home):
    return build_run(studio_home / "runs" / "run-smol", tiny_smollm_dir)


def test_a_push_with_gguf_adds_the_file_its_modelfile_and_how_to_run_them(hub, run_dir, tmp_path):  # noqa: F811
    before = sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*"))
    push_run(run_dir, REPO, token=GOOD, gguf="q8_0")
    files = hub.repos[REPO].files
    (gguf_name,) = [name for name in files if name.endswith(".gguf")]
    assert gguf_name.endswith("-q8_0.gguf") and "Modelfile" in files and "adapter_model.safetensors" in files
    assert len(hub.repos[REPO].commits) == 1  # one commit: adapter, card and GGUF together
    card = files["README.md"].decode()
    assert "## Run it with Ollama or llama.cpp" in card and f"llama-cli -m {gguf_name}" in card
    default_system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    assert "default system prompt, which every training conversation" in card and default_system in card
    assert f'SYSTEM """{default_system}"""' in files["Modelfile"].decode()
    assert "- gguf" in card.split("---")[1]  # a tag in the metadata header
    assert files["Modelfile"].decode().startswith(f"FROM ./{gguf_name}")
    assert sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*")) == before  # the run is unchanged

    # What the Hub received is a model transformers reads, with the run's tokenizer.
    (tmp_path / gguf_name).write_bytes(files[gguf_name])
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=gguf_name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=gguf_name)
    text = "Question 99? Arr"
    assert tokenizer(text)["input_ids"] == AutoTokenizer.from_pretrained(str(run_dir))(text)["input_ids"]
    assert model(torch.tensor([tokenizer(text)["input_ids"]])).logits.shape[-1] == model.config.vocab_size
    llama.check_in_llama_cpp(tmp_path / gguf_name, AutoTokenizer.from_pretrained(str(run_dir)), model, 0.85)


def test_an_unknown_gguf_quant_is_refused_before_anything_is_sent(hub, run_dir):  # noqa: F811
    with pytest.raises(UserError) as info:
        push_run(run_dir, REPO, token=GOOD, gguf="q4_k")
    assert str(info.value).startswith("quant: ") and REPO not in hub.repos


def test_the_publish_tab_pushes_a_gguf_when_asked(hub, run_dir, studio_home):  # noqa: F811
    from finetune.studio import Studio
    from ui.app import build_app

    ui = build_app(Studio(studio_home / "runs")).studio_ui
    message, token_box = ui.publish.push(run_dir.name, REPO, GOOD, True, False, None, "f16")
    assert message.startswith("✓ Pushed the adapter and a f16 GGUF") and token_box == ""
    assert any(name.endswith("-f16.gguf") for name in hub.repos[REPO].files)
