"""Verifiable math reward: 1 if the response's final answer equals the ground truth, else 0.

The grading itself is `train.rewards.math_grader` — the same module `evals.math` scores with.
"""

from __future__ import annotations

from train.rewards.base import RewardResult
from train.rewards.math_grader import grade_batch


class MathReward:
    def __init__(self, timeout_s: float = 3.0, num_workers: int | None = None) -> None:
        self.timeout_s = timeout_s
        self.num_workers = num_workers

    def __call__(self, rows: list[dict], responses: list[str], group_index: list[int]) -> RewardResult:
        golds = [str(r.get("ground_truth", "")) for r in rows]
        scores = grade_batch(responses, golds, timeout_s=self.timeout_s, num_workers=self.num_workers)
        return RewardResult(scores=list(scores), correct=[float(s > 0.5) for s in scores])
