"""How long the training rows are, in tokens of the run's own tokenizer and template: percentiles, the share of rows
that fit `max_seq_length`, and what cutting to a shorter length would lose. The advice prices truncation with it
(cutting to 512 tokens is free when every row is shorter) and the first screen shows it beside the data preview.

Reads the data through `finetune.data`'s own loading and rendering (the same training uses), so the counts are the
tokens a step will see. Large datasets are sampled evenly (SAMPLE_ROWS rows), which the result says.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from finetune.config import TrainConfig
from finetune.data.checks import as_conversation, message_list, text_value
from finetune.data.detection import detect_format
from finetune.data.kinds import DataFormat, DataKind
from finetune.data.loading import load_raw
from finetune.data.registry import handler, render_segments
from finetune.errors import UserError

SAMPLE_ROWS = 2000  # rows tokenised at most: percentiles are stable well before this, and it takes about a second
CHARS_PER_TOKEN = 4  # English text in a BPE vocabulary: the stand-in when no tokenizer can be loaded
TEMPLATE_TOKENS = 4  # role markers and separators a chat template adds per message (ChatML: 4-5)
_CACHE: OrderedDict[tuple, DataStats] = OrderedDict()
_CACHE_SIZE = 16
_LOCK = threading.Lock()


@dataclass
class DataStats:
    """Token lengths of the training rows (sorted), with the figures a person reads."""

    rows: int  # rows in the training split
    lengths: list[int]  # token length of each counted row, sorted (all rows, or an even sample)
    max_seq_length: int  # the length the settings cut rows to
    tokenizer: str  # whose tokenizer counted (the model's own, or a stand-in when it could not be loaded)
    notes: list[str] = field(default_factory=list)

    @property
    def sampled(self) -> bool:
        """True when fewer rows were counted than the split holds."""
        return len(self.lengths) < self.rows

    def percentile(self, q: float) -> int:
        """The length at or below which `q` percent of the rows are (nearest rank)."""
        if not self.lengths:
            return 0
        rank = max(1, min(len(self.lengths), -(-len(self.lengths) * q // 100)))
        return self.lengths[int(rank) - 1]

    @property
    def p50(self) -> int:
        """Median row length in tokens."""
        return self.percentile(50)

    @property
    def p90(self) -> int:
        """90th percentile row length in tokens."""
        return self.percentile(90)

    @property
    def p99(self) -> int:
        """99th percentile row length in tokens."""
        return self.percentile(99)

    @property
    def max(self) -> int:
        """The longest row in tokens."""
        return self.lengths[-1] if self.lengths else 0

    def share_within(self, length: int) -> float:
        """Share of rows (0..1) no longer than `length` tokens: they are not cut."""
        if not self.lengths:
            return 1.0
        return bisect.bisect_right(self.lengths, length) / len(self.lengths)

    @property
    def fit_share(self) -> float:
        """Share of rows that fit max_seq_length whole."""
        return self.share_within(self.max_seq_length)

    def tokens_lost(self, length: int) -> float:
        """Share of the training tokens (0..1) that cutting rows to `length` throws away."""
        total = sum(self.lengths)
        if not total:
            return 0.0
        return sum(n - length for n in self.lengths if n > length) / total

    def summary(self) -> str:
        """One line: rows and percentiles, and how many fit max_seq_length."""
        counted = f" ({len(self.lengths)} sampled)" if self.sampled else ""
        return (
            f"{self.rows} rows{counted}; tokens per row: median {self.p50}, 90% ≤ {self.p90}, 99% ≤ {self.p99}, "
            f"longest {self.max}; {self.fit_share:.0%} fit max_seq_length {self.max_seq_length}"
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able figures (without the per-row lengths)."""
        return {
            "rows": self.rows,
            "counted": len(self.lengths),
            "p50": self.p50,
            "p90": self.p90,
            "p99": self.p99,
            "max": self.max,
            "max_seq_length": self.max_seq_length,
            "fit_share": round(self.fit_share, 4),
            "tokenizer": self.tokenizer,
            "notes": list(self.notes),
        }


