"""Export, checked by reading it back: transformers loads the merged model and the GGUF, and they predict alike;
every GGUF written here is also loaded by real llama.cpp when llama-cpp-python is installed (tests/llama_cpp_support).

Tiny Llama runs really trained through RunManager: a LoRA run on the tied-embedding base, a full run on an untied
copy, a QLoRA-method config merged through the LoRA plan, and a GPT-2 full run that GGUF export must refuse. The GGUF
runs use SmolLM2's tokenizer (a vocabulary llama.cpp knows); the tests' 384-token tokenizer must be refused.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from finetune.errors import UserError
from finetune.publish import export as exportmod
from finetune.publish import gguf_writer, modelfile
from finetune.publish.export import check_format, export_run
from tests import llama_cpp_support as llama
from tests.ollama_render import ollama_prompt, parse_modelfile
from tests.run_fixtures import train_run
from tests.tiny import TINY_SHAPE, build_llama, build_tokenizer, copy_tokenizer

UNSEEN = llama.UNSEEN  # prose the runs never saw (their data is pirate answers to numbered questions)
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def untied_model_dir(tmp_path_factory, smollm_tokenizer_dir):
    """The tiny Llama with its own output head (tie_word_embeddings=False), the shape of most larger models."""
    import torch
    from transformers import LlamaForCausalLM

    path = build_llama(tmp_path_factory.mktemp("tiny-untied"), tokenizer_dir=smollm_tokenizer_dir)
    model = LlamaForCausalLM.from_pretrained(path)
    model.config.tie_word_embeddings = False
    torch.manual_seed(1)
    head = model.model.embed_tokens.weight.detach().clone() + 0.1 * torch.randn_like(model.model.embed_tokens.weight)
    model.lm_head.weight = torch.nn.Parameter(head)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, tiny_model_dir):
    return train_run(tmp_path_factory.mktemp("export-runs") / "lora-run", tiny_model_dir, steps=6, eval_split="")


@pytest.fixture(scope="module")
def smol_run(tmp_path_factory, tiny_smollm_dir):
    """A LoRA run on the tiny Llama with SmolLM2's tokenizer: the one the GGUF tests export."""
    return train_run(tmp_path_factory.mktemp("export-runs") / "smol-run", tiny_smollm_dir, steps=6, eval_split="")


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, untied_model_dir):
    root = tmp_path_factory.mktemp("export-runs")
    return train_run(root / "full-run", untied_model_dir, steps=4, eval_split="", method="full", learning_rate=1e-3)


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory):
    from transformers import GPT2Config, GPT2LMHeadModel

    path = tmp_path_factory.mktemp("tiny-gpt2")
    tokenizer = build_tokenizer(path)
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2, n_positions=128)
    GPT2LMHeadModel(config).save_pretrained(path)
    root = tmp_path_factory.mktemp("export-runs")
    return train_run(root / "gpt2-run", path, steps=1, eval_split="", method="full", learning_rate=1e-3)


def _ids(model_dir: Path, text: str = UNSEEN):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)(text, return_tensors="pt")["input_ids"]


def _logits(model, ids):
    import torch

    with torch.no_grad():
        return model(input_ids=ids).logits[0].float()


def assert_merged_logits(merged, expected) -> None:
    """A merged model's logits are the adapter's: fp32 rounding of (W + BA)x against Wx + B(Ax) scales with the
    logits (1.3e-4 at |6|), so the bound is relative; a wrong merge is off by more than 1e-2."""
    gap = (merged - expected).abs().max().item()
    assert gap < 1e-4 * max(1.0, expected.abs().max().item()), gap


def _agreement(a, b) -> float:
    return (a.argmax(-1) == b.argmax(-1)).float().mean().item()


def _load(folder: Path, gguf_file: str | None = None):
    from transformers import AutoModelForCausalLM

    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    return AutoModelForCausalLM.from_pretrained(folder, dtype="float32", **kwargs).eval()


# ---------------------------------------------------------------------------------------------- merged


