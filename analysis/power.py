"""How many seeds would make a paired comparison decisive, from the spread the seeds showed so far.

With per-seed paired differences d_1..d_k (mean d, standard deviation s), a two-sided paired t test at 95%
tells d from 0 with n seeds when t_{0.975, n-1} * s / sqrt(n) < |d|: the interval of n seeds with the
observed mean and spread excludes 0. t depends on n, so n is found by counting up. That is the seed count
at which a result like the observed one is just significant (about half of such repeats would be); the
count for 80% power (noncentral t) is given beside it. Both take the observed s as the true spread,
which with 2 or 3 seeds is itself a rough estimate. Pure functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats

CONFIDENCE = 0.95
POWER = 0.8
MAX_SEEDS = 10_000


@dataclass(frozen=True)
class SeedsNeeded:
    """`mean`/`sd` of the observed paired differences over `n` seeds; `to_detect`: the fewest seeds whose
    interval excludes 0 at the observed mean and spread; `for_power`: the fewest for 80% power. None where
    it cannot be estimated (fewer than 2 seeds, a zero mean) or exceeds MAX_SEEDS (see `reason`)."""

    mean: float
    sd: float
    n: int
    to_detect: int | None
    for_power: int | None
    reason: str = ""


def _half_width_ratio(n: int, confidence: float) -> float:
    """t_{(1+c)/2, n-1} / sqrt(n): the interval's half-width per unit of standard deviation."""
    return stats.t.ppf((1 + confidence) / 2, n - 1) / math.sqrt(n)


def power_at(n: int, effect_size: float, confidence: float = CONFIDENCE) -> float:
    """Power of the two-sided paired t test with n seeds when the true mean / sd is `effect_size`."""
    df = n - 1
    crit = stats.t.ppf((1 + confidence) / 2, df)
    nc = abs(effect_size) * math.sqrt(n)
    return float(stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc))


def seeds_needed(
    diffs: list[float], confidence: float = CONFIDENCE, power: float = POWER, min_seeds: int = 2
) -> SeedsNeeded:
    """From the per-seed paired differences (NaNs dropped), the seeds a decisive comparison needs."""
    d = [float(v) for v in diffs if not math.isnan(float(v))]
    k = len(d)
    mean = sum(d) / k if k else math.nan
    if k < 2:
        return SeedsNeeded(mean, math.nan, k, None, None, "the spread needs 2 or more seeds")
    sd = math.sqrt(sum((v - mean) ** 2 for v in d) / (k - 1))
    if abs(mean) < 1e-12:
        return SeedsNeeded(mean, sd, k, None, None, "the observed difference is 0")
    start = max(2, min_seeds)
    if sd < 1e-12 * max(1.0, abs(mean)):
        return SeedsNeeded(mean, sd, k, start, start, "no spread between seeds observed")
    effect = abs(mean) / sd
    detect = next((n for n in range(start, MAX_SEEDS + 1) if _half_width_ratio(n, confidence) < effect), None)
    powered = None
    if detect is not None:
        powered = next(
            (n for n in range(detect, MAX_SEEDS + 1) if power_at(n, effect, confidence) >= power), None
        )
    reason = "" if detect is not None and powered is not None else f"more than {MAX_SEEDS} seeds"
    return SeedsNeeded(mean, sd, k, detect, powered, reason)
