"""An arm comparison's numbers, computed once, and the paper-style outputs made from them.

`compare` takes a `load_arm_runs` table (with the curves' `@first/@last` means) and the experiment's
headline declaration (analysis.headline) and returns `Results`: the headline metrics first, then every
other metric after training without duplicates (two metrics with the same values at every logged step of
every run, such as val/pass_at_1 and val/accuracy, are shown once), the `@first` means (before training)
apart; per arm and metric the mean with its interval clipped to the metric's range, per baseline the
paired difference, its verdict and the seeds a decisive comparison needs (analysis.power). The page
(analysis.report), `leaderboard.{md,tex,csv}` (`results_table`) and the README row (`readme_row`) all
read the same `Results`. Pure functions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pandas as pd

from analysis.arms import MIN_SEEDS_FOR_CI, Estimate, arm_summary, comparisons, verdict_clause
from analysis.headline import Headline, Range, base_metric, metric_range, run_samples
from analysis.power import MAX_SEEDS, SeedsNeeded, seeds_needed


@dataclass
class Results:
    order: list[str]  # arms; the first is the method, the rest its baselines
    headline: list[Headline]  # declared and logged
    missing: list[str]  # declared headline metrics no run has logged (yet)
    metrics: list[str]  # after training: the headline ones first, no duplicates, no @first
    before: list[str]  # `@first` means: before training had an effect
    same_as: dict[str, list[str]]  # shown metric -> the metrics with the same values (not shown)
    ranges: dict[str, Range | None]
    summary: dict[str, dict[str, Estimate]]  # arm -> metric -> estimate
    diffs: dict[tuple[str, str], dict]  # (metric, baseline) -> comparisons() entry
    power: dict[tuple[str, str], SeedsNeeded] = field(default_factory=dict)  # every compared metric
    runs_per_arm: dict[str, int] = field(default_factory=dict)

    @property
    def first(self) -> str:
        return self.order[0]

    @property
    def baselines(self) -> list[str]:
        return self.order[1:]

    def better(self, metric: str) -> str | None:
        return next((h.better for h in self.headline if h.metric == metric), None)


def equal_series(history: pd.DataFrame, metrics: list[str]) -> dict[str, str]:
    """Pure: metric -> the earlier metric (in `metrics` order) with the same value at every (run, step)
    either was logged at. A series that never changes is kept apart (two pass@k saturated at 1.0 are not
    the same metric)."""
    if history.empty:
        return {}
    wide = history.pivot_table(index=["run_id", "step"], columns="key", values="value", aggfunc="last")
    out: dict[str, str] = {}
    kept: list[str] = []
    for m in metrics:
        if m not in wide:
            kept.append(m)
            continue
        col = wide[m]
        twin = next(
            (
                k
                for k in kept
                if k in wide
                and col.notna().equals(wide[k].notna())
                and col.dropna().nunique() > 1
                and ((col - wide[k]).abs().dropna() <= 1e-12).all()
            ),
            None,
        )
        if twin is None:
            kept.append(m)
        else:
            out[m] = twin
    return out


def compare(
    table: pd.DataFrame,
    order: list[str],
    candidates: list[str],
    headline: list[Headline],
    history: pd.DataFrame | None = None,
) -> Results:
    """The numbers of an arm comparison. `candidates`: the metrics worth comparing (columns of `table`);
    `history`: their logged values per step (for `equal_series`; None: no duplicate detection)."""
    declared = [
        h
        for h in headline
        if h.metric in table and pd.to_numeric(table[h.metric], errors="coerce").notna().any()
    ]
    missing = [h.metric for h in headline if h not in declared]
    heads = [h.metric for h in declared]
    ordered = list(dict.fromkeys(heads + [m for m in candidates if m in table]))
    plain = [m for m in ordered if base_metric(m)[1] is None]
    same = equal_series(history, plain) if history is not None else {}
    same_as: dict[str, list[str]] = {}
    for dup, kept in same.items():
        same_as.setdefault(kept, []).append(dup)
    shown = [m for m in ordered if m not in same]
    before = [m for m in shown if "@first" in m and m not in heads]
    after = [m for m in shown if m not in before]
    declared_ranges = {h.metric: h.range for h in declared}
    ranges = {m: metric_range(m, run_samples(table, m), declared_ranges.get(m)) for m in after + before}
    summary = arm_summary(table, after + before, order, ranges)
    better = {h.metric: h.better for h in declared}
    entries = comparisons(table, after + before, order, ranges, better)
    diffs = {(d["metric"], d["baseline"]): d for d in entries}
    power = {
        key: seeds_needed(list(d["diff"].values), min_seeds=MIN_SEEDS_FOR_CI) for key, d in diffs.items()
    }
    counts = {a: int((table["arm"] == a).sum()) for a in order}
    return Results(order, declared, missing, after, before, same_as, ranges, summary, diffs, power, counts)


# ---- sentences ----------------------------------------------------------------------------------


def headline_sentence(r: Results, h: Headline, baseline: str) -> str:
    """One sentence: the label, the direction that is better, each arm's value, the verdict."""
    d = r.diffs[(h.metric, baseline)]["diff"]
    a, b = r.summary[r.first][h.metric], r.summary[baseline][h.metric]
    clause = verdict_clause(r.first, baseline, d, better=h.better)
    return f"{h.label}, {h.better} is better: {r.first} {a.text()} vs {baseline} {b.text()}; {clause}."