def data_stats(config: TrainConfig, tokenizer: Any = None) -> DataStats:
    """Token-length statistics of the training split as `config` trains on it (cached per data and model: the
    form asks again on every edit, and the tokenizer is loaded only when the data is counted)."""
    key = _key(config)
    with _LOCK:
        cached = _CACHE.get(key) if tokenizer is None else None
    if cached is None:
        notes: list[str] = []
        name = config.model
        if tokenizer is None:
            tokenizer, name = _tokenizer_for(config, notes)
        cached = _measure(config, tokenizer, name, notes)
        with _LOCK:
            _CACHE[key] = cached
            while len(_CACHE) > _CACHE_SIZE:
                _CACHE.popitem(last=False)
    return DataStats(cached.rows, cached.lengths, config.max_seq_length, cached.tokenizer, list(cached.notes))


def cached_or_local(config: TrainConfig) -> DataStats | None:
    """The statistics when they cost no download and no conversion: counted already (the first screen asked), or
    the data is on this machine (bundled or a file) and its tokenizer at hand. None for a Hub dataset not counted yet
    (an estimate never downloads a dataset) and for the embedded model before its one conversion (17 s or more: an
    estimate never waits for it)."""
    from pathlib import Path

    from finetune.config import EMBEDDED_MODEL
    from finetune.model.loading import embedded_cache_dir

    with _LOCK:
        cached = _CACHE.get(_key(config))
    if cached is not None:
        return DataStats(cached.rows, cached.lengths, config.max_seq_length, cached.tokenizer, list(cached.notes))
    if config.model == EMBEDDED_MODEL and not (embedded_cache_dir() / "tokenizer_config.json").is_file():
        return None
    if config.dataset.startswith("bundled:") or Path(config.dataset).expanduser().is_file():
        return data_stats(config)
    return None


def _key(config: TrainConfig) -> tuple:
    """What identifies a count: the model (its tokenizer), the data and how its rows are read."""
    return (config.model, config.dataset, config.dataset_split, _columns(config), config.task, _data_stamp(config))


def _columns(config: TrainConfig) -> tuple:
    """The column settings that change what a row renders to."""
    names = ("text_column", "text_pair_column", "prompt_column", "completion_column", "messages_column")
    return tuple(getattr(config, n, "") for n in names)


def _data_stamp(config: TrainConfig) -> int:
    """A local file's modification time (a rewritten file is counted again); 0 for others."""
    import os

    try:
        return os.stat(os.path.expanduser(config.dataset)).st_mtime_ns
    except OSError:
        return 0


def _tokenizer_for(config: TrainConfig, notes: list[str]) -> tuple[Any, str]:
    """The model's own tokenizer; when it cannot be loaded (offline, gated), the embedded model's if it is ready on
    disk, else None (lengths estimated from characters); either stand-in is said in a note."""
    from finetune.config import EMBEDDED_MODEL
    from finetune.model import loading

    try:
        from finetune.plan import plan_for, vision_family

        if vision_family(config.model) is not None:  # image tokens are counted by the model's processor
            return loading.load_processor(plan_for(config)), config.model
        return loading.load_tokenizer(config), config.model
    except UserError:
        if config.model == EMBEDDED_MODEL:
            raise
    if (loading.embedded_cache_dir() / "tokenizer_config.json").is_file():  # converted already: loads in 0.3 s
        notes.append(
            f"counted with the embedded SmolLM2 tokenizer: {config.model}'s own could not be loaded here "
            "(counts differ by tokenizer, typically within 20%)"
        )
        return loading.load_tokenizer(config.replace(model=EMBEDDED_MODEL)), EMBEDDED_MODEL
    notes.append(
        f"estimated at {CHARS_PER_TOKEN} characters per token: {config.model}'s tokenizer could not be loaded here"
    )
    return None, f"about {CHARS_PER_TOKEN} characters per token"


