"""Matplotlib figures from `analysis.store` tables; each function returns a Figure (no I/O).

Runs that differ only by seed share a `group` and a colour, so a DARLING-vs-GRPO sweep reads as two
colours with one line per seed.
"""

from __future__ import annotations

import re

import matplotlib.pyplot as plt
import pandas as pd

NOVELTY_CATEGORY = re.compile(r"^eval/novelty/(?P<metric>distinct|utility)[^/]*/(?P<category>.+)$")


def _colours(groups: list[str]) -> dict[str, str]:
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {g: cycle[i % len(cycle)] for i, g in enumerate(sorted(set(groups)))}


def _window(history: pd.DataFrame, key: str, smooth: int) -> int:
    """`smooth` for a curve logged every step; 1 (the points as logged) for a sparse one such as val/* at
    step 0 and the end, where a rolling mean would blend the start into the final value."""
    steps = history.loc[history["key"] == key, "step"].drop_duplicates().sort_values()
    dense = len(steps) > 1 and steps.diff().dropna().max() <= 1
    return smooth if smooth > 1 and dense else 1


def curves(history: pd.DataFrame, runs: pd.DataFrame, key: str, smooth: int = 1):
    """One line per run of `key` against step (rolling mean over `smooth` steps if logged every step)."""
    smooth = _window(history, key, smooth)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    colours = _colours(list(runs["group"]))
    for _, run in runs.iterrows():
        h = history[(history["run_id"] == run["run_id"]) & (history["key"] == key)]
        if h.empty:
            continue
        y = h["value"].rolling(smooth, min_periods=1).mean() if smooth > 1 else h["value"]
        ax.plot(h["step"], y, color=colours[run["group"]], label=f"{run['run_name']}", alpha=0.85, marker=".")
    ax.set_xlabel("step")
    ax.set_ylabel(key)
    ax.set_title(key + (f" (rolling mean {smooth})" if smooth > 1 else ""))
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def arm_curves(
    history: pd.DataFrame,
    runs: pd.DataFrame,
    key: str,
    order: list[str],
    smooth: int = 1,
    bounds: tuple[float, float] | None = None,
    seeds: bool = False,
):
    """One line per arm of `key` against step: the mean over the arm's runs (seeds), bold. An arm with
    MIN_SEEDS_FOR_CI runs or more gets a light band, the 95% t interval over its runs at each step clipped
    to `bounds` (the metric's range); an arm with fewer shows each seed as a thin line instead (a t band
    from 2 seeds is 12.7 spreads wide and buries the means). `seeds`: each seed's thin line beside the
    band too (held-out figures logged at a few steps, where a seed's own path is the story). `runs` needs
    an `arm` column."""
    from analysis.arms import MIN_SEEDS_FOR_CI

    smooth = _window(history, key, smooth)

    fig, ax = plt.subplots(figsize=(6, 3.6))
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    banded = seeded = False
    for i, arm in enumerate(order):
        ids = set(runs.loc[runs["arm"] == arm, "run_id"])
        h = history[(history["run_id"].isin(ids)) & (history["key"] == key)].sort_values("step")
        if h.empty:
            continue
        if smooth > 1:
            h = h.assign(
                value=h.groupby("run_id")["value"].transform(
                    lambda v: v.rolling(smooth, min_periods=1).mean()
                )
            )
        band = _plot_arm(ax, h, arm, cycle[i % len(cycle)], bounds, seeds)
        banded, seeded = banded or band, seeded or seeds or not band
    ax.set_xlabel("step")
    ax.set_ylabel(key)
    spread = []
    if banded:
        clip = f", clipped to {_span(bounds)}" if bounds else ""
        spread.append(f"band: 95% t CI over seeds{clip}")
    if seeded:
        spread.append("thin: each seed" + ("" if seeds else f" (a band needs {MIN_SEEDS_FOR_CI}+)"))
    ax.set_title(
        key + (f" (rolling mean {smooth})" if smooth > 1 else "") + "\nbold: mean; " + "; ".join(spread),
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _plot_arm(
    ax, h: pd.DataFrame, arm: str, colour: str, bounds: tuple[float, float] | None, seeds: bool = False
) -> bool:
    """One arm's bold mean line over its runs, with its CI band (True) or, below MIN_SEEDS_FOR_CI runs,
    each seed's thin line (False); `seeds`: the seeds' lines with the band too."""
    from analysis.arms import MIN_SEEDS_FOR_CI, interval

    n = h["run_id"].nunique()
    per_step = [(step, interval(list(g["value"]), bounds)) for step, g in h.groupby("step")]
    steps = [s for s, _ in per_step]
    banded = n >= MIN_SEEDS_FOR_CI
    if banded:
        lo = [e.lo if e.has_ci else e.mean for _, e in per_step]
        hi = [e.hi if e.has_ci else e.mean for _, e in per_step]
        ax.fill_between(steps, lo, hi, color=colour, alpha=0.12, linewidth=0)
    if seeds or not banded:
        for _, run in h.groupby("run_id"):
            ax.plot(run["step"], run["value"], color=colour, alpha=0.35, linewidth=0.8)
    ax.plot(
        steps, [e.mean for _, e in per_step], color=colour, label=f"{arm} (n={n})", marker=".", linewidth=2
    )
    return banded


def _span(bounds: tuple[float, float]) -> str:
    return f"[{bounds[0]:g}, {bounds[1]:g}]" if bounds[1] != float("inf") else f">= {bounds[0]:g}"


def diversity_vs_quality(runs: pd.DataFrame, diversity: str, quality: str):
    """A point per run (diversity on y, quality on x), coloured by group; group means as large markers."""
    fig, ax = plt.subplots(figsize=(5, 4))
    data = runs.dropna(subset=[diversity, quality]) if {diversity, quality} <= set(runs.columns) else runs[:0]
    colours = _colours(list(data["group"]))
    for group, g in data.groupby("group"):
        ax.scatter(g[quality], g[diversity], color=colours[group], alpha=0.6, label=str(group))
        ax.scatter([g[quality].mean()], [g[diversity].mean()], color=colours[group], s=160, marker="*")
    ax.set_xlabel(quality)
    ax.set_ylabel(diversity)
    ax.set_title("diversity vs quality (star: group mean)")
    ax.grid(alpha=0.3)
    if len(data):
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def novelty_by_category(runs: pd.DataFrame, metric: str = "distinct"):
    """Grouped bars: per novelty category, the group-mean of `eval/novelty/<metric>*/<category>`."""
    cols = {c: m.group("category") for c in runs.columns if (m := NOVELTY_CATEGORY.match(c))}
    cols = {c: cat for c, cat in cols.items() if NOVELTY_CATEGORY.match(c).group("metric") == metric}
    fig, ax = plt.subplots(figsize=(7, 3.6))
    if cols:
        table = runs.groupby("group")[list(cols)].mean().rename(columns=cols).T
        table.plot.bar(ax=ax, rot=30)
        ax.legend(fontsize=7)
    ax.set_ylabel(metric)
    ax.set_title(f"NoveltyBench {metric} by category")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig
