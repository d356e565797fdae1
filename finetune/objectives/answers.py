"""Scoring a generated answer against a reference: the one copy that evaluation metrics and GRPO rewards both use.

Normalisation follows the usual SQuAD convention (lower case, no punctuation, no articles, single spaces), so
"The Paris." and "paris" match. `last_number` reads the final number of a text, as GSM-style graders do
("... so the answer is 1,234." -> 1234), which is what arithmetic data is judged by.
"""

from __future__ import annotations

import re
import string
from decimal import Decimal, InvalidOperation

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
# A signed number with optional thousands separators and decimals; a trailing full stop is not a decimal point.
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def normalize_answer(text: str) -> str:
    """Lower case, punctuation and articles removed, whitespace collapsed."""
    text = str(text).lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, reference: str) -> float:
    """1.0 when the normalised prediction equals the normalised reference, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(reference))


def last_number(text: str) -> Decimal | None:
    """The last number written in `text` (thousands separators dropped), or None when there is none."""
    found = _NUMBER.findall(str(text))
    if not found:
        return None
    try:
        return Decimal(found[-1].replace(",", ""))
    except InvalidOperation:
        return None


def number_match(prediction: str, reference: str) -> float:
    """1.0 when the last number of the prediction equals the last number of the reference (3 == 3.0), else 0.0."""
    expected = last_number(reference)
    return float(expected is not None and last_number(prediction) == expected)
