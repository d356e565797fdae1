"""Training data: load (bundled, local file, Hub id), detect the format, render with the chat template, tokenise, mask.

Formats: `messages` (chat), `prompt`/`completion` (loss on the completion only), plain `text`, and text(+pair)/label
for sequence classification. Preference objectives (dpo, orpo, kto) read `prompt`/`chosen`/`rejected` pairs, or for
kto `prompt`/`completion`/true-false `label`, each side as text or as a conversation (TRL's standard and
conversational shapes); TRL tokenises them, this module checks, normalises and previews them.

Labels are masked by position (prompt vs answer), never by token id: SmolLM2's pad token is also its EOS, and masking
by id would teach the model never to stop.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune import objectives
from finetune.config import BUNDLED_DATASET, TrainConfig
from finetune.errors import UserError
from finetune.paths import BUNDLED

BUNDLED_DIR = BUNDLED
FILE_TYPES = (".jsonl", ".json", ".csv", ".parquet")
IGNORE = -100

MESSAGES_NAMES = ("messages", "conversations", "conversation", "chat")
PAIR_NAMES = (
    ("prompt", "completion"),
    ("prompt", "response"),
    ("instruction", "output"),
    ("instruction", "response"),
    ("question", "answer"),
    ("input", "output"),
)
TEXT_NAMES = ("text", "sentence", "sentence1", "content", "document")
TEXT_PAIR_NAMES = ("sentence2", "text_pair", "text2", "hypothesis")
LABEL_NAMES = ("label", "labels", "class", "target")
CHOSEN_NAMES = ("chosen", "preferred", "accepted", "chosen_response")
REJECTED_NAMES = ("rejected", "dispreferred", "rejected_response")
PREFERENCE_PROMPT_NAMES = ("prompt", "question", "instruction", "input")
KTO_COMPLETION_NAMES = ("completion", "response", "answer", "output")
PREFERENCE_KINDS = ("preference", "unpaired")  # prompt/chosen/rejected pairs; prompt/completion/label (kto)
PROMPTS_KIND = "prompts"  # prompts alone (learning from rewards): every other column goes to the reward functions
TRL_KINDS = (*PREFERENCE_KINDS, PROMPTS_KIND)  # rows TRL's trainers read in their own shape
PREVIEW_COLUMNS = 4  # a prompt's other columns shown in the preview
ROLE_ALIASES = {"human": "user", "gpt": "assistant", "bot": "assistant", "model": "assistant"}


@dataclass
class DataFormat:
    """How rows are read: the kind and the columns it uses."""

    kind: str  # messages | prompt_completion | text | classification | preference | unpaired
    columns: dict[str, str]

    def describe(self) -> str:
        cols = ", ".join(f"{k}={v}" for k, v in self.columns.items())
        return f"{self.kind} ({cols})"


@dataclass
class PreparedData:
    """Tokenised train / eval sets and what was learnt about the data."""

    train: Any
    eval: Any | None
    format: DataFormat
    label_names: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def num_labels(self) -> int:
        return len(self.label_names)


# ----------------------------------------------------------------------------- loading
def load_raw(config: TrainConfig) -> tuple[Any, Any | None]:
    """The raw train split and (if present) the eval split as `datasets.Dataset`s, checked against the config.

    Every row of the columns the format uses is checked here, before any model loads: an empty cell, a value of the
    wrong kind, `messages` that are not a list of {role, content} objects, a label that is not a class. Values that
    can mean only one thing are made uniform (numbers in a text column become text, "3" in a label column the
    class 3); anything else is refused with one line naming the field, the row, the line and the column.
    """
    name = config.dataset
    if name.startswith("bundled:"):
        folder = BUNDLED_DIR / name.split(":", 1)[1]
        if not folder.is_dir():
            available = ", ".join(f"bundled:{p.name}" for p in BUNDLED_DIR.iterdir() if p.is_dir())
            raise UserError(f"dataset: {name!r} is not bundled; available: {available}", field="dataset")
        splits = sorted(p.stem for p in folder.glob("*.jsonl"))
        if config.dataset_split not in splits:
            raise UserError(
                f"dataset_split: {config.dataset_split!r} is not a split of {name}; splits: {', '.join(splits)}",
                field="dataset_split",
            )
        train = _read_table(folder / f"{config.dataset_split}.jsonl", "dataset_split", "dataset")
        eval_file = folder / f"{config.eval_split}.jsonl"
        evaluation = _read_table(eval_file, "eval_split") if config.eval_split and eval_file.is_file() else None
        return _checked_tables(train, evaluation, config)
    path = Path(name).expanduser()
    if path.suffix.lower() in FILE_TYPES or path.exists() or name.startswith((".", "/", "~")):
        train = _read_table(path, "dataset")
        evaluation = None
        if config.eval_split:
            eval_path = Path(config.eval_split).expanduser()
            if eval_path.is_file() or _names_a_file(config.eval_split):
                evaluation = _read_table(eval_path, "eval_split")  # a file that is not there is refused
        return _checked_tables(train, evaluation, config)
    train_ds, eval_ds = _load_hub(config)
    fmt = detect_format(list(train_ds.column_names), config)
    tables = [_Table(f"{name} [{config.dataset_split}]", "dataset", {c: train_ds[c] for c in fmt.columns.values()})]
    if eval_ds is not None:
        _require_columns(list(eval_ds.column_names), fmt, f"{name} [{config.eval_split}]", "eval_split")
        columns = {c: eval_ds[c] for c in fmt.columns.values()}
        tables.append(_Table(f"{name} [{config.eval_split}]", "eval_split", columns))
    _check_columns(tables, fmt, config)  # Hub data is typed: checked, and rendered through the same functions
    return train_ds, eval_ds


def _load_hub(config: TrainConfig) -> tuple[Any, Any | None]:
    import datasets

    def split(name: str, key: str) -> Any:
        try:
            return datasets.load_dataset(config.dataset, split=name)
        except ValueError as exc:
            if "split" in str(exc).lower() or "Unknown" in str(exc):
                raise UserError(f"{key}: {name!r} is not a split of {config.dataset}", field=key) from None
            raise UserError(f"dataset: cannot load {config.dataset!r}: {exc}", field="dataset") from None
        except Exception as exc:  # network, missing repo, offline mode: all one message for the user
            reason = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
            raise UserError(
                f"dataset: cannot load {config.dataset!r} from the Hub ({reason}); "
                f"use a local .jsonl/.csv/.parquet file or {BUNDLED_DATASET}",
                field="dataset",
            ) from None

    train = split(config.dataset_split, "dataset_split")
    evaluation = None
    if config.eval_split:
        try:
            evaluation = split(config.eval_split, "eval_split")
        except UserError:
            evaluation = None  # an absent eval split is not an error: training goes on without evaluation
    return train, evaluation


def _names_a_file(value: str) -> bool:
    """Whether an eval_split value is meant as a file path rather than a split name."""
    return Path(value).suffix.lower() in FILE_TYPES or value.startswith((".", "/", "~")) or "/" in value


@dataclass
class _Table:
    """Rows of one file (or split), column by column, and where each row sits in its file."""

    name: str  # for messages: the file name, or "owner/name [split]"
    key: str  # the field that names it: dataset | eval_split
    columns: dict[str, list[Any]]
    lines: list[int] | None = None  # the file line each row starts on (JSON lines, CSV)

    def error(self, index: int, column: str, problem: str) -> UserError:
        """One line naming the field, the row (1-based), its line in the file and the column."""
        line = self.lines[index] if self.lines else None
        where = f"row {index + 1}" + (f" (line {line})" if line is not None and line != index + 1 else "")
        return UserError(f"{self.key}: {where} of {self.name}, column {column!r}{problem}", field=self.key)


class _Bad(ValueError):
    """A value that cannot be used; the message says why (the caller adds the row and column)."""


def _read_table(path: Path, key: str, row_key: str | None = None) -> _Table:
    """A local data file, with one clear error for every way the file itself can be wrong."""
    suffix = path.suffix.lower()
    if not path.is_file():
        raise UserError(f"{key}: file not found: {path}", field=key)
    if suffix not in FILE_TYPES:
        raise UserError(f"{key}: {path.name} has an unsupported type; use one of {', '.join(FILE_TYPES)}", field=key)
    if path.stat().st_size == 0:
        raise UserError(f"{key}: {path.name} is empty; it needs at least one example", field=key)
    row_key = row_key or key
    if suffix == ".parquet":
        rows, lines = _read_parquet(path, key), None
    else:
        raw = path.read_bytes()
        if b"\x00" in raw[:65536]:
            raise UserError(f"{key}: {path.name} is not text (is it a binary file?)", field=key)
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise UserError(f"{key}: {path.name} is not UTF-8 text (is it a binary file?)", field=key) from None
        rows, lines = _read_csv(text, path.name, key) if suffix == ".csv" else _read_json(text, path, key)
    if not rows:
        raise UserError(f"{key}: {path.name} has no rows; it needs at least one example", field=key)
    columns: dict[str, list[Any]] = {}
    for row in rows:
        for column in row:
            columns.setdefault(column, [])
    for column, values in columns.items():
        values.extend(row.get(column) for row in rows)
    return _Table(path.name, row_key, columns, lines)


def _read_parquet(path: Path, key: str) -> list[dict[str, Any]]:
    with open(path, "rb") as fh:
        head = fh.read(4)
        fh.seek(-4, 2)
        tail = fh.read(4)
    if head != b"PAR1" or tail != b"PAR1":
        raise UserError(f"{key}: {path.name} is not a Parquet file", field=key)
    try:
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises many types; the message is what matters
        raise UserError(f"{key}: cannot read {path.name}: {str(exc).splitlines()[0][:160]}", field=key) from None


def _read_json(text: str, path: Path, key: str) -> tuple[list[dict[str, Any]], list[int] | None]:
    """Rows of a JSON array file or a JSON-lines file, and the line each row starts on."""
    stripped = text.strip()
    if stripped.startswith("[") or path.suffix.lower() == ".json":
        try:
            whole = json.loads(stripped)
        except ValueError as exc:
            if stripped.startswith("["):
                raise UserError(f"{key}: {path.name} is not valid JSON: {exc}", field=key) from None
        else:
            rows = whole if isinstance(whole, list) else [whole]
            for index, row in enumerate(rows):
                if not isinstance(row, dict):
                    raise UserError(
                        f"{key}: row {index + 1} of {path.name} is {_kind_text(row)}, not a JSON object with named "
                        "fields; use one object per example",
                        field=key,
                    )
            return rows, None
    rows, lines = [], []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise UserError(f"{key}: line {number} of {path.name} is not valid JSON", field=key) from None
        if not isinstance(row, dict):
            raise UserError(
                f"{key}: line {number} of {path.name} is {_kind_text(row)}, not a JSON object with named fields; "
                "use one object per example",
                field=key,
            )
        rows.append(row)
        lines.append(number)
    return rows, lines


def _read_csv(text: str, name: str, key: str) -> tuple[list[dict[str, Any]], list[int]]:
    """Rows of a CSV file (every cell is text; an empty cell is None) and the line each row starts on."""
    import csv
    import io

    reader = csv.reader(io.StringIO(text, newline=""))
    header: list[str] | None = None
    rows, lines = [], []
    start = 1
    try:
        for record in reader:
            line, start = start, reader.line_num + 1
            if not record or (len(record) == 1 and not record[0].strip()):
                continue  # a blank line
            if header is None:
                header = [c.strip() or f"Unnamed: {i}" for i, c in enumerate(record)]
                twice = sorted({c for c in header if header.count(c) > 1})
                if twice:
                    raise UserError(f"{key}: column {twice[0]!r} appears twice in the header of {name}", field=key)
                continue
            if len(record) > len(header):
                where = f"row {len(rows) + 1} (line {line})"
                raise UserError(
                    f"{key}: {where} of {name} has {len(record)} cells but the header names {len(header)} columns; "
                    "quote cells that contain commas",
                    field=key,
                )
            rows.append({c: (v if v.strip() else None) for c, v in zip(header, record, strict=False)})
            lines.append(line)
    except csv.Error as exc:
        raise UserError(f"{key}: cannot read {name} at line {reader.line_num}: {exc}", field=key) from None
    return rows, lines


def _kind_text(value: Any) -> str:
    """How a value reads in a message: 'a list', 'a number', 'text', …"""
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def _require_columns(columns: list[str], fmt: DataFormat, name: str, key: str) -> None:
    missing = [c for c in fmt.columns.values() if c not in columns]
    if missing:
        raise UserError(
            f"{key}: column {missing[0]!r} is not in {name} (the training data has it); columns: {', '.join(columns)}",
            field=key,
        )


def _checked_tables(train: _Table, evaluation: _Table | None, config: TrainConfig) -> tuple[Any, Any | None]:
    """Detect the format, check and normalise the used columns, and build the Datasets."""
    fmt = detect_format(list(train.columns), config)
    tables = [train]
    if evaluation is not None:
        _require_columns(list(evaluation.columns), fmt, evaluation.name, evaluation.key)
        tables.append(evaluation)
    for table, columns in zip(tables, _check_columns(tables, fmt, config), strict=True):
        table.columns.update(columns)
    datasets = [_dataset(table, set(fmt.columns.values())) for table in tables]
    return datasets[0], (datasets[1] if evaluation is not None else None)


def _dataset(table: _Table, used: set[str]) -> Any:
    """A `datasets.Dataset` of the table; unused columns that Arrow cannot hold as they are become JSON text."""
    from datasets import Dataset

    columns = {}
    for column, values in table.columns.items():
        if column not in used and not _arrow_uniform(values):
            values = [v if v is None or isinstance(v, str) else json.dumps(v, default=str) for v in values]
        columns[column] = values
    try:
        return Dataset.from_dict(columns)
    except Exception as exc:  # pyarrow's many errors: one line for the user
        reason = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise UserError(f"{table.key}: cannot read {table.name}: {reason}", field=table.key) from None


def _arrow_uniform(values: list[Any]) -> bool:
    kinds = {_kind_text(v) for v in values if v is not None}
    return len(kinds) <= 1 and kinds <= {"text", "a number", "true/false"}


# ----------------------------------------------------------------------------- checking values
def _check_columns(tables: list[_Table], fmt: DataFormat, config: TrainConfig) -> list[dict[str, list[Any]]]:
    """Every row of every used column checked; returns the normalised columns of each table."""
    if fmt.kind in TRL_KINDS:
        return [_check_preference_table(table, fmt) for table in tables]
    out: list[dict[str, list[Any]]] = [{} for _ in tables]
    for role, column in fmt.columns.items():
        if role == "label":
            continue
        for table, normalised in zip(tables, out, strict=True):
            values = table.columns[column]
            normalised[column] = (
                _check_messages(table, column, values) if role == "messages" else _check_text(table, column, values)
            )
    if "label" in fmt.columns:
        column = fmt.columns["label"]
        labels = _check_labels(tables, column, config)
        for normalised, values in zip(out, labels, strict=True):
            normalised[column] = values
    return out


def text_value(value: Any) -> str:
    """A text cell as a string: text as it is, a number as its usual notation; anything else is refused."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not _is_nan(value):
        return str(value)
    raise _Bad(f"expected text, got {_kind_text(value)}")


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and value != value


