"""Export, checked by reading it back: transformers loads the merged model and the GGUF, and they predict alike.

Tiny Llama runs really trained through RunManager: a LoRA run on the tied-embedding base, a full run on an untied
copy, a QLoRA-method config merged through the LoRA plan, and a GPT-2 full run that GGUF export must refuse.
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
from finetune.publish import gguf_writer
from finetune.publish.export import check_format, export_run
from tests.run_fixtures import train_run
from tests.tiny import TINY_SHAPE, build_llama, build_tokenizer

# Text the runs never saw (their data is pirate answers to numbered questions).
UNSEEN = (
    "The quick brown fox jumps over the lazy dog. Explain why the sky is blue in one sentence. "
    "You are a helpful assistant; what is two plus two? Sentence one and sentence two are paraphrases."
)
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def untied_model_dir(tmp_path_factory):
    """The tiny Llama with its own output head (tie_word_embeddings=False), the shape of most larger models."""
    import torch
    from transformers import LlamaForCausalLM

    path = build_llama(tmp_path_factory.mktemp("tiny-untied"))
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
    assert (merged - expected).abs().max().item() < 1e-4
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
    from finetune.rundir import RunDir

    real = RunDir.load_config
    monkeypatch.setattr(RunDir, "load_config", lambda self: real(self).replace(method="qlora"))
    loaded = []
    import finetune.models

    original = finetune.models.load_base
    monkeypatch.setattr(finetune.models, "load_base", lambda plan, **kw: loaded.append(plan) or original(plan, **kw))
    messages = []
    result = export_run(lora_run, "merged", out=tmp_path / "q", progress=messages.append)
    assert result.warnings == (exportmod.QLORA_WARNING,) and exportmod.QLORA_WARNING in messages
    assert loaded and loaded[0].quantization is None and isinstance(loaded[0].config, TrainConfig)


# ------------------------------------------------------------------------------------------------ gguf


@pytest.mark.parametrize("quant,floor", [("f16", 0.99), ("q8_0", 0.90)])
def test_gguf_of_a_lora_run_reads_back_and_predicts_like_the_merged_model(lora_run, tmp_path, quant, floor):
    merged = export_run(lora_run, "merged", out=tmp_path / "merged").folder
    result = export_run(lora_run, "gguf", quant=quant, out=tmp_path / "gguf")
    assert result.main.suffix == ".gguf" and result.main.parent == result.folder
    assert sorted(p.name for p in result.folder.iterdir()) == sorted(["Modelfile", result.main.name])
    from gguf import GGMLQuantizationType, GGUFReader

    matrices = {t.tensor_type.name for t in GGUFReader(result.main).tensors if len(t.shape) == 2}
    assert matrices == {quant.upper()}, matrices  # every matrix in the asked type (rows here are 64 or 128 wide)
    assert GGMLQuantizationType[quant.upper()]
    ids = _ids(merged)
    expected = _logits(_load(merged), ids)
    got = _logits(_load(result.folder, result.main.name), ids)
    agreement = _agreement(got, expected)
    print(f"{quant}: {agreement:.1%} of {ids.shape[1]} positions, {result.size_bytes} bytes")
    assert agreement >= floor
    if quant == "f16":
        assert (got - expected).abs().mean().item() < 0.02  # f16 rounding only


def test_gguf_of_an_untied_full_run_keeps_its_own_output_head(full_run, tmp_path):
    from gguf import GGUFReader

    result = export_run(full_run, "gguf", quant="f16", out=tmp_path / "gguf")
    names = {t.name for t in GGUFReader(result.main).tensors}
    assert "output.weight" in names and "token_embd.weight" in names
    ids = _ids(full_run)
    expected = _logits(_load(full_run), ids)
    model = _load(result.folder, result.main.name)
    assert model.config.tie_word_embeddings is False
    assert _agreement(_logits(model, ids), expected) >= 0.99


def test_gguf_of_a_tied_model_has_no_output_tensor(lora_run, tmp_path):
    from gguf import GGUFReader

    result = export_run(lora_run, "gguf", out=tmp_path / "gguf")
    assert "output.weight" not in {t.name for t in GGUFReader(result.main).tensors}


def test_gguf_tokenizer_encodes_exactly_as_the_original(lora_run, tmp_path):
    from transformers import AutoTokenizer

    result = export_run(lora_run, "gguf", out=tmp_path / "gguf")
    original = AutoTokenizer.from_pretrained(lora_run)
    restored = AutoTokenizer.from_pretrained(result.folder, gguf_file=result.main.name)
    chat = original.apply_chat_template(
        [{"role": "user", "content": "Ahoy, what is two plus two?"}], tokenize=False, add_generation_prompt=True
    )
    for text in (UNSEEN, chat, "  spaces\tand\nnewlines 12345 ünïcödé <|im_end|><|endoftext|>"):
        assert restored(text)["input_ids"] == original(text)["input_ids"], text
    assert (restored.eos_token, restored.bos_token, restored.pad_token) == ("<|im_end|>", "<|im_start|>", "<|im_end|>")
    assert restored.chat_template == original.chat_template
    from gguf import GGUFReader, TokenType

    field = GGUFReader(result.main).fields["tokenizer.ggml.token_type"]
    types = [int(field.parts[i][0]) for i in field.data]
    for token in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):  # llama.cpp stops and parses by these types
        assert types[original.convert_tokens_to_ids(token)] == TokenType.CONTROL, token


def test_modelfile_has_from_template_and_stops(lora_run, tmp_path):
    result = export_run(lora_run, "gguf", quant="q8_0", out=tmp_path / "gguf")
    text = (result.folder / "Modelfile").read_text()
    assert f"FROM ./{result.main.name}\n" in text
    assert 'TEMPLATE """{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n' in text
    assert 'PARAMETER stop "<|im_end|>"' in text and "PARAMETER temperature" in text


def test_modelfile_falls_back_clearly_for_a_template_that_is_not_chatml(tmp_path):
    build_llama(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "chat_template.jinja").unlink(missing_ok=True)
    config["chat_template"] = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{% endfor %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    text = gguf_writer.modelfile_text(tmp_path, "m.gguf")
    assert "not ChatML" in text and 'TEMPLATE """' in text and 'PARAMETER stop "<|im_end|>"' in text


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

    from finetune.rundir import RunDir

    copy = tmp_path / "running"
    shutil.copytree(lora_run, copy, ignore=shutil.ignore_patterns("exports"))
    run = RunDir(copy)
    run.write_status({**run.read_status(), "status": "failed", "pid": None})
    with pytest.raises(UserError, match="not finished"):
        export_run(copy, "merged", out=tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_a_failed_write_leaves_nothing_under_the_final_name(lora_run, tmp_path, monkeypatch):
    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf_writer, "write_gguf", no_space)
    (tmp_path / "out").mkdir()
    with pytest.raises(UserError, match="No space left on device"):
        export_run(lora_run, "gguf", out=tmp_path / "out" / "gguf")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("model_type", ["mistral", "qwen2"])
def test_gguf_of_other_llama_family_shapes_reads_back(model_type, tmp_path):
    """Mistral (written as llama, read back as mistral) and Qwen2 (q/k/v biases, no Q/K permutation)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = tmp_path / model_type
    tokenizer = build_tokenizer(folder)
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
    target = tmp_path / "out" / "m.gguf"
    target.parent.mkdir()
    gguf_writer.write_gguf(folder, target, "f16", "tiny", lambda message: None)
    restored = _load(target.parent, target.name)
    assert restored.config.model_type == {"mistral": "llama"}.get(model_type, model_type)
    ids = _ids(folder)
    got, expected = _logits(restored, ids), _logits(model, ids)
    # An untrained model has near-ties that f16 rounding may flip: the logits themselves must match.
    assert (got - expected).abs().mean().item() < 0.02 and _agreement(got, expected) >= 0.95


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


def test_the_publish_tab_exports_through_the_studio_and_shows_the_size(studio_home, tiny_model_dir):
    from finetune.studio import Studio
    from tests.run_fixtures import build_run
    from ui.app import build_app

    studio = Studio(studio_home / "runs")
    build_run(studio.manager.root / "run-a", tiny_model_dir)
    demo = build_app(studio)
    tab = demo.studio_ui.publish
    wired = [
        d for d in demo.config["dependencies"] if [list(t) for t in d["targets"]] == [[tab.export_btn._id, "click"]]
    ]
    assert wired and wired[0]["outputs"] == [tab.export_result._id]
    assert wired[0]["inputs"] == [tab.run._id, tab.export_format._id, tab.export_quant._id]
    message = tab.export("run-a", "gguf", "q8_0")
    assert re.fullmatch(r"✓ Wrote `exports/gguf-q8_0/run-a-q8_0\.gguf` \(\d+\.\d KB\) in run `run-a`.*", message)
    assert (studio.manager.root / "run-a" / "exports" / "gguf-q8_0" / "Modelfile").is_file()
    assert str(studio_home) not in tab.export("run-a", "gguf", "q4_k")  # one line naming the field, no path
    assert tab.export("run-a", "gguf", "q4_k").startswith("⚠ quant: expected one of f16, q8_0")
    assert tab.export("../elsewhere", "merged", "f16").startswith("⚠ run:")


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

    gguf_writer._add_one(Recorder(), "a", np.ones((4, 64), np.float32), "q8_0")
    gguf_writer._add_one(Recorder(), "b", np.ones((4, 48), np.float32), "q8_0")
    gguf_writer._add_one(Recorder(), "c", np.ones(64, np.float32), "q8_0")
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
