"""The project's one math answer grader: RL reward and `evals.math` both use it.

Follows the Qwen2.5-Math evaluation harness (docs/evals.md, "Math"): extract the final answer
(choice letter, "final answer is $..$. I hope", last \\boxed{}, <answer> tags, "####", "the answer is" /
"Answer:" and their translations, last number), normalise it, then compare: strings, numbers (rel tol
1e-4; a decimal gold is taken as rounded), percentages, choices, clock times, numbers in other bases,
quantities with units, tuples/intervals, sets, matrices, equations, and finally sympy. The conventions of
each answer format are written down in `math_grader.forms` and tested per family in tests/grader_cases/.

Boxes: the last \\boxed{} wins (a later box corrects an earlier one); boxes joined only by "and"/"or"/commas
are one listed answer ('x = \\boxed{2} or x = \\boxed{3}' is '2, 3'); a box inside a box is its content.
Lists and sets compare in any order unless the question asks for an order (`ordered=True`); tuples,
vectors and intervals are always ordered.

Safety: model text never reaches eval/exec/sympify; a whitelist parser (`math_grader.parse`) builds sympy
objects and rejects absurd numbers. Every sympy comparison runs in a worker process with a hard time
limit (`math_grader.pool`); cheap cases are decided in the calling process so the common case stays fast.
Every scan of the text is linear, a response is cut to its last MAX_RESPONSE_CHARS and an answer longer
than MAX_ANSWER_CHARS (either side) is compared as a string only, so `grade` stays bounded on any input.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from math_grader.equiv import quick_equiv
from math_grader.pool import get_pool, shutdown_pool
from math_grader.text import (
    MAX_RESPONSE_CHARS,
    is_solution,
    last_boxed,
    normalize_answer,
    reduce_arithmetic_chain,
)
from math_grader.text import extract_answer as _extract

__all__ = [
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


def extract_answer(text: str) -> str | None:
    """Final answer of a response by the harness's rules (first that applies), or None if there is none."""
    return _extract(text)


def _answer_text(text: str) -> str:
    """The answer a side of a comparison states, by the same rule for the prediction and the gold: a
    solution (`math_grader.text.is_solution`: an answer marker, or prose) gets its final answer extracted;
    an answer (however long: a big matrix) is left alone."""
    text = str(text)
    return (extract_answer(text) or text) if is_solution(text) else reduce_arithmetic_chain(text)


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
    pairs: list[tuple[str | None, str]], timeout_s: float, num_workers: int | None, ordered: bool
) -> list[bool]:
    """Decide cheap pairs here, send the rest (deduplicated, cache-checked) to the worker pool."""
    deadline = time.monotonic() + timeout_s
    out: list[bool | None] = []
    pending: dict[tuple[str, str, bool], list[int]] = {}
    for i, (pred, gold) in enumerate(pairs):
        if pred is None or not str(pred).strip():
            out.append(False)
            continue
        key = (str(pred).strip(), _answer_text(gold).strip(), ordered)
        if len(key[0]) > MAX_ANSWER_CHARS or len(key[1]) > MAX_ANSWER_CHARS:
            out.append(key[0] == key[1])  # no real answer is this long: exact match only, no parsing
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


def is_equiv(prediction: str, gold: str, timeout_s: float = 3.0, *, ordered: bool = False) -> bool:
    """Whether a prediction equals the gold answer (hard time limit; a time-out is False).

    A whole solution is accepted too: its final answer is extracted first. ordered: the question asks
    for an ordered list, so '2, 1' is not '1, 2'.
    """
    return _equiv_many([(_answer_text(prediction), gold)], timeout_s, None, ordered)[0]


def equivalent_answers(
    pairs: list[tuple[str, str]], timeout_s: float = 3.0, *, ordered: bool = False
) -> list[bool]:
    """Whether each pair of extracted answers is the same answer (e.g. two responses' final answers)."""
    return _equiv_many(list(pairs), timeout_s, None, ordered)


def grade(response: str, gold: str, timeout_s: float = 3.0, *, ordered: bool = False) -> float:
    """1.0 if the response's extracted answer equals gold, else 0.0; extraction and comparison together
    take at most about timeout_s."""
    deadline = time.monotonic() + timeout_s
    answer = extract_answer(response or "") or ""
    ok = _equiv_many([(answer, gold)], max(0.05, deadline - time.monotonic()), None, ordered)[0]
    return 1.0 if ok else 0.0


def grade_batch(
    responses: list[str],
    golds: list[str],
    timeout_s: float = 3.0,
    num_workers: int | None = None,
    *,
    ordered: bool = False,
) -> list[float]:
    """Grade many responses: cheap cases inline, the rest in parallel workers, each with a hard limit."""
    if len(responses) != len(golds):
        raise ValueError(f"{len(responses)} responses but {len(golds)} golds")
    pairs = [(extract_answer(r or ""), g) for r, g in zip(responses, golds)]
    return [1.0 if ok else 0.0 for ok in _equiv_many(pairs, timeout_s, num_workers, ordered)]
