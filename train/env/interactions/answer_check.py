"""A user who checks the model's answer and says so (verl's gsm8k interaction): "that is wrong, try again".

Each model turn without a tool call is taken as an answer and graded against the row's `ground_truth`
with the project's one math grader. Right: the trajectory ends with reward 1. Wrong: the user replies
with `feedback` and the model tries again, until `max_attempts` (or `env.max_turns`) runs out. The
reward is `correct` on the attempt that got it right, discounted by `retry_discount` per earlier attempt,
so a first-try answer is worth more than a fourth-try one.
"""

from __future__ import annotations

from math_grader import grade
from train.env.base import EnvStep


class AnswerCheck:
    def __init__(
        self,
        feedback: str = "That is not right. Check your work and give the final answer again.",
        max_attempts: int = 3,
        correct: float = 1.0,
        retry_discount: float = 1.0,
        timeout_s: float = 3.0,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"env.interaction.max_attempts={max_attempts}: expected >= 1")
        self.feedback, self.max_attempts = feedback, max_attempts
        self.correct, self.retry_discount, self.timeout_s = correct, retry_discount, timeout_s
        self.gold = ""
        self.attempts = 0

    def reset(self, task: dict) -> str | None:
        self.gold = str(task.get("ground_truth", ""))
        self.attempts = 0
        return None

    def step(self, model_turn: str) -> EnvStep:
        self.attempts += 1
        if grade(model_turn, self.gold, timeout_s=self.timeout_s) == 1.0:
            return EnvStep(None, self.correct * self.retry_discount ** (self.attempts - 1), done=True)
        if self.attempts >= self.max_attempts:
            return EnvStep(None, 0.0, done=True)
        return EnvStep(self.feedback, 0.0, done=False)
