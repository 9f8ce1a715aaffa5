"""Grader on the real benchmark golds in ../shared (skipped without it).

Every gold, boxed as a model would write it, must grade 1.0 against itself, and shuffled golds must
(almost) never match: a grader that says yes to everything would fail the second check.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from data_prep.math_jsonl import load_math_jsonl
from math_grader import grade_batch, normalize_answer

pytestmark = pytest.mark.needs_shared

DATASETS = ["gsm8k", "math500", "aime24", "amc23", "minerva_math"]


def _golds(shared_dir: Path, name: str) -> list[str]:
    # gold answers come from the data loader (one implementation of each data set's convention)
    return [
        row["ground_truth"]
        for row in load_math_jsonl(shared_dir / "data" / "math" / name / "test.jsonl", name)
    ]


def _self_misses(golds: list[str], write: Callable[[str], str]) -> list[str]:
    """The golds that do not grade 1.0 against a response `write(gold)` states them in."""
    scores = grade_batch([write(g) for g in golds], golds)
    return [g for g, s in zip(golds, scores) if s != 1.0]


@pytest.mark.parametrize("name", DATASETS)
def test_gold_graded_against_itself(shared_dir: Path, name: str) -> None:
    golds = _golds(shared_dir, name)
    misses = _self_misses(golds, lambda g: f"Reasoning... so the answer is $\\boxed{{{g}}}$.")
    assert len(misses) <= len(golds) // 200, misses[:10]


@pytest.mark.parametrize("name", ["math500", "minerva_math"])
def test_gold_in_final_answer_format(shared_dir: Path, name: str) -> None:
    golds = _golds(shared_dir, name)
    misses = _self_misses(golds, lambda g: f"Final Answer: The final answer is ${g}$. I hope it is correct.")
    assert len(misses) <= len(golds) // 100, misses[:10]


@pytest.mark.parametrize("name", ["math500", "minerva_math", "gsm8k"])
def test_shuffled_golds_rarely_match(shared_dir: Path, name: str) -> None:
    golds = _golds(shared_dir, name)
    shuffled = golds[:]
    random.Random(0).shuffle(shuffled)
    responses = [f"$\\boxed{{{g}}}$" for g in golds]
    scores = grade_batch(responses, shuffled)
    false_hits = [
        (a, b)
        for a, b, s in zip(golds, shuffled, scores)
        if s == 1.0 and normalize_answer(a) != normalize_answer(b)
    ]
    assert len(false_hits) <= 2, false_hits
    assert sum(scores) < 0.05 * len(golds)
