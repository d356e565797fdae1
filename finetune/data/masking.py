"""Rendering and masking for the kinds whose loss masking is ours (chat messages, prompt/completion, plain text): each
example as text pieces flagged trained or not, tokenised with labels -100 where not trained; `masked_kind` makes the
handler of such a kind from its detection and rendering.

Labels are masked by position (prompt vs answer), never by token id: SmolLM2's pad token is also its EOS, and masking
by id would teach the model never to stop.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from finetune.config import TrainConfig
from finetune.data.checks import check_roles
from finetune.data.handler import KindHandler, Row, Sample, Segments
from finetune.data.kinds import DataFormat, DataKind, PreparedData
from finetune.errors import UserError

IGNORE = -100
Render = Callable[[Row, DataFormat, Any], Segments]


def require_chat_template(tokenizer: Any) -> None:
    """Chat data is rendered with the model's chat template: refused, naming the field, when it has none."""
    if not tokenizer.chat_template:
        raise UserError("dataset: chat data needs a tokenizer with a chat template; this model has none", "dataset")


def chat_segments(messages: list[dict[str, str]], tokenizer: Any) -> Segments:
    """A conversation through the chat template, as text pieces: the assistant messages trained, the rest not."""
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


def prepare(
    config: TrainConfig, tokenizer: Any, train_raw: Any, eval_raw: Any, fmt: DataFormat, render: Render
) -> PreparedData:
    """The train and eval sets rendered, tokenised and masked, one example per row; rows with no answer left within
    max_seq_length are skipped, with a note."""
    notes: list[str] = []
    train = _tokenize_lm(train_raw, fmt, tokenizer, config, notes, "train", render)
    evaluation = _tokenize_lm(eval_raw, fmt, tokenizer, config, notes, "eval", render) if eval_raw is not None else None
    return PreparedData(train, evaluation, fmt, notes=notes)


def _tokenize_lm(
    raw: Any, fmt: DataFormat, tokenizer: Any, config: TrainConfig, notes: list[str], name: str, render: Render
) -> Any:
    def encode(row: dict[str, Any]) -> dict[str, list[int]]:
        return tokenize_segments(render(row, fmt, tokenizer), tokenizer, config.max_seq_length)

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


def example(row: Row, fmt: DataFormat, tokenizer: Any, config: TrainConfig, render: Render) -> dict[str, Any]:
    """A row for the preview: its text pieces (trained or masked) and token counts."""
    segments = render(row, fmt, tokenizer)
    encoded = tokenize_segments(segments, tokenizer, config.max_seq_length)
    trained = sum(1 for label in encoded["labels"] if label != IGNORE)
    return {"segments": segments, "tokens": len(encoded["input_ids"]), "trained_tokens": trained}


def masked_kind(
    kind: DataKind,
    detect: Callable[[list[str], TrainConfig], DataFormat | None],
    render: Render,
    samples: Callable[[Row, DataFormat], list[Sample]],
    conversation: Callable[[Row, DataFormat], list[dict[str, str]]] | None = None,
) -> KindHandler:
    """The handler of a kind whose loss masking is ours: its columns checked as text (or conversations), its rows
    rendered by `render`, then tokenised and masked here."""
    return KindHandler(
        kind,
        detect=detect,
        check=check_roles,
        prepare=partial(prepare, render=render),
        example=partial(example, render=render),
        samples=samples,
        render=render,
        conversation=conversation,
    )
