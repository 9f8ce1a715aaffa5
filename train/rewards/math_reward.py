"""Verifiable math reward: `correct` if the response's final answer is right, else `incorrect`.

Rows with one gold answer are graded by `math_grader` — the same module `evals.math` scores with.
Rows of a task with many correct answers are graded by that task's checker, chosen by `data_source`
(CHECKERS); the checkers extract the answer with the same grader rules.
"""

from __future__ import annotations

from collections.abc import Callable

from data_prep import multi_answer, tool_multi_answer
from math_grader import ANSWER_RULES, grade_batch, start_workers
from train.rewards.base import RewardResult

# data_source -> check(response, ground_truth) -> bool, for tasks whose ground_truth is not one answer
CHECKERS: dict[str, Callable[[str, str], bool]] = {
    multi_answer.DATA_SOURCE: multi_answer.check,
    tool_multi_answer.DATA_SOURCE: multi_answer.check,  # the same list of answers in ground_truth
}


class MathReward:
    def __init__(
        self,
        timeout_s: float = 3.0,
        num_workers: int | None = None,
        correct: float = 1.0,
        incorrect: float = 0.0,
        answer_rule: str = "last",
    ) -> None:
        if answer_rule not in ANSWER_RULES:
            raise ValueError(f"reward.answer_rule={answer_rule!r}; valid: {', '.join(ANSWER_RULES)}")
        self.answer_rule = answer_rule  # "last": the last committed answer (no reward for a retracted one)
        self.timeout_s = timeout_s
        self.num_workers = num_workers
        self.correct, self.incorrect = correct, incorrect
        start_workers(num_workers)  # they import sympy while the first rollouts are generated

    def __call__(self, rows: list[dict], responses: list[str], group_index: list[int]) -> RewardResult:
        hits = [0.0] * len(rows)
        graded = []
        for i, row in enumerate(rows):
            checker = CHECKERS.get(str(row.get("data_source", "")))
            if checker is None:
                graded.append(i)
            else:
                hits[i] = float(checker(responses[i], str(row.get("ground_truth", ""))))
        if graded:
            golds = [str(rows[i].get("ground_truth", "")) for i in graded]
            results = grade_batch(
                [responses[i] for i in graded],
                golds,
                timeout_s=self.timeout_s,
                num_workers=self.num_workers,
                rule=self.answer_rule,
            )
            for i, h in zip(graded, results):
                hits[i] = h
        scores = [self.correct if h == 1.0 else self.incorrect for h in hits]
        return RewardResult(scores=scores, correct=[float(h == 1.0) for h in hits])
