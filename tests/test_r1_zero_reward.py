"""The CS336 format x answer reward (assignment 5's r1_zero and question-only definitions), its four classes
in training metrics and in evals.math, and the r1_zero plain-text prompt — hand-written cases."""

from __future__ import annotations

import argparse

import pytest

from data_prep.prompt_templates import R1_ZERO, render
from evals.common.cli import build_parser
from evals.math import SUITE
from math_grader.answer_format import class_rates, classify, formatted_answer
from train.rewards.r1_zero_reward import R1ZeroReward

ROW = {"data_source": "t", "prompt": [{"role": "user", "content": "What is 2+2?"}], "ground_truth": "4"}


def test_r1_zero_prompt_ends_in_an_open_think_tag():
    text = render("r1_zero", ROW)
    assert text.endswith("User: What is 2+2?\nAssistant: <think>")
    assert "<think> reasoning process here </think> <answer> answer here </answer>." in text
    assert text == R1_ZERO.replace("{question}", "What is 2+2?")
    with pytest.raises(ValueError, match="unknown prompt template 'r2'"):
        render("r2", ROW)


@pytest.mark.parametrize(
    ("response", "fmt", "answer"),
    [
        ("2 plus 2 </think> <answer>4</answer>", True, "4"),
        ("2 plus 2 </think>\n<answer>4</answer>", False, None),  # the course's grader wants one space
        ("2 plus 2 </think> <answer>4", False, None),  # never closed
        ("x </think> <answer>\\boxed{\\frac{8}{2}}</answer>", True, "\\frac{8}{2}"),
        ("x </think> <answer>see \\boxed{}</answer>", True, None),  # a box with nothing: no answer
        ("x </think> <answer>3</answer> then <answer> 4 </answer>", True, "4"),  # the last one
    ],
)
def test_r1_zero_format_and_answer(response, fmt, answer):
    assert formatted_answer(response, "r1_zero") == (fmt, answer)


def test_any_whitespace_option_and_boxed_format():
    assert formatted_answer("a </think>\n<answer>4</answer>", "r1_zero", "any") == (True, "4")
    assert formatted_answer("so it is \\boxed{4}.", "boxed") == (True, "4")
    assert formatted_answer("the answer is 4", "boxed") == (False, None)
    assert formatted_answer("\\boxed{4", "boxed") == (False, None)  # unclosed box
    with pytest.raises(ValueError, match="answer_format"):
        formatted_answer("x", "tags")


RESPONSES = [
    "2+2 is 4 </think> <answer>4</answer>",  # format right, answer right
    "2+2 is 5 </think> <answer>5</answer>",  # format right, answer wrong
    "2+2 is 4 </think>\n<answer>4</answer>",  # format wrong, answer right (graded anyway)
    "no idea",  # format wrong, answer wrong
]


def test_reward_is_format_times_answer_and_reports_the_four_classes():
    result = R1ZeroReward()([ROW] * 4, RESPONSES, [0, 0, 0, 0])
    assert result.scores == [1.0, 0.0, 0.0, 0.0]
    assert result.correct == [1.0, 0.0, 1.0, 0.0]  # the answer alone
    assert result.signals["format"] == [1.0, 1.0, 0.0, 0.0]
    assert result.metrics == {
        "format_rate": 0.5,
        "answer_rate": 0.5,
        "fmt_wrong_ans_wrong": 0.25,
        "fmt_wrong_ans_right": 0.25,
        "fmt_right_ans_wrong": 0.25,
        "fmt_right_ans_right": 0.25,
    }
    shaped = R1ZeroReward(format_only=0.1, incorrect=-1.0)([ROW] * 4, RESPONSES, [0, 0, 0, 0])
    assert shaped.scores == [1.0, 0.1, -1.0, -1.0]


def test_grader_equivalence_decides_the_tagged_answer():
    fmt, right = classify(["x </think> <answer>\\boxed{\\frac{8}{2}}</answer>", "x </think> <answer>4.0</answer>"],
                          ["4", "4"])  # fmt: skip
    assert fmt == [True, True] and right == [True, True]


def test_class_rates_of_an_empty_batch_are_zero():
    assert class_rates([], [])["format_rate"] == 0.0


def test_evals_math_reports_format_and_answer_rates_next_to_accuracy():
    args = build_parser(SUITE).parse_args(["--ckpt", "x", "--n", "2", "--answer-format", "r1_zero"])
    recs = [
        {"id": "a", "dataset": "gsm8k", "correct": [1.0, 0.0], "answers": ["4", "5"], "format": [1.0, 0.0]},
        {"id": "b", "dataset": "gsm8k", "correct": [1.0, 1.0], "answers": ["4", "4"], "format": [1.0, 1.0]},
    ]
    out = SUITE.summarize(recs, args)
    assert out["acc"] == 1.0 and out["format_rate"] == 0.75 and out["answer_rate"] == 0.75
    assert out["fmt_wrong_ans_wrong"] == 0.25 and out["fmt_right_ans_right"] == 0.75
    assert out["gsm8k/format_rate"] == 0.75


def test_evals_math_prompt_template_renders_plain_text(shared_dir):
    data = str(shared_dir / "data" / "math")
    argv = ["--ckpt", "x", "--data-dir", data, "--datasets", "gsm8k", "--prompt-template", "r1_zero"]
    args = build_parser(SUITE).parse_args(argv)
    items = SUITE.load_items(args)
    assert isinstance(items[0]["prompt"], str) and items[0]["prompt"].endswith("Assistant: <think>")
    assert isinstance(args, argparse.Namespace)
