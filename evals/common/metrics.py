"""Pure metric functions shared by suites (no I/O): majority vote (by key or by an equivalence), best-of-k,
mean with a bootstrap CI. pass@k is math_grader/pass_at_k.py (train's held-out validation uses it too)."""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Sequence


def majority_index(keys: Sequence[Hashable | None], *, skip_unanswered: bool = False) -> int | None:
    """Index of the first sample whose key is the most common among `keys` (ties: the key seen first).

    A None key is a sample with no answer. By default it is a vote like any other (all None keys form
    one group), as Qwen2.5-Math's `rm_maj_eval` counts "" and lm-evaluation-harness counts "[invalid]":
    [None, "42", None, "42", "3"] elects the no-answer group. `skip_unanswered=True` (the option
    `--maj-skip-unanswered`) leaves them out; None is then returned when every key is None.
    """
    counts: dict[Hashable, int] = {}
    first: dict[Hashable, int] = {}
    for i, key in enumerate(keys):
        if key is None and skip_unanswered:
            continue
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, i)
    if not counts:
        return None
    best = max(counts.values())
    return min(first[k] for k, c in counts.items() if c == best)


def group_by_equivalence(answers: Sequence[str | None], equivalent) -> list[int]:
    """Group id of each answer: an answer joins the first earlier group whose FIRST member it is
    equivalent to (`equivalent(a, b) -> bool`), else opens a new group; None answers share one group.

    This is Qwen2.5-Math's `group_pred(use_symbol=True)`: votes counted by the grader's equivalence,
    so "1/2" and "\\frac{1}{2}" vote together.
    """
    heads: list[tuple[int, str | None]] = []  # (group id, first member)
    out: list[int] = []
    for a in answers:
        gid = None
        for g, head in heads:
            if (a is None and head is None) or (a is not None and head is not None and equivalent(a, head)):
                gid = g
                break
        if gid is None:
            gid = len(heads)
            heads.append((gid, a))
        out.append(gid)
    return out


def best_of_k_index(scores: Sequence[float]) -> int:
    """Index of the highest score, the first on ties (rm@k: the sample a scorer ranks best)."""
    if not scores:
        raise ValueError("best_of_k_index needs at least one score")
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


def mean_ci(
    values: Sequence[float], resamples: int = 1000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float, float]:
    """(mean, lo, hi): percentile bootstrap CI of the mean; (nan, nan, nan) for no values."""
    vals = [float(v) for v in values]
    if not vals:
        return math.nan, math.nan, math.nan
    mean = sum(vals) / len(vals)
    if len(vals) == 1:
        return mean, mean, mean
    rng = random.Random(seed)
    n = len(vals)
    means = sorted(sum(vals[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    lo = means[int(math.floor(alpha / 2 * (resamples - 1)))]
    hi = means[int(math.ceil((1 - alpha / 2) * (resamples - 1)))]
    return mean, lo, hi
