"""Value and row checks: every row of the columns a format uses is checked here, before any model loads.

An empty cell, a value of the wrong kind, `messages` that are not a list of {role, content} objects, a label that is
not a class: each is refused with one line naming the field, the row, the line and the column (`Table.error`). Values
that can mean only one thing are made uniform (numbers in a text column become text, "3" in a label column the class
3, ShareGPT's from/value messages become role/content).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune.data.kinds import DataFormat
from finetune.errors import UserError

ROLE_ALIASES = {"human": "user", "gpt": "assistant", "bot": "assistant", "model": "assistant"}


@dataclass
class Table:
    """Rows of one file (or split), column by column, and where each row sits in its file."""

    name: str  # for messages: the file name, or "owner/name [split]"
    key: str  # the field that names it: dataset | eval_split
    columns: dict[str, list[Any]]
    lines: list[int] | None = None  # the file line each row starts on (JSON lines, CSV)
    folder: Path | None = None  # the file's folder: where relative image paths start

    def error(self, index: int, column: str, problem: str) -> UserError:
        """One line naming the field, the row (1-based), its line in the file and the column."""
        line = self.lines[index] if self.lines else None
        where = f"row {index + 1}" + (f" (line {line})" if line is not None and line != index + 1 else "")
        return UserError(f"{self.key}: {where} of {self.name}, column {column!r}{problem}", field=self.key)


class Bad(ValueError):
    """A value that cannot be used; the message says why (the caller adds the row and column)."""


def kind_text(value: Any) -> str:
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


def text_value(value: Any) -> str:
    """A text cell as a string: text as it is, a number as its usual notation; anything else is refused."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not _is_nan(value):
        return str(value)
    raise Bad(f"expected text, got {kind_text(value)}")


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and value != value


def is_empty(value: Any) -> bool:
    return value is None or _is_nan(value) or (isinstance(value, str) and not value.strip())


def check_text(table: Table, column: str, values: list[Any]) -> list[str]:
    for index, value in enumerate(values):
        if is_empty(value):
            raise table.error(index, column, " is empty; fill it in or remove the row")
        try:
            text_value(value)
        except Bad as exc:
            raise table.error(index, column, f": {exc}") from None
    refuse_numbers_among_text(table, column, values)
    return [text_value(v) for v in values]


def refuse_numbers_among_text(table: Table, column: str, values: list[Any]) -> None:
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


def check_roles(tables: list[Table], fmt: DataFormat, config: Any = None) -> list[dict[str, list[Any]]]:
    """Every row of each used column but the label checked, `messages` as conversations and the rest as text; returns
    the normalised columns of each table (`config`: the signature every kind's check has)."""
    out: list[dict[str, list[Any]]] = [{} for _ in tables]
    for role, column in fmt.columns.items():
        if role == "label":
            continue
        for table, normalised in zip(tables, out, strict=True):
            values = table.columns[column]
            normalised[column] = (
                check_messages(table, column, values) if role == "messages" else check_text(table, column, values)
            )
    return out


def message_list(value: Any) -> list[dict[str, str]]:
    """A `messages` cell as [{role, content}] (ShareGPT's from/value and JSON text accepted); refuses the rest."""
    out = parse_messages(value)
    answers = [i for i, m in enumerate(out, 1) if m["role"] == "assistant"]
    if not answers:
        raise Bad("no assistant message to learn from")
    for number in answers:
        if not out[number - 1]["content"].strip():
            raise Bad(f"message {number} (assistant) is empty")
    return out


def parse_messages(value: Any) -> list[dict[str, str]]:
    """A non-empty list of {role, content} messages (from/value and JSON text accepted), roles normalised."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise Bad("expected a list of {role, content} messages, got text that is not JSON") from None
    if not isinstance(value, (list, tuple)) or not value:
        got = "an empty list" if isinstance(value, (list, tuple)) else kind_text(value)
        raise Bad(f"expected a list of {{role, content}} messages, got {got}")
    out = []
    for number, message in enumerate(value, 1):
        if not isinstance(message, dict):
            raise Bad(f"message {number} is {kind_text(message)}, not an object with role and content")
        role = message.get("role", message.get("from"))
        if not isinstance(role, str) or not role.strip():
            raise Bad(f"message {number} has no role (user, assistant or system)")
        if "content" not in message and "value" not in message:
            raise Bad(f"message {number} has no content")
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
    except Bad:
        raise Bad(f"message {number} has content that is {kind_text(content)}, not text") from None


def check_messages(table: Table, column: str, values: list[Any]) -> list[list[dict[str, str]]]:
    out = []
    for index, value in enumerate(values):
        if is_empty(value):
            raise table.error(index, column, " is empty; fill it in or remove the row")
        try:
            out.append(message_list(value))
        except Bad as exc:
            raise table.error(index, column, f": {exc}") from None
    return out


def as_conversation(value: Any, role: str) -> list[dict[str, str]]:
    """A side as TRL's conversational shape: a prompt text becomes a user message, an answer an assistant one."""
    if isinstance(value, str):
        return [{"role": "user" if role == "prompt" else "assistant", "content": value}]
    return parse_messages(value)


def kto_label(value: Any) -> bool:
    """A kto label: true (a good answer) or false (a bad one); also 1/0 and "true"/"false" text."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    raise Bad(f"{value!r} is not true or false; a kto label says whether the answer is good (true) or bad (false)")


def check_kto_labels(table: Table, column: str, values: list[Any]) -> list[bool]:
    labels = []
    for index, value in enumerate(values):
        if is_empty(value):
            raise table.error(index, column, " is empty; every row needs a label: true (good answer) or false (bad)")
        try:
            labels.append(kto_label(value))
        except Bad as exc:
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
            raise Bad(f"{value!r} is not a class; labels are whole numbers from 0 or names")
        if value < 0:
            raise Bad(f"{int(value)} is not a class; numbered classes count from 0 (is this an unlabelled row?)")
        return int(value)
    if isinstance(value, str):
        return value.strip()
    raise Bad(f"expected a class name or number, got {kind_text(value)}")


def label_names(labels: list[int | str]) -> list[str]:
    """Class names in class order: 0..max for numbered classes, else the names sorted."""
    if labels and all(isinstance(label, int) for label in labels):
        return [str(i) for i in range(max(labels) + 1)]  # type: ignore[type-var]
    return sorted({str(label) for label in labels})