def test_merged_lora_equals_the_peft_model_and_stands_alone(lora_run, tiny_model_dir, tmp_path):
    from peft import PeftModel

    messages = []
    result = export_run(lora_run, "merged", out=tmp_path / "merged", progress=messages.append)
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= {p.name for p in result.folder.iterdir()}
    assert not any(p.is_symlink() for p in result.folder.iterdir())
    assert re.fullmatch(r"wrote .*merged \(\d+\.\d (KB|MB)\)", messages[-1]), messages[-1]
    ids = _ids(result.folder)
    merged = _logits(_load(result.folder), ids)
    peft = PeftModel.from_pretrained(_load(tiny_model_dir), str(lora_run)).eval()
    expected = _logits(peft, ids)
    assert_merged_logits(merged, expected)
    base = _logits(_load(tiny_model_dir), ids)
    assert (base - expected).abs().max().item() > 1e-2  # the adapter changed the model: the merge is visible
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(result.folder)
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template


def test_export_writes_only_under_exports_and_never_into_the_run(lora_run):
    before = sorted(p.relative_to(lora_run) for p in lora_run.rglob("*") if "exports" not in p.parts)
    result = export_run(lora_run, "merged")
    assert result.folder == lora_run / "exports" / "merged"
    export_run(lora_run, "merged")  # a second export replaces the first
    after = sorted(p.relative_to(lora_run) for p in lora_run.rglob("*") if "exports" not in p.parts)
    assert before == after
    assert sorted(p.name for p in (lora_run / "exports").iterdir()) == ["merged"]


def test_qlora_run_merges_onto_the_full_precision_base_with_a_warning(lora_run, monkeypatch, tmp_path):
    from finetune.config import TrainConfig
    from finetune.runs.rundir import RunDir

    real = RunDir.load_config
    monkeypatch.setattr(RunDir, "load_config", lambda self: real(self).replace(method="qlora"))
    loaded = []
    import finetune.model.loading

    original = finetune.model.loading.load_base
    monkeypatch.setattr(
        finetune.model.loading, "load_base", lambda plan, **kw: loaded.append(plan) or original(plan, **kw)
    )
    messages = []
    result = export_run(lora_run, "merged", out=tmp_path / "q", progress=messages.append)
    assert result.warnings == (exportmod.QLORA_WARNING,) and exportmod.QLORA_WARNING in messages
    assert loaded and loaded[0].quantization is None and isinstance(loaded[0].config, TrainConfig)


# ------------------------------------------------------------------------------------------------ gguf


# Random weights have near-ties that rounding flips, so the floors are lower than the default run's (98% / 90%); the
# f16 logits themselves must match closely.
@pytest.mark.parametrize("quant,floor", [("f16", 0.95), ("q8_0", 0.85)])
def test_gguf_of_a_lora_run_reads_back_and_predicts_like_the_merged_model(smol_run, tmp_path, quant, floor):
    from transformers import AutoTokenizer

    merged = export_run(smol_run, "merged", out=tmp_path / "merged").folder
    result = export_run(smol_run, "gguf", quant=quant, out=tmp_path / "gguf")
    assert result.main.suffix == ".gguf" and result.main.parent == result.folder
    assert sorted(p.name for p in result.folder.iterdir()) == sorted(["Modelfile", result.main.name])
    from gguf import GGMLQuantizationType, GGUFReader

    matrices = {t.tensor_type.name for t in GGUFReader(result.main).tensors if len(t.shape) == 2}
    assert matrices == {quant.upper()}, matrices  # every matrix in the asked type (rows here are 64 or 128 wide)
    assert GGMLQuantizationType[quant.upper()]
    ids = _ids(merged)
    merged_model = _load(merged)
    expected = _logits(merged_model, ids)
    got = _logits(_load(result.folder, result.main.name), ids)
    agreement = _agreement(got, expected)
    print(f"{quant}: {agreement:.1%} of {ids.shape[1]} positions, {result.size_bytes} bytes")
    assert agreement >= floor
    if quant == "f16":
        assert (got - expected).abs().mean().item() < 0.02  # f16 rounding only
    # Real llama.cpp: loads it, tokenizes as the trained tokenizer, predicts like the merged model (random weights:
    # near-ties that rounding flips, so the floors are this test's, not the default run's).
    llama.check_in_llama_cpp(result.main, AutoTokenizer.from_pretrained(merged), merged_model, floor - 0.05)


