"""Loading: bundled sets, local files (JSON lines, JSON, CSV, Parquet) and Hub datasets, each file refused with one
clear line for every way it can be wrong, then detected, checked row by row by its kind's own check and built as
`datasets.Dataset`s."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from finetune.config import BUNDLED_DATASET, TrainConfig
from finetune.data.checks import Table, kind_text
from finetune.data.detection import detect_format
from finetune.data.kinds import DataFormat
from finetune.data.registry import handler
from finetune.errors import UserError
from finetune.paths import BUNDLED

BUNDLED_DIR = BUNDLED
FILE_TYPES = (".jsonl", ".json", ".csv", ".parquet")


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
    tables = [Table(f"{name} [{config.dataset_split}]", "dataset", {c: train_ds[c] for c in fmt.columns.values()})]
    if eval_ds is not None:
        _require_columns(list(eval_ds.column_names), fmt, f"{name} [{config.eval_split}]", "eval_split")
        columns = {c: eval_ds[c] for c in fmt.columns.values()}
        tables.append(Table(f"{name} [{config.eval_split}]", "eval_split", columns))
    handler(fmt.kind).check(tables, fmt, config)  # Hub data is typed: checked, and rendered through the same functions
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


def _read_table(path: Path, key: str, row_key: str | None = None) -> Table:
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
    return Table(path.name, row_key, columns, lines, folder=path.parent.resolve())


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
                        f"{key}: row {index + 1} of {path.name} is {kind_text(row)}, not a JSON object with named "
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
                f"{key}: line {number} of {path.name} is {kind_text(row)}, not a JSON object with named fields; "
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


def _require_columns(columns: list[str], fmt: DataFormat, name: str, key: str) -> None:
    missing = [c for c in fmt.columns.values() if c not in columns]
    if missing:
        raise UserError(
            f"{key}: column {missing[0]!r} is not in {name} (the training data has it); columns: {', '.join(columns)}",
            field=key,
        )


def _checked_tables(train: Table, evaluation: Table | None, config: TrainConfig) -> tuple[Any, Any | None]:
    """Detect the format, check and normalise the used columns, and build the Datasets."""
    fmt = detect_format(list(train.columns), config)
    tables = [train]
    if evaluation is not None:
        _require_columns(list(evaluation.columns), fmt, evaluation.name, evaluation.key)
        tables.append(evaluation)
    for table, columns in zip(tables, handler(fmt.kind).check(tables, fmt, config), strict=True):
        table.columns.update(columns)
    datasets = [_dataset(table, set(fmt.columns.values())) for table in tables]
    return datasets[0], (datasets[1] if evaluation is not None else None)


def _dataset(table: Table, used: set[str]) -> Any:
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
    kinds = {kind_text(v) for v in values if v is not None}
    return len(kinds) <= 1 and kinds <= {"text", "a number", "true/false"}


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
