"""The project's one math answer grader: RL reward and `evals.math` both use it.

Conventions (chosen for rewards after reading Math-Verify, Qwen2.5-Math's evaluation grader, lm-eval's
minerva_math, NeMo-Skills, lighteval, Hendrycks' MATH is_equiv, DeepScaleR and understand-r1-zero; where
they disagree, no reward for a retracted or non-final answer and never "true" for a different answer):

- Extraction (`extract_answer`): every answer marker is a candidate (a box, or boxes joined only by
  connectors such as 'and' or '\\quad\\text{and}\\quad'; "final answer is $..$. I hope"; <answer> tags;
  '####'; "the answer is" / "Answer:" and their translations; a choice said in prose, "which makes the
  answer D"). The LAST one in the text wins: a correction replaces an earlier answer whatever the forms
  (Qwen and Math-Verify rank "final answer is .. I hope" above any later box: rule="qwen" keeps that
  order, the math eval's default, for published numbers). A phrase that states no answer ("the answer is
  correct since ...") leaves the one before it; a phrase followed by a sentence answers its final
  expression ("Final Answer: The smallest $k$ is 12." is 12); a run into a new "Problem:" ends the
  response. Without a marker: the whole text when it is a bare answer, else the final expression (the
  last number of its own, never digits inside a word such as 'QX7RT'; the last $...$ span holding it;
  spans joined by 'and'/commas are one list); CJK sentences likewise ("所以结果是 5/8" is 5/8).
- Both sides of a comparison go through the same extraction: a gold that is a solution (an answer marker
  or prose) is read like a response, so grade(s, s) == 1 whenever s holds an answer.
- Comparison: strings, numbers (rel tol 1e-4; a decimal gold is taken as rounded), percentages, choices
  (a marked letter B' or B* is another label; a gold "B Paris" or "(B) 12" is the letter B, whose text
  also matches), clock times, numbers in other bases, quantities with units (a unit on one side only is
  dropped, whichever side it is on), tuples/intervals, sets, matrices, equations, named values ('(x, y)
  = (1, 4)' and 'x = 1, y = 4' compare by name), and finally sympy. A comma followed by a space separates
  list items ('12, 345' is two numbers); '1,234' groups thousands; a lone comma between digits is a
  decimal comma against a single number ('3,75' = 3.75). The conventions of each answer format are
  written down in `math_grader.forms` and tested per family in tests/grader_cases/ (and the held-out
  families in tests/grader_cases/heldout/).

Lists and sets compare in any order unless the question asks for an order (`ordered=True`); tuples,
vectors and intervals are always ordered.

Conventions of issue 46 (held-out cases tests/grader_cases/heldout/i46_*.txt; where the field's graders
disagree, the reading that cannot be gamed, a wrong "true" being worse than a wrong "false"):

- Matrices and vectors: compared cell by cell whatever the environment (pmatrix = bmatrix = array in
  \\left( \\right)), shape included (a row is not a column); a column vector equals the tuple of its entries
  in order (Qwen's grader and Math-Verify; lm-eval and Hendrycks compare strings). A response that is only a
  matrix answers the matrix, never its last number.
- Doubled backslashes ('\\\\frac', a JSON string escaped twice): undoubled on either side, but only when every
  backslash is doubled and one starts a command or brace (Qwen's strip_string undoubles always, which would
  break a matrix's row break '\\\\' written once; Math-Verify and lm-eval do not undouble).
- Labelled answers ('|AB|=1', 'V_{1}:V_{2}=11:21', 'f(x)=1', 'P(A)=0.3', '\\angle ABC=30^\\circ'): the label is
  dropped, on one side or when both sides carry the same one (Math-Verify unwraps such assignments; lm-eval,
  Hendrycks and NeMo-Skills compare the whole string). An equation whose left side computes ('x+y=5') is
  the answer itself, never its right side.
- Choice letters: a letter ruled out ('not A', 'rather than A', '不是 A', 'A is wrong', '(A) cannot hold')
  is never the answer; a conclusion that is only a letter ('..., so B.', 'Hence (D).', 'B。') is (Qwen's
  choice_answer_clean takes the last capital letter, negated or not; lighteval the letter after "answer").
- Several boxes: boxes joined by connectors or math delimiters ('\\(\\boxed{1}\\) and \\(\\boxed{-2}\\)') are one
  listed answer. Boxes side by side or apart in prose: the last committed one, on both sides alike
  (Math-Verify joins every box into a set: on a prediction that would reward a retracted box).
- Order: a bare list is a set (Math-Verify; the project's cases); a tuple, named values or `ordered=True`
  compare in order (Qwen and lm-eval compare lists in order). The gold alone cannot say that order matters:
  the question does, through `ordered`.
- A unit on one side only is dropped (Qwen, Minerva, Math-Verify strip units); units on both sides convert;
  different kinds or a scale word ('10 thousand') differ. Dropping cannot be gamed: the number must match.
- An empty answer ('\\boxed{}', 'The answer is $\\boxed{}$.') states nothing and equals nothing, itself included
  (string-comparing graders give two empty boxes a "true"). '\\{\\}' and '\\emptyset' are answers.
- Inequalities in one unknown (also 'f(x)') are the intervals they describe, never a single number.
- '1,\\!000' and '1{,}000' are one number (MATH's thousands); a number's first thousands group never starts
  with 0, so '0,111' is the decimal 0.111 (Math-Verify, lighteval), while '1,234' groups thousands.

Safety and speed: model text never reaches eval/exec/sympify; a whitelist parser (`math_grader.parse`)
builds sympy objects and rejects absurd numbers. Every sympy comparison runs in a worker process with a
hard time limit (`math_grader.pool`), started with the reward or the eval (`start_workers`) so no call
waits for them; cheap cases are decided in the calling process. Every scan of the text is linear; a
response longer than MAX_RESPONSE_CHARS is read in a window of that size that starts just before its last
answer marker (so a 100k-character box stays the answer), and an answer longer than MAX_ANSWER_CHARS
(either side) is compared as a string only, so `grade` stays bounded on any input.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from math_grader.equiv import quick_equiv
from math_grader.pool import get_pool, shutdown_pool
from math_grader.text import (
    ANSWER_RULES,
    MAX_RESPONSE_CHARS,
    is_solution,
    last_boxed,
    normalize_answer,
    reduce_arithmetic_chain,
    undouble_backslashes,
)
from math_grader.text import extract_answer as _extract

__all__ = [
    "ANSWER_RULES",
    "equivalent_answers",
    "extract_answer",
    "grade",
    "grade_batch",
    "is_equiv",
    "last_boxed",
    "MAX_ANSWER_CHARS",
    "MAX_RESPONSE_CHARS",
    "normalize_answer",
    "shutdown_pool",
    "start_workers",
    "warm_up",
]

_CACHE_SIZE = 50_000
MAX_ANSWER_CHARS = 1000
_cache: OrderedDict[tuple[str, str, bool], bool] = OrderedDict()


def extract_answer(text: str, rule: str = "last") -> str | None:
    """The final answer of a response (the last committed one; rule="qwen": Qwen2.5-Math's order of
    rules), or None if there is none."""
    return _extract(text, rule)


def _answer_text(text: str, rule: str = "last") -> str:
    """The answer a side of a comparison states, by the same rule for the prediction and the gold: a
    solution (`math_grader.text.is_solution`: an answer marker, or prose) gets its final answer extracted;
    an answer (however long: a big matrix) is left alone."""
    text = undouble_backslashes(str(text))
    if not is_solution(text):
        return reduce_arithmetic_chain(text)
    answer = extract_answer(text, rule)
    if answer is None and last_boxed(text) is not None:
        return ""  # only empty boxes: no answer (not the text around them)
    return answer or text


def _cache_get(key: tuple[str, str, bool]) -> bool | None:
    value = _cache.get(key)
    if value is not None:
        _cache.move_to_end(key)
    return value


def _cache_put(key: tuple[str, str, bool], value: bool) -> None:
    _cache[key] = value
    if len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)


def _quick(pred: str, gold: str, ordered: bool) -> bool | None:
    try:
        return quick_equiv(pred, gold, ordered)
    except (RecursionError, ValueError, OverflowError, ZeroDivisionError):
        return None


def _equiv_many(
    pairs: list[tuple[str | None, str]],
    timeout_s: float,
    num_workers: int | None,
    ordered: bool,
    rule: str = "last",
) -> list[bool]:
    """Decide cheap pairs here, send the rest (deduplicated, cache-checked) to the worker pool."""
    deadline = time.monotonic() + timeout_s
    out: list[bool | None] = []
    pending: dict[tuple[str, str, bool], list[int]] = {}
    for i, (pred, gold) in enumerate(pairs):
        if pred is None or not str(pred).strip():
            out.append(False)
            continue
        key = (undouble_backslashes(str(pred)).strip(), _answer_text(gold, rule).strip(), ordered)
        if len(key[0]) > MAX_ANSWER_CHARS or len(key[1]) > MAX_ANSWER_CHARS:
            out.append(key[0] == key[1])  # no real answer is this long: exact match only, no parsing
            continue
        if not normalize_answer(key[0]) or not normalize_answer(key[1]):
            out.append(
                False
            )  # an empty answer ('\\boxed{}') states nothing: it equals nothing, itself included
            continue
        verdict = _quick(*key)
        verdict = _cache_get(key) if verdict is None else verdict
        out.append(verdict)
        if verdict is None:
            pending.setdefault(key, []).append(i)
    if pending:
        keys = list(pending)
        # one pair's comparison gets what is left of its time limit after the cheap steps
        budget = timeout_s if len(keys) > 1 else max(0.05, deadline - time.monotonic())
        results = get_pool(num_workers).run(keys, budget)
        for key, ok in zip(keys, results):
            _cache_put(key, ok)
            for i in pending[key]:
                out[i] = ok
    return [bool(v) for v in out]


def start_workers(num_workers: int | None = None) -> None:
    """Start the sympy worker processes without waiting for them: the math reward and the math eval call
    this when they are built, so the workers are ready by the time the first responses are graded and no
    grading call pays their start (~1-2 s of importing sympy)."""
    get_pool(num_workers).start()


def warm_up(num_workers: int | None = None) -> None:
    """Start the worker processes and wait until they have answered once (benchmarks, tests)."""
    get_pool(num_workers).run([("x+1", "1+x", False)], timeout_s=30.0)


def is_equiv(
    prediction: str, gold: str, timeout_s: float = 3.0, *, ordered: bool = False, rule: str = "last"
) -> bool:
    """Whether a prediction equals the gold answer (hard time limit; a time-out is False).

    A whole solution is accepted on either side: its final answer is extracted first, by the same rule
    for both. ordered: the question asks for an ordered list, so '2, 1' is not '1, 2'. rule: see
    `extract_answer`.
    """
    return _equiv_many([(_answer_text(prediction, rule), gold)], timeout_s, None, ordered, rule)[0]


def equivalent_answers(
    pairs: list[tuple[str, str]], timeout_s: float = 3.0, *, ordered: bool = False
) -> list[bool]:
    """Whether each pair of extracted answers is the same answer (e.g. two responses' final answers)."""
    return _equiv_many(list(pairs), timeout_s, None, ordered)


def grade(
    response: str, gold: str, timeout_s: float = 3.0, *, ordered: bool = False, rule: str = "last"
) -> float:
    """1.0 if the response's extracted answer equals gold, else 0.0; extraction and comparison together
    take at most about timeout_s. rule: see `extract_answer`."""
    deadline = time.monotonic() + timeout_s
    answer = extract_answer(response or "", rule) or ""
    ok = _equiv_many([(answer, gold)], max(0.05, deadline - time.monotonic()), None, ordered, rule)[0]
    return 1.0 if ok else 0.0


def grade_batch(
    responses: list[str],
    golds: list[str],
    timeout_s: float = 3.0,
    num_workers: int | None = None,
    *,
    ordered: bool = False,
    rule: str = "last",
) -> list[float]:
    """Grade many responses: cheap cases inline, the rest in parallel workers, each with a hard limit."""
    if len(responses) != len(golds):
        raise ValueError(f"{len(responses)} responses but {len(golds)} golds")
    pairs = [(extract_answer(r or "", rule), g) for r, g in zip(responses, golds)]
    return [1.0 if ok else 0.0 for ok in _equiv_many(pairs, timeout_s, num_workers, ordered, rule)]