def test_gguf_of_an_untied_full_run_keeps_its_own_output_head(full_run, tmp_path):
    from gguf import GGUFReader
    from transformers import AutoTokenizer

    result = export_run(full_run, "gguf", quant="f16", out=tmp_path / "gguf")
    names = {t.name for t in GGUFReader(result.main).tensors}
    assert "output.weight" in names and "token_embd.weight" in names
    ids = _ids(full_run)
    reference = _load(full_run)
    expected = _logits(reference, ids)
    model = _load(result.folder, result.main.name)
    assert model.config.tie_word_embeddings is False
    assert _agreement(_logits(model, ids), expected) >= 0.99
    llama.check_in_llama_cpp(result.main, AutoTokenizer.from_pretrained(full_run), reference, 0.95)


def test_gguf_of_a_tied_model_has_no_output_tensor(smol_run, tmp_path):
    from gguf import GGUFReader

    result = export_run(smol_run, "gguf", out=tmp_path / "gguf")
    assert "output.weight" not in {t.name for t in GGUFReader(result.main).tensors}


def _field(reader, key):
    """A GGUF metadata value as Python (str, number or list)."""
    field = reader.fields[key]
    return field.contents()


def test_gguf_tokenizer_and_metadata_are_what_llama_cpps_converter_writes(smol_run, tmp_path):
    from gguf import GGUFReader, TokenType
    from transformers import AutoTokenizer

    result = export_run(smol_run, "gguf", out=tmp_path / "gguf")
    original = AutoTokenizer.from_pretrained(smol_run)
    restored = AutoTokenizer.from_pretrained(result.folder, gguf_file=result.main.name)
    chat = original.apply_chat_template(
        [{"role": "user", "content": "Ahoy, what is two plus two?"}], tokenize=False, add_generation_prompt=True
    )
    for text in (UNSEEN, chat, *llama.HARD_STRINGS):
        assert restored(text)["input_ids"] == original(text)["input_ids"], text
    assert (restored.eos_token, restored.bos_token) == (original.eos_token, original.bos_token)
    assert restored.chat_template == original.chat_template
    reader = GGUFReader(result.main)
    field = reader.fields["tokenizer.ggml.token_type"]
    types = [int(field.parts[i][0]) for i in field.data]
    for token in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):  # llama.cpp stops and parses by these types
        assert types[original.convert_tokens_to_ids(token)] == TokenType.CONTROL, token
    # The pre-tokenizer llama.cpp's converter identifies for SmolLM2 (by hashing its check text), and the keys it
    # writes besides: BOS as the tokenizer adds it (SmolLM2: not at all), the file's type, size and quant version.
    assert _field(reader, "tokenizer.ggml.pre") == "smollm"
    assert _field(reader, "tokenizer.ggml.add_bos_token") is (original("a")["input_ids"][0] == original.bos_token_id)
    assert _field(reader, "general.type") == "model"
    assert _field(reader, "general.quantization_version") == 2
    assert re.fullmatch(r"\d+(\.\d+)?[KM]", _field(reader, "general.size_label")), _field(reader, "general.size_label")


def test_an_unknown_tokenizer_is_refused_before_anything_is_written(lora_run, tmp_path):
    """The tests' own 384-token tokenizer is byte-level BPE like GPT-2's, but its vocabulary is one llama.cpp's
    converter does not list: a GGUF of it would load with a guessed pre-tokenizer, so export refuses it."""
    with pytest.raises(UserError) as err:
        export_run(lora_run, "gguf", out=tmp_path / "gguf")
    message = str(err.value)
    assert message.startswith("format: llama.cpp does not know this tokenizer (") and "\n" not in message
    assert "384 tokens, ByteLevel pre-tokenizer" in message and "export --format merged" in message
    assert not (tmp_path / "gguf").exists() and not list(tmp_path.iterdir())