def power_sentence(r: Results, metric: str, baseline: str) -> str:
    """The seeds a decisive comparison needs, from the observed per-seed differences."""
    p = r.power[(metric, baseline)]
    if p.n < 2 or abs(p.mean) < 1e-12:
        return f"Seeds needed: not estimable ({p.reason})."
    observed = f"{p.mean:+.3g} (per-seed sd {p.sd:.3g} over {p.n} seeds)"
    if p.to_detect is None:
        return f"Seeds needed to tell {observed} from 0 at 95%: {p.reason}."
    if p.sd == 0 or p.reason:  # no spread observed: any count from the minimum
        return f"Seeds needed to tell {observed} from 0 at 95%: {p.to_detect} ({p.reason}; {p.n} seeds say little about it)."
    enough = f" (the {p.n} seeds here suffice)" if p.n >= p.to_detect else ""
    power = f"{p.for_power}" if p.for_power is not None else f"more than {MAX_SEEDS}"
    return (
        f"Seeds needed to tell {observed} from 0 at 95% (two-sided paired t): {p.to_detect}{enough}; "
        f"for 80% power: {power}."
    )


# ---- the paper's table and the README row -------------------------------------------------------

ARROW = {"higher": "\N{UPWARDS ARROW}", "lower": "\N{DOWNWARDS ARROW}"}


def table_metrics(r: Results) -> list[str]:
    """The results table's columns: the headline metrics, else every metric after training."""
    return [h.metric for h in r.headline] or r.metrics


def results_table(r: Results) -> tuple[list[str], list[list[str]], list[list[bool]]]:
    """(header, rows of cell text, bold mask): a row per arm (mean [CI] or the seeds' values) and one per
    baseline with the paired difference; the better arm of a headline column in bold when the interval of
    the difference excludes 0 (or every seed agrees, below MIN_SEEDS_FOR_CI seeds)."""
    metrics = table_metrics(r)
    header = ["arm"] + [f"{m} {ARROW.get(r.better(m) or '', '')}".strip() for m in metrics]
    rows, bold = [], []
    for arm in r.order:
        rows.append([f"{arm} (n={r.runs_per_arm.get(arm, 0)})"] + [r.summary[arm][m].text() for m in metrics])
        bold.append([False] + [_wins(r, arm, m) for m in metrics])
    for base in r.baselines:
        rows.append(
            [f"{r.first} - {base} (paired)"] + [r.diffs[(m, base)]["diff"].text(signed=True) for m in metrics]
        )
        bold.append([False] * (len(metrics) + 1))
    return header, rows, bold


