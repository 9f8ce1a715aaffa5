"""Properties of the grader on every family (tuned and held-out cases): an answer equals itself, both sides
go through the same extraction, the last committed answer wins, a wrong "true" is rarer than a wrong
"false"; and the answer of a long response is read after its last answer marker, not from a fixed tail.
"""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

from math_grader import _answer_text, extract_answer, grade, is_equiv, normalize_answer, start_workers
from math_grader.pool import get_pool
from math_grader.text import MAX_RESPONSE_CHARS
from tests.grader_cases import CONVENTION_DISAGREES, HELDOUT_DIR, load_cases

CASES = load_cases() + load_cases(HELDOUT_DIR)
FAMILIES = sorted({c.family for c in CASES})
TIMEOUT_S = 30.0  # verdicts, not speed (a loaded machine must not turn a slow comparison into a "no")


def _by_family(select) -> dict[str, list]:
    out: dict[str, list] = defaultdict(list)
    for case in CASES:
        if select(case):
            out[case.family].append(case)
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_an_answer_grades_equal_to_itself(family: str) -> None:
    """grade(s, s) == 1 whenever s holds an answer, a whole response or a bare answer, either side (an empty
    box holds none: it equals nothing, tests/test_math_grader_issue46.py)."""
    misses = []
    for case in (c for c in CASES if c.family == family):
        for text in (case.pred, case.gold):
            if not normalize_answer(_answer_text(text)):
                continue  # the grader reads no answer in it ('The answer is $\\boxed{}$.')
            if case.whole_response and text is case.pred:
                if extract_answer(text) is not None and grade(text, text, TIMEOUT_S) != 1.0:
                    misses.append(text)
            elif not is_equiv(text, text, TIMEOUT_S):
                misses.append(text)
    assert not misses, misses[:10]


@pytest.mark.parametrize("family", FAMILIES)
def test_both_sides_share_one_extraction(family: str) -> None:
    """A whole response given as the gold states the same answer as when it is graded."""
    misses = []
    for case in (c for c in CASES if c.family == family and c.whole_response):
        answer = extract_answer(case.pred)
        if answer is not None and not is_equiv(answer, case.pred, TIMEOUT_S):
            misses.append((case.pred, answer))
    assert not misses, misses[:10]


# a first answer, then a retraction and the committed one, in the forms models write
RETRACTIONS = (
    "The answer is $\\boxed{{{first}}}$. Wait, that is wrong; the answer is $\\boxed{{{last}}}$.",
    "Final Answer: The final answer is ${first}$. I hope it is correct.\n\nWait, let me correct that: "
    "$\\boxed{{{last}}}$",
    "$\\boxed{{{first}}}$\n\nOn reflection I miscounted.\nFinal Answer: The final answer is ${last}$. "
    "I hope it is correct.",
    "So the answer is {first}.\n\nHold on, I dropped a term. The answer is: {last}",
)


def _retraction_pairs(family: str) -> list[tuple[str, str, str]]:
    """(right, wrong, gold) from one family: a right bare answer and a wrong one for the same gold."""

    def bare(c) -> bool:
        return (
            not c.whole_response and not c.ordered and "$" not in c.pred and c.id not in CONVENTION_DISAGREES
        )

    right = _by_family(lambda c: c.expected and bare(c))[family]
    wrong = _by_family(lambda c: not c.expected and bare(c))[family]
    pairs = []
    for r in right:
        for w in wrong:
            if w.gold == r.gold and "\\text{ or }" not in r.pred + w.pred:
                pairs.append((r.pred, w.pred, r.gold))
                break
    return pairs[:8]


FAMILIES_WITH_PAIRS = [f for f in FAMILIES if _retraction_pairs(f)]


@pytest.mark.parametrize("family", FAMILIES_WITH_PAIRS)
def test_the_last_committed_answer_wins(family: str) -> None:
    """A retracted answer earns nothing and the committed one after it earns the reward, whichever form
    (box, "final answer is", answer phrase) each one takes."""
    misses = []
    for right, wrong, gold in _retraction_pairs(family):
        for template in RETRACTIONS:
            corrected = template.format(first=wrong, last=right)
            retracted = template.format(first=right, last=wrong)
            if grade(corrected, gold, TIMEOUT_S) != 1.0:
                misses.append(("corrected", corrected, gold))
            if grade(retracted, gold, TIMEOUT_S) != 0.0:
                misses.append(("retracted", retracted, gold))
    assert not misses, misses[:10]


