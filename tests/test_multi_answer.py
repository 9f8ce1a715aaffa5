"""The many-answers number task: generator, checker, reward dispatch, distinct correct answers per group,
and the held-out metrics (pass@k, distinct_k) on hand-computed values. No model: fast."""

from __future__ import annotations

import json

import pytest

from data_prep import multi_answer
from data_prep.datasets import load_prompt_rows
from data_prep.schema import extra_info_of, make_row, read_parquet, validate_row
from train.heldout_metrics import heldout_metrics
from train.rewards.darling_reward import DarlingReward
from train.rewards.math_reward import MathReward

ANSWER_AWARE = {"_target_": "train.diversity.judges.AnswerAwareJudge"}


def _row(ground_truth: str) -> dict:
    return make_row(multi_answer.DATA_SOURCE, [{"role": "user", "content": "?"}], ground_truth, {})


# each family's correct answers, written out again from the prompt's parameters
EXPECTED = {
    "between": lambda p: set(range(p["lo"], p["hi"] + 1)),
    "parity": lambda p: {k for k in range(p["lo"], p["hi"] + 1) if k % 2 == (0 if p["even"] else 1)},
    "multiple_of": lambda p: {k for k in range(p["lo"], p["hi"] + 1) if k % p["m"] == 0},
    "prime": lambda p: {k for k in range(p["lo"], p["hi"] + 1) if all(k % d for d in range(2, k))},
    "digit_sum": lambda p: {k for k in range(10, 100) if sum(map(int, str(k))) == p["s"]},
    "divisor": lambda p: {d for d in range(2, p["n"]) if p["n"] % d == 0},
    "square": lambda p: {k * k for k in range(1, 30) if p["lo"] <= k * k <= p["hi"]},
    "greater_than": lambda p: set(range(p["x"] + 1, 100)),
}


def test_every_row_lists_exactly_the_numbers_its_prompt_asks_for():
    rows = multi_answer.generate(160, seed=5, families=list(multi_answer.FAMILIES))
    assert {extra_info_of(r)["family"] for r in rows} == set(multi_answer.FAMILIES)
    default = {extra_info_of(r)["family"] for r in multi_answer.generate(50, seed=5)}
    assert default == set(multi_answer.DEFAULT_FAMILIES)
    for row in rows:
        validate_row(row, "row")
        info, text = extra_info_of(row), row["prompt"][-1]["content"]
        answers = multi_answer.parse_answers(row["ground_truth"])
        assert len(answers) >= multi_answer.MIN_ANSWERS and text.endswith(multi_answer.INSTRUCTION)
        p = info["params"]
        expected = EXPECTED[info["family"]](p)
        assert answers == expected, text
        shown = {k: v for k, v in p.items() if not isinstance(v, bool)}
        if "two-digit multiple" in text:  # "a two-digit multiple of m" states the range 10..99 in words
            assert (shown.pop("lo"), shown.pop("hi")) == (10, 99)
        assert all(str(v) in text for v in shown.values()), text


def test_hand_checked_prompts_and_the_few_shot_turns():
    rows = multi_answer.generate(800, 1, families=list(multi_answer.FAMILIES))
    by_text = {r["prompt"][-1]["content"].split("\n")[0]: r["ground_truth"] for r in rows}
    assert by_text["Give a two-digit number whose digits add up to 9."] == "18,27,36,45,54,63,72,81,90"
    assert by_text["Give a divisor of 36 other than 1 and 36."] == "2,3,4,6,9,12,18"
    assert by_text["Give a two-digit multiple of 8."] == "16,24,32,40,48,56,64,72,80,88,96"
    assert by_text["Give a perfect square between 20 and 100."] == "25,36,49,64,81,100"
    shots = rows[0]["prompt"][:-1]
    assert [m["role"] for m in shots] == ["user", "assistant", "user", "assistant"]
    assert (
        shots[1]["content"] == "4" and shots[3]["content"] == "31"
    )  # an even number in 3..9; a prime in 20..40


def test_splits_are_disjoint_and_seeded():
    train = {r["prompt"][-1]["content"] for r in multi_answer.generate(500, seed=1)}
    test = {r["prompt"][-1]["content"] for r in multi_answer.generate(200, seed=2, split="test")}
    assert train and test and not train & test
    assert multi_answer.generate(20, seed=3) == multi_answer.generate(20, seed=3)
    assert multi_answer.generate(20, seed=3) != multi_answer.generate(20, seed=4)
    assert load_prompt_rows("builtin:multi_answer", 20, 3, split="test") == multi_answer.generate(
        20, 3, "test"
    )


