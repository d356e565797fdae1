"""Training data: load (bundled, local file, Hub id), detect the format, render with the chat template, tokenise, mask.

Formats: `messages` (chat), `prompt`/`completion` (loss on the completion only), plain `text`, and text(+pair)/label
for sequence classification. Labels are masked by position (prompt vs answer), never by token id: SmolLM2's pad
token is also its EOS, and masking by id would teach the model never to stop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune.config import BUNDLED_DATASET, TrainConfig
from finetune.errors import UserError

BUNDLED_DIR = Path(__file__).parent / "bundled"
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
ROLE_ALIASES = {"human": "user", "gpt": "assistant", "bot": "assistant", "model": "assistant"}


@dataclass
class DataFormat:
    """How rows are read: the kind and the columns it uses."""

    kind: str  # messages | prompt_completion | text | classification
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
    """The raw train split and (if present) the eval split as `datasets.Dataset`s."""
    name = config.dataset
    if name.startswith("bundled:"):
        folder = BUNDLED_DIR / name.split(":", 1)[1]
        if not folder.is_dir():
            available = ", ".join(f"bundled:{p.name}" for p in BUNDLED_DIR.iterdir() if p.is_dir())
            raise UserError(f"dataset: {name!r} is not bundled; available: {available}", field="dataset")
        train = _read_file(folder / f"{config.dataset_split}.jsonl", "dataset_split")
        eval_file = folder / f"{config.eval_split}.jsonl"
        return train, (_read_file(eval_file, "eval_split") if config.eval_split and eval_file.is_file() else None)
    path = Path(name).expanduser()
    if path.suffix.lower() in FILE_TYPES or path.exists() or name.startswith((".", "/", "~")):
        train = _read_file(path, "dataset")
        eval_path = Path(config.eval_split).expanduser() if config.eval_split else None
        has_eval = eval_path is not None and eval_path.suffix.lower() in FILE_TYPES and eval_path.is_file()
        return train, (_read_file(eval_path, "eval_split") if has_eval else None)
    return _load_hub(config)


def _read_file(path: Path, key: str) -> Any:
    """A local data file as a Dataset, with one clear error for every way it can be wrong."""
    from datasets import Dataset

    suffix = path.suffix.lower()
    if not path.is_file():
        raise UserError(f"{key}: file not found: {path}", field=key)
    if suffix not in FILE_TYPES:
        raise UserError(f"{key}: {path.name} has an unsupported type; use one of {', '.join(FILE_TYPES)}", field=key)
    if path.stat().st_size == 0:
        raise UserError(f"{key}: {path.name} is empty; it needs at least one example", field=key)
    try:
        if suffix == ".parquet":
            import pandas as pd

            rows = pd.read_parquet(path).to_dict("records")
        elif suffix == ".csv":
            import pandas as pd

            rows = pd.read_csv(path, encoding="utf-8").to_dict("records")
        else:
            rows = _read_json_rows(path, key)
    except UserError:
        raise
    except UnicodeDecodeError:
        raise UserError(f"{key}: {path.name} is not UTF-8 text (is it a binary file?)", field=key) from None
    except Exception as exc:  # pandas/pyarrow raise many types; the message is what matters
        raise UserError(f"{key}: cannot read {path.name}: {str(exc).splitlines()[0][:160]}", field=key) from None
    if not rows:
        raise UserError(f"{key}: {path.name} has no rows; it needs at least one example", field=key)
    return Dataset.from_list(rows)


def _read_json_rows(path: Path, key: str) -> list[dict[str, Any]]:
    text = path.read_bytes().decode("utf-8")
    if "\x00" in text:
        raise UserError(f"{key}: {path.name} is not text (is it a binary file?)", field=key)
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            rows = json.loads(stripped)
        except ValueError as exc:
            raise UserError(f"{key}: {path.name} is not valid JSON: {exc}", field=key) from None
    else:
        rows = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError:
                raise UserError(f"{key}: line {number} of {path.name} is not valid JSON", field=key) from None
    if not all(isinstance(r, dict) for r in rows):
        raise UserError(f"{key}: {path.name} must hold one JSON object per example", field=key)
    return rows


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
    ):
        value = getattr(config, key)
        if value and value not in cols:
            raise UserError(f"{key}: column {value!r} is not in the data; columns: {', '.join(columns)}", field=key)
    if config.task == "sequence_classification":
        return _detect_classification(columns, config)
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


def _first(names: tuple[str, ...], cols: set[str]) -> str:
    return next((n for n in names if n in cols), "")


# ----------------------------------------------------------------------------- rendering and masking
def to_messages(row: dict[str, Any], fmt: DataFormat) -> list[dict[str, str]]:
    """A row as chat messages (role/content), for the chat-template path."""
    if fmt.kind == "prompt_completion":
        return [
            {"role": "user", "content": str(row[fmt.columns["prompt"]])},
            {"role": "assistant", "content": str(row[fmt.columns["completion"]])},
        ]
    raw = row[fmt.columns["messages"]]
    if isinstance(raw, str):
        raw = json.loads(raw)
    if not isinstance(raw, list) or not raw:
        raise UserError("messages_column: each row must hold a list of {role, content} messages", "messages_column")
    out = []
    for m in raw:
        role = m.get("role", m.get("from", ""))
        content = m.get("content", m.get("value", ""))
        out.append({"role": ROLE_ALIASES.get(role, role), "content": str(content)})
    return out


def render_segments(row: dict[str, Any], fmt: DataFormat, tokenizer: Any) -> list[tuple[str, bool]]:
    """The example as text pieces, each flagged True when the model is trained on it."""
    eos = tokenizer.eos_token or ""
    if fmt.kind == "text":
        return [(str(row[fmt.columns["text"]]) + eos, True)]
    if fmt.kind == "prompt_completion" and not tokenizer.chat_template:
        prompt = str(row[fmt.columns["prompt"]]).rstrip() + "\n"
        return [(prompt, False), (str(row[fmt.columns["completion"]]) + eos, True)]
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
    """Load, detect, tokenise and (optionally) pack the train and eval sets."""
    train_raw, eval_raw = load_raw(config)
    fmt = detect_format(list(train_raw.column_names), config)
    if config.task == "causal_lm" and fmt.kind == "classification":
        raise UserError("task: this data has labels; set task: sequence_classification", field="task")
    if fmt.kind == "classification":
        return _prepare_classification(config, tokenizer, train_raw, eval_raw, fmt)
    notes: list[str] = []
    train = _tokenize_lm(train_raw, fmt, tokenizer, config, notes, "train")
    evaluation = _tokenize_lm(eval_raw, fmt, tokenizer, config, notes, "eval") if eval_raw is not None else None
    if config.packing:
        train = pack(train, config.max_seq_length)
        notes.append(f"packed the training set into {len(train)} rows of {config.max_seq_length} tokens")
    return PreparedData(train, evaluation, fmt, notes=notes)


def _tokenize_lm(raw: Any, fmt: DataFormat, tokenizer: Any, config: TrainConfig, notes: list[str], name: str) -> Any:
    def encode(row: dict[str, Any]) -> dict[str, list[int]]:
        return tokenize_segments(render_segments(row, fmt, tokenizer), tokenizer, config.max_seq_length)

    _check_rows(raw, fmt)
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


def _check_rows(raw: Any, fmt: DataFormat) -> None:
    """Empty or missing values give one clear error instead of a failure deep in tokenisation."""
    for column in fmt.columns.values():
        for index, value in enumerate(raw[column][:1000]):
            if value is None or (isinstance(value, str) and not value.strip()):
                raise UserError(f"dataset: row {index + 1} has an empty {column!r} value", field="dataset")


def pack(dataset: Any, length: int) -> Any:
    """Concatenate examples and cut them into rows of exactly `length` tokens (labels move with their tokens)."""
    from datasets import Dataset

    ids = [t for row in dataset["input_ids"] for t in row]
    labels = [t for row in dataset["labels"] for t in row]
    rows = [
        {"input_ids": ids[i : i + length], "attention_mask": [1] * length, "labels": labels[i : i + length]}
        for i in range(0, len(ids) - length + 1, length)
    ]
    if not rows:
        raise UserError(
            f"packing: the data holds fewer than max_seq_length={length} tokens; turn packing off", "packing"
        )
    return Dataset.from_list(rows)


def _prepare_classification(config: TrainConfig, tokenizer: Any, train_raw: Any, eval_raw: Any, fmt: DataFormat) -> Any:
    label_col = fmt.columns["label"]
    raw_labels = list(train_raw[label_col]) + (list(eval_raw[label_col]) if eval_raw is not None else [])
    names = _label_names(raw_labels, train_raw.features.get(label_col))
    if config.num_labels and len(names) > config.num_labels:
        raise UserError(
            f"num_labels: the data has {len(names)} classes but num_labels is {config.num_labels}", "num_labels"
        )
    while config.num_labels and len(names) < config.num_labels:
        names.append(str(len(names)))
    index = {name: i for i, name in enumerate(names)}

    def encode(row: dict[str, Any]) -> dict[str, Any]:
        pair = str(row[fmt.columns["text_pair"]]) if "text_pair" in fmt.columns else None
        out = tokenizer(str(row[fmt.columns["text"]]), pair, truncation=True, max_length=config.max_seq_length)
        out["labels"] = index[str(row[label_col])]
        return dict(out)

    def encode_all(raw: Any) -> Any:
        _check_rows(raw, DataFormat("classification", {k: v for k, v in fmt.columns.items() if k != "label"}))
        return raw.map(encode, remove_columns=raw.column_names, desc="tokenising")

    evaluation = encode_all(eval_raw) if eval_raw is not None else None
    return PreparedData(encode_all(train_raw), evaluation, fmt, label_names=names)


def _label_names(values: list[Any], feature: Any) -> list[str]:
    if feature is not None and getattr(feature, "names", None):
        return [str(i) for i in range(len(feature.names))]
    if any(v is None for v in values):
        raise UserError("label_column: some rows have no label", field="label_column")
    if all(isinstance(v, (int, float)) and float(v).is_integer() for v in values):
        return [str(i) for i in range(int(max(values)) + 1)]
    return sorted({str(v) for v in values})


def collator(config: TrainConfig, tokenizer: Any) -> Any:
    """Pads each batch to its longest row (labels with -100)."""
    if config.task == "sequence_classification":
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
    if config.task != "causal_lm":
        return []
    if config.dataset.startswith("bundled:"):
        path = BUNDLED_DIR / config.dataset.split(":", 1)[1] / "heldout.json"
        if path.is_file():
            return json.loads(path.read_text(encoding="utf-8"))[:limit]
    try:
        train_raw, eval_raw = load_raw(config)
    except UserError:
        return []
    source = eval_raw if eval_raw is not None else train_raw
    fmt = detect_format(list(source.column_names), config)
    prompts: list[str] = []
    for row in source.select(range(min(limit, len(source)))):
        if fmt.kind == "prompt_completion":
            prompts.append(str(row[fmt.columns["prompt"]]))
        elif fmt.kind == "messages":
            users = [m["content"] for m in to_messages(row, fmt) if m["role"] == "user"]
            if users:
                prompts.append(users[0])
    return prompts[: min(limit, 3)]
