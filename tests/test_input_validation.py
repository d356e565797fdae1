"""Bad data files and model folders are refused before anything starts: one line naming the field, the row (as the
user counts in the file), its line and the column; no run directory is created. What can mean only one thing is
accepted and made uniform instead.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from finetune import data
from finetune.errors import UserError
from finetune.runs.manager import RunManager
from tests.helpers import tiny_config

PC = ("prompt", "completion")


def rows(*pairs: tuple[Any, Any], names: tuple[str, str] = PC) -> bytes:
    """JSON lines of prompt/completion rows."""
    return "".join(json.dumps(dict(zip(names, pair, strict=True))) + "\n" for pair in pairs).encode()


def chat(*conversations: Any) -> bytes:
    return "".join(json.dumps({"messages": c}) + "\n" for c in conversations).encode()


def labelled(*labels: Any) -> bytes:
    return "".join(json.dumps({"text": f"example {i}", "label": lab}) + "\n" for i, lab in enumerate(labels)).encode()


GOOD_TURNS = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ahoy"}]
CLASSIFY = {"task": "sequence_classification", "method": "full"}

# (file name, content, config overrides, [message parts]). The first part is always where the message starts.
BAD_DATA: list[tuple[str, bytes, dict[str, Any], list[str]]] = [
    (
        "empty_cell.csv",
        b"prompt,completion\nHi,Arr\nHello,\n",
        {},
        ["dataset: row 2 (line 3) of empty_cell.csv", "column 'completion'", "is empty"],
    ),
    (
        "empty_prompt.csv",
        b"prompt,completion\n,Arr\n",
        {},
        ["dataset: row 1 (line 2) of empty_prompt.csv", "column 'prompt'", "is empty"],
    ),
    (
        "quoted_newline.csv",
        b'prompt,completion\n"two\nlines",Arr\nHello,  \n',
        {},
        ["dataset: row 2 (line 4) of quoted_newline.csv", "column 'completion'", "is empty"],
    ),
    (
        "too_many_cells.csv",
        b"prompt,completion\nHi,Arr,extra\n",
        {},
        ["dataset: row 1 (line 2) of too_many_cells.csv", "3 cells but the header names 2 columns"],
    ),
    ("twice.csv", b"prompt,prompt,completion\na,b,c\n", {}, ["dataset: column 'prompt' appears twice"]),
    (
        "mixed.jsonl",
        rows(("a", "x"), ("b", "y"), ("c", 42), ("d", "z")),
        {},
        ["dataset: row 3 of mixed.jsonl", "column 'completion'", "42 is a number but the other rows hold text"],
    ),
    (
        "mixed_mostly_numbers.jsonl",
        rows(("a", 1), ("b", 2), ("c", "three")),
        {},
        ["dataset: row 3 of mixed_mostly_numbers.jsonl", "column 'completion'", "'three' is text"],
    ),
    (
        "prompt_list.jsonl",
        rows(("a", "x"), (["a", "b"], "y")),
        {},
        ["dataset: row 2 of prompt_list.jsonl", "column 'prompt'", "expected text, got a list"],
    ),
    (
        "prompt_object.jsonl",
        rows(({"q": 1}, "y")),
        {},
        ["dataset: row 1 of prompt_object.jsonl", "column 'prompt'", "expected text, got an object"],
    ),
    (
        "true.jsonl",
        rows(("a", True)),
        {},
        ["dataset: row 1 of true.jsonl", "column 'completion'", "expected text, got true/false"],
    ),
    (
        "empty_answer.jsonl",
        rows(("a", "x"), ("b", "   ")),
        {},
        ["dataset: row 2 of empty_answer.jsonl", "column 'completion'", "is empty"],
    ),
    (
        "missing_answer.jsonl",
        b'{"prompt": "a", "completion": "x"}\n{"prompt": "b"}\n',
        {},
        ["dataset: row 2 of missing_answer.jsonl", "column 'completion'", "is empty"],
    ),
    (
        "blank_lines.jsonl",
        b'{"prompt": "a", "completion": "x"}\n\n\n{"prompt": "b", "completion": null}\n',
        {},
        ["dataset: row 2 (line 4) of blank_lines.jsonl", "column 'completion'", "is empty"],
    ),
    (
        "messages_text.jsonl",
        chat(GOOD_TURNS, "hello"),
        {},
        [
            "dataset: row 2 of messages_text.jsonl",
            "column 'messages'",
            "expected a list of {role, content} messages, got text",
        ],
    ),
    (
        "messages_object.jsonl",
        chat({"role": "user", "content": "hi"}),
        {},
        ["dataset: row 1 of messages_object.jsonl", "column 'messages'", "expected a list", "got an object"],
    ),
    (
        "messages_strings.jsonl",
        chat(["hi", "ahoy"]),
        {},
        ["dataset: row 1 of messages_strings.jsonl", "column 'messages'", "message 1 is text, not an object"],
    ),
    (
        "messages_no_role.jsonl",
        chat(GOOD_TURNS, [{"content": "hi"}, {"role": "assistant", "content": "ahoy"}]),
        {},
        ["dataset: row 2 of messages_no_role.jsonl", "column 'messages'", "message 1 has no role"],
    ),
    (
        "messages_no_content.jsonl",
        chat([{"role": "user", "content": "hi"}, {"role": "assistant"}]),
        {},
        ["dataset: row 1 of messages_no_content.jsonl", "column 'messages'", "message 2 has no content"],
    ),
    (
        "messages_no_answer.jsonl",
        chat(GOOD_TURNS, [{"role": "user", "content": "hi"}]),
        {},
        ["dataset: row 2 of messages_no_answer.jsonl", "column 'messages'", "no assistant message"],
    ),
    (
        "messages_empty_answer.jsonl",
        chat([{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]),
        {},
        ["dataset: row 1 of messages_empty_answer.jsonl", "column 'messages'", "message 2 (assistant) is empty"],
    ),
    (
        "messages_empty_list.jsonl",
        chat([]),
        {},
        ["dataset: row 1 of messages_empty_list.jsonl", "column 'messages'", "got an empty list"],
    ),
    (
        "one_class.jsonl",
        labelled("pos", "pos", "pos"),
        CLASSIFY,
        ["dataset: every row of one_class.jsonl has the label 'pos'", "column 'label'", "at least two classes"],
    ),
    (
        "negative_label.jsonl",
        labelled(0, 1, -1),
        CLASSIFY,
        ["dataset: row 3 of negative_label.jsonl", "column 'label'", "-1 is not a class"],
    ),
    (
        "fraction_label.jsonl",
        labelled(0, 0.5),
        CLASSIFY,
        ["dataset: row 2 of fraction_label.jsonl", "column 'label'", "0.5 is not a class"],
    ),
    (
        "mixed_labels.jsonl",
        labelled(0, 1, "pos"),
        CLASSIFY,
        ["dataset: row 3 of mixed_labels.jsonl", "column 'label'", "'pos' is a class name", "class numbers"],
    ),
    (
        "no_label.csv",
        b"text,label\na,0\nb,\n",
        CLASSIFY,
        ["dataset: row 2 (line 3) of no_label.csv", "'label' is empty"],
    ),
    (
        "list_label.jsonl",
        labelled(0, [1]),
        CLASSIFY,
        ["dataset: row 2 of list_label.jsonl", "column 'label'", "got a list"],
    ),
    ("three_classes.jsonl", labelled(0, 1, 2), {**CLASSIFY, "num_labels": 2}, ["num_labels: the data has 3 classes"]),
    ("png.jsonl", b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", {}, ["dataset: png.jsonl is not text (is it a binary file?)"]),
    ("latin1.jsonl", b'{"text": "caf\xe9"}\n', {}, ["dataset: latin1.jsonl is not UTF-8 text (is it a binary file?)"]),
    ("binary.csv", b"a,b\n\x00\x01,\x02\n", {}, ["dataset: binary.csv is not text (is it a binary file?)"]),
    ("text.parquet", b"prompt,completion\na,b\n", {}, ["dataset: text.parquet is not a Parquet file"]),
    (
        "list_row.jsonl",
        b'{"text": "a"}\n[1, 2]\n',
        {},
        ["dataset: line 2 of list_row.jsonl is a list, not a JSON object"],
    ),
    ("array.json", b'[{"text": "a"}, 5]', {}, ["dataset: row 2 of array.json is a number, not a JSON object"]),
    ("no_rows.csv", b"prompt,completion\n", {}, ["dataset: no_rows.csv has no rows"]),
]


def write(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


def assert_refused_before_a_run(config, root: Path, parts: list[str]) -> str:
    """Start refuses with one line holding every part (the first one leading); no run folder appears."""
    with pytest.raises(UserError) as info:
        RunManager(root).start(config, background=False)
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message, message
    assert message.startswith(parts[0]), message
    for part in parts[1:]:
        assert part in message, (part, message)
    assert info.value.field == parts[0].split(":")[0], (info.value.field, message)
    runs = [p for p in root.iterdir() if p.is_dir()] if root.exists() else []
    assert runs == [], runs
    return message


@pytest.mark.parametrize(("name", "content", "overrides", "parts"), BAD_DATA, ids=[case[0] for case in BAD_DATA])
def test_bad_data_is_refused_before_a_run_directory_exists(tiny_model_dir, tmp_path, name, content, overrides, parts):
    path = write(tmp_path / name, content)
    config = tiny_config(tiny_model_dir, dataset=str(path), **overrides)
    assert_refused_before_a_run(config, tmp_path / "runs", parts)


def test_parquet_with_an_empty_cell(tiny_model_dir, tmp_path):
    import pandas as pd

    pd.DataFrame({"prompt": ["a", "b"], "completion": ["x", None]}).to_parquet(tmp_path / "d.parquet")
    config = tiny_config(tiny_model_dir, dataset=str(tmp_path / "d.parquet"))
    assert_refused_before_a_run(config, tmp_path / "runs", ["dataset: row 2 of d.parquet", "'completion' is empty"])


EVAL_CASES = [
    ("missing.jsonl", None, ["eval_split: file not found"]),
    ("other_columns.jsonl", rows(("a", "x"), names=("question", "reply")), ["eval_split: column 'prompt' is not in"]),
    ("empty_cell.jsonl", rows(("a", "x"), ("b", "")), ["eval_split: row 2 of empty_cell.jsonl", "'completion'"]),
    ("mixed.jsonl", rows(("a", "x"), ("b", "y"), (3, "z")), ["eval_split: row 3 of mixed.jsonl", "3 is a number"]),
]


@pytest.mark.parametrize(("name", "content", "parts"), EVAL_CASES, ids=[case[0] for case in EVAL_CASES])
def test_a_bad_eval_file_is_refused_naming_eval_split(tiny_model_dir, tmp_path, name, content, parts):
    eval_file = tmp_path / name
    if content is not None:
        write(eval_file, content)
    config = tiny_config(tiny_model_dir, eval_split=str(eval_file))
    assert_refused_before_a_run(config, tmp_path / "runs", parts)


def test_eval_labels_must_be_the_same_kind_as_training_labels(tiny_model_dir, tmp_path):
    train = write(tmp_path / "train.jsonl", labelled(0, 1, 1))
    evaluation = write(tmp_path / "eval.jsonl", labelled("pos"))
    config = tiny_config(tiny_model_dir, dataset=str(train), eval_split=str(evaluation), **CLASSIFY)
    parts = ["eval_split: row 1 of eval.jsonl", "column 'label'", "the training rows hold class numbers"]
    assert_refused_before_a_run(config, tmp_path / "runs", parts)


# ----------------------------------------------------------------------------- models
def model_copy(tiny_model_dir: Path, tmp_path: Path, config_text: str | None) -> Path:
    target = tmp_path / "model"
    shutil.copytree(tiny_model_dir, target)
    if config_text is None:
        (target / "config.json").unlink()
    else:
        (target / "config.json").write_text(config_text, encoding="utf-8")
    return target


def tiny_llama_config(tiny_model_dir: Path, **changes: Any) -> str:
    values = json.loads((tiny_model_dir / "config.json").read_text())
    values.update(changes)
    return json.dumps({k: v for k, v in values.items() if v is not None})


BAD_MODELS = [
    ("no_config", lambda d: None, "has no config.json"),
    ("no_model_type", lambda d: tiny_llama_config(d, model_type=None), "config.json has no model_type"),
    ("empty_model_type", lambda d: tiny_llama_config(d, model_type=""), "config.json has no model_type"),
    ("broken_json", lambda d: '{"model_type": "llama",', "config.json is not valid JSON"),
    ("list_json", lambda d: "[1, 2]", "config.json is not a JSON object"),
    ("unknown_type", lambda d: tiny_llama_config(d, model_type="no-such-arch"), "model_type 'no-such-arch'"),
]


@pytest.mark.parametrize(("case", "make", "part"), BAD_MODELS, ids=[case[0] for case in BAD_MODELS])
def test_a_bad_model_folder_is_refused_naming_model(tiny_model_dir, tmp_path, case, make, part):
    model = model_copy(tiny_model_dir, tmp_path, make(tiny_model_dir))
    config = tiny_config(model)
    message = assert_refused_before_a_run(config, tmp_path / "runs", ["model: ", part])
    assert str(model) in message


# ----------------------------------------------------------------------------- what is accepted
def test_what_can_mean_only_one_thing_is_accepted(tiny_model_dir, tmp_path):
    # A column of numbers used as text is text; an unused column may hold anything; a CSV cell may be empty when
    # its column is not used; JSON text in a CSV messages column, ShareGPT turns and text parts are messages.
    numbers = write(tmp_path / "numbers.jsonl", rows(("1+1?", 2), ("2+2?", 4), ("half of 5?", 2.5)))
    train, _ = data.load_raw(tiny_config(tiny_model_dir, dataset=str(numbers)))
    assert train["completion"] == ["2", "4", "2.5"]

    extra = write(tmp_path / "extra.jsonl", b'{"text": "a", "id": 1}\n{"text": "b", "id": "x"}\n{"text": "c"}\n')
    train, _ = data.load_raw(tiny_config(tiny_model_dir, dataset=str(extra)))
    assert train["text"] == ["a", "b", "c"] and train["id"] == ["1", "x", None]

    csv = write(tmp_path / "d.csv", b"\xef\xbb\xbfprompt,completion,notes\nHi,Arr,\n\nHello,Ahoy,seen\n")
    train, _ = data.load_raw(tiny_config(tiny_model_dir, dataset=str(csv)))
    assert train["prompt"] == ["Hi", "Hello"] and train["notes"] == [None, "seen"]

    turns = [
        json.dumps(GOOD_TURNS),
        json.dumps([{"from": "human", "value": "hi"}, {"from": "gpt", "value": "ahoy"}]),
        json.dumps(
            [{"role": "user", "content": [{"type": "text", "text": "hi"}]}, {"role": "assistant", "content": 7}]
        ),
    ]
    chat_csv = tmp_path / "chat.csv"
    import csv as csv_module

    with open(chat_csv, "w", newline="", encoding="utf-8") as fh:
        writer = csv_module.writer(fh)
        writer.writerow(["messages"])
        writer.writerows([[t] for t in turns])
    train, _ = data.load_raw(tiny_config(tiny_model_dir, dataset=str(chat_csv)))
    assert [m["role"] for m in train[1]["messages"]] == ["user", "assistant"]
    assert train[2]["messages"] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "7"}]


def test_numbered_labels_written_as_text_are_classes(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    csv = write(tmp_path / "d.csv", b"text,label\na,0\nb,2\nc,10\nd,1.0\n")
    prepared = data.prepare(
        tiny_config(tiny_model_dir, dataset=str(csv), **CLASSIFY), AutoTokenizer.from_pretrained(tiny_model_dir)
    )
    assert prepared.num_labels == 11 and prepared.train["labels"] == [0, 2, 10, 1]
    names = write(tmp_path / "names.jsonl", labelled("pos", "neg", " pos"))
    train, _ = data.load_raw(tiny_config(tiny_model_dir, dataset=str(names), **CLASSIFY))
    assert train["label"] == ["pos", "neg", "pos"]
    single = write(tmp_path / "single.jsonl", labelled(1, 1))
    data.load_raw(tiny_config(tiny_model_dir, dataset=str(single), **CLASSIFY, num_labels=2))  # the user said 2


def test_a_json_array_file_with_a_number_column_trains(tiny_model_dir, tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps([{"text": 1000 + i} for i in range(4)]), encoding="utf-8")
    state = RunManager(tmp_path / "runs").start(
        tiny_config(tiny_model_dir, dataset=str(path), max_steps=1, save_steps=1), background=False
    )
    assert state.status == "completed", (state.status, state.error)


def test_a_bundled_split_that_does_not_exist(tiny_model_dir, tmp_path):
    config = tiny_config(tiny_model_dir, dataset="bundled:pirate", dataset_split="tarin")
    parts = ["dataset_split: 'tarin' is not a split of bundled:pirate", "splits: train, validation"]
    assert_refused_before_a_run(config, tmp_path / "runs", parts)


# ----------------------------------------------------------------------------- what the weights would refuse
def plan(config):
    """The plan preflight checks (its model class and LoRA targets)."""
    from finetune.plan import plan_for

    return plan_for(config, device="cpu")


def config_only_model(tmp_path: Path, model_type: str) -> Path:
    """A folder holding only the config.json of a small model of `model_type` (enough for check_model)."""
    from transformers import AutoConfig

    folder = tmp_path / model_type
    folder.mkdir()
    AutoConfig.for_model(model_type).save_pretrained(folder)
    return folder


def test_lora_targets_that_name_no_layer_are_refused_from_the_config_alone(tiny_model_dir):
    from finetune.model import loading

    with pytest.raises(UserError) as info:
        loading.check_model(plan(tiny_config(tiny_model_dir, lora_target_modules="qproj, v_prj")))
    assert str(info.value).startswith("lora_target_modules: 'qproj, v_prj' matches no layer of this model")
    assert info.value.field == "lora_target_modules"
    with pytest.raises(UserError, match="lora_target_modules: 'proj' matches no layer"):
        loading.check_model(plan(tiny_config(tiny_model_dir, lora_target_modules="proj")))  # PEFT: whole names
    loading.check_model(plan(tiny_config(tiny_model_dir, lora_target_modules="q_proj,nothing")))  # one matches
    loading.check_model(plan(tiny_config(tiny_model_dir, lora_target_modules="self_attn.o_proj")))
    loading.check_model(plan(tiny_config(tiny_model_dir, method="full", lora_target_modules="nothing")))


@pytest.mark.parametrize(
    ("model_type", "task", "part"),
    [
        ("codegen", "sequence_classification", "task: sequence_classification needs a classification head"),
        ("deberta-v2", "causal_lm", "task: causal_lm needs a model that generates text"),
    ],
)
def test_a_task_the_model_has_no_head_for_is_refused(tmp_path, model_type, task, part):
    from finetune.config import TrainConfig
    from finetune.model import loading

    config = TrainConfig(model=str(config_only_model(tmp_path, model_type)), dataset="d.jsonl", task=task)
    with pytest.raises(UserError) as info:
        loading.check_model(plan(config))
    assert str(info.value).startswith(part) and repr(model_type) in str(info.value) and info.value.field == "task"


def test_hub_data_gets_the_same_checks(tiny_model_dir, monkeypatch):
    from datasets import ClassLabel, Dataset, Features, Value

    from finetune.data import loading

    bad = Dataset.from_dict({"prompt": ["a", "b"], "completion": ["x", ""]})
    monkeypatch.setattr(loading, "_load_hub", lambda config: (bad, None))
    with pytest.raises(UserError) as info:
        data.load_raw(tiny_config(tiny_model_dir, dataset="owner/pirates"))
    assert str(info.value).startswith("dataset: row 2 of owner/pirates [train], column 'completion' is empty")

    features = Features({"sentence": Value("string"), "label": ClassLabel(names=["neg", "pos", "neutral"])})
    typed = Dataset.from_dict({"sentence": ["good", "bad"], "label": [1, 0]}, features=features)
    unlabelled = Dataset.from_dict({"sentence": ["meh"], "label": [-1]})
    monkeypatch.setattr(loading, "_load_hub", lambda config: (typed, unlabelled))
    with pytest.raises(UserError) as info:
        data.load_raw(tiny_config(tiny_model_dir, dataset="owner/sst", eval_split="validation", **CLASSIFY))
    assert str(info.value).startswith("eval_split: row 1 of owner/sst [validation], column 'label': -1 is not a class")

    from transformers import AutoTokenizer

    monkeypatch.setattr(loading, "_load_hub", lambda config: (typed, None))
    prepared = data.prepare(
        tiny_config(tiny_model_dir, dataset="owner/sst", **CLASSIFY), AutoTokenizer.from_pretrained(tiny_model_dir)
    )
    assert prepared.num_labels == 3 and prepared.train["labels"] == [1, 0]  # the ClassLabel's own class count


# ----------------------------------------------------------------------------- the facade the app's API calls
@pytest.mark.parametrize(
    ("values", "field", "start"),
    [
        ({"max_steps": "abc"}, "max_steps", "max_steps: 'abc' is not a whole number"),
        ({"learning_rate": "fast"}, "learning_rate", "learning_rate: 'fast' is not a number"),
        ({"lora_r": "8.5"}, "lora_r", "lora_r: '8.5' is not a whole number"),
        ({"lora_dropout": "nan"}, "lora_dropout", "lora_dropout: 'nan' is not a finite number"),
        ({"max_steps": [1]}, "max_steps", "max_steps: [1] is not a whole number"),
    ],
)
def test_text_in_a_number_field_through_the_api_is_one_line_naming_the_field(values, field, start):
    from finetune.errors import ConfigError
    from finetune.studio import Studio

    config, problems = Studio().check(values)
    assert config is None and list(problems) == [field] and problems[field].startswith(start), problems
    with pytest.raises(ConfigError) as info:
        Studio().config(values)
    assert info.value.field == field and "\n" not in str(info.value)


def test_the_apis_other_numbers_of_the_wrong_kind_are_refused_by_name(tiny_model_dir, studio_home):
    """What an API client may send besides the settings: a process count, a preview size, an export setting."""
    from finetune.studio import Studio
    from tests.run_fixtures import build_run

    studio = Studio()
    build_run(studio.manager.root / "run-a", tiny_model_dir, status="stopped")
    values = {"model": str(tiny_model_dir)}
    calls = {
        "processes": [lambda: studio.start(values, processes="two"), lambda: studio.resume("run-a", processes="2")],
        "n": [lambda: studio.preview_data(values, n="three")],
        "quant": [lambda: studio.export("run-a", "gguf", quant=5)],
    }
    for field, attempts in calls.items():
        for attempt in attempts:
            with pytest.raises(UserError) as info:
                attempt()
            assert info.value.field == field and str(info.value).startswith(f"{field}: "), str(info.value)
    assert studio.state() is None and [r.status for r in studio.runs()] == ["stopped"]  # nothing started
