"""Rendering and masking for the kinds whose loss masking is ours (chat messages, prompt/completion, plain text): each
example as text pieces flagged trained or not, tokenised with labels -100 where not trained.

Labels are masked by position (prompt vs answer), never by token id: SmolLM2's pad token is also its EOS, and masking
by id would teach the model never to stop.
"""

from __future__ import annotations

from typing import Any

from finetune.config import TrainConfig
from finetune.data.checks import Bad, message_list, text_value
from finetune.data.kinds import DataFormat, DataKind, PreparedData
from finetune.errors import UserError

IGNORE = -100


def to_messages(row: dict[str, Any], fmt: DataFormat) -> list[dict[str, str]]:
    """A row as chat messages (role/content), for the chat-template path."""
    if fmt.kind is DataKind.PROMPT_COMPLETION:
        return [
            {"role": "user", "content": text_value(row[fmt.columns["prompt"]])},
            {"role": "assistant", "content": text_value(row[fmt.columns["completion"]])},
        ]
    try:
        return message_list(row[fmt.columns["messages"]])  # load_raw checked every row: this does not refuse
    except Bad as exc:
        raise UserError(f"dataset: column {fmt.columns['messages']!r}: {exc}", "dataset") from None


def render_segments(row: dict[str, Any], fmt: DataFormat, tokenizer: Any) -> list[tuple[str, bool]]:
    """The example as text pieces, each flagged True when the model is trained on it."""
    eos = tokenizer.eos_token or ""
    if fmt.kind is DataKind.TEXT:
        return [(text_value(row[fmt.columns["text"]]) + eos, True)]
    if fmt.kind is DataKind.PROMPT_COMPLETION and not tokenizer.chat_template:
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


def prepare(config: TrainConfig, tokenizer: Any, train_raw: Any, eval_raw: Any, fmt: DataFormat) -> PreparedData:
    """The train and eval sets tokenised and masked, one example per row; rows with no answer left are skipped."""
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
