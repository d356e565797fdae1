"""The shared answer scoring that evaluation and GRPO rewards use."""

from __future__ import annotations

from decimal import Decimal

from finetune.objectives.answers import exact_match, last_number, normalize_answer, number_match


def test_normalisation_ignores_case_punctuation_articles_and_spacing():
    assert normalize_answer("  The  Capital is PARIS. ") == "capital is paris"
    assert exact_match("The Paris.", "paris") == 1.0
    assert exact_match("Paris, France", "Paris") == 0.0


def test_last_number_reads_the_final_number_with_separators_and_signs():
    assert last_number("3 + 4 = 7, so the answer is 1,234.") == Decimal("1234")
    assert last_number("it is -2.50") == Decimal("-2.50")
    assert last_number("no digits here") is None


def test_number_match_compares_values_not_spelling():
    assert number_match("The answer is 12.", "12") == 1.0
    assert number_match("12.0", "12") == 1.0
    assert number_match("13", "12") == 0.0
    assert number_match("anything", "no number") == 0.0