def _is_empty(value: Any) -> bool:
    return value is None or _is_nan(value) or (isinstance(value, str) and not value.strip())


def _check_text(table: _Table, column: str, values: list[Any]) -> list[str]:
    for index, value in enumerate(values):
        if _is_empty(value):
            raise table.error(index, column, " is empty; fill it in or remove the row")
        try:
            text_value(value)
        except _Bad as exc:
            raise table.error(index, column, f": {exc}") from None
    _refuse_numbers_among_text(table, column, values)
    return [text_value(v) for v in values]


def _refuse_numbers_among_text(table: _Table, column: str, values: list[Any]) -> None:
    """A column of numbers is read as text unambiguously; one that mixes numbers and text (or conversations) is a
    mistake somewhere: the row in the minority is refused."""
    numbers = [i for i, v in enumerate(values) if isinstance(v, (int, float)) and not isinstance(v, bool)]
    texts = [i for i, v in enumerate(values) if not isinstance(v, (int, float)) or isinstance(v, bool)]
    if not (texts and numbers):
        return
    odd = numbers if len(numbers) <= len(texts) else texts
    value = values[odd[0]]
    problem = (
        f': {value!r} is a number but the other rows hold text; write it as text ("{value}")'
        if odd is numbers
        else f": {value!r} is text but the other rows hold numbers"
    )
    raise table.error(odd[0], column, problem)


