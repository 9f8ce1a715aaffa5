"""The many-answers task with tool paths (data_prep/tool_multi_answer.py): every prompt's answers enumerated
again from its parameters, the fixed split, the builtin and the reward's checker. No model: fast."""

from __future__ import annotations

import pytest

from data_prep import tool_multi_answer as task
from data_prep.datasets import load_prompt_rows
from data_prep.schema import extra_info_of, make_row, validate_row
from train.rewards.math_reward import MathReward

# each family's correct answers, by brute force over every whole number up to 20000 from the prompt's parameters
BRUTE = range(1, 20_000)
EXPECTED = {
    "digit_sum": lambda p: [
        n for n in BRUTE if len(str(n)) == 4 and n % p["k"] == 0 and sum(map(int, str(n))) == p["s"]
    ],
    "range": lambda p: [n for n in BRUTE if p["a"] <= n <= p["b"] and n % p["k"] == 0],
    "remainder": lambda p: [n for n in BRUTE if p["a"] <= n <= p["b"] and n % p["k"] == p["r"]],
    "two_divisors": lambda p: [n for n in BRUTE if len(str(n)) == 4 and n % p["k"] == n % p["m"] == 0],
}


def test_every_prompt_has_several_answers_and_lists_exactly_them():
    rows = task.generate(60, seed=4) + task.generate(20, seed=4, split="test")
    assert {extra_info_of(r)["family"] for r in rows} == set(task.FAMILIES) == set(EXPECTED)
    for row in rows:
        validate_row(row, "row")
        info, text = extra_info_of(row), row["prompt"][-1]["content"]
        expected = EXPECTED[info["family"]](info["params"])
        assert row["ground_truth"] == ",".join(map(str, expected)), text
        assert task.MIN_ANSWERS <= len(expected) == info["num_answers"] <= task.MAX_ANSWERS
        assert all(str(v) in text for v in info["params"].values()), text
        assert info["tools"] == ["calculator"] and text.endswith(task.INSTRUCTION)


def test_the_issues_example_by_hand():
    answers = task.FAMILIES["digit_sum"].answers({"k": 37, "s": 19})
    assert answers == [1369, 2368, 3367, 4366, 5365, 6364, 7363, 8029, 8362, 9028, 9361]
    assert task.FAMILIES["two_divisors"].answers({"k": 12, "m": 35})[:3] == [1260, 1680, 2100]
    text = task.FAMILIES["remainder"].question.format(a=4100, b=4600, k=29, r=5)
    assert text == "Give a number between 4100 and 4600 that leaves remainder 5 when divided by 29."


def test_splits_are_disjoint_fixed_and_seeded():
    train = {r["prompt"][0]["content"] for r in task.generate(400, seed=1)}
    test = {r["prompt"][0]["content"] for r in task.generate(100, seed=2, split="test")}
    assert train and test and not train & test
    assert task.generate(10, 3) == task.generate(10, 3) != task.generate(10, 4)
    assert load_prompt_rows("builtin:tool_multi_answer", 10, 3, split="test") == task.generate(10, 3, "test")
    with pytest.raises(ValueError, match="unknown tool_multi_answer families"):
        task.generate(2, 0, families=["rhymes"])


def test_the_math_reward_grades_the_final_answer_against_the_list():
    row = make_row(task.DATA_SOURCE, [{"role": "user", "content": "?"}], "1369,2368,3367", {})
    responses = ["The answer is 2368.", "2368 = 37 * 64", "The answer is 2369.", "no idea"]
    result = MathReward()([row] * 4, responses, [0] * 4)
    assert result.correct == [1.0, 0.0, 0.0, 0.0]  # the second's final number is 64