def test_retraction_pairs_cover_most_families() -> None:
    assert len(FAMILIES_WITH_PAIRS) >= 15, FAMILIES_WITH_PAIRS


def _accuracy(cases) -> float:
    right = 0
    for c in cases:
        if c.whole_response:
            verdict = grade(c.pred, c.gold, TIMEOUT_S, ordered=c.ordered) == 1.0
        else:
            verdict = is_equiv(c.pred, c.gold, TIMEOUT_S, ordered=c.ordered)
        right += verdict is c.expected
    return right / len(cases)


def test_a_wrong_true_is_rarer_than_a_wrong_false() -> None:
    """Reward for a wrong answer is worse than none for a right one: expected-false accuracy is at least
    expected-true accuracy, over the tuned and the held-out cases."""
    assert _accuracy([c for c in CASES if not c.expected]) >= _accuracy([c for c in CASES if c.expected])


def test_a_unit_on_one_side_gets_one_verdict_whichever_side_carries_it() -> None:
    bare = [c for c in CASES if c.family in ("units", "units_sides") and not c.whole_response]
    asymmetric = [
        (c.pred, c.gold)
        for c in bare
        if is_equiv(c.pred, c.gold, TIMEOUT_S) != is_equiv(c.gold, c.pred, TIMEOUT_S)
    ]
    assert not asymmetric, asymmetric


# ------------------------------------------------------------------------------------------------------
# long responses (issue 26 item 6): the window follows the last answer marker
# ------------------------------------------------------------------------------------------------------
def test_a_box_longer_than_the_window_stays_the_answer() -> None:
    """A 100k-character boxed answer was cut to its last 30k characters, which lost the box, and the
    last bare number after it was graded (1.0 here on the old code)."""
    response = "We expand the product. $\\boxed{" + "x+" * 50_000 + "1}$ and the check gives 7."
    assert len(response) > 3 * MAX_RESPONSE_CHARS
    assert extract_answer(response).startswith("x+x+")
    assert grade(response, "7") == 0.0
    assert grade(response, response) == 1.0  # the same (long, string-compared) answer on both sides


def test_the_answer_before_long_trailing_text_is_kept() -> None:
    """A box followed by more than a window of chatter: the box, not the chatter's last number."""
    response = "So the answer is $\\boxed{42}$." + " Checking again, 3 times 14 is 42 and 5 is odd." * 1_500
    assert len(response) > 2 * MAX_RESPONSE_CHARS
    assert extract_answer(response) == "42"
    assert grade(response, "42") == 1.0
    assert grade(response, "5") == 0.0


def test_the_last_marker_of_a_long_response_wins() -> None:
    early = "The answer is \\boxed{3}. " + "Let me reconsider the count. " * 3_000
    assert extract_answer(early + "Final Answer: The final answer is $4$. I hope it is correct.") == "4"
    assert extract_answer(early) == "3"


def test_long_responses_are_read_in_bounded_time() -> None:
    """Finding the last marker is linear: a million characters of text with no marker, with a marker at
    the start, and with phrases everywhere, each graded well within a second."""
    texts = [
        "word 7 " * 150_000,
        "\\boxed{1}" + " no marker here" * 70_000,
        "the answer is 1. " * 60_000,
        "\\boxed{" + "{" * 500_000,
    ]
    for text in texts:
        start = time.perf_counter()
        grade(text, "1")
        assert time.perf_counter() - start < 2.0, text[:40]


def test_start_workers_returns_at_once_and_the_workers_get_ready() -> None:
    """The reward and the eval start the sympy workers when they are built; starting does not wait."""
    get_pool().close()
    start = time.perf_counter()
    start_workers()
    started_in = time.perf_counter() - start
    assert started_in < 0.5, started_in
    assert get_pool()._workers and all(w.proc.poll() is None for w in get_pool()._workers)
    assert is_equiv("\\frac{x^2-1}{x-1}", "x+1", TIMEOUT_S)


def test_the_math_reward_starts_the_workers_when_built() -> None:
    """Built, the reward has the sympy workers starting, so its first grading call does not wait for them;
    a bad answer rule is one line naming the key."""
    from train.rewards.math_reward import MathReward

    get_pool().close()
    reward = MathReward()
    assert get_pool()._workers and all(w.proc.poll() is None for w in get_pool()._workers)
    assert reward.answer_rule == "last"
    with pytest.raises(ValueError, match=r"reward.answer_rule='minerva'; valid: last, qwen"):
        MathReward(answer_rule="minerva")