def message_list(value: Any) -> list[dict[str, str]]:
    """A `messages` cell as [{role, content}] (ShareGPT's from/value and JSON text accepted); refuses the rest."""
    out = _parse_messages(value)
    answers = [i for i, m in enumerate(out, 1) if m["role"] == "assistant"]
    if not answers:
        raise _Bad("no assistant message to learn from")
    for number in answers:
        if not out[number - 1]["content"].strip():
            raise _Bad(f"message {number} (assistant) is empty")
    return out


def _parse_messages(value: Any) -> list[dict[str, str]]:
    """A non-empty list of {role, content} messages (from/value and JSON text accepted), roles normalised."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise _Bad("expected a list of {role, content} messages, got text that is not JSON") from None
    if not isinstance(value, (list, tuple)) or not value:
        got = "an empty list" if isinstance(value, (list, tuple)) else _kind_text(value)
        raise _Bad(f"expected a list of {{role, content}} messages, got {got}")
    out = []
    for number, message in enumerate(value, 1):
        if not isinstance(message, dict):
            raise _Bad(f"message {number} is {_kind_text(message)}, not an object with role and content")
        role = message.get("role", message.get("from"))
        if not isinstance(role, str) or not role.strip():
            raise _Bad(f"message {number} has no role (user, assistant or system)")
        if "content" not in message and "value" not in message:
            raise _Bad(f"message {number} has no content")
        content = message.get("content", message.get("value"))
        out.append({"role": ROLE_ALIASES.get(role.strip(), role.strip()), "content": _content_text(content, number)})
    return out


def _content_text(content: Any, number: int) -> str:
    if content is None:
        return ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)  # [{"type": "text", "text": ...}] parts
    try:
        return text_value(content)
    except _Bad:
        raise _Bad(f"message {number} has content that is {_kind_text(content)}, not text") from None


def _check_messages(table: _Table, column: str, values: list[Any]) -> list[list[dict[str, str]]]:
    out = []
    for index, value in enumerate(values):
        if _is_empty(value):
            raise table.error(index, column, " is empty; fill it in or remove the row")
        try:
            out.append(message_list(value))
        except _Bad as exc:
            raise table.error(index, column, f": {exc}") from None
    return out


# ----------------------------------------------------------------------------- preference rows (dpo, orpo, kto)
def _check_preference_table(table: _Table, fmt: DataFormat) -> dict[str, list[Any]]:
    """Every side of every row checked (text or a conversation, not empty; chosen differs from rejected; kto labels
    true or false); returns the columns normalised, all sides as conversations when any row holds one."""
    out: dict[str, list[Any]] = {}
    for role, column in fmt.columns.items():
        values = table.columns[column]
        if role == "label":
            out[column] = _check_kto_labels(table, column, values)
        else:
            out[column] = [_checked_side(table, index, column, value, role) for index, value in enumerate(values)]
            _refuse_numbers_among_text(table, column, values)
    if fmt.kind == "preference":
        chosen, rejected = fmt.columns["chosen"], fmt.columns["rejected"]
        for index, (better, worse) in enumerate(zip(out[chosen], out[rejected], strict=True)):
            if _answer_text(better) == _answer_text(worse):
                raise table.error(
                    index,
                    rejected,
                    f" is the same as column {chosen!r}; a pair needs two different answers: fix or remove the row",
                )
    sides = [(role, column) for role, column in fmt.columns.items() if role != "label"]
    if any(isinstance(value, list) for _, column in sides for value in out[column]):
        for role, column in sides:  # one shape per column (Arrow needs it; TRL reads one shape per row)
            out[column] = [as_conversation(value, role) for value in out[column]]
    return out


def _checked_side(table: _Table, index: int, column: str, value: Any, role: str) -> str | list[dict[str, str]]:
    """One side of a preference row: text, or messages (the answer sides need an assistant message)."""
    if _is_empty(value):
        raise table.error(index, column, " is empty; fill it in or remove the row")
    if isinstance(value, str) and value.lstrip().startswith("[{"):
        try:
            value = json.loads(value)  # a conversation written as JSON text (CSV cells)
        except ValueError:
            pass
    try:
        if isinstance(value, (list, tuple)):
            return _parse_messages(value) if role == "prompt" else message_list(value)
        return text_value(value)
    except _Bad as exc:
        kind = "text or a list of {role, content} messages"
        problem = str(exc) if isinstance(value, (list, tuple)) else f"expected {kind}, got {_kind_text(value)}"
        raise table.error(index, column, f": {problem}") from None


def _answer_text(value: str | list[dict[str, str]]) -> str:
    """What an answer says, for comparing two answers (surrounding spaces ignored)."""
    if isinstance(value, str):
        return value.strip()
    return "\n".join(f"{m['role']}: {m['content'].strip()}" for m in value)


def as_conversation(value: Any, role: str) -> list[dict[str, str]]:
    """A side as TRL's conversational shape: a prompt text becomes a user message, an answer an assistant one."""
    if isinstance(value, str):
        return [{"role": "user" if role == "prompt" else "assistant", "content": value}]
    return _parse_messages(value)


