"""DARLING over agent strategies: a trajectory's strategy (tool path and final answer), the partition over
(strategy, answer), and the distinct-strategies figure, on hand-computed groups. No model: fast."""

from __future__ import annotations

import json

import pytest

from data_prep.schema import make_row
from data_prep.tool_multi_answer import DATA_SOURCE
from train.batch import Batch
from train.diversity.partition import refine
from train.diversity.strategy import Strategy, skeleton, strategy_of, tool_path
from train.heldout_metrics import heldout_metrics
from train.rewards.darling_reward import DarlingReward
from train.rewards.trajectory import score_rollout

ANSWER_AWARE = {"_target_": "train.diversity.judges.AnswerAwareJudge"}


def call(expression: str, name: str = "calculator") -> str:
    return (
        "<tool_call>" + json.dumps({"name": name, "arguments": {"expression": expression}}) + "</tool_call>"
    )


def trajectory(*calls: str, answer: str) -> dict:
    """A summary as the agent loop writes it: a model turn per call, each answered by the environment."""
    segments = []
    for c in calls:
        segments += [
            {"role": "model", "text": call(c)},
            {"role": "env", "text": "<tool_response>1</tool_response>"},
        ]
    segments.append({"role": "model", "text": answer})
    return {"segments": segments, "tool_calls": len(calls), "turns": len(calls) + 1, "failed": None}


def test_operator_skeletons_by_hand():
    assert skeleton("37 * 54") == "*" and skeleton("1998 % 37") == "%" and skeleton("1998 / 37") == "/"
    assert skeleton("1 + 9 + 9 + 8") == "+ + +"
    assert (
        skeleton("(1998 - 74) // 37") == skeleton("1998 - 74 // 37") == "- //"
    )  # brackets are not operators
    assert skeleton("2 ** 10 × 3") == "** *" and skeleton("-5 * 3") == "neg *"
    assert skeleton("1998") == skeleton(1998) == "n"
    assert skeleton("37 *") == skeleton("abs(3)") == skeleton(None) == "?"


def test_tool_path_reads_calls_with_the_agent_loops_parser():
    two_in_one = call("37 * 54") + " then " + call("1998 % 37")
    assert tool_path([two_in_one, "The answer is 1998."]) == ("calculator:*", "calculator:%")
    lookup = '<tool_call>{"name": "catalog", "arguments": {"item": "tin cup"}}</tool_call>'
    assert tool_path([lookup, call("3 * 4")]) == ("catalog", "calculator:*")
    assert tool_path(["<tool_call>{not json}</tool_call>", "<tool_call>open"]) == ("malformed", "malformed")
    assert tool_path(["The answer is 7."]) == ()


def test_strategy_of_a_trajectory():
    t = trajectory("37 * 54", "1 + 9 + 9 + 8", answer="So \\boxed{1998}")
    t["segments"][1]["text"] = call("2 * 2")  # what the environment writes is not a call of the model
    assert strategy_of(t) == Strategy(("calculator:*", "calculator:+ + +"), "1998")
    assert strategy_of(t).describe() == "calculator:* > calculator:+ + +"
    assert strategy_of(trajectory(answer="I cannot tell.")) == Strategy((), "")  # the grader finds no answer
    assert strategy_of({"segments": []}).describe() == "no tools"


def test_refine_splits_classes_by_key():
    assert refine([0, 0, 1, 0, 1], ["*", "%", "*", "*", "*"]) == [0, 1, 2, 0, 2]
    assert refine([0, 0], [(), ()]) == [0, 0]
    with pytest.raises(ValueError, match="2 labels but 1 keys"):
        refine([0, 0], ["*"])


# group 0 (gold 1998 or 2368): 1998 by `37 * 54`, 1998 by `1998 % 37`, 2368 by `37 * 64`, 1998 by `37 * 54`,
# and a wrong 1000 with no call; group 1 (gold 1998): 1998 twice by digit sum then division
GOLD = ["1998,2368"] * 5 + ["1998"] * 2
GROUPS = [0, 0, 0, 0, 0, 1, 1]


def trajectories(final: str = "{}") -> list[dict]:
    """The groups above, each final answer written as `final` ("{}": the bare number)."""
    paths = [["37 * 54"], ["1998 % 37"], ["37 * 64"], ["37 * 54"], [], ["1 + 9 + 9 + 8", "1998 / 37"]] + [
        ["1 + 9 + 9 + 8", "1998 / 37"]
    ]
    answers = ["1998", "1998", "2368", "1998", "1000", "1998", "1998"]
    return [trajectory(*p, answer=final.format(a)) for p, a in zip(paths, answers)]


TRAJECTORIES = trajectories()


def _score(partition_by: str, given: list[dict] | None, final: str = "{}"):
    """DARLING's reward of the groups above, with `given` as the trajectories (None: a single-turn call)."""
    rows = [make_row(DATA_SOURCE, [{"role": "user", "content": "?"}], g, {}) for g in GOLD]
    texts = [t["segments"][-1]["text"] for t in trajectories(final)]
    reward = DarlingReward(judge=ANSWER_AWARE, partition_by=partition_by)
    return reward(rows, texts, GROUPS, **({"trajectories": given} if given else {}))


