"""Format x answer classification of a response (CS336 / R1-Zero): does the response hold the answer format,
and is its answer right. Training's reward (train/rewards/r1_zero_reward.py) and `evals.math` both classify
with it, so it sits with the one grader they both use.

Formats (`answer_format`):

- `r1_zero` (CS336 assignment 5's `r1_zero_reward_fn`): the format holds when the response contains
  "</think> <answer>" (exactly one space, as the course's grader; `whitespace="any"` accepts any
  whitespace) and "</answer>". The answer is the text between the last "<answer>" and the "</answer>"
  after it; when it holds a \\boxed{}, the box's content (no box content: the answer is wrong).
- `boxed` (the course's `question_only_reward_fn`): the format holds when the response has a closed
  \\boxed{...}; the answer is the last box's content.

The answer is graded even when the format is wrong (the grader's own extraction of the whole response), so
all four classes (`CLASSES`, format wrong/right x answer wrong/right) are measured: "format wrong, answer
right" is the share a stricter format costs.
"""

from __future__ import annotations

import re

from math_grader import equivalent_answers, extract_answer, grade_batch

FORMATS = ("r1_zero", "boxed")
WHITESPACE = ("one_space", "any")
CLASSES = ("fmt_wrong_ans_wrong", "fmt_wrong_ans_right", "fmt_right_ans_wrong", "fmt_right_ans_right")
_ANY_SPACE_RE = re.compile(r"</think>\s*<answer>")


def check_format(answer_format: str, whitespace: str) -> None:
    if answer_format not in FORMATS:
        raise ValueError(f"answer_format must be one of {FORMATS}, got {answer_format!r}")
    if whitespace not in WHITESPACE:
        raise ValueError(f"whitespace must be one of {WHITESPACE}, got {whitespace!r}")


def formatted_answer(response: str, answer_format: str = "r1_zero", whitespace: str = "one_space"):
    """(format holds, the answer it gives or None) of one response."""
    check_format(answer_format, whitespace)
    response = response or ""
    if answer_format == "boxed":
        start = max(response.rfind("\\boxed"), response.rfind("\\fbox"))
        tail = response[start:] if start >= 0 else ""
        if not tail or "}" not in tail:
            return False, None
        answer = extract_answer(tail)
        return answer is not None, answer
    opened = (
        "</think> <answer>" in response
        if whitespace == "one_space"
        else _ANY_SPACE_RE.search(response) is not None
    )
    if not (opened and "</answer>" in response):
        return False, None
    inside = response.rsplit("<answer>", 1)[1]
    inside = inside.split("</answer>", 1)[0]
    if "\\boxed" in inside or "\\fbox" in inside:
        return True, extract_answer(inside) or None
    return True, inside.strip() or None


def classify(
    responses: list[str],
    golds: list[str],
    answer_format: str = "r1_zero",
    whitespace: str = "one_space",
    timeout_s: float = 3.0,
    num_workers: int | None = None,
) -> tuple[list[bool], list[bool]]:
    """(format holds, answer right) per response. A formatted response's answer is its tagged/boxed
    answer; an unformatted one's is the grader's extraction of the whole response."""
    if len(responses) != len(golds):
        raise ValueError(f"{len(responses)} responses but {len(golds)} golds")
    parsed = [formatted_answer(r, answer_format, whitespace) for r in responses]
    fmt = [ok for ok, _ in parsed]
    right = [False] * len(responses)
    tagged = [i for i, ok in enumerate(fmt) if ok]
    loose = [i for i, ok in enumerate(fmt) if not ok]
    if tagged:
        pairs = [(parsed[i][1] or "", str(golds[i])) for i in tagged]
        for i, ok in zip(tagged, equivalent_answers(pairs, timeout_s)):
            right[i] = bool(ok)
    if loose:
        graded = grade_batch(
            [responses[i] for i in loose], [str(golds[i]) for i in loose], timeout_s, num_workers
        )
        for i, g in zip(loose, graded):
            right[i] = g == 1.0
    return fmt, right


def class_rates(fmt: list[bool], right: list[bool]) -> dict[str, float]:
    """format_rate, answer_rate and the four class shares (0 for an empty batch)."""
    n = max(len(fmt), 1)
    counts = dict.fromkeys(CLASSES, 0)
    for f, a in zip(fmt, right):
        counts[f"fmt_{'right' if f else 'wrong'}_ans_{'right' if a else 'wrong'}"] += 1
    return {
        "format_rate": sum(fmt) / n,
        "answer_rate": sum(right) / n,
        **{k: v / n for k, v in counts.items()},
    }