def kto_label(value: Any) -> bool:
    """A kto label: true (a good answer) or false (a bad one); also 1/0 and "true"/"false" text."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    raise _Bad(f"{value!r} is not true or false; a kto label says whether the answer is good (true) or bad (false)")


def _check_kto_labels(table: _Table, column: str, values: list[Any]) -> list[bool]:
    labels = []
    for index, value in enumerate(values):
        if _is_empty(value):
            raise table.error(index, column, " is empty; every row needs a label: true (good answer) or false (bad)")
        try:
            labels.append(kto_label(value))
        except _Bad as exc:
            raise table.error(index, column, f": {exc}") from None
    return labels


_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def label_value(value: Any) -> int | str:
    """A label cell as a class: a whole number ≥ 0 (also written as text, "3" or 3.0) or a name."""
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        value = float(value)
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        if not float(value).is_integer():
            raise _Bad(f"{value!r} is not a class; labels are whole numbers from 0 or names")
        if value < 0:
            raise _Bad(f"{int(value)} is not a class; numbered classes count from 0 (is this an unlabelled row?)")
        return int(value)
    if isinstance(value, str):
        return value.strip()
    raise _Bad(f"expected a class name or number, got {_kind_text(value)}")


def _check_labels(tables: list[_Table], column: str, config: TrainConfig) -> list[list[int | str]]:
    """Labels as classes; one kind (numbers or names) across train and eval, and at least two classes."""
    out: list[list[int | str]] = []
    kind: tuple[str, _Table] | None = None  # the first row's kind and its table
    for table in tables:
        labels: list[int | str] = []
        for index, value in enumerate(table.columns[column]):
            if _is_empty(value):
                raise table.error(index, column, " is empty; every row needs a label")
            try:
                label = label_value(value)
            except _Bad as exc:
                raise table.error(index, column, f": {exc}") from None
            this = "numbers" if isinstance(label, int) else "names"
            if kind is None:
                kind = (this, table)
            elif this != kind[0]:
                other = "the other rows" if kind[1] is table else "the training rows"
                raise table.error(
                    index,
                    column,
                    f": {value!r} is a class {this[:-1]} but {other} hold class {kind[0]}; use one or the other",
                )
            labels.append(label)
        out.append(labels)
    seen = {label for labels in out for label in labels}
    classes = len(label_names(sorted(seen, key=str)))
    if config.num_labels and classes > config.num_labels:
        raise UserError(
            f"num_labels: the data has {classes} classes but num_labels is {config.num_labels}", "num_labels"
        )
    if len(seen) < 2 and config.num_labels < 2:
        only = next(iter(seen))
        raise UserError(
            f"{tables[0].key}: every row of {tables[0].name} has the label {only!r} in column {column!r}; "
            "classification needs at least two classes",
            field=tables[0].key,
        )
    return out


def label_names(labels: list[int | str]) -> list[str]:
    """Class names in class order: 0..max for numbered classes, else the names sorted."""
    if labels and all(isinstance(label, int) for label in labels):
        return [str(i) for i in range(max(labels) + 1)]  # type: ignore[type-var]
    return sorted({str(label) for label in labels})


# ----------------------------------------------------------------------------- format detection
def detect_format(columns: list[str], config: TrainConfig) -> DataFormat:
    """Which format the columns hold; explicit `*_column` settings win over detection."""
    cols = set(columns)
    for key in (
        "text_column",
        "text_pair_column",
        "prompt_column",
        "completion_column",
        "messages_column",
        "label_column",
        "chosen_column",
        "rejected_column",
    ):
        value = getattr(config, key)
        if value and value not in cols:
            raise UserError(f"{key}: column {value!r} is not in the data; columns: {', '.join(columns)}", field=key)
    objective = objectives.of(config)
    if objective.is_classifier:
        return _detect_classification(columns, config)
    if objective.data_kind in PREFERENCE_KINDS:
        return _detect_preference(columns, config)
    if objective.data_kind == PROMPTS_KIND:
        return _detect_prompts(columns, config)
    messages = config.messages_column or _first(MESSAGES_NAMES, cols)
    if messages and not (config.prompt_column or config.text_column):
        return DataFormat("messages", {"messages": messages})
    prompt, completion = config.prompt_column, config.completion_column
    if not (prompt and completion):
        for p, c in PAIR_NAMES:
            if (prompt or p) in cols and (completion or c) in cols:
                prompt, completion = prompt or p, completion or c
                break
    if prompt and completion and not config.text_column:
        return DataFormat("prompt_completion", {"prompt": prompt, "completion": completion})
    text = config.text_column or _first(TEXT_NAMES, cols)
    if text:
        return DataFormat("text", {"text": text})
    if _first(CHOSEN_NAMES, cols) and _first(REJECTED_NAMES, cols):
        learners = [o.name for o in objectives.OBJECTIVES.values() if o.data_kind in PREFERENCE_KINDS]
        raise UserError(
            f"objective: columns {', '.join(columns)} hold preference pairs, which objective: {objective.name} cannot "
            f"learn from; set objective: {', '.join(learners[:-1])} or {learners[-1]}",
            field="objective",
        )
    raise UserError(
        f"dataset: cannot tell the format from columns {', '.join(columns)}; set messages_column, "
        "prompt_column + completion_column, or text_column",
        field="dataset",
    )


def _detect_classification(columns: list[str], config: TrainConfig) -> DataFormat:
    cols = set(columns)
    text = config.text_column or _first(TEXT_NAMES + ("question", "prompt"), cols)
    label = config.label_column or _first(LABEL_NAMES, cols)
    if not text:
        raise UserError(f"text_column: no text column found among {', '.join(columns)}; set text_column", "text_column")
    if not label:
        raise UserError(
            f"label_column: no label column found among {', '.join(columns)}; set label_column", "label_column"
        )
    found = {"text": text, "label": label}
    pair = config.text_pair_column or _first(TEXT_PAIR_NAMES, cols - {text})
    if pair:
        found["text_pair"] = pair
    return DataFormat("classification", found)


def _detect_preference(columns: list[str], config: TrainConfig) -> DataFormat:
    """prompt/chosen/rejected pairs (dpo, orpo, kto), or for kto prompt/completion/label rows."""
    cols = set(columns)
    prompt = config.prompt_column or _first(PREFERENCE_PROMPT_NAMES, cols)
    chosen = config.chosen_column or _first(CHOSEN_NAMES, cols)
    rejected = config.rejected_column or _first(REJECTED_NAMES, cols)
    if chosen and rejected:
        if not prompt:
            raise UserError(
                f"prompt_column: no prompt column found among {', '.join(columns)}; set prompt_column", "prompt_column"
            )
        return DataFormat("preference", {"prompt": prompt, "chosen": chosen, "rejected": rejected})
    if objectives.of(config).data_kind == "unpaired":
        completion = config.completion_column or _first(KTO_COMPLETION_NAMES, cols)
        label = config.label_column or _first(LABEL_NAMES, cols)
        if prompt and completion and label:
            return DataFormat("unpaired", {"prompt": prompt, "completion": completion, "label": label})
    if chosen or rejected:  # one side named or found: say which column is missing
        key, what = ("rejected_column", "worse") if chosen else ("chosen_column", "preferred")
        raise UserError(
            f"{key}: no column with the {what} answer found among {', '.join(columns)}; set {key}", field=key
        )
    raise UserError(_not_preference_data(columns, config), field="dataset")


def _detect_prompts(columns: list[str], config: TrainConfig) -> DataFormat:
    """A prompt column (text or a conversation) for learning from rewards; the rest goes to the reward functions."""
    prompt = config.prompt_column or _first(PREFERENCE_PROMPT_NAMES, set(columns))
    if not prompt:
        raise UserError(
            f"prompt_column: no prompt column among {', '.join(columns)}; objective: {config.objective} samples "
            "answers to prompts: name the column with prompt_column (text or chat messages)",
            field="prompt_column",
        )
    return DataFormat(PROMPTS_KIND, {"prompt": prompt})


def _not_preference_data(columns: list[str], config: TrainConfig) -> str:
    """Why data without pairs cannot train a preference objective, and what to use instead."""
    objective = objectives.of(config)
    needs = "prompt, chosen and rejected columns"
    if objective.data_kind == "unpaired":
        needs += " (or prompt, completion and a true/false label)"
    advice = "set chosen_column and rejected_column if they have other names"
    if config.dataset.startswith("bundled:") and objective.bundled_data not in ("", config.dataset):
        advice = f"use dataset: {objective.bundled_data}, the same set as preference pairs"
    return (
        f"dataset: {config.dataset} has columns {', '.join(columns)}, not preference data; "
        f"objective: {objective.name} needs {needs}; {advice}"
    )


def _first(names: tuple[str, ...], cols: set[str]) -> str:
    return next((n for n in names if n in cols), "")


# ----------------------------------------------------------------------------- rendering and masking
def to_messages(row: dict[str, Any], fmt: DataFormat) -> list[dict[str, str]]:
    """A row as chat messages (role/content), for the chat-template path."""
    if fmt.kind == "prompt_completion":
        return [
            {"role": "user", "content": text_value(row[fmt.columns["prompt"]])},
            {"role": "assistant", "content": text_value(row[fmt.columns["completion"]])},
        ]
    try:
        return message_list(row[fmt.columns["messages"]])  # load_raw checked every row: this does not refuse
    except _Bad as exc:
        raise UserError(f"dataset: column {fmt.columns['messages']!r}: {exc}", "dataset") from None


def render_segments(row: dict[str, Any], fmt: DataFormat, tokenizer: Any) -> list[tuple[str, bool]]:
    """The example as text pieces, each flagged True when the model is trained on it."""
    eos = tokenizer.eos_token or ""
    if fmt.kind == "text":
        return [(text_value(row[fmt.columns["text"]]) + eos, True)]
    if fmt.kind == "prompt_completion" and not tokenizer.chat_template:
        prompt = text_value(row[fmt.columns["prompt"]]).rstrip() + "\n"
        return [(prompt, False), (text_value(row[fmt.columns["completion"]]) + eos, True)]
    if not tokenizer.chat_template:
        raise UserError("dataset: chat data needs a tokenizer with a chat template; this model has none", "dataset")
    messages = to_messages(row, fmt)
    segments: list[tuple[str, bool]] = []
    done = ""
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True) if i else ""
        upto = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
        if not (before.startswith(done) and upto.startswith(before)):
            # Templates that rewrite earlier turns (rare): train on the whole conversation rather than guess.
            return [(tokenizer.apply_chat_template(messages, tokenize=False), True)]
        segments += [(before[len(done) :], False), (upto[len(before) :], True)]
        done = upto
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    if full.startswith(done) and len(full) > len(done):
        segments.append((full[len(done) :], False))
    if not any(trained for _, trained in segments):
        raise UserError("messages_column: a conversation has no assistant message to learn from", "messages_column")
    return [(text, trained) for text, trained in segments if text]


def tokenize_segments(segments: list[tuple[str, bool]], tokenizer: Any, max_len: int) -> dict[str, list[int]]:
    """input_ids and labels (-100 where not trained), truncated to `max_len`."""
    ids: list[int] = []
    labels: list[int] = []
    for text, trained in segments:
        piece = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += piece
        labels += piece if trained else [IGNORE] * len(piece)
    ids, labels = ids[:max_len], labels[:max_len]
    return {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels}


# ----------------------------------------------------------------------------- the whole pipeline
def prepare(config: TrainConfig, tokenizer: Any) -> PreparedData:
    """Load, detect and tokenise the train and eval sets (one example per row; the collator lays out batches)."""
    train_raw, eval_raw = load_raw(config)
    fmt = detect_format(list(train_raw.column_names), config)
    if fmt.kind in PREFERENCE_KINDS:
        return _prepare_preference(config, tokenizer, train_raw, eval_raw, fmt)
    if fmt.kind == PROMPTS_KIND:
        return _prepare_prompts(config, tokenizer, train_raw, eval_raw, fmt)
    if not objectives.of(config).is_classifier and fmt.kind == "classification":
        raise UserError("task: this data has labels; set task: sequence_classification", field="task")
    if fmt.kind == "classification":
        return _prepare_classification(config, tokenizer, train_raw, eval_raw, fmt)
    notes: list[str] = []
    train = _tokenize_lm(train_raw, fmt, tokenizer, config, notes, "train")
    evaluation = _tokenize_lm(eval_raw, fmt, tokenizer, config, notes, "eval") if eval_raw is not None else None
    return PreparedData(train, evaluation, fmt, notes=notes)


def _tokenize_lm(raw: Any, fmt: DataFormat, tokenizer: Any, config: TrainConfig, notes: list[str], name: str) -> Any:
    def encode(row: dict[str, Any]) -> dict[str, list[int]]:
        return tokenize_segments(render_segments(row, fmt, tokenizer), tokenizer, config.max_seq_length)

    tokenised = raw.map(encode, remove_columns=raw.column_names, desc=f"tokenising {name}")
    kept = tokenised.filter(lambda row: any(label != IGNORE for label in row["labels"]))
    dropped = len(tokenised) - len(kept)
    if dropped:
        notes.append(f"{dropped} {name} examples had no answer tokens within max_seq_length and were skipped")
    if len(kept) == 0:
        raise UserError(
            f"max_seq_length: {config.max_seq_length} cuts off every answer in the {name} set; raise it",
            "max_seq_length",
        )
    return kept


def _prepare_preference(config: TrainConfig, tokenizer: Any, train_raw: Any, eval_raw: Any, fmt: DataFormat) -> Any:
    """Rows in TRL's shape (prompt/chosen/rejected, or prompt/completion/label); TRL's trainers tokenise them."""

    def shaped(raw: Any, name: str) -> Any:
        return raw.map(
            lambda row: trl_row(row, fmt, tokenizer), remove_columns=raw.column_names, desc=f"shaping {name} rows"
        )

    notes = []
    train = shaped(train_raw, "train")
    evaluation = shaped(eval_raw, "eval") if eval_raw is not None else None
    if objectives.of(config).data_kind == "unpaired":
        if fmt.kind == "preference":
            notes.append("kto: each pair gives two rows, the chosen answer marked good and the rejected one bad")
            train = _unpaired(train)
            evaluation = _unpaired(evaluation) if evaluation is not None else None
        # TRL reads KTO batches in data order (its KL term pairs neighbours); mix good and bad rows once, seeded,
        # so that batches are not all good then all bad (and a resume sees the same order).
        train = train.shuffle(seed=config.seed).flatten_indices()
    return PreparedData(train, evaluation, fmt, notes=notes)


def _prepare_prompts(config: TrainConfig, tokenizer: Any, train_raw: Any, eval_raw: Any, fmt: DataFormat) -> Any:
    """Rows for learning from rewards in TRL's shape: `prompt` (a conversation when the model has a chat template),
    every other column as it is (the reward functions read them), and the data row each came from (for errors).
    Prompts longer than max_seq_length tokens are skipped, with a note."""
    from finetune.objectives.rewards import ROW_COLUMN

    column = fmt.columns["prompt"]
    notes: list[str] = []

    def shaped(raw: Any, name: str) -> Any:
        def one(row: dict[str, Any], index: int) -> dict[str, Any]:
            prompt = trl_row({"prompt": row[column]}, DataFormat(PROMPTS_KIND, {"prompt": "prompt"}), tokenizer)
            return {**{k: v for k, v in row.items() if k != column}, **prompt, ROW_COLUMN: index + 1}

        rows = raw.map(one, with_indices=True, remove_columns=[column], desc=f"shaping {name} prompts")
        kept = rows.filter(lambda row: _prompt_tokens(row["prompt"], tokenizer) <= config.max_seq_length)
        if len(kept) < len(rows):
            notes.append(f"{len(rows) - len(kept)} {name} prompts are longer than max_seq_length and were skipped")
        if len(kept) == 0:
            raise UserError(
                f"max_seq_length: every {name} prompt is longer than {config.max_seq_length} tokens; raise it",
                "max_seq_length",
            )
        return kept

    evaluation = shaped(eval_raw, "eval") if eval_raw is not None else None
    return PreparedData(shaped(train_raw, "train"), evaluation, fmt, notes=notes)


def _prompt_tokens(prompt: Any, tokenizer: Any) -> int:
    """Tokens of a prompt as the model reads it before its answer (chat markup included)."""
    text = render_preference({"prompt": prompt}, tokenizer)["prompt"]
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _unpaired(pairs: Any) -> Any:
    """prompt/chosen/rejected pairs as kto rows: (prompt, chosen, good) and (prompt, rejected, bad)."""

    def split(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        size = len(batch["prompt"])
        return {
            "prompt": batch["prompt"] * 2,
            "completion": batch["chosen"] + batch["rejected"],
            "label": [True] * size + [False] * size,
        }

    return pairs.map(split, batched=True, remove_columns=pairs.column_names, desc="unpairing")


def trl_row(row: dict[str, Any], fmt: DataFormat, tokenizer: Any) -> dict[str, Any]:
    """A checked preference row under TRL's column names: conversations when the model has a chat template (the
    model then sees what it sees in chat), else plain text with the prompt ending on a new line, as for SFT."""
    out: dict[str, Any] = {}
    for role, column in fmt.columns.items():
        value = row[column]
        if role == "label":
            out["label"] = kto_label(value)
        elif tokenizer.chat_template:
            out[role] = as_conversation(value, role)
        elif isinstance(value, str):
            out[role] = value.rstrip() + "\n" if role == "prompt" else value
        else:
            raise UserError("dataset: chat data needs a tokenizer with a chat template; this model has none", "dataset")
    return out


def render_preference(row: dict[str, Any], tokenizer: Any) -> dict[str, str]:
    """Each side of a TRL-shaped row as the text the model reads: the prompt with the chat markup that opens the
    answer, and each answer as it follows that prompt (its end-of-turn markup included)."""
    sides = [name for name in ("chosen", "rejected", "completion") if name in row]
    if isinstance(row["prompt"], str):
        eos = tokenizer.eos_token or ""
        return {"prompt": row["prompt"], **{name: row[name] + eos for name in sides}}
    prompt = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
    out = {"prompt": prompt}
    for name in sides:
        whole = tokenizer.apply_chat_template(row["prompt"] + row[name], tokenize=False)
        out[name] = whole[len(prompt) :] if whole.startswith(prompt) else whole
    return out


def _prepare_classification(config: TrainConfig, tokenizer: Any, train_raw: Any, eval_raw: Any, fmt: DataFormat) -> Any:
    # load_raw checked the labels (one kind, at least two classes, no more than num_labels).
    label_col = fmt.columns["label"]
    raw_labels = list(train_raw[label_col]) + (list(eval_raw[label_col]) if eval_raw is not None else [])
    feature = train_raw.features.get(label_col)
    if getattr(feature, "names", None):
        names = [str(i) for i in range(len(feature.names))]  # a Hub ClassLabel: its own class count
    else:
        names = label_names([label_value(v) for v in raw_labels])
    while config.num_labels and len(names) < config.num_labels:
        names.append(str(len(names)))
    index = {name: i for i, name in enumerate(names)}

    def encode(row: dict[str, Any]) -> dict[str, Any]:
        pair = text_value(row[fmt.columns["text_pair"]]) if "text_pair" in fmt.columns else None
        text = text_value(row[fmt.columns["text"]])
        out = tokenizer(text, pair, truncation=True, max_length=config.max_seq_length)
        out["labels"] = index[str(label_value(row[label_col]))]
        return dict(out)

    def encode_all(raw: Any) -> Any:
        return raw.map(encode, remove_columns=raw.column_names, desc="tokenising")

    evaluation = encode_all(eval_raw) if eval_raw is not None else None
    return PreparedData(encode_all(train_raw), evaluation, fmt, label_names=names)


def collator(config: TrainConfig, tokenizer: Any, packing: bool = False) -> Any:
    """How a micro batch is laid out: padded to its longest row (labels with -100), or with `packing` (the plan's
    decision) the same examples end to end in one row without padding, their boundaries beside them for the packed
    attention (`finetune.model.packing`); each example's first label is -100, as a padded row's first never counts."""
    if packing:
        from transformers import DataCollatorWithFlattening

        return DataCollatorWithFlattening(return_flash_attn_kwargs=True, separator_id=IGNORE)
    if objectives.of(config).is_classifier:
        from transformers import DataCollatorWithPadding

        return DataCollatorWithPadding(tokenizer)
    from transformers import DataCollatorForSeq2Seq

    return DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE, padding=True)


# ----------------------------------------------------------------------------- what the UI shows
def preview(config: TrainConfig, tokenizer: Any, n: int = 3) -> dict[str, Any]:
    """The first `n` examples as the model sees them: text pieces (trained or masked) and token counts."""
    train_raw, eval_raw = load_raw(config)
    fmt = detect_format(list(train_raw.column_names), config)
    examples = []
    for row in train_raw.select(range(min(n, len(train_raw)))):
        if fmt.kind in TRL_KINDS:
            example = _preference_example(row, fmt, tokenizer)
            if fmt.kind == PROMPTS_KIND:  # what the rewards read besides the prompt
                others = [(k, v) for k, v in row.items() if k not in fmt.columns.values()]
                example["columns"] = {k: str(v)[:80] for k, v in others[:PREVIEW_COLUMNS]}
            examples.append(example)
            continue
        if fmt.kind == "classification":
            pair = row.get(fmt.columns.get("text_pair", ""), "")
            text = f"{row[fmt.columns['text']]}" + (f" [SEP] {pair}" if pair else "")
            tokens = len(tokenizer(text)["input_ids"])
            examples.append({"segments": [(text, False)], "label": row[fmt.columns["label"]], "tokens": tokens})
            continue
        segments = render_segments(row, fmt, tokenizer)
        encoded = tokenize_segments(segments, tokenizer, config.max_seq_length)
        trained = sum(1 for label in encoded["labels"] if label != IGNORE)
        examples.append({"segments": segments, "tokens": len(encoded["input_ids"]), "trained_tokens": trained})
    return {
        "format": fmt.describe(),
        "rows": len(train_raw),
        "eval_rows": len(eval_raw) if eval_raw is not None else 0,
        "examples": examples,
    }


def _preference_example(row: dict[str, Any], fmt: DataFormat, tokenizer: Any) -> dict[str, Any]:
    """A preference row for the preview: each side as the model reads it, with its token count."""
    shaped = trl_row(row, fmt, tokenizer)
    sides = [
        {"name": name, "text": text, "tokens": len(tokenizer(text, add_special_tokens=False)["input_ids"])}
        for name, text in render_preference(shaped, tokenizer).items()
    ]
    example: dict[str, Any] = {"sides": sides, "tokens": sum(side["tokens"] for side in sides)}
    if "label" in shaped:
        example["label"] = shaped["label"]
    return example


def fingerprint(config: TrainConfig, train_raw: Any = None) -> dict[str, str]:
    """What identifies the exact data: sha256 of a local (or bundled) file, or the Hub dataset's revision."""
    import hashlib

    if config.dataset.startswith("bundled:"):
        path = BUNDLED_DIR / config.dataset.split(":", 1)[1] / f"{config.dataset_split}.jsonl"
    else:
        path = Path(config.dataset).expanduser()
    if path.is_file():
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        return {"dataset_sha256": digest.hexdigest()}
    info = getattr(train_raw, "info", None)
    revision = getattr(info, "version", None) if info is not None else None
    fingerprint_ = getattr(train_raw, "_fingerprint", None)
    return {"dataset_revision": str(revision or fingerprint_ or "unknown")}


