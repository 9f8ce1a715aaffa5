"""What RL changed, per arm: each held-out (`val/*`) headline metric at the first validation (step 0:
after any warm-up, before RL), at the last, and the change between them.

A GRPO run validates at step 0 and at later steps to the end, so a run is its own before/after pair: the
change is end minus start per run (seed), then its mean with a Student-t interval over the arm's seeds,
clipped to the difference's range (analysis.arms.arm_summary, as every other figure of the report). The
ends are analysis.store.add_last_steps_means' `<metric>@first1` and `<metric>@last1` columns (the same
mechanism as the training curves' `@first5`/`@last5`); a run with a single validation has no change.
Pure functions on the report's tables.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from analysis.arms import CLIPPED_MARK, MIN_SEEDS_FOR_CI, Estimate, arm_summary, seed_signs, tidy
from analysis.headline import Headline, base_metric, difference_range, metric_range, run_samples

ENDS = 1  # add_last_steps_means' k: a run's first and last logged value


@dataclass(frozen=True)
class Change:
    """One arm's figures of one metric: at the first and the last validation, and the change (end - start
    per seed), each a mean with its interval over seeds; the steps the runs validated at first and last."""

    arm: str
    metric: str
    label: str
    start: Estimate
    end: Estimate
    change: Estimate
    first_steps: tuple[int, ...]
    last_steps: tuple[int, ...]


def rl_headline(headline: list[Headline]) -> list[Headline]:
    """The declared headline metrics measured on held-out prompts (`val/*`, not a curve's `@first`/`@last`)."""
    return [h for h in headline if h.metric.startswith("val/") and base_metric(h.metric)[1] is None]


def end_columns(metric: str) -> tuple[str, str]:
    """The `add_last_steps_means(k=ENDS)` columns of a run's first and last value of `metric`."""
    return f"{metric}@first{ENDS}", f"{metric}@last{ENDS}"


def changes(
    table: pd.DataFrame, history: pd.DataFrame, heads: list[Headline], order: list[str]
) -> list[Change]:
    """A Change per headline metric and arm (metric-major, arms in `order`). `table`: the report's runs
    with `arm`, `pair` and the `end_columns` of each metric; `history`: the metrics' logged values (the
    steps of the ends)."""
    out = []
    for h in heads:
        first, last = end_columns(h.metric)
        if first not in table:
            continue
        bounds = metric_range(h.metric, run_samples(table, h.metric), h.range)
        steps = _end_steps(history, h.metric)
        delta = f"{h.metric}@change"
        once = [rid for rid, (a, b) in steps.items() if a == b]  # a single validation: no change
        view = table.assign(**{delta: (table[last] - table[first]).where(~table["run_id"].isin(once))})
        summary = arm_summary(view, [first, last], order, {first: bounds, last: bounds})
        moved = arm_summary(view, [delta], order, {delta: difference_range(bounds)})
        for arm in order:
            ids = set(table.loc[table["arm"] == arm, "run_id"])
            ends = [steps[rid] for rid in ids if rid in steps]
            out.append(
                Change(
                    arm,
                    h.metric,
                    h.label,
                    summary[arm][first],
                    summary[arm][last],
                    moved[arm][delta],
                    tuple(sorted({a for a, _ in ends})),
                    tuple(sorted({b for _, b in ends})),
                )
            )
    return out


def _end_steps(history: pd.DataFrame, metric: str) -> dict[str, tuple[int, int]]:
    """run id -> (first, last) step `metric` was logged at."""
    h = history[history["key"] == metric]
    return {rid: (int(g["step"].min()), int(g["step"].max())) for rid, g in h.groupby("run_id")}


def steps_text(steps: tuple[int, ...]) -> str:
    return "step " + "/".join(map(str, steps)) if steps else "-"


def _signed(x: float, digits: int) -> str:
    x = tidy(x)
    return "0" if x == 0 else f"{x:+.{digits}g}"


def reading(d: Estimate) -> str:
    """The change in words: rose / fell / no change beyond seed noise; below MIN_SEEDS_FOR_CI seeds how the
    seeds agree (analysis.arms.seed_signs)."""
    if d.n == 0:
        return "-"
    if d.has_ci:
        lo, hi = tidy(d.lo), tidy(d.hi)
        return "rose" if lo > 0 else "fell" if hi < 0 else "no change beyond seed noise"
    if d.n == 1:
        return "one seed"
    every = "both seeds" if d.n == 2 else f"all {d.n} seeds"
    return {
        "higher": f"rose in {every}",
        "lower": f"fell in {every}",
        "equal": f"unchanged in {every}",
        "higher or equal": "rose in some seeds, unchanged in the rest",
        "lower or equal": "fell in some seeds, unchanged in the rest",
    }.get(seed_signs([tidy(v) for v in d.values]), "the sign varies across seeds")


def sentence(c: Change, digits: int = 3) -> str:
    """ "calculator: held-out accuracy 0.3 -> 0.75 under RL (step 0 -> step 20; +0.45, 95% interval
    [+0.326, +0.574] over 3 seeds: rose)"; below MIN_SEEDS_FOR_CI seeds each seed's change."""
    if c.start.n == 0 and c.end.n == 0:
        return f"{c.arm}: {c.label} not logged"
    g = f".{digits}g"
    head = f"{c.arm}: {c.label} {tidy(c.start.mean):{g}} -> {tidy(c.end.mean):{g}} under RL"
    where = f"{steps_text(c.first_steps)} -> {steps_text(c.last_steps)}"
    d = c.change
    if d.n == 0:
        return f"{head} ({where}; every run validated once: no change to tell)"
    if all(tidy(v) == 0 for v in d.values):
        return f"{head} ({where}; no change in any of the {d.n} seeds)"
    mean = _signed(d.mean, digits)
    if d.has_ci:
        mark = CLIPPED_MARK if d.clipped else ""
        span = f"[{_signed(d.lo, digits)}, {_signed(d.hi, digits)}]{mark}"
        return f"{head} ({where}; {mean}, 95% interval {span} over {d.n} seeds: {reading(d)})"
    need = f"an interval needs {MIN_SEEDS_FOR_CI} or more seeds"
    if d.n == 1:
        return f"{head} ({where}; {mean} on one seed; {need})"
    seeds = ", ".join(_signed(v, digits) for v in d.values)
    return f"{head} ({where}; {mean}, seeds {seeds}: {reading(d)}; {need})"


def to_csv(found: list[Change]) -> str:
    """Full precision: a row per (arm, metric) with the steps, the three figures, their intervals and seeds."""
    rows = []
    for c in found:
        row = {
            "arm": c.arm,
            "metric": c.metric,
            "first_step": " ".join(map(str, c.first_steps)),
            "last_step": " ".join(map(str, c.last_steps)),
        }
        for name, e in (("start", c.start), ("end", c.end), ("change", c.change)):
            row |= {
                f"{name}_mean": e.mean, f"{name}_ci_lo": e.lo, f"{name}_ci_hi": e.hi,
                f"{name}_clipped": e.clipped, f"{name}_n": e.n,
                f"{name}_seeds": " ".join(f"{v:.6g}" for v in e.values),
            }  # fmt: skip
        rows.append(row)
    return pd.DataFrame(rows).to_csv(index=False)
