"""The CS336 / R1-Zero format x answer reward, and its four classes (format wrong/right x answer wrong/right).

The formats (`answer_format`: `r1_zero`, `boxed`) and the format x answer classification are
`math_grader/answer_format.py` (the evals classify with it too); the answer is compared with the gold by
the project's one grader (`math_grader`). The reward is the course's: `correct` when format AND answer are right, `format_only` (0 in the course: no reward for format
alone, against hacking) when only the format is, else `incorrect`. The answer is graded even when the
format is wrong (the grader's own extraction of the whole response), so all four classes are measured:
"format wrong, answer right" is the share a stricter format costs. The course's `answer_reward` (0
whenever the format is wrong) averages to the `fmt_right_ans_right` share.

Logged per batch (as `reward/*` in training, next to accuracy in `python -m evals.math`): `format_rate`,
`answer_rate` (answer right, whatever the format) and the four shares `fmt_{wrong,right}_ans_{wrong,right}`
(they sum to 1). `correct` (train/accuracy, the expert-iteration filter) is the answer alone; the per-sample
format is the `format` signal.
"""

from __future__ import annotations

from math_grader.answer_format import check_format, class_rates, classify
from train.rewards.base import RewardResult


class R1ZeroReward:
    """reward = format x answer (train/rewards/base.py interface); `provides_signals`: the per-sample format."""

    provides_signals = ("format",)

    def __init__(
        self,
        answer_format: str = "r1_zero",
        whitespace: str = "one_space",
        correct: float = 1.0,
        format_only: float = 0.0,
        incorrect: float = 0.0,
        timeout_s: float = 3.0,
        num_workers: int | None = None,
    ) -> None:
        check_format(answer_format, whitespace)
        self.answer_format, self.whitespace = answer_format, whitespace
        self.correct, self.format_only, self.incorrect = correct, format_only, incorrect
        self.timeout_s, self.num_workers = timeout_s, num_workers

    def __call__(self, rows: list[dict], responses: list[str], group_index: list[int]) -> RewardResult:
        golds = [str(r.get("ground_truth", "")) for r in rows]
        fmt, right = classify(
            responses, golds, self.answer_format, self.whitespace, self.timeout_s, self.num_workers
        )
        scores = [
            self.correct if f and a else self.format_only if f else self.incorrect for f, a in zip(fmt, right)
        ]
        return RewardResult(
            scores=scores,
            correct=[float(a) for a in right],
            metrics=class_rates(fmt, right),
            signals={"format": [float(f) for f in fmt]},
        )