CONVERSATIONS = (
    [{"role": "user", "content": "Ahoy, what is two plus two?"}],
    [{"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "Capital of France?"}],
)


def test_the_modelfile_renders_the_training_prompt_as_ollama_builds_it(smol_run, tmp_path):
    """SmolLM2's chat template inserts a default system prompt: every training example carried it, so the Modelfile
    must too. The Modelfile's TEMPLATE and SYSTEM are rendered as Ollama does (tests/ollama_render.py: the SYSTEM
    put first, the Go template interpreted) and compared with apply_chat_template, for both conversation shapes."""
    from transformers import AutoTokenizer

    result = export_run(smol_run, "gguf", quant="q8_0", out=tmp_path / "gguf")
    text = (result.folder / "Modelfile").read_text()
    assert f"FROM ./{result.main.name}\n" in text and "PARAMETER temperature" in text
    tokenizer = AutoTokenizer.from_pretrained(smol_run)
    assert parse_modelfile(text)["system"] == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    for messages in CONVERSATIONS:
        expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert ollama_prompt(text, messages) == expected
    # The stops: the text that ends an assistant turn in the template, and the EOS the model was trained to emit.
    turn = [*CONVERSATIONS[0], {"role": "assistant", "content": "Arr, four!"}]
    after = tokenizer.apply_chat_template(turn, tokenize=False).split("Arr, four!", 1)[1]
    stops = parse_modelfile(text)["stops"]
    assert any(after.startswith(stop) for stop in stops) and tokenizer.eos_token in stops, (after, stops)


def test_a_template_without_a_default_system_prompt_gets_no_system_line(tmp_path):
    from transformers import AutoTokenizer

    build_llama(tmp_path)  # the tests' plain ChatML template: no default system prompt
    text = modelfile.modelfile_text(tmp_path, "m.gguf")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert "SYSTEM" not in text
    for messages in CONVERSATIONS:
        expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert ollama_prompt(text, messages) == expected


def test_modelfile_falls_back_clearly_for_a_template_that_is_not_chatml(tmp_path):
    build_llama(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "chat_template.jinja").unlink(missing_ok=True)
    config["chat_template"] = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{% endfor %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    text = modelfile.modelfile_text(tmp_path, "m.gguf")
    assert "not plain ChatML" in text and 'TEMPLATE """' in text and 'PARAMETER stop "<|im_end|>"' in text
    assert "SYSTEM" not in text


def test_gguf_lora_writes_the_adapter_alone_in_llama_cpps_lora_format(smol_run, tiny_smollm_dir, tmp_path):
    from gguf import GGUFReader

    result = export_run(smol_run, "gguf-lora", out=tmp_path / "lora")
    assert result.main.name == "smol-run-lora-f16.gguf" and [p.name for p in result.folder.iterdir()] == [
        result.main.name
    ]
    reader = GGUFReader(result.main)
    assert _field(reader, "general.type") == "adapter" and _field(reader, "adapter.type") == "lora"
    assert _field(reader, "adapter.lora.alpha") == 16.0
    names = {t.name for t in reader.tensors}
    assert "blk.0.attn_q.weight.lora_a" in names and "blk.1.ffn_down.weight.lora_b" in names
    assert all(name.endswith((".lora_a", ".lora_b")) for name in names) and len(names) == 2 * 7 * 2
    if llama.available():  # base GGUF + adapter in llama.cpp predict like the merged model
        from transformers import AutoTokenizer

        merged = export_run(smol_run, "merged", out=tmp_path / "merged").folder
        base_gguf = tmp_path / "base.gguf"
        gguf_writer.write_gguf(tiny_smollm_dir, base_gguf, "f16", "base", lambda message: None)
        tokenizer = AutoTokenizer.from_pretrained(merged)
        share = llama.check_in_llama_cpp(base_gguf, tokenizer, _load(merged), 0.94, lora=result.main)
        print(f"base + LoRA GGUF in llama.cpp: {share:.1%} top-1 agreement with the merged model")


def test_gguf_lora_refuses_a_full_fine_tune_in_one_line(full_run, tmp_path):
    with pytest.raises(UserError, match="^format: gguf-lora needs a LoRA run"):
        export_run(full_run, "gguf-lora", out=tmp_path / "lora")
    assert not (tmp_path / "lora").exists()


def test_exported_files_are_readable_like_the_users_other_files(smol_run, tmp_path):
    import os
    import stat

    probe = tmp_path / "probe"
    probe.touch()
    expected = stat.S_IMODE(probe.stat().st_mode)  # 0644 under the usual umask
    for fmt in ("merged", "gguf"):
        folder = export_run(smol_run, fmt, out=tmp_path / fmt).folder
        modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in folder.iterdir()}
        assert set(modes.values()) == {oct(expected)}, modes
    assert os.access(tmp_path / "merged" / "model.safetensors", os.R_OK)


# ------------------------------------------------------------------------------------------- refusals


def test_unsupported_architecture_is_refused_in_one_line_by_the_cli(gpt2_run, tmp_path):
    out = tmp_path / "gguf"
    proc = subprocess.run(
        [sys.executable, "-m", "finetune", "export", str(gpt2_run), "--format", "gguf", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "'gpt2'" in lines[0] and "not" in lines[0], proc.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    "fmt,quant,field",
    [("onnx", None, "format"), ("gguf", "q4_k", "quant"), ("merged", "q8_0", "quant")],
)
def test_bad_format_or_quant_is_one_line_naming_the_field(fmt, quant, field):
    with pytest.raises(UserError) as err:
        check_format(fmt, quant)
    assert err.value.field == field and "\n" not in str(err.value) and str(err.value).startswith(field)


def test_an_unfinished_run_is_refused(lora_run, tmp_path):
    import shutil

    from finetune.runs.rundir import RunDir

    copy = tmp_path / "running"
    shutil.copytree(lora_run, copy, ignore=shutil.ignore_patterns("exports"))
    run = RunDir(copy)
    run.write_status({**run.read_status(), "status": "failed", "pid": None})
    with pytest.raises(UserError, match="not finished"):
        export_run(copy, "merged", out=tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_a_failed_write_leaves_nothing_under_the_final_name(smol_run, tmp_path, monkeypatch):
    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf_writer, "write_gguf", no_space)
    (tmp_path / "out").mkdir()
    with pytest.raises(UserError, match="No space left on device"):
        export_run(smol_run, "gguf", out=tmp_path / "out" / "gguf")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("model_type", ["mistral", "qwen2"])
def test_gguf_of_other_llama_family_shapes_reads_back(model_type, tmp_path, smollm_tokenizer_dir, monkeypatch):
    """Mistral (written as llama, read back as mistral) and Qwen2 (q/k/v biases, no Q/K permutation), read back by
    transformers and by llama.cpp. For a qwen2 model transformers loads any tokenizer as Qwen2Tokenizer, which splits
    text with Qwen's own rule: over SmolLM2's vocabulary that is a tokenizer llama.cpp does not know (export refuses
    it, rightly), and Qwen's vocabulary is not here. So for the qwen2 shape the tokenizer is read as its
    tokenizer.json says (SmolLM2's): what this test checks there is the architecture, not Qwen's tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    folder = tmp_path / model_type
    tokenizer = copy_tokenizer(smollm_tokenizer_dir, folder)
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        model_type,
        vocab_size=len(tokenizer),
        **TINY_SHAPE,
        initializer_range=0.3,
        tie_word_embeddings=False,
    )
    model = AutoModelForCausalLM.from_config(config).eval()
    if model_type == "qwen2":  # random biases, so a dropped or misplaced bias shows
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.3)
    model.save_pretrained(folder)
    if model_type == "qwen2":
        with pytest.raises(UserError, match="llama.cpp does not know this tokenizer \\(Qwen2Tokenizer"):
            gguf_writer.check_gguf_support(folder)
        monkeypatch.setattr(gguf_writer, "_load_tokenizer", lambda path: PreTrainedTokenizerFast.from_pretrained(path))
        tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    target = tmp_path / "out" / "m.gguf"
    target.parent.mkdir()
    gguf_writer.write_gguf(folder, target, "f16", "tiny", lambda message: None)
    restored = _load(target.parent, target.name)
    assert restored.config.model_type == {"mistral": "llama"}.get(model_type, model_type)
    ids = tokenizer(UNSEEN, return_tensors="pt")["input_ids"]
    got, expected = _logits(restored, ids), _logits(model, ids)
    # An untrained model has near-ties that f16 rounding may flip: the logits themselves must match.
    assert (got - expected).abs().mean().item() < 0.02 and _agreement(got, expected) >= 0.95
    llama.check_in_llama_cpp(target, tokenizer, model, 0.9)


def test_a_local_name_in_config_json_is_dropped_and_any_other_local_path_refused(full_run, tmp_path):
    import shutil

    copy = tmp_path / "runs" / "full-copy"
    shutil.copytree(full_run, copy, ignore=shutil.ignore_patterns("exports"))
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "_name_or_path": str(copy)}))
    result = export_run(copy, "merged", out=tmp_path / "merged")
    assert "_name_or_path" not in json.loads((result.folder / "config.json").read_text())
    jinja = copy / "chat_template.jinja"  # the chat template travels inside the GGUF
    if jinja.is_file():
        jinja.write_text(jinja.read_text() + f"{{# made in {copy} #}}")
    else:
        tokenizer_config = json.loads((copy / "tokenizer_config.json").read_text())
        tokenizer_config["chat_template"] += f"{{# made in {copy} #}}"
        (copy / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    with pytest.raises(UserError, match=r"\.gguf contains a local path \(the run directory\)"):
        export_run(copy, "gguf", out=tmp_path / "gguf")
    assert not (tmp_path / "gguf").exists()


def test_the_publish_tab_exports_through_the_studio_and_shows_the_size(studio_home, tiny_smollm_dir):
    from finetune.studio import Studio
    from tests.run_fixtures import build_run
    from ui.app import build_app

    studio = Studio(studio_home / "runs")
    build_run(studio.manager.root / "run-a", tiny_smollm_dir)
    demo = build_app(studio)
    tab = demo.studio_ui.publish
    wired = [
        d for d in demo.config["dependencies"] if [list(t) for t in d["targets"]] == [[tab.export_btn._id, "click"]]
    ]
    assert wired and wired[0]["outputs"] == [tab.export_result._id, tab.export_files._id]
    assert wired[0]["inputs"] == [tab.run._id, tab.export_format._id, tab.export_quant._id]
    message, files = tab.export("run-a", "gguf", "q8_0")
    assert re.fullmatch(r"✓ Wrote `exports/gguf-q8_0/run-a-q8_0\.gguf` \(\d+\.\d MB\) in run `run-a`.*", message)
    folder = studio.manager.root / "run-a" / "exports" / "gguf-q8_0"
    assert (folder / "Modelfile").is_file() and "Download it below" in message
    assert files["visible"] and files["value"] == [str(folder / "Modelfile"), str(folder / "run-a-q8_0.gguf")]
    assert [choice[1] for choice in tab.export_format.choices] == ["merged", "gguf", "gguf-lora"]
    message, _ = tab.export("run-a", "gguf-lora", "f16")
    assert message.startswith("✓ Wrote `exports/gguf-lora-f16/run-a-lora-f16.gguf` (") and "--lora" in message
    refused, no_files = tab.export("run-a", "gguf", "q4_k")
    assert str(studio_home) not in refused and not no_files["visible"]  # one line naming the field, no path
    assert refused.startswith("⚠ quant: expected one of f16, q8_0")
    assert tab.export("../elsewhere", "merged", "f16")[0].startswith("⚠ run:")


def test_a_stopped_run_is_exported_from_its_last_checkpoint(lora_run, tiny_model_dir, tmp_path):
    """Stop saves a checkpoint, not the final adapter: export merges the newest complete checkpoint and says so."""
    import shutil

    from peft import PeftModel

    from finetune.runs.rundir import RunDir

    copy = tmp_path / "pirate-run"
    shutil.copytree(lora_run, copy, ignore=shutil.ignore_patterns("exports"))
    (copy / "adapter_model.safetensors").unlink()
    run = RunDir(copy)
    run.write_status({**run.read_status(), "status": "stopped", "pid": None})
    checkpoint = run.last_checkpoint()
    result = export_run(copy, "merged", out=tmp_path / "merged")
    assert result.warnings == (
        f"pirate-run stopped before its final save: exported from its last checkpoint, {checkpoint.name}",
    )
    ids = _ids(result.folder)
    expected = _logits(PeftModel.from_pretrained(_load(tiny_model_dir), str(checkpoint)).eval(), ids)
    assert_merged_logits(_logits(_load(result.folder), ids), expected)


def test_out_must_be_new_and_outside_the_runs_own_files(lora_run, tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    with pytest.raises(UserError, match="^out: taken already exists and is not empty"):
        export_run(lora_run, "merged", out=tmp_path / "taken")
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine"
    with pytest.raises(UserError, match="^out: not among the run's own files"):
        export_run(lora_run, "merged", out=lora_run / "checkpoints-copy")
    assert not (lora_run / "checkpoints-copy").exists()


def test_q8_0_keeps_rows_that_do_not_split_into_32_value_blocks_in_f16():
    import numpy as np
    from gguf import GGMLQuantizationType

    written = {}

    class Recorder:
        def add_tensor(self, name, data, raw_dtype=None):
            written[name] = (data.dtype, raw_dtype)

    gguf_writer.add_weight(Recorder(), "a", np.ones((4, 64), np.float32), "q8_0")
    gguf_writer.add_weight(Recorder(), "b", np.ones((4, 48), np.float32), "q8_0")
    gguf_writer.add_weight(Recorder(), "c", np.ones(64, np.float32), "q8_0")
    assert written == {
        "a": (np.uint8, GGMLQuantizationType.Q8_0),
        "b": (np.float16, None),
        "c": (np.float32, None),
    }


def test_a_bf16_base_is_merged_and_saved_in_bf16(tmp_path):
    import torch
    from peft import PeftModel
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    base_dir = build_llama(tmp_path / "bf16-base")
    AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.bfloat16).save_pretrained(base_dir)
    run = train_run(tmp_path / "runs" / "bf16-run", base_dir, steps=4, eval_split="")
    result = export_run(run, "merged", out=tmp_path / "merged")
    assert json.loads((result.folder / "config.json").read_text())["dtype"] == "bfloat16"
    with safe_open(str(result.folder / "model.safetensors"), framework="pt") as fh:
        assert {fh.get_tensor(k).dtype for k in fh.keys()} == {torch.bfloat16}
    ids = _ids(result.folder)
    peft = PeftModel.from_pretrained(_load(base_dir), str(run)).eval()
    assert _agreement(_logits(_load(result.folder), ids), _logits(peft, ids)) >= 0.95


@pytest.mark.parametrize(
    "change,words",
    [
        ({"use_dora": True}, "llama.cpp has no DoRA adapters"),
        ({"alpha_pattern": {"q_proj": 32}}, "one LoRA alpha per adapter"),
        ({"modules_to_save": ["lm_head"]}, "trains whole modules or tokens"),
    ],
)
def test_gguf_lora_refuses_adapters_llama_cpp_cannot_apply_in_one_line(tmp_path, change, words):
    from finetune.publish import gguf_lora

    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16, **change}))
    with pytest.raises(UserError) as err:
        gguf_lora.check_lora_support(tmp_path, {"model_type": "llama"})
    assert str(err.value).startswith("format: ") and words in str(err.value) and "\n" not in str(err.value)


def test_gguf_lora_alpha_gives_peft_scale_under_llama_cpps_alpha_over_rank():
    from finetune.publish import gguf_lora

    assert gguf_lora._alpha({"r": 8, "lora_alpha": 16}) / 8 == 16 / 8  # PEFT: alpha / r
    assert gguf_lora._alpha({"r": 16, "lora_alpha": 16, "use_rslora": True}) / 16 == pytest.approx(16 / 16**0.5)
