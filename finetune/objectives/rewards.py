"""Reward functions for learning from rewards (GRPO): the `rewards` setting read, checked and turned into callables
with TRL's signature `f(prompts, completions, **columns) -> list[float]`.

Built-ins score with `finetune.objectives.answers` (the same functions evaluation uses):
  number_match       1 when the last number of the completion equals the last number of the `answer` column
  exact_match        1 when the completion equals the `answer` column (normalised: case, punctuation, articles)
  regex:PATTERN      1 when the completion matches PATTERN (re.search)
  contains:TEXT      1 when the completion contains TEXT
  max_length:N       1 at or under N tokens, falling linearly to 0 at 2N tokens
  python:FILE:FUNC   FUNC from the Python file FILE, called as TRL calls a reward function

Every call is checked: a reward that raises, returns the wrong number of values or something that is not a number
stops the run with one line naming the reward and the row of the data. Light: no torch here.
"""

from __future__ import annotations

import importlib.util
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune.errors import UserError
from finetune.objectives import answers

ANSWER_COLUMN = "answer"  # the column number_match and exact_match compare with
ROW_COLUMN = "_row"  # the data row (1-based) each prompt came from, added to the data so errors can name it
BUILT_INS = ("number_match", "exact_match")
WITH_ARGUMENT = ("regex", "contains", "max_length", "python")
KINDS = BUILT_INS + WITH_ARGUMENT
# A comma starts a new reward only where a reward's name follows it: a regex or a text may hold commas.
_SPLIT = re.compile(r",\s*(?=(?:" + "|".join(BUILT_INS) + r")\s*(?:,|$)|(?:" + "|".join(WITH_ARGUMENT) + r"):)")


@dataclass(frozen=True)
class RewardSpec:
    """One entry of the `rewards` setting, parsed."""

    text: str  # as written: "regex:\\d+"
    kind: str  # number_match | exact_match | regex | contains | max_length | python
    argument: str = ""

    @property
    def columns(self) -> tuple[str, ...]:
        """Data columns the reward reads (beyond the prompt and the completion)."""
        return (ANSWER_COLUMN,) if self.kind in BUILT_INS else ()

    @property
    def runs_code(self) -> bool:
        """It runs Python code from a file (refused where a visitor could name the file)."""
        return self.kind == "python"


def split(text: str) -> list[str]:
    """The `rewards` setting as its entries (comma-separated; a comma inside a pattern or text stays in it)."""
    return [part.strip() for part in _SPLIT.split(text or "") if part.strip()]


def parse(text: str) -> list[RewardSpec]:
    """Every entry of `rewards`, checked for its form (a regex compiles, N is a whole number, ...); a ConfigError-
    style `UserError` naming `rewards` otherwise. Files are not read here (see `check_files`)."""
    specs = [_parse_one(part) for part in split(text)]
    if not specs:
        raise UserError(f"rewards: empty; name at least one reward ({', '.join(KINDS)})", "rewards")
    return specs


def _parse_one(part: str) -> RewardSpec:
    kind, _, argument = part.partition(":")
    kind = kind.strip()
    if kind in BUILT_INS and not argument:
        return RewardSpec(part, kind)
    if kind not in WITH_ARGUMENT:
        raise UserError(f"rewards: {part!r} is not a reward; use {', '.join(BUILT_INS)}, regex:PATTERN, "
                        "contains:TEXT, max_length:N or python:FILE:FUNCTION", "rewards")  # fmt: skip
    if not argument:
        raise UserError(f"rewards: {kind} needs a value after the colon ({kind}:...)", "rewards")
    if kind == "regex":
        try:
            re.compile(argument)
        except re.error as exc:
            raise UserError(f"rewards: regex:{argument} is not a valid regular expression: {exc}", "rewards") from None
    if kind == "max_length" and not (argument.strip().isdigit() and int(argument) > 0):
        raise UserError(f"rewards: max_length:{argument}: give a whole number of tokens above 0", "rewards")
    if kind == "python":
        file, _, function = argument.rpartition(":")
        if not file or not function.isidentifier():
            raise UserError(f"rewards: {part!r}: write python:FILE:FUNCTION (e.g. python:rewards.py:score)", "rewards")
    return RewardSpec(part, kind, argument.strip() if kind == "max_length" else argument)


def weights(text: str, count: int) -> list[float] | None:
    """The `reward_weights` setting as one number per reward (None: all weigh 1)."""
    parts = [part.strip() for part in (text or "").split(",") if part.strip()]
    if not parts:
        return None
    try:
        values = [float(part) for part in parts]
    except ValueError:
        raise UserError(
            f"reward_weights: {text!r}: give numbers separated by commas (1,0.5)", "reward_weights"
        ) from None
    if not all(math.isfinite(v) for v in values):
        raise UserError(f"reward_weights: {text!r}: give finite numbers", "reward_weights")
    if len(values) != count:
        raise UserError(
            f"reward_weights: {len(values)} weights for {count} reward{'s' if count != 1 else ''}; give one per reward",
            "reward_weights",
        )
    return values


def names(specs: list[RewardSpec]) -> list[str]:
    """A short name per reward (its kind, or the Python function's name), made unique: `rewards/<name>` in the log."""
    out: list[str] = []
    for spec in specs:
        base = spec.argument.rpartition(":")[2] if spec.kind == "python" else spec.kind
        name, n = base, 2
        while name in out:
            name, n = f"{base}_{n}", n + 1
        out.append(name)
    return out


# ----------------------------------------------------------------------------- checks before a run
def check_files(specs: list[RewardSpec]) -> None:
    """Each python: reward's file exists, runs, and defines the function (the file is executed once here)."""
    for spec in specs:
        if spec.runs_code:
            load_function(spec)