def _wins(r: Results, arm: str, metric: str) -> bool:
    """`arm` is better than every other arm on a headline metric, decisively (see results_table)."""
    better = r.better(metric)
    if better is None or len(r.order) < 2:
        return False
    sign = 1 if better == "higher" else -1

    def decisive(d: Estimate) -> int:  # +1: first arm higher, -1: lower, 0: undecided
        if d.has_ci:
            return 1 if d.lo > 0 else -1 if d.hi < 0 else 0
        if d.n >= 2 and all(v > 0 for v in d.values):
            return 1
        if d.n >= 2 and all(v < 0 for v in d.values):
            return -1
        return 0

    signs = [decisive(r.diffs[(metric, b)]["diff"]) * sign for b in r.baselines]
    if arm == r.first:
        return all(s > 0 for s in signs)
    return len(r.baselines) == 1 and signs[0] < 0


def _tex(s: str) -> str:
    s = s.replace("\N{UPWARDS ARROW}", "$\\uparrow$").replace("\N{DOWNWARDS ARROW}", "$\\downarrow$")
    return re.sub(r"(?<!\\)([_%&#])", r"\\\1", s)


def to_markdown(table: tuple[list[str], list[list[str]], list[list[bool]]]) -> str:
    header, rows, bold = table
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row, marks in zip(rows, bold):
        lines.append("| " + " | ".join(f"**{c}**" if b else c for c, b in zip(row, marks)) + " |")
    return "\n".join(lines) + "\n"


def to_latex(table: tuple[list[str], list[list[str]], list[list[bool]]], note: str = "") -> str:
    header, rows, bold = table
    lines = [
        "\\begin{tabular}{l" + "r" * (len(header) - 1) + "}",
        "\\toprule",
        " & ".join(map(_tex, header)) + " \\\\",
        "\\midrule",
    ]
    for row, marks in zip(rows, bold):
        lines.append(
            " & ".join(f"\\textbf{{{_tex(c)}}}" if b else _tex(c) for c, b in zip(row, marks)) + " \\\\"
        )
    lines += ["\\bottomrule", "\\end{tabular}"]
    if note:
        lines.append(f"% {note}")
    return "\n".join(lines) + "\n"


def to_csv(r: Results) -> str:
    """Full precision: a row per (arm or paired difference, metric), with the per-seed values."""
    rows = []
    for m in table_metrics(r):
        for arm in r.order:
            rows.append(_csv_row(arm, m, r.summary[arm][m]))
        for base in r.baselines:
            p = r.power[(m, base)]
            rows.append(
                _csv_row(f"{r.first} - {base}", m, r.diffs[(m, base)]["diff"])
                | {"seeds_to_detect": p.to_detect, "seeds_for_80pct_power": p.for_power}
            )
    return pd.DataFrame(rows).to_csv(index=False)


def _csv_row(row: str, metric: str, e: Estimate) -> dict:
    return {
        "row": row, "metric": metric, "mean": e.mean, "ci_lo": e.lo, "ci_hi": e.hi, "clipped": e.clipped,
        "n": e.n, "seeds": " ".join(f"{v:.6g}" for v in e.values),
    }  # fmt: skip


def method_note(r: Results) -> str:
    """How the intervals were made, one line (page, table note)."""
    return (
        f"95% CI: Student t over seeds, clipped to the metric's range (marked *); below {MIN_SEEDS_FOR_CI} "
        "seeds no interval, each seed's value instead"
    )


def readme_row(r: Results, experiment: str, selection: str) -> str:
    """`| experiment | result |` as in the README's results table: the headline sentences with the seeds
    each needs, ready to paste."""
    n = max(r.runs_per_arm.values(), default=0)
    cell = f"`{experiment}` ({' vs '.join(r.order)}, {n} seeds; {selection})"
    parts = []
    for h in r.headline:
        for base in r.baselines:
            p = r.power[(h.metric, base)]
            need = f" [seeds to tell it from 0 at 95%: {p.to_detect}]" if p.to_detect else ""
            parts.append(headline_sentence(r, h, base).rstrip(".") + need + ".")
    if not parts:
        parts = ["(no headline metrics declared: `headline:` in the experiment file)"]
    text = " ".join(parts).replace("|", "\\|")
    return f"| {cell} | {text} |"


def readme_table(r: Results, experiment: str, selection: str) -> str:
    return "| experiment | result |\n|---|---|\n" + readme_row(r, experiment, selection) + "\n"
