"""The question an experiment with arms asks: is one arm better than the other, beyond seed noise?

An experiment file names its arms (`arms:` in experiments/<name>.yaml, each a set of grid values):

    arms:
      DARLING: {reward.combine: multiplicative}
      GRPO: {reward.combine: quality}

A run belongs to the arm whose values its grid point (or its config params) matches; runs of different
arms with the same remaining grid values (the seed) are a pair. Per arm and metric: the mean over runs
with a Student-t 95% CI, clipped to the metric's range (analysis.headline.metric_range) and marked when
clipped, drawn only from MIN_SEEDS_FOR_CI seeds up (below that the seeds' values are shown instead); per
pair of arms: the paired difference (first arm minus the other, one value per seed) with its CI, and a
one-line verdict. An experiment without `arms:` gets one arm per grid
point without its seed. Pure functions on `analysis.store` tables, except `experiment_arms` (reads YAML).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

import pandas as pd
from omegaconf import OmegaConf
from scipy import stats

from analysis.headline import difference_range
from analysis.store import AnalysisError, load_runs

CONFIDENCE = 0.95
# With 2 seeds a t interval multiplies the spread by t_{0.975,1} = 12.7: wider than most metrics' range.
MIN_SEEDS_FOR_CI = 3
CLIPPED_MARK = "*"  # after an interval cut at its metric's range


@dataclass(frozen=True)
class Estimate:
    """mean with its CI over `n` values (`values`, in seed order); lo/hi are NaN when there is no interval
    (n < 2 for `t_interval`, n < MIN_SEEDS_FOR_CI for `interval`); `clipped`: cut at the metric's range."""

    mean: float
    lo: float
    hi: float
    n: int
    values: tuple[float, ...] = ()
    clipped: bool = False

    @property
    def has_ci(self) -> bool:
        return not math.isnan(self.lo)

    def text(self, digits: int = 3, signed: bool = False) -> str:
        """`m [lo, hi]` (`*`: clipped), else the seeds' values: `m (seeds a, b)`, `m (one seed)`."""
        f = f"{'+' if signed else ''}.{digits}g"
        if math.isnan(self.mean):
            return "-"
        self = Estimate(
            tidy(self.mean),
            tidy(self.lo),
            tidy(self.hi),
            self.n,
            tuple(map(tidy, self.values)),
            self.clipped,
        )
        if self.has_ci:
            return f"{self.mean:{f}} [{self.lo:{f}}, {self.hi:{f}}]{CLIPPED_MARK if self.clipped else ''}"
        if self.n == 1:
            return f"{self.mean:{f}} (one seed)"
        if self.values:
            return f"{self.mean:{f}} (seeds {', '.join(f'{v:{f}}' for v in self.values)})"
        return f"{self.mean:{f}} (n={self.n})"


def t_interval(values: list[float], confidence: float = CONFIDENCE) -> Estimate:
    """Mean and Student-t CI: mean +- t_{(1+c)/2, n-1} * sd / sqrt(n); NaNs are dropped."""
    vals = [float(v) for v in values if not math.isnan(float(v))]
    n = len(vals)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    mean = sum(vals) / n
    if n == 1:
        return Estimate(mean, math.nan, math.nan, 1, tuple(vals))
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * sd / math.sqrt(n)
    return Estimate(mean, mean - half, mean + half, n, tuple(vals))


def interval(values: list[float], bounds: tuple[float, float] | None = None) -> Estimate:
    """What the report shows: the t interval clipped to `bounds` (marked `clipped`) from MIN_SEEDS_FOR_CI
    values up; with fewer, the mean and the values without an interval."""
    e = t_interval(values)
    if e.n < MIN_SEEDS_FOR_CI:
        return Estimate(e.mean, math.nan, math.nan, e.n, e.values)
    if bounds is None:
        return e
    lo, hi = max(e.lo, float(bounds[0])), min(e.hi, float(bounds[1]))
    return Estimate(e.mean, lo, hi, e.n, e.values, clipped=(lo, hi) != (e.lo, e.hi))


def paired_difference(
    a: dict[str, float], b: dict[str, float], bounds: tuple[float, float] | None = None
) -> Estimate:
    """a - b over the pair keys (seeds) both have (in a's order), with its `interval` (bounds: the
    difference's range)."""
    keys = [k for k in a if k in b and not math.isnan(a[k]) and not math.isnan(b[k])]
    return interval([a[k] - b[k] for k in keys], bounds)


def tidy(x: float) -> float:
    """`x` for printing: no -2.8e-17 from a difference of equal floats, no -0."""
    return round(x, 12) + 0.0


def seed_signs(values: list[float]) -> str:
    """How per-seed differences agree: "higher"/"lower"/"equal" in every seed, "higher or equal",
    "lower or equal" (one direction, some seeds equal) or "sign varies"."""
    if all(v > 0 for v in values):
        return "higher"
    if all(v < 0 for v in values):
        return "lower"
    if all(v == 0 for v in values):
        return "equal"
    if all(v >= 0 for v in values):
        return "higher or equal"
    return "lower or equal" if all(v <= 0 for v in values) else "sign varies"