def test_checker_uses_the_graders_final_answer():
    gold = "14,21,28"
    assert multi_answer.check("21", gold) and multi_answer.check("I pick \\boxed{28}.", gold)
    assert multi_answer.check("21.0", gold) and multi_answer.check("The answer is 14", gold)
    assert not multi_answer.check("22", gold) and not multi_answer.check("no idea", gold)
    assert not multi_answer.check("21 is a multiple of 7", gold)  # the final number is 7
    assert not multi_answer.check("21.5", gold) and not multi_answer.check("", gold)


def test_bad_ground_truth_is_one_line_naming_the_fix():
    with pytest.raises(ValueError, match="regenerate the rows with data_prep.multi_answer") as info:
        multi_answer.check("3", "three, four")
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="unknown multi_answer families"):
        multi_answer.generate(3, 0, families=["rhymes"])


def test_math_reward_dispatches_on_data_source():
    rows = [_row("14,21,28"), _row("14,21,28"), {"data_source": "arithmetic", "ground_truth": "21"}]
    result = MathReward()(rows, ["28", "27", "21"], [0, 0, 1])
    assert result.correct == [1.0, 0.0, 1.0] and result.scores == [1.0, 0.0, 1.0]


def test_distinct_correct_answers_per_group_by_hand():
    # group 0: answers 14, 14, 21, 5 (wrong) -> 2 distinct correct of 3 correct; 3 classes in all
    # group 1: 28, 28, none, none (one wrong answer) -> 1 distinct correct; 2 classes
    rows = [_row("14,21,28")] * 8
    texts = ["14", "14", "21", "5", "28", "28", "none", "none"]
    groups = [0, 0, 0, 0, 1, 1, 1, 1]
    reward = DarlingReward(judge=ANSWER_AWARE, combine="quality")(rows, texts, groups)
    assert reward.metrics["distinct_correct_mean"] == pytest.approx((2 + 1) / 2)
    assert reward.metrics["distinct_classes_mean"] == pytest.approx((3 + 2) / 2)
    darling = DarlingReward(judge=ANSWER_AWARE)(rows, texts, groups)
    # DARLING: q x d, d = share of the other 3 answers in another class: 14 -> 2/3, 21 -> 1, 28 -> 2/3
    assert darling.scores == pytest.approx([2 / 3, 2 / 3, 1.0, 0.0, 2 / 3, 2 / 3, 0.0, 0.0])


def test_heldout_metrics_pass_at_k_by_hand():
    # prompt A: 2 of 4 correct; prompt B: 0 of 4; prompt C: 4 of 4
    correct = [1, 0, 1, 0] + [0] * 4 + [1] * 4
    groups = [0] * 4 + [1] * 4 + [2] * 4
    figures = {"distinct_correct_mean": 1.5, "distinct_classes_mean": 3.0, "partition_s": 0.1}
    out = heldout_metrics([0.5] * 12, [float(c) for c in correct], groups, figures)
    assert out["val/accuracy"] == pytest.approx(6 / 12) and out["val/reward_mean"] == 0.5
    assert out["val/pass_at_1"] == pytest.approx((0.5 + 0 + 1) / 3)
    assert out["val/pass_at_2"] == pytest.approx(((1 - 1 / 6) + 0 + 1) / 3)  # 1 - C(2,2)/C(4,2)
    assert out["val/pass_at_3"] == pytest.approx((1 + 0 + 1) / 3) and out["val/pass_at_4"] == 2 / 3
    assert "val/pass_at_5" not in out
    assert out["val/distinct_correct_mean"] == 1.5 and out["val/distinct_k"] == 3.0
    greedy = heldout_metrics([1.0, 0.0], [1.0, 0.0], [0, 1], figures)
    assert greedy == {"val/reward_mean": 0.5, "val/accuracy": 0.5}
    assert heldout_metrics([0.3], None, [0]) == {"val/reward_mean": 0.3}


def test_parquet_cli_writes_both_splits(tmp_path, capsys):
    multi_answer.main(
        ["--out", str(tmp_path), "--train-size", "30", "--test-size", "10", "--families", "prime"]
    )
    assert len(read_parquet(tmp_path / "train.parquet")) == 30
    test = read_parquet(tmp_path / "test.parquet")
    assert len(test) == 10 and {extra_info_of(r)["family"] for r in test} == {"prime"}
    assert "wrote 10 test rows" in capsys.readouterr().out


def test_spread_builtin_is_three_quarters_between():
    """darling_math's builtin:multi_answer_spread: 3 "between" questions for each "parity" one."""
    from data_prep.datasets import load_prompt_rows

    rows = load_prompt_rows("builtin:multi_answer_spread", 400, seed=1)
    families = [json.loads(r["extra_info"])["family"] for r in rows]
    assert set(families) == {"between", "parity"}
    assert abs(families.count("between") / len(families) - 0.75) < 0.02