def test_partition_by_answer_counts_one_answer_once_whatever_the_path():
    r = _score("answer", TRAJECTORIES)
    # group 0 classes {1998: 3}, {2368}, {1000}: d = (5 - |C|) / 4 = 0.5, 1, 1; group 1 one class: floor 0.1
    assert r.scores == pytest.approx([0.5, 0.5, 1.0, 0.5, 0.0, 0.1, 0.1])
    assert r.signals["partition_class"] == [0, 0, 1, 0, 2, 0, 0]
    assert r.metrics["distinct_classes_mean"] == pytest.approx((3 + 1) / 2)


def test_partition_by_strategy_and_answer_counts_each_path_to_an_answer():
    r = _score("strategy_and_answer", TRAJECTORIES)
    # group 0 classes (*, 1998) x2, (%, 1998), (*, 2368), (none, 1000): d = 3/4, 1, 1, 3/4, 1 (q = 0 on 1000)
    assert r.scores == pytest.approx([0.75, 1.0, 1.0, 0.75, 0.0, 0.1, 0.1])
    assert r.signals["partition_class"] == [0, 1, 2, 0, 3, 0, 0]
    assert r.signals["strategy_class"] == [0, 1, 0, 0, 2, 0, 0]
    assert r.metrics["distinct_classes_mean"] == pytest.approx((4 + 1) / 2)
    # answers are still answers: {1998, 2368} and {1998}; paths among correct: {*, %} and {+ + + > /}
    assert r.metrics["distinct_correct_mean"] == pytest.approx((2 + 1) / 2)
    assert r.metrics["distinct_correct_strategies_mean"] == pytest.approx((2 + 1) / 2)
    assert _score("answer", TRAJECTORIES).metrics["distinct_correct_strategies_mean"] == pytest.approx(1.5)


def test_worded_final_answers_are_told_apart_by_value():
    worded = "The answer is {}."
    by_answer = _score("answer", trajectories(worded), worded)
    by_strategy = _score("strategy_and_answer", trajectories(worded), worded)
    # the short-answer shortcut on whole texts puts "The answer is 1998." with "... 2368." (3 of 4 words shared)
    assert by_answer.signals["partition_class"] == [0, 0, 0, 0, 0, 0, 0]
    assert by_strategy.signals["partition_class"] == [0, 1, 2, 0, 3, 0, 0]
    assert by_strategy.scores == pytest.approx([0.75, 1.0, 1.0, 0.75, 0.0, 0.1, 0.1])
    assert by_strategy.metrics["distinct_correct_mean"] == pytest.approx(1.5)


def test_single_turn_rollouts_are_partitioned_by_answer_as_before():
    plain = _score("strategy_and_answer", None)
    assert plain.scores == _score("answer", None).scores == _score("answer", TRAJECTORIES).scores
    assert "distinct_correct_strategies_mean" not in plain.metrics and "strategy_class" not in plain.signals


def test_the_training_reward_hands_trajectories_over_and_validation_reports_the_figure():
    rows = [make_row(DATA_SOURCE, [{"role": "user", "content": "?"}], g, {}) for g in GOLD]
    n = len(GOLD)
    rollout = Batch(
        prompt_ids=[[1]] * n,
        response_ids=[[2]] * n,
        response_logprobs=[[0.0]] * n,
        texts=[t["segments"][-1]["text"] for t in TRAJECTORIES],
        finish_reasons=["stop"] * n,
        group_index=GROUPS,
        episodes=TRAJECTORIES,
    )
    reward = DarlingReward(judge=ANSWER_AWARE, partition_by="strategy_and_answer")
    result = score_rollout(reward, rows, rollout)
    assert result.scores == pytest.approx([0.75, 1.0, 1.0, 0.75, 0.0, 0.1, 0.1])
    val = heldout_metrics(result.scores, result.correct, GROUPS, result.metrics)
    assert val["val/distinct_correct_strategies_mean"] == pytest.approx(1.5)
    assert val["val/distinct_correct_mean"] == pytest.approx(1.5)


def test_bad_options_are_one_line():
    with pytest.raises(ValueError, match="reward.partition_by='tools' is unknown"):
        DarlingReward(judge=ANSWER_AWARE, partition_by="tools")
    with pytest.raises(ValueError, match="2 trajectories for 7 responses"):
        _score("strategy_and_answer", TRAJECTORIES[:2])


def test_the_experiment_warms_up_as_tool_math_then_compares_the_rewards_over_strategies():
    from analysis.arms import experiment_arms
    from orchestration.pipeline import plan

    sft, grpo = plan("darling_tool", ["grpo.reward.combine=quality"])
    assert sft.key == plan("tool_math")[0].key  # one warm-up for both experiments
    assert grpo.model_from == "sft" and grpo.cfg.reward.combine == "quality"
    assert grpo.cfg.reward.partition_by == "strategy_and_answer" and list(grpo.cfg.env.tools) == [
        "calculator"
    ]
    assert grpo.cfg.data.train_path == grpo.cfg.data.val_path == "builtin:tool_multi_answer"
    assert experiment_arms("darling_tool") == {
        "darling": {"grpo.reward.combine": "multiplicative"},
        "grpo": {"grpo.reward.combine": "quality"},
    }