def _measure(config: TrainConfig, tokenizer: Any, name: str, notes: list[str]) -> DataStats:
    """Render and tokenise (a sample of) the training rows as training does, and sort the lengths."""
    train_raw, _ = load_raw(config)
    fmt = detect_format(list(train_raw.column_names), config)
    rows = len(train_raw)
    picked = range(rows) if rows <= SAMPLE_ROWS else [i * rows // SAMPLE_ROWS for i in range(SAMPLE_ROWS)]
    lengths = sorted(_row_length(row, fmt, tokenizer) for row in train_raw.select(picked))
    if fmt.kind is DataKind.IMAGES and not hasattr(tokenizer, "image_processor"):
        notes.append("text only: the images' tokens are not in these lengths (the model's processor is not here)")
    return DataStats(rows, lengths, config.max_seq_length, name, notes)


def _row_length(row: dict[str, Any], fmt: DataFormat, tokenizer: Any) -> int:
    """Tokens in one row, uncut: the chat template or prompt/completion rendering training uses."""
    if tokenizer is None and fmt.kind is not DataKind.IMAGES:
        return _estimated_length(row, fmt)
    if fmt.kind is DataKind.CLASSIFICATION:
        pair = text_value(row[fmt.columns["text_pair"]]) if "text_pair" in fmt.columns else None
        return len(tokenizer(text_value(row[fmt.columns["text"]]), pair)["input_ids"])
    if fmt.kind is DataKind.IMAGES:
        from finetune.data.images import as_text, conversation, encode

        if hasattr(tokenizer, "image_processor"):  # the images' tokens included
            return len(encode(row, fmt, tokenizer).input_ids)
        # No processor here (a catalogue model): the text alone, each image an `<image>` tag (the estimate counts
        # the images' tokens from the model's family, and a run refuses a length that would cut them).
        messages = as_text(conversation(row, fmt))
        return sum(_text_tokens(m["content"], tokenizer) + TEMPLATE_TOKENS for m in messages)
    if handler(fmt.kind).render is None:  # preference pairs: the prompt with its longer answer is what a step holds
        return _estimated_length(row, fmt, tokenizer)
    segments = render_segments(row, fmt, tokenizer)
    return sum(len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text, _ in segments)


def _estimated_length(row: dict[str, Any], fmt: DataFormat, tokenizer: Any = None) -> int:
    """Tokens of a row from its text alone: counted with `tokenizer`, else characters / CHARS_PER_TOKEN, plus a few
    tokens of template per message; preference rows count the prompt and the longer answer."""

    def tokens(text: str) -> int:
        return _text_tokens(text, tokenizer)

    pieces: dict[str, int] = {}
    for role, column in fmt.columns.items():
        value = row.get(column)
        if role == "label" or value is None:
            continue
        if role == "messages" or isinstance(value, list):  # a conversation (a prompt or an answer may be one too)
            messages = message_list(value) if role == "messages" else as_conversation(value, role)
            pieces[role] = sum(tokens(m["content"]) + TEMPLATE_TOKENS for m in messages)
        else:
            pieces[role] = tokens(text_value(value)) + TEMPLATE_TOKENS
    if fmt.kind is DataKind.PREFERENCE and {"chosen", "rejected"} <= set(pieces):
        # a step holds the prompt with one answer at a time: the longer one counts
        return sum(pieces.values()) - min(pieces["chosen"], pieces["rejected"])
    return sum(pieces.values())


def _text_tokens(text: str, tokenizer: Any = None) -> int:
    """Tokens of a text: counted with `tokenizer`, else characters / CHARS_PER_TOKEN."""
    if tokenizer is not None:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])
    return -(-len(text) // CHARS_PER_TOKEN)