def check_columns(specs: list[RewardSpec], columns: list[str]) -> None:
    """The columns the built-in rewards compare with are in the data."""
    for spec in specs:
        missing = [c for c in spec.columns if c not in columns]
        if missing:
            raise UserError(
                f"rewards: {spec.text} compares with the {missing[0]!r} column, which the data does not have; "
                f"columns: {', '.join(columns)}",
                "rewards",
            )


def load_function(spec: RewardSpec) -> Callable[..., Any]:
    """The function a python: reward names, from its file."""
    file, _, function = spec.argument.rpartition(":")
    path = Path(file).expanduser()
    if not path.is_file():
        raise UserError(f"rewards: {spec.text}: file not found: {path}", "rewards")
    module_name = f"finetune_reward_{abs(hash(str(path.resolve())))}"
    loader = importlib.util.spec_from_file_location(module_name, path)
    if loader is None or loader.loader is None:
        raise UserError(f"rewards: {spec.text}: {path.name} is not a Python file", "rewards")
    module = importlib.util.module_from_spec(loader)
    try:
        loader.loader.exec_module(module)
    except Exception as exc:  # the user's file: one line, whatever it raised
        raise UserError(f"rewards: {spec.text}: running {path.name} raised {_one_line(exc)}", "rewards") from None
    found = getattr(module, function, None)
    if not callable(found):
        raise UserError(f"rewards: {spec.text}: {path.name} has no function {function!r}", "rewards")
    return found


# ----------------------------------------------------------------------------- the callables TRL calls
def reward_functions(specs: list[RewardSpec], tokenizer: Any = None) -> list[Callable[..., list[float]]]:
    """One checked callable per reward, named for the log (`__name__`), with TRL's signature."""
    return [
        _checked(_built_in(spec, tokenizer) if not spec.runs_code else load_function(spec), spec, name)
        for spec, name in zip(specs, names(specs), strict=True)
    ]


def completion_text(completion: Any) -> str:
    """A completion as text: TRL passes text, or for chat prompts a list of messages (the assistant's turn)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
    return str(completion)


def _built_in(spec: RewardSpec, tokenizer: Any) -> Callable[..., list[float]]:
    if spec.kind == "number_match" or spec.kind == "exact_match":
        score = answers.number_match if spec.kind == "number_match" else answers.exact_match

        def by_answer(prompts: list, completions: list, answer: list, **_: Any) -> list[float]:
            return [score(completion_text(c), str(a)) for c, a in zip(completions, answer, strict=True)]

        return by_answer
    if spec.kind == "regex":
        pattern = re.compile(spec.argument)
        return lambda prompts, completions, **_: [float(bool(pattern.search(completion_text(c)))) for c in completions]
    if spec.kind == "contains":
        return lambda prompts, completions, **_: [float(spec.argument in completion_text(c)) for c in completions]
    limit = int(spec.argument)

    def length(prompts: list, completions: list, completion_ids: list | None = None, **_: Any) -> list[float]:
        counts = [len(ids) for ids in completion_ids] if completion_ids is not None else None
        if counts is None:
            counts = [len(tokenizer(completion_text(c), add_special_tokens=False)["input_ids"]) for c in completions]
        return [max_length_score(n, limit) for n in counts]

    return length


def max_length_score(tokens: int, limit: int) -> float:
    """1 at or under `limit` tokens, falling linearly to 0 at twice the limit."""
    return max(0.0, min(1.0, (2 * limit - tokens) / limit))


def _checked(function: Callable[..., Any], spec: RewardSpec, name: str) -> Callable[..., list[float]]:
    """`function` as TRL calls it, with every answer checked; a problem stops the run in one line."""

    def reward(prompts: list, completions: list, **columns: Any) -> list[float]:
        rows = columns.get(ROW_COLUMN) or [None] * len(completions)
        try:
            values = function(prompts=prompts, completions=completions, **columns)
        except UserError:
            raise
        except Exception as exc:  # the user's function: name the row it fails on
            where = _failing_row(function, prompts, completions, columns, rows)
            raise UserError(f"rewards: {spec.text} raised {_one_line(exc)}{where}", "rewards") from None
        try:
            values = list(values)
        except TypeError:
            raise UserError(
                f"rewards: {spec.text} returned {_short(values)}, not a list of numbers", "rewards"
            ) from None
        if len(values) != len(completions):
            raise UserError(
                f"rewards: {spec.text} returned {len(values)} values for {len(completions)} completions; return one "
                "number per completion",
                "rewards",
            )
        for value, row in zip(values, rows, strict=True):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                where = f" for row {row} of the data" if row is not None else ""
                raise UserError(f"rewards: {spec.text} returned {_short(value)}{where}; rewards are numbers (or None "
                                "to skip a completion)", "rewards")  # fmt: skip
        return [None if v is None else float(v) for v in values]

    reward.__name__ = name
    return reward


def _failing_row(function: Callable[..., Any], prompts: list, completions: list, columns: dict, rows: list) -> str:
    """' on row N of the data': the first completion the function fails on alone (empty when none does alone)."""
    for index, row in enumerate(rows):
        one = {k: [v[index]] if isinstance(v, list) and len(v) == len(completions) else v for k, v in columns.items()}
        try:
            function(prompts=[prompts[index]], completions=[completions[index]], **one)
        except Exception:  # noqa: BLE001 - this is the row it fails on
            return f" on row {row} of the data" if row is not None else f" on completion {index + 1} of the batch"
    return ""


def _one_line(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
