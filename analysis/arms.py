"""The question an experiment with arms asks: is one arm better than the other, beyond seed noise?

An experiment file names its arms (`arms:` in experiments/<name>.yaml, each a set of grid values):

    arms:
      DARLING: {reward.combine: multiplicative}
      GRPO: {reward.combine: quality}

A run belongs to the arm whose values its grid point (or its config params) matches; runs of different
arms with the same remaining grid values (the seed) are a pair. Per arm and metric: the mean over runs
with a Student-t 95% CI; per pair of arms: the paired difference (first arm minus the other, one value
per seed) with its t CI, and a one-line verdict. An experiment without `arms:` gets one arm per grid
point without its seed. Pure functions on `analysis.store` tables, except `experiment_arms` (reads YAML).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pandas as pd
from omegaconf import OmegaConf
from scipy import stats

from analysis.store import AnalysisError, load_runs

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Estimate:
    """mean with its CI over `n` values; lo/hi are NaN when n < 2 (no spread to estimate)."""

    mean: float
    lo: float
    hi: float
    n: int

    def text(self, digits: int = 3) -> str:
        if math.isnan(self.mean):
            return "-"
        if math.isnan(self.lo):
            return f"{self.mean:.{digits}g} (n={self.n})"
        return f"{self.mean:.{digits}g} [{self.lo:.{digits}g}, {self.hi:.{digits}g}]"


def t_interval(values: list[float], confidence: float = CONFIDENCE) -> Estimate:
    """Mean and Student-t CI: mean +- t_{(1+c)/2, n-1} * sd / sqrt(n); NaNs are dropped."""
    vals = [float(v) for v in values if not math.isnan(float(v))]
    n = len(vals)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    mean = sum(vals) / n
    if n == 1:
        return Estimate(mean, math.nan, math.nan, 1)
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
    half = stats.t.ppf((1 + confidence) / 2, n - 1) * sd / math.sqrt(n)
    return Estimate(mean, mean - half, mean + half, n)


def paired_difference(a: dict[str, float], b: dict[str, float]) -> Estimate:
    """a - b over the pair keys (seeds) both have, with its t CI."""
    keys = [k for k in a if k in b and not math.isnan(a[k]) and not math.isnan(b[k])]
    return t_interval([a[k] - b[k] for k in keys])


def verdict(metric: str, first: str, other: str, diff: Estimate, digits: int = 3) -> str:
    """One line: "<first> higher than <other> by x [lo, hi]", "... lower ...", or no difference beyond noise."""
    if diff.n == 0:
        return f"{metric}: no paired runs of {first} and {other}"
    diff = Estimate(*(round(x, 12) + 0.0 for x in (diff.mean, diff.lo, diff.hi)), diff.n)  # no -2.8e-17
    if diff.n == 1:
        return f"{metric}: {first} - {other} = {diff.mean:+.{digits}g} on one seed (no CI: run more seeds)"
    span = f"[{diff.lo:+.{digits}g}, {diff.hi:+.{digits}g}], {diff.n} seeds"
    if diff.lo > 0:
        return f"{metric}: {first} higher than {other} by {diff.mean:.{digits}g} {span}"
    if diff.hi < 0:
        return f"{metric}: {first} lower than {other} by {-diff.mean:.{digits}g} {span}"
    return f"{metric}: no difference beyond noise ({first} - {other} = {diff.mean:+.{digits}g} {span})"


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


def arm_summary(table: pd.DataFrame, metrics: list[str], order: list[str]) -> dict[str, dict[str, Estimate]]:
    """arm -> metric -> mean with t CI over its runs (seeds)."""
    return {
        arm: {
            m: t_interval(list(pd.to_numeric(table.loc[table["arm"] == arm, m], errors="coerce")))
            if m in table
            else Estimate(math.nan, math.nan, math.nan, 0)
            for m in metrics
        }
        for arm in order
    }


def comparisons(table: pd.DataFrame, metrics: list[str], order: list[str]) -> list[dict]:
    """Per metric and baseline arm: the paired difference (first arm - baseline) and its verdict line."""
    out = []
    if len(order) < 2:
        return out
    first = order[0]

    def by_pair(arm: str, m: str) -> dict[str, float]:
        sub = table[table["arm"] == arm]
        return dict(zip(sub["pair"], pd.to_numeric(sub[m], errors="coerce"))) if m in sub else {}

    for m in metrics:
        for other in order[1:]:
            diff = paired_difference(by_pair(first, m), by_pair(other, m))
            out.append(
                {
                    "metric": m,
                    "arm": first,
                    "baseline": other,
                    "diff": diff,
                    "verdict": verdict(m, first, other, diff),
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