def verdict(
    metric: str, first: str, other: str, diff: Estimate, digits: int = 3, better: str | None = None
) -> str:
    """One line: "<metric>: " + `verdict_clause`."""
    if diff.n == 0:
        return f"{metric}: no paired runs of {first} and {other}"
    return f"{metric}: {verdict_clause(first, other, diff, digits, better)}"


def verdict_clause(first: str, other: str, diff: Estimate, digits: int = 3, better: str | None = None) -> str:
    """ "<first> higher than <other> by x [lo, hi], n seeds", "... lower ...", no difference beyond noise;
    below MIN_SEEDS_FOR_CI seeds the per-seed differences and how many seeds an interval needs. With
    `better` ("higher"/"lower", a headline's direction) it says better/worse instead of higher/lower."""
    if diff.n == 0:
        return f"no paired runs of {first} and {other}"
    up, down = {"higher": ("better", "worse"), "lower": ("worse", "better")}.get(
        better or "", ("higher", "lower")
    )
    mean, values = tidy(diff.mean), [tidy(v) for v in diff.values]
    f = f"+.{digits}g"
    if not diff.has_ci:
        need = f"an interval needs {MIN_SEEDS_FOR_CI} or more seeds"
        if diff.n == 1:
            return f"{first} - {other} = {mean:{f}} on one seed ({need})"
        seeds = ", ".join(f"{v:{f}}" for v in values)
        every = "both seeds" if diff.n == 2 else f"all {diff.n} seeds"
        signs = seed_signs(values)
        if signs in ("higher", "lower"):
            return f"{first} {up if signs == 'higher' else down} than {other} in {every} ({seeds}); {need}"
        if signs == "equal":
            return f"no difference in any of the {diff.n} seeds; {need}"
        if signs == "sign varies":
            return f"{first} - {other} changes sign across the {diff.n} seeds ({seeds}); {need}"
        # one direction, some seeds equal
        word, k = (
            (up, sum(v > 0 for v in values))
            if signs == "higher or equal"
            else (down, sum(v < 0 for v in values))
        )
        return f"{first} {word} than {other} in {k} of {diff.n} seeds, equal in the rest ({seeds}); {need}"
    lo, hi = tidy(diff.lo), tidy(diff.hi)
    span = f"[{lo:{f}}, {hi:{f}}]{CLIPPED_MARK if diff.clipped else ''}, {diff.n} seeds"
    if lo > 0:
        return f"{first} {up} than {other} by {mean:.{digits}g} {span}"
    if hi < 0:
        return f"{first} {down} than {other} by {-mean:.{digits}g} {span}"
    return f"no difference beyond noise ({first} - {other} = {mean:{f}} {span})"


def reading(diff: Estimate) -> str:
    """A difference in a word or three, for a table column."""
    if diff.n == 0:
        return "-"
    values = [tidy(v) for v in diff.values]
    if not diff.has_ci:
        if diff.n == 1:
            return "one seed"
        every = "both seeds" if diff.n == 2 else f"all {diff.n} seeds"
        signs = seed_signs(values)
        return f"{signs} in {every}" if signs in ("higher", "lower") else signs
    if tidy(diff.lo) > 0:
        return "higher"
    if tidy(diff.hi) < 0:
        return "lower"
    return "no difference beyond noise"


# ---- arms of an experiment -----------------------------------------------------------------------


def experiment_arms(experiment: str) -> dict[str, dict[str, object]]:
    """`arms:` of experiments/<experiment>.yaml (name -> grid values), or {} when it names none."""
    from train.config import ConfigError, experiment_file

    try:
        path = experiment_file(experiment)
    except ConfigError:  # an MLflow experiment without a file (ad-hoc runs): arms come from the grid
        return {}
    arms = OmegaConf.to_container(OmegaConf.load(path).get("arms", {}) or {}, resolve=True)
    bad = [name for name, values in arms.items() if not isinstance(values, dict) or not values]
    if bad:
        raise AnalysisError(
            f"{path}: arms {bad} must each map grid keys to values, e.g. DARLING: {{reward.combine: multiplicative}}"
        )
    return arms


def _same(value: object, wanted: object) -> bool:
    if isinstance(value, str) and not isinstance(wanted, str):  # MLflow params are strings
        try:
            value = OmegaConf.from_dotlist([f"v={value}"]).v
        except Exception:
            return False
    return value == wanted or str(value) == str(wanted)


def arm_of(point: dict, params: dict, arms: dict[str, dict]) -> str | None:
    """The first arm whose every value equals the run's grid point value (else its config param)."""
    for name, values in arms.items():
        if all(
            _same(point[k], v) if k in point else k in params and _same(params[k], v)
            for k, v in values.items()
        ):
            return name
    return None


def pair_key(point: dict, arms: dict[str, dict]) -> str:
    """What pairs runs across arms: the grid point without the arms' keys (usually just the seed)."""
    arm_keys = {k for values in arms.values() for k in values}
    return json.dumps({k: v for k, v in sorted(point.items()) if k not in arm_keys}, sort_keys=True)


