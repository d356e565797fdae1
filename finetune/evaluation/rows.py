"""Which rows an evaluation scores, each rendered exactly as training renders it.

Default: the run's own evaluation split; a run without one is scored on its held-out prompts (with their reference
answers where the data has them). `--data D` names other data (a file, `bundled:NAME` or a Hub id) read through the
same loader and checks as training data, `--split` a split of it (or of the run's own data).

Each row keeps what every score needs: the conversation the model answers, the reference answer, and the pieces of
text the loss counts (`finetune.data`'s rendering and masking, so `loss` covers exactly the tokens training counts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from finetune import objectives
from finetune.config import TrainConfig
from finetune.data import preference, prompts
from finetune.data.checks import as_conversation, kto_label, label_value, text_value
from finetune.data.detection import detect_format
from finetune.data.heldout import heldout_samples
from finetune.data.images import as_text, conversation, encode, image_count, image_list, render
from finetune.data.kinds import DataFormat, DataKind
from finetune.data.loading import FILE_TYPES, load_raw
from finetune.data.registry import render_segments, to_messages
from finetune.data.trl_rows import render_preference, trl_row
from finetune.errors import UserError

Segments = list[tuple[str, bool]]  # text pieces, each flagged True when training counts it in the loss
HELDOUT = "heldout"  # the kind of a selection of held-out prompts
PAIR_FORMAT = DataFormat(DataKind.PROMPT_COMPLETION, {"prompt": "prompt", "completion": "completion"})  # held-out
SHAREGPT_FORMAT = DataFormat(DataKind.IMAGES, {"messages": "messages", "images": "images"})  # held-out image prompts


@dataclass
class EvalRow:
    """One row to score."""

    prompt: list[dict[str, str]] | None = None  # the conversation the model answers (None: plain text, a classifier)
    reference: str | None = None  # the answer generations are scored against
    scored: Segments | None = None  # the row as training renders it: the loss is taken on its trained pieces
    rejected: Segments | None = None  # a preference pair: the same prompt with the rejected answer
    good: bool | None = None  # a kto row: its answer is marked good (True) or bad (False)
    label: int | None = None  # a classification row: the class index
    text: str = ""
    text_pair: str = ""
    images: list[Any] = field(default_factory=list)  # image data: the prompt's pictures (files), one per <image> tag
    # Image data: the row as training tokenises it ({input_ids, labels, images}), for the loss with its pictures.
    encoded: dict[str, Any] | None = None


@dataclass
class Selection:
    """The rows, where they came from and what can be scored on them."""

    rows: list[EvalRow]
    source: str  # in words: "bundled:pirate [validation]", "my-eval.jsonl", "the 5 held-out prompts of ..."
    kind: str  # the data's kind (a DataKind), or HELDOUT for a run's held-out prompts
    notes: list[str] = field(default_factory=list)
    label_names: list[str] = field(default_factory=list)

    @property
    def has_references(self) -> bool:
        return any(row.reference is not None for row in self.rows)


def select(
    config: TrainConfig,
    tokenizer: Any,
    dataset: str = "",
    split: str = "",
    limit: int | None = None,
    label_names: list[str] | None = None,
) -> Selection:
    """The rows to score for a run with `config` (see the module docstring); a one-line UserError for bad data."""
    if dataset or split:
        source_config, source = _other_data(config, dataset, split)
        try:
            raw, _ = load_raw(source_config)
        except UserError as exc:  # the loader names training's fields: here they are --data and --split
            field = {"dataset": "data", "dataset_split": "split"}.get(exc.field or "", exc.field or "data")
            raise UserError(f"{field}: {str(exc).split(': ', 1)[-1]}", field=field) from None
    else:
        source_config = config
        raw, evaluation = load_raw(config)
        if evaluation is None:
            return _heldout(config, tokenizer, limit)
        raw, source = evaluation, _eval_split_name(config)
    if limit:
        raw = raw.select(range(min(limit, len(raw))))
    fmt = detect_format(list(raw.column_names), source_config)
    rows = [_row(row, fmt, tokenizer, label_names or [], source_config) for row in raw]
    selection = Selection(rows, source, fmt.kind, label_names=list(label_names or []))
    if fmt.kind is DataKind.TEXT:
        selection.notes.append(
            "only loss and perplexity: the data is plain text, with no prompt and reference answer to score a "
            "generated answer against"
        )
    return selection


def _other_data(config: TrainConfig, dataset: str, split: str) -> tuple[TrainConfig, str]:
    """The config that reads `dataset` (default: the run's own data) at `split`, and how to name it."""
    name = dataset or config.dataset
    local = not (name.startswith("bundled:") or _is_hub(name))
    if local and split:
        raise UserError("split: applies to bundled and Hub data; a local data file is read whole", field="split")
    chosen = split or config.eval_split or "train"
    try:
        source = config.replace(dataset=name, dataset_split="train" if local else chosen, eval_split="")
    except Exception as exc:  # the config's own one-line reason (a dataset value it refuses)
        raise UserError(f"data: {str(exc).splitlines()[0]}", field="data") from None
    return source, _data_name(name) + ("" if local else f" [{chosen}]")


def _eval_split_name(config: TrainConfig) -> str:
    """The run's evaluation split as results name it: a file by its name, else "data [split]"."""
    split = config.eval_split
    if split.lower().endswith(FILE_TYPES) or "/" in split or "\\" in split:
        return _data_name(split)
    return f"{_data_name(config.dataset)} [{split}]"


def _is_hub(name: str) -> bool:
    from finetune.model import catalogue

    return catalogue.is_hub_id(name) and not name.lower().endswith(FILE_TYPES)


def _data_name(name: str) -> str:
    """Data as the results name it: a bundled or Hub name as it is, a file by its name alone."""
    if name.startswith("bundled:") or _is_hub(name):
        return name
    from pathlib import Path

    return Path(name).name


def _heldout(config: TrainConfig, tokenizer: Any, limit: int | None) -> Selection:
    """A run without an evaluation split: its held-out prompts, with their reference answers where known."""
    if objectives.of(config).is_classifier:
        raise UserError(
            "data: this classification run has no evaluation split; give --data FILE with text and label columns",
            field="data",
        )
    samples = heldout_samples(config, limit=limit or 5)
    if not samples:
        raise UserError("data: this run has no evaluation split and no held-out prompts; give --data FILE", "data")
    rows = []
    for prompt, reference in samples:
        conversation = [{"role": "user", "content": str(prompt)}]
        scored = None
        pictures = list(getattr(prompt, "images", ()))  # an image prompt's pictures (finetune.data.images.ImagePrompt)
        if pictures or hasattr(tokenizer, "image_processor"):
            row = EvalRow(prompt=conversation, reference=reference, images=pictures)
            if reference is not None:  # scored as a conversation of the prompt (its <image> tags) and the reference
                turns = [*conversation, {"role": "assistant", "content": reference}]
                _encode_image_row({"messages": turns, "images": pictures}, SHAREGPT_FORMAT, tokenizer, row, config)
            rows.append(row)
            continue
        if reference is not None:
            scored = render_segments({"prompt": prompt, "completion": reference}, PAIR_FORMAT, tokenizer)
        rows.append(EvalRow(prompt=conversation, reference=reference, scored=scored))
    note = (
        f"this run has no evaluation split: scored on its {len(rows)} held-out prompts; give --data FILE (or "
        "--split NAME) to score more rows"
    )
    return Selection(rows, f"the held-out prompts of {_data_name(config.dataset)}", HELDOUT, notes=[note])


def _row(row: dict[str, Any], fmt: DataFormat, tokenizer: Any, label_names: list[str], config: TrainConfig) -> EvalRow:
    """One data row as an `EvalRow` for its format."""
    if fmt.kind is DataKind.CLASSIFICATION:
        return _classification_row(row, fmt, label_names)
    if fmt.kind in (DataKind.PREFERENCE, DataKind.UNPAIRED):
        return _preference_row(row, fmt, tokenizer)
    if fmt.kind is DataKind.PROMPTS:
        return _prompts_row(row, fmt, tokenizer)
    if fmt.kind is DataKind.IMAGES:
        return _image_row(row, fmt, tokenizer, config)
    scored = render_segments(row, fmt, tokenizer)
    if fmt.kind is DataKind.TEXT:
        return EvalRow(scored=scored)
    messages = to_messages(row, fmt)
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return EvalRow(prompt=messages[:last], reference=messages[last]["content"], scored=scored)


def _image_row(row: dict[str, Any], fmt: DataFormat, processor: Any, config: TrainConfig) -> EvalRow:
    """An image row (checked: its images are files found and readable, or in-memory images): the conversation up to
    its last answer, each image an `<image>` tag, with the pictures those tags place; the answer is the reference.
    The loss is taken on the whole row as training tokenises it, pictures included."""
    messages = conversation(row, fmt)
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    pictures = image_list(row.get(fmt.columns["images"]))[: image_count(messages[:last])]
    text = as_text(messages)
    scored = EvalRow(prompt=text[:last], reference=text[last]["content"], images=pictures)
    _encode_image_row(row, fmt, processor, scored, config)
    return scored


def _encode_image_row(row: dict[str, Any], fmt: DataFormat, processor: Any, out: EvalRow, config: TrainConfig) -> None:
    """Fill `out.scored` (the rendered pieces) and `out.encoded` (ids, labels and pictures, cut to max_seq_length as
    training cuts them): the row's loss is taken on its trained tokens, with its pictures in the forward pass."""
    encoded = encode(row, fmt, processor)
    limit = config.max_seq_length
    if encoded.images_end > limit:
        raise UserError(
            f"data: a row needs {encoded.images_end} tokens up to the end of its last image, beyond the run's "
            f"max_seq_length {limit}, which never cuts image tokens; evaluate on rows with fewer or smaller images",
            field="data",
        )
    out.scored = render(row, fmt, processor)
    pictures = image_list(row.get(fmt.columns["images"]))
    out.encoded = {"input_ids": encoded.input_ids[:limit], "labels": encoded.labels[:limit], "images": pictures}


def _preference_row(row: dict[str, Any], fmt: DataFormat, tokenizer: Any) -> EvalRow:
    """A pair (or a kto answer): each side as TRL reads it, after the same prompt."""
    rendered = render_preference(trl_row(row, fmt, tokenizer), tokenizer)
    prompt = as_conversation(row[fmt.columns["prompt"]], "prompt")
    head = (rendered["prompt"], False)
    if fmt.kind is DataKind.UNPAIRED:
        good = kto_label(row[fmt.columns["label"]])
        return EvalRow(
            prompt=prompt,
            reference=preference.reference_answer(row, fmt),
            scored=[head, (rendered["completion"], True)],
            good=good,
        )
    return EvalRow(
        prompt=prompt,
        reference=preference.reference_answer(row, fmt),
        scored=[head, (rendered["chosen"], True)],
        rejected=[head, (rendered["rejected"], True)],
    )


def _prompts_row(row: dict[str, Any], fmt: DataFormat, tokenizer: Any) -> EvalRow:
    """A prompt for learning from rewards, with its `answer` column as the reference where the data has one; the loss
    is then that answer's likelihood after the prompt, rendered as TRL renders the prompt."""
    prompt = row[fmt.columns["prompt"]]
    reference = prompts.reference_answer(row, fmt)
    if reference is None:
        return EvalRow(prompt=as_conversation(prompt, "prompt"))
    pair = DataFormat(DataKind.PROMPTS, {"prompt": "prompt", "completion": "completion"})
    rendered = render_preference(trl_row({"prompt": prompt, "completion": reference}, pair, tokenizer), tokenizer)
    return EvalRow(
        prompt=as_conversation(prompt, "prompt"),
        reference=reference,
        scored=[(rendered["prompt"], False), (rendered["completion"], True)],
    )


def _classification_row(row: dict[str, Any], fmt: DataFormat, names: list[str]) -> EvalRow:
    label = str(label_value(row[fmt.columns["label"]]))
    if label not in names:
        raise UserError(
            f"data: label {label!r} is not one of the run's labels ({', '.join(names)}); evaluate on data with the "
            "labels the run was trained on",
            field="data",
        )
    pair = text_value(row[fmt.columns["text_pair"]]) if "text_pair" in fmt.columns else ""
    return EvalRow(label=names.index(label), text=text_value(row[fmt.columns["text"]]), text_pair=pair)
