"""The default run's exports in the runtimes they are for: real llama.cpp (llama-cpp-python) and plain transformers.

One default run (embedded SmolLM2-135M-Instruct, bundled pirate data, LoRA; only the length cut) is trained in a
studio home of this module's own and exported merged, as f16 and q8_0 GGUF, and as a LoRA GGUF; its base is written
as an f16 GGUF for the LoRA. `measure` (tests/llama_cpp_support.py) loads each file once and every test asserts on
those figures: tokenization of hard strings, next-token agreement with the merged model on unseen text, greedy chat
answers, and the prompt an Ollama Modelfile builds. Skipped with one line when llama-cpp-python is not installed.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from tests import llama_cpp_support as llama

# The module fixture converts the embedded model, trains 4 short steps and exports four ways, once; its setup counts
# against the first test's timeout: on a machine shared by many jobs (load 18 on 2 cores) it took over 30 minutes.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(not llama.available(), reason=llama.SKIP_REASON),
]

PROMPTS = llama.CHAT_PROMPTS[:3]  # greedy answers compared token for token (the bench answers all five)
# Short (seconds on an idle CPU), with a learning rate high enough that the adapter moves the model measurably.
SHORT = {
    "max_steps": 4,
    "per_device_train_batch_size": 2,
    "max_seq_length": 64,
    "learning_rate": 3e-3,
    "eval_split": "",
    "save_steps": 4,
}


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    return llama.default_run_exports(tmp_path_factory.mktemp("default-run-home"), samples=False, **SHORT)


@pytest.fixture(scope="module")
def figures(exports):
    return llama.measure(exports, PROMPTS, old_modelfile=False)


def test_llama_cpp_tokenizes_hard_strings_exactly_as_the_trained_tokenizer(figures):
    assert figures["tokenization_differs"] == [], figures["tokenization_differs"]


def test_f16_gguf_predicts_and_answers_like_the_merged_model(figures):
    assert figures["f16_agreement"] >= 0.98, figures["f16_agreement"]
    assert figures["f16_same_answers"] == len(PROMPTS), (figures["answers"], figures["f16_same_answers"])


def test_q8_0_gguf_predicts_like_the_merged_model(figures):
    assert figures["q8_0_agreement"] >= 0.90, figures["q8_0_agreement"]


def test_the_lora_gguf_over_the_base_gguf_is_the_merged_model(figures):
    assert figures["lora_agreement"] >= 0.98 and figures["lora_same_answers"] == len(PROMPTS), figures
    # The adapter is really applied: without it the base is measurably further from the merged model.
    assert figures["lora_logit_error"] < figures["base_logit_error"] / 2, figures


def test_the_ollama_modelfile_prompt_is_the_training_prompt_and_answers_alike(figures):
    """Rendered as Ollama renders it (tests/ollama_render.py), the Modelfile's TEMPLATE + SYSTEM give the chat
    template's own prompt, and llama.cpp answers that prompt as the merged model answers the training prompt."""
    assert figures["ollama_prompt_is_the_training_prompt"]
    assert figures["ollama_same_answers"] == len(PROMPTS), figures["ollama_answers"]


def test_the_gguf_files_carry_what_llama_cpps_converter_writes(exports):
    from gguf import GGUFReader

    def value(reader, key):
        return reader.fields[key].contents()

    model = GGUFReader(exports.f16)
    assert value(model, "tokenizer.ggml.pre") == "smollm"
    assert value(model, "tokenizer.ggml.add_bos_token") is False  # SmolLM2's tokenizer adds no BOS
    assert (value(model, "general.type"), value(model, "general.size_label")) == ("model", "135M")
    assert value(model, "general.quantization_version") == 2
    lora = GGUFReader(exports.lora)
    assert (value(lora, "general.type"), value(lora, "adapter.type")) == ("adapter", "lora")
    assert value(lora, "adapter.lora.alpha") == 16.0
    assert {t.name for t in lora.tensors} >= {"blk.0.attn_q.weight.lora_a", "blk.29.ffn_down.weight.lora_b"}


# A user's script: only transformers, no project code on the path, in a fresh process.
PLAIN_TRANSFORMERS = """
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, text, question = sys.argv[1], sys.argv[2], sys.argv[3]
tokenizer = AutoTokenizer.from_pretrained(folder)
model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
ids = tokenizer(text, return_tensors="pt")["input_ids"]
chat = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                     return_tensors="pt", return_dict=True)
with torch.no_grad():
    top1 = model(ids).logits[0].argmax(-1).tolist()
    out = model.generate(**chat, max_new_tokens=int(sys.argv[4]), do_sample=False)
answer = tokenizer.decode(out[0, chat["input_ids"].shape[1]:], skip_special_tokens=True)
print(json.dumps({"top1": top1, "answer": answer}))
"""


def test_the_merged_export_loads_in_plain_transformers_and_is_readable_by_others(exports, figures, tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", PLAIN_TRANSFORMERS, str(exports.merged), llama.UNSEEN, PROMPTS[0], "32"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["top1"] == figures["expected_top1"]
    assert got["answer"].strip() == figures["answers"][0].strip()
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in exports.merged.iterdir()}
    assert all(mode & 0o044 == 0o044 for mode in modes.values()), modes  # group and others may read every file
