"""Data: every format loads, is detected, rendered with the chat template and masked by position."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from finetune import data
from finetune.errors import UserError
from tests.helpers import tiny_config, write_jsonl


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def trained_text(tokenizer, row):
    return tokenizer.decode([t for t, lab in zip(row["input_ids"], row["labels"], strict=True) if lab != -100])


def test_bundled_data_is_a_few_hundred_pirate_examples(tiny_model_dir, tokenizer):
    prepared = data.prepare(tiny_config(tiny_model_dir, dataset="bundled:pirate", eval_split="validation"), tokenizer)
    assert prepared.format.kind == "prompt_completion"
    assert 200 <= len(prepared.train) <= 400 and len(prepared.eval) >= 20
    assert len(data.heldout_prompts(tiny_config(tiny_model_dir, dataset="bundled:pirate"))) == 5


def test_prompt_completion_trains_only_on_the_answer_and_its_end_token(tiny_model_dir, tokenizer, tmp_path):
    f = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "Say hi", "completion": "Arr, hi!"}])
    row = data.prepare(tiny_config(tiny_model_dir, dataset=str(f)), tokenizer).train[0]
    assert trained_text(tokenizer, row).startswith("Arr, hi!<|im_end|>")
    prompt_part = tokenizer.decode([t for t, lab in zip(row["input_ids"], row["labels"], strict=True) if lab == -100])
    assert "Say hi" in prompt_part and "Arr" not in prompt_part


def test_messages_train_on_every_assistant_turn(tiny_model_dir, tokenizer, tmp_path):
    conv = [
        {"role": "user", "content": "a?"},
        {"role": "assistant", "content": "ONE"},
        {"role": "user", "content": "b?"},
        {"role": "assistant", "content": "TWO"},
    ]
    f = write_jsonl(tmp_path / "chat.jsonl", [{"messages": conv}])
    prepared = data.prepare(tiny_config(tiny_model_dir, dataset=str(f)), tokenizer)
    assert prepared.format.kind == "messages"
    text = trained_text(tokenizer, prepared.train[0])
    assert "ONE" in text and "TWO" in text and "a?" not in text and "b?" not in text


def test_sharegpt_roles_and_plain_text(tiny_model_dir, tokenizer, tmp_path):
    conv = [{"from": "human", "value": "hey"}, {"from": "gpt", "value": "ahoy"}]
    f = write_jsonl(tmp_path / "sg.jsonl", [{"conversations": conv}])
    assert "ahoy" in trained_text(
        tokenizer, data.prepare(tiny_config(tiny_model_dir, dataset=str(f)), tokenizer).train[0]
    )
    t = write_jsonl(tmp_path / "t.jsonl", [{"text": "all of this is trained"}])
    row = data.prepare(tiny_config(tiny_model_dir, dataset=str(t)), tokenizer).train[0]
    assert all(lab != -100 for lab in row["labels"])


def test_csv_parquet_and_explicit_columns(tiny_model_dir, tokenizer, tmp_path):
    import pandas as pd

    frame = pd.DataFrame({"q": ["one?", "two?"], "a": ["uno", "dos"]})
    frame.to_csv(tmp_path / "d.csv", index=False)
    frame.to_parquet(tmp_path / "d.parquet")
    for name in ("d.csv", "d.parquet"):
        cfg = tiny_config(tiny_model_dir, dataset=str(tmp_path / name), prompt_column="q", completion_column="a")
        assert len(data.prepare(cfg, tokenizer).train) == 2


def test_packing_keeps_one_example_per_row(tiny_model_dir, tokenizer):
    """Packing is a layout of each micro batch (tests/test_packing.py), not a concatenation of the data set."""
    config = tiny_config(tiny_model_dir, dataset="bundled:pirate", max_seq_length=64)
    packed, padded = (data.prepare(config.replace(packing=on), tokenizer).train for on in (True, False))
    assert packed["input_ids"] == padded["input_ids"] and len(packed) == 265


def test_mrpc_shaped_pairs_for_classification(tiny_model_dir, tokenizer, tmp_path):
    rows = [
        {"sentence1": "a cat", "sentence2": "a feline", "label": 1},
        {"sentence1": "x", "sentence2": "y", "label": 0},
    ]
    f = write_jsonl(tmp_path / "mrpc.jsonl", rows)
    prepared = data.prepare(tiny_config(tiny_model_dir, dataset=str(f), task="sequence_classification"), tokenizer)
    assert prepared.format.columns == {"text": "sentence1", "label": "label", "text_pair": "sentence2"}
    assert prepared.num_labels == 2 and prepared.train[0]["labels"] == 1


def test_preview_shows_what_is_masked(tiny_model_dir, tokenizer):
    shown = data.preview(tiny_config(tiny_model_dir), tokenizer, n=2)
    assert shown["rows"] == 32 and len(shown["examples"]) == 2
    first = shown["examples"][0]
    assert [trained for _, trained in first["segments"]] == [False, True]
    assert 0 < first["trained_tokens"] < first["tokens"]


BAD_DATA = [
    ("missing.jsonl", None, "dataset: file not found"),
    ("empty.jsonl", b"", "is empty"),
    ("binary.jsonl", b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "dataset: binary.jsonl is not text (is it a binary file?)"),
    ("broken.jsonl", b'{"prompt": "a", "completion": "b"}\n{"prompt": \n', "line 2 of broken.jsonl is not valid JSON"),
    ("columns.jsonl", b'{"foo": "a", "bar": "b"}\n', "cannot tell the format from columns foo, bar"),
    ("blank.jsonl", b'{"prompt": "", "completion": "b"}\n', "dataset: row 1 of blank.jsonl, column 'prompt' is empty"),
    ("data.txt", b"hello", "unsupported type"),
]


@pytest.mark.parametrize(("name", "content", "message"), BAD_DATA, ids=[b[0] for b in BAD_DATA])
def test_bad_datasets_get_a_clear_error(tiny_model_dir, tokenizer, tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(UserError) as info:
        data.prepare(tiny_config(tiny_model_dir, dataset=str(path)), tokenizer)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_wrong_column_name_and_too_short_sequences(tiny_model_dir, tokenizer, tmp_path):
    f = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "p " * 200, "completion": "c"}])
    with pytest.raises(UserError, match="completion_column: column 'answer' is not in the data"):
        data.prepare(tiny_config(tiny_model_dir, dataset=str(f), completion_column="answer"), tokenizer)
    with pytest.raises(UserError, match="max_seq_length: 64 cuts off every answer"):
        data.prepare(tiny_config(tiny_model_dir, dataset=str(f)), tokenizer)


def test_the_package_offers_its_public_names_from_the_modules_that_define_them():
    """`data.prepare`, `data.load_raw`, ... are the defining modules' own objects, and the names written out for readers
    (the package's TYPE_CHECKING imports) are exactly the ones it serves."""
    import ast
    import importlib
    from pathlib import Path

    import finetune.data as package

    tree = ast.parse(Path(package.__file__).read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If))
    written = {alias.name: node.module for node in block.body for alias in node.names}
    assert written == {name: f"finetune.data.{home}" for name, home in package._HOMES.items()}
    for name, module in written.items():
        assert getattr(package, name) is getattr(importlib.import_module(module), name)
    with pytest.raises(AttributeError):
        package.load_raws  # noqa: B018 (a misspelt name is an AttributeError, as in any module)


def test_every_kind_has_its_handler_and_every_objective_reads_registered_kinds():
    """A kind added to DataKind without its module's handler in the registry (or named by an objective without one)
    would fail the first run on such data; here it fails at once."""
    from finetune import objectives
    from finetune.data.kinds import DataKind
    from finetune.data.registry import HANDLERS

    assert set(HANDLERS) == set(DataKind)
    for record in objectives.OBJECTIVES.values():
        assert record.data_kinds and set(record.data_kinds) <= set(HANDLERS), record.name