def heldout_prompts(config: TrainConfig, limit: int = 5) -> list[str]:
    """Prompts answered at step 0 and at each evaluation, so the user sees the tuning take hold."""
    return [prompt for prompt, _ in heldout_samples(config, limit)]


def heldout_samples(config: TrainConfig, limit: int = 5) -> list[tuple[str, str | None]]:
    """The held-out prompts with their reference answers (None where the data has none): a bundled set's
    heldout.json (entries are a prompt, or {"prompt", "reference"}), else the first rows of the eval split (of the
    training data when there is none) with their answer (preference data: the chosen one; kto: a good one; prompts
    for learning from rewards: their `answer` column)."""
    if objectives.of(config).is_classifier:
        return []
    if config.dataset.startswith("bundled:"):
        path = BUNDLED_DIR / config.dataset.split(":", 1)[1] / "heldout.json"
        if path.is_file():
            entries = json.loads(path.read_text(encoding="utf-8"))[:limit]
            return [(e, None) if isinstance(e, str) else (e["prompt"], e.get("reference")) for e in entries]
    try:
        train_raw, eval_raw = load_raw(config)
    except UserError:
        return []
    source = eval_raw if eval_raw is not None else train_raw
    fmt = detect_format(list(source.column_names), config)
    samples: list[tuple[str, str | None]] = []
    for row in source.select(range(min(limit, len(source)))):
        if fmt.kind in TRL_KINDS:
            users = [m["content"] for m in as_conversation(row[fmt.columns["prompt"]], "prompt") if m["role"] == "user"]
            samples += [(user, reference_answer(row, fmt)) for user in users[-1:]]
        elif fmt.kind == "prompt_completion":
            samples.append((str(row[fmt.columns["prompt"]]), text_value(row[fmt.columns["completion"]])))
        elif fmt.kind == "messages":
            messages = to_messages(row, fmt)
            first = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
            if first is not None:
                reply = next((m["content"] for m in messages[first + 1 :] if m["role"] == "assistant"), None)
                samples.append((messages[first]["content"], reply))
    return samples[: min(limit, 3)]


def reference_answer(row: dict[str, Any], fmt: DataFormat) -> str | None:
    """The answer a TRL-shaped row holds up as right, as text: the chosen one, a kto answer marked good (None if bad),
    or a prompt's `answer` column, which the built-in rewards compare with (None when the data has none)."""
    if fmt.kind == PROMPTS_KIND:
        from finetune.objectives.rewards import ANSWER_COLUMN

        value = row.get(ANSWER_COLUMN)
        if _is_empty(value):
            return None
        try:
            return text_value(value)
        except _Bad:  # neither text nor a number: nothing an answer can be compared with
            return None
    if fmt.kind == "unpaired":
        if not kto_label(row[fmt.columns["label"]]):
            return None
        value = row[fmt.columns["completion"]]
    else:
        value = row[fmt.columns["chosen"]]
    return answer_content(value, "chosen")


def answer_content(value: Any, role: str) -> str:
    """What an answer side says (its assistant messages' text), without chat markup."""
    messages = as_conversation(value, role)
    return "\n".join(m["content"] for m in messages if m["role"] == "assistant") or "\n".join(
        m["content"] for m in messages
    )
