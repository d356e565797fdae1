"""Rows TRL's trainers read in their own shape (preference pairs, kto rows, prompts for learning from rewards): each
side as text or as a conversation (TRL's standard and conversational shapes). TRL tokenises them; this module checks,
normalises and renders them as TRL does, for the preview and the evaluation."""

from __future__ import annotations

import json
from typing import Any

from finetune.config import TrainConfig
from finetune.data.checks import (
    Bad,
    Table,
    as_conversation,
    check_kto_labels,
    is_empty,
    kind_text,
    kto_label,
    message_list,
    parse_messages,
    refuse_numbers_among_text,
    text_value,
)
from finetune.data.kinds import DataFormat, DataKind
from finetune.errors import UserError


def check(tables: list[Table], fmt: DataFormat, config: TrainConfig) -> list[dict[str, list[Any]]]:
    """Every row of each table checked (`_check_table`); the normalised columns of each table."""
    return [_check_table(table, fmt) for table in tables]


def _check_table(table: Table, fmt: DataFormat) -> dict[str, list[Any]]:
    """Every side of every row checked (text or a conversation, not empty; chosen differs from rejected; kto labels
    true or false); returns the columns normalised, all sides as conversations when any row holds one."""
    out: dict[str, list[Any]] = {}
    for role, column in fmt.columns.items():
        values = table.columns[column]
        if role == "label":
            out[column] = check_kto_labels(table, column, values)
        else:
            out[column] = [_checked_side(table, index, column, value, role) for index, value in enumerate(values)]
            refuse_numbers_among_text(table, column, values)
    if fmt.kind is DataKind.PREFERENCE:
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


def _checked_side(table: Table, index: int, column: str, value: Any, role: str) -> str | list[dict[str, str]]:
    """One side of a preference row: text, or messages (the answer sides need an assistant message)."""
    if is_empty(value):
        raise table.error(index, column, " is empty; fill it in or remove the row")
    if isinstance(value, str) and value.lstrip().startswith("[{"):
        try:
            value = json.loads(value)  # a conversation written as JSON text (CSV cells)
        except ValueError:
            pass
    try:
        if isinstance(value, (list, tuple)):
            return parse_messages(value) if role == "prompt" else message_list(value)
        return text_value(value)
    except Bad as exc:
        kind = "text or a list of {role, content} messages"
        problem = str(exc) if isinstance(value, (list, tuple)) else f"expected {kind}, got {kind_text(value)}"
        raise table.error(index, column, f": {problem}") from None


def _answer_text(value: str | list[dict[str, str]]) -> str:
    """What an answer says, for comparing two answers (surrounding spaces ignored)."""
    if isinstance(value, str):
        return value.strip()
    return "\n".join(f"{m['role']}: {m['content'].strip()}" for m in value)


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


def preview_example(row: dict[str, Any], fmt: DataFormat, tokenizer: Any, config: TrainConfig) -> dict[str, Any]:
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


def last_user_prompt(row: dict[str, Any], fmt: DataFormat) -> list[str]:
    """The prompt's last user message (none when it has no user message), as held-out samples ask it."""
    return [m["content"] for m in as_conversation(row[fmt.columns["prompt"]], "prompt") if m["role"] == "user"][-1:]


def answer_content(value: Any, role: str) -> str:
    """What an answer side says (its assistant messages' text), without chat markup."""
    messages = as_conversation(value, role)
    return "\n".join(m["content"] for m in messages if m["role"] == "assistant") or "\n".join(
        m["content"] for m in messages
    )