def with_arms(runs: pd.DataFrame, arms: dict[str, dict]) -> pd.DataFrame:
    """`runs` (a `load_runs` table) plus `arm` and `pair` columns; runs outside every arm are dropped.

    Without declared arms, each group (grid point minus seed) is an arm."""
    out = runs.copy()
    if out.empty:
        return out.assign(arm=pd.Series(dtype=str), pair=pd.Series(dtype=str))
    points = [json.loads(p) if p else {} for p in out.get("grid_point", pd.Series([""] * len(out)))]
    if not arms:
        out["arm"] = out["group"]
        out["pair"] = [
            json.dumps({k: v for k, v in sorted(p.items()) if k.split(".")[-1] == "seed"}) for p in points
        ]
        return out
    params = [
        {
            c[len("param:") :]: row[c]
            for c in out.columns
            if c.startswith("param:") and isinstance(row[c], str)
        }
        for _, row in out.iterrows()
    ]
    out["arm"] = [arm_of(p, q, arms) for p, q in zip(points, params)]
    out["pair"] = [pair_key(p, arms) for p in points]
    return out[out["arm"].notna()].reset_index(drop=True)


def arm_order(table: pd.DataFrame, arms: dict[str, dict]) -> list[str]:
    """Declared order (the first arm is the method, the rest its baselines), else sorted."""
    present = set(table["arm"]) if "arm" in table else set()
    return [a for a in arms if a in present] if arms else sorted(present)


Ranges = dict[str, tuple[float, float] | None]


def _natural_keys(pairs: pd.Series) -> pd.Series:
    """Seed order 1, 2, 10 (not "1", "10", "2") for the per-seed values."""
    return pairs.map(
        lambda p: tuple((0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", str(p)))
    )


def arm_summary(
    table: pd.DataFrame, metrics: list[str], order: list[str], ranges: Ranges | None = None
) -> dict[str, dict[str, Estimate]]:
    """arm -> metric -> mean with its `interval` over the arm's runs (seeds, in pair order), clipped to
    `ranges[metric]`."""
    ranges = ranges or {}
    out: dict[str, dict[str, Estimate]] = {}
    for arm in order:
        sub = table[table["arm"] == arm]
        if "pair" in sub:
            sub = sub.sort_values("pair", kind="stable", key=_natural_keys)
        out[arm] = {
            m: interval(list(pd.to_numeric(sub[m], errors="coerce")), ranges.get(m))
            if m in table
            else Estimate(math.nan, math.nan, math.nan, 0)
            for m in metrics
        }
    return out


def comparisons(
    table: pd.DataFrame,
    metrics: list[str],
    order: list[str],
    ranges: Ranges | None = None,
    better: dict[str, str] | None = None,
) -> list[dict]:
    """Per metric and baseline arm: the paired difference (first arm - baseline, its interval clipped to
    the difference's range) and its verdict line (better/worse for metrics in `better`)."""
    out = []
    if len(order) < 2:
        return out
    first = order[0]
    ranges, better = ranges or {}, better or {}

    def by_pair(arm: str, m: str) -> dict[str, float]:
        sub = table[table["arm"] == arm].sort_values("pair", kind="stable")
        return dict(zip(sub["pair"], pd.to_numeric(sub[m], errors="coerce"))) if m in sub else {}

    for m in metrics:
        for other in order[1:]:
            diff = paired_difference(by_pair(first, m), by_pair(other, m), difference_range(ranges.get(m)))
            out.append(
                {
                    "metric": m,
                    "arm": first,
                    "baseline": other,
                    "diff": diff,
                    "verdict": verdict(m, first, other, diff, better=better.get(m)),
                }
            )
    return out


ALL_SWEEPS = "all"


def select_runs(table: pd.DataFrame, sweep: str | None = None) -> pd.DataFrame:
    """Pure: the runs a comparison reads, one per (arm, pair).

    `sweep=None`: the newest sweep's runs when any run belongs to a sweep (a later sweep of the same
    experiment with another config, or a longer variant, never mixes into it); `"all"` (or a sweep id,
    already filtered by the store): every run. Either way a point run twice (resubmitted, or repeated in
    two sweeps) counts once: its newest run."""
    if table.empty:
        return table
    if sweep is None and "sweep" in table and (table["sweep"] != "").any():
        tagged = table[table["sweep"] != ""].sort_values("start_time", kind="stable")
        table = table[table["sweep"] == tagged["sweep"].iloc[-1]]
    keys = [k for k in ("arm", "pair") if k in table]
    return (
        table.sort_values("start_time", kind="stable")
        .drop_duplicates(keys, keep="last")
        .reset_index(drop=True)
    )


def load_arm_runs(
    experiment: str, sweep: str | None = None, uri: str | None = None
) -> tuple[pd.DataFrame, dict]:
    """`store.load_runs` with `arm` and `pair` columns and the arms the experiment declares, selected by
    `select_runs` (default: the newest sweep; `sweep="all"`: every run; else that sweep id)."""
    arms = experiment_arms(experiment)
    runs = load_runs(experiment, sweep=None if sweep in (None, ALL_SWEEPS) else sweep, uri=uri)
    return select_runs(with_arms(runs, arms), sweep), arms
