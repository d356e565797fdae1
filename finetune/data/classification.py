"""Classification data: a text (and optionally a second text) with a class label, for sequence classification."""

from __future__ import annotations

from typing import Any

from finetune import objectives
from finetune.config import TrainConfig
from finetune.data.checks import Bad, Table, check_roles, is_empty, label_names, label_value, text_value
from finetune.data.handler import KindHandler, Row, no_samples
from finetune.data.kinds import DataFormat, DataKind, PreparedData
from finetune.data.names import LABEL_NAMES, TEXT_NAMES, TEXT_PAIR_NAMES, first
from finetune.errors import UserError


def detect(columns: list[str], config: TrainConfig) -> DataFormat:
    """A text column, a label column and (when there is one) a second text; refused when either is missing."""
    cols = set(columns)
    text = config.text_column or first(TEXT_NAMES + ("question", "prompt"), cols)
    label = config.label_column or first(LABEL_NAMES, cols)
    if not text:
        raise UserError(f"text_column: no text column found among {', '.join(columns)}; set text_column", "text_column")
    if not label:
        raise UserError(
            f"label_column: no label column found among {', '.join(columns)}; set label_column", "label_column"
        )
    found = {"text": text, "label": label}
    pair = config.text_pair_column or first(TEXT_PAIR_NAMES, cols - {text})
    if pair:
        found["text_pair"] = pair
    return DataFormat(DataKind.CLASSIFICATION, found)


def check(tables: list[Table], fmt: DataFormat, config: TrainConfig) -> list[dict[str, list[Any]]]:
    """The texts checked as text, the labels as classes (`check_labels`); the normalised columns of each table."""
    out = check_roles(tables, fmt)
    column = fmt.columns["label"]
    for normalised, values in zip(out, check_labels(tables, column, config), strict=True):
        normalised[column] = values
    return out


def check_labels(tables: list[Table], column: str, config: TrainConfig) -> list[list[int | str]]:
    """Labels as classes; one kind (numbers or names) across train and eval, and at least two classes."""
    out: list[list[int | str]] = []
    kind: tuple[str, Table] | None = None  # the first row's kind and its table
    for table in tables:
        labels: list[int | str] = []
        for index, value in enumerate(table.columns[column]):
            if is_empty(value):
                raise table.error(index, column, " is empty; every row needs a label")
            try:
                label = label_value(value)
            except Bad as exc:
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


def prepare(config: TrainConfig, tokenizer: Any, train_raw: Any, eval_raw: Any, fmt: DataFormat) -> PreparedData:
    """The texts tokenised (a pair as the tokenizer joins two texts) and each label as its class index."""
    if not objectives.of(config).is_classifier:
        raise UserError("task: this data has labels; set task: sequence_classification", field="task")
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


def example(row: Row, fmt: DataFormat, tokenizer: Any, config: TrainConfig) -> dict[str, Any]:
    """A row for the preview: the text (a pair joined by [SEP]), its label and its token count."""
    pair = row.get(fmt.columns.get("text_pair", ""), "")
    text = f"{row[fmt.columns['text']]}" + (f" [SEP] {pair}" if pair else "")
    tokens = len(tokenizer(text)["input_ids"])
    return {"segments": [(text, False)], "label": row[fmt.columns["label"]], "tokens": tokens}


HANDLER = KindHandler(
    DataKind.CLASSIFICATION, detect=detect, check=check, prepare=prepare, example=example, samples=no_samples
)
