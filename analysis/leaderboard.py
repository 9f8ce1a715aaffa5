"""Leaderboard tables from MLflow: one row per run (or per evaluated checkpoint), a column per metric.

`python -m analysis.leaderboard [--experiment EXP] [--per checkpoint] [--by arm] [--out reports]`
(`make leaderboard`) writes `leaderboard[_EXP][_arms].{md,html,csv,tex}`. `--by arm` (needs --experiment)
has one row per arm of the experiment (analysis.arms): the mean over its seeds with a 95% t CI from 3 seeds
up, clipped to the metric's range and marked `*` where cut (analysis.headline.metric_range; the rating
column stays first). A metric with logged CI bounds (`<m>_ci_lo`, `<m>_ci_hi`) is shown as
`value [lo, hi]`; the best value of each column is bold (lower is better for the names in LOWER_IS_BETTER). A run without a metric gets an empty cell.
"""

from __future__ import annotations

import argparse
import html
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis.arms import ALL_SWEEPS, CLIPPED_MARK, arm_order, arm_summary, load_arm_runs
from analysis.headline import metric_range, run_samples
from analysis.store import AnalysisError, checkpoint_table, load_runs, metric_columns

DEFAULT_PREFIXES = ("eval/", "val/", "train/accuracy", "train/reward_mean")
# The creative-writing rating (`python -m evals.creative_writing --rate`, CI from TrueSkill's sigma): first column.
RATING_METRIC = "eval/creative_writing/rating"
# Metric names where smaller is better (matched anywhere in the name).
LOWER_IS_BETTER = re.compile(r"(loss|flip_rate|apolog|slop|repetition|/kl|_kl|time|_s$|error|fail)")


@dataclass
class Leaderboard:
    """`values`: numeric table (rows x metrics); `lo`/`hi`: CI bounds (NaN where none); `best`: per column."""

    label: str  # what a row is: "run" or "checkpoint"
    rows: list[str]
    values: pd.DataFrame
    lo: pd.DataFrame
    hi: pd.DataFrame
    best: dict[str, int | None]
    clipped: pd.DataFrame | None = None  # True where a CI was cut at its metric's range (shown with `*`)


def higher_is_better(metric: str) -> bool:
    return LOWER_IS_BETTER.search(metric) is None


def build(table: pd.DataFrame, metrics: list[str] | None = None, label: str = "run") -> Leaderboard:
    """Pure: a `load_runs`/`checkpoint_table` frame -> Leaderboard (metrics default to DEFAULT_PREFIXES)."""
    if metrics is None:
        metrics = [m for m in metric_columns(table) if m.startswith(DEFAULT_PREFIXES) and "/" in m]
        metrics = [m for m in metrics if m != "step"]
        metrics = sorted(metrics, key=lambda m: m != RATING_METRIC)  # stable: the rating first
    rows = list(table["run_name"]) if "run_name" in table else []
    values = pd.DataFrame(index=range(len(rows)))
    lo = pd.DataFrame(index=range(len(rows)))
    hi = pd.DataFrame(index=range(len(rows)))
    best: dict[str, int | None] = {}
    clipped = pd.DataFrame(index=range(len(rows)))
    for m in metrics:
        col = (
            pd.to_numeric(table[m], errors="coerce").reset_index(drop=True)
            if m in table
            else pd.Series([math.nan] * len(rows), dtype=float)
        )
        values[m] = col
        lo[m] = _column(table, m + "_ci_lo", len(rows))
        hi[m] = _column(table, m + "_ci_hi", len(rows))
        clipped[m] = _column(table, m + "_ci_clipped", len(rows)).fillna(0).astype(bool)
        valid = col.dropna()
        if valid.empty:
            best[m] = None
        else:
            best[m] = int(valid.idxmax() if higher_is_better(m) else valid.idxmin())
    return Leaderboard(label=label, rows=rows, values=values, lo=lo, hi=hi, best=best, clipped=clipped)


def _column(table: pd.DataFrame, name: str, n: int) -> pd.Series:
    if name in table:
        return pd.to_numeric(table[name], errors="coerce").reset_index(drop=True)
    return pd.Series([math.nan] * n, dtype=float)


def cells(board: Leaderboard) -> list[list[str]]:
    """Display text of every cell (rows x metrics): `value` or `value [lo, hi]`, "" when missing."""
    v, lo, hi = board.values.to_numpy(), board.lo.to_numpy(), board.hi.to_numpy()
    clipped = board.clipped.to_numpy() if board.clipped is not None else None
    out = []
    for i in range(v.shape[0]):
        row = []
        for j in range(v.shape[1]):
            if math.isnan(v[i, j]):
                row.append("")
            elif math.isnan(lo[i, j]) or math.isnan(hi[i, j]):
                row.append(f"{v[i, j]:.4g}")
            else:
                bound = ".0f" if abs(v[i, j]) >= 1000 else ".3g"  # a rating's CI: 1000, not 1e+03
                mark = CLIPPED_MARK if clipped is not None and clipped[i, j] else ""
                row.append(f"{v[i, j]:.4g} [{lo[i, j]:{bound}}, {hi[i, j]:{bound}}]{mark}")
        out.append(row)
    return out


def _best_index(board: Leaderboard) -> list[int | None]:
    return [board.best[m] for m in board.values.columns]


def to_markdown(board: Leaderboard) -> str:
    metrics = list(board.values.columns)
    lines = [
        "| " + " | ".join([board.label, *metrics]) + " |",
        "|" + "---|" * (len(metrics) + 1),
    ]
    best = _best_index(board)
    for i, (name, row) in enumerate(zip(board.rows, cells(board))):
        row = [f"**{c}**" if best[j] == i else c for j, c in enumerate(row)]
        lines.append("| " + " | ".join([name.replace("|", "\\|"), *row]) + " |")
    if not board.rows:
        lines.append("| (no runs) |" + " |" * len(metrics))
    return "\n".join(lines) + "\n"


def to_html(board: Leaderboard) -> str:
    metrics = list(board.values.columns)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in [board.label, *metrics])
    body = []
    best = _best_index(board)
    for i, (name, row) in enumerate(zip(board.rows, cells(board))):
        tds = [
            f'<td class="best"><b>{html.escape(c)}</b></td>' if best[j] == i else f"<td>{html.escape(c)}</td>"
            for j, c in enumerate(row)
        ]
        body.append(f"<tr><td>{html.escape(name)}</td>{''.join(tds)}</tr>")
    if not board.rows:
        body.append(f'<tr><td colspan="{len(metrics) + 1}">no runs</td></tr>')
    return (
        f'<table class="leaderboard">\n<thead><tr>{head}</tr></thead>\n<tbody>\n'
        + "\n".join(body)
        + ("\n</tbody>\n</table>\n")
    )


def _tex(s: str) -> str:
    return re.sub(r"([_%&#$])", r"\\\1", s)


def to_latex(board: Leaderboard) -> str:
    metrics = list(board.values.columns)
    lines = [
        "\\begin{tabular}{l" + "r" * len(metrics) + "}",
        "\\toprule",
        " & ".join(_tex(h) for h in [board.label, *metrics]) + " \\\\",
        "\\midrule",
    ]
    best = _best_index(board)
    for i, (name, row) in enumerate(zip(board.rows, cells(board))):
        row = [f"\\textbf{{{_tex(c)}}}" if best[j] == i else _tex(c) for j, c in enumerate(row)]
        lines.append(" & ".join([_tex(name), *row]) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


def to_csv(board: Leaderboard) -> str:
    """Raw numbers (full precision) with the CI bounds as their own columns."""
    out = pd.DataFrame({board.label: board.rows})
    for m in board.values.columns:
        out[m] = board.values[m]
        if board.lo[m].notna().any():
            out[m + "_ci_lo"] = board.lo[m]
            out[m + "_ci_hi"] = board.hi[m]
    return out.to_csv(index=False)


def write(board: Leaderboard, out_dir: Path, stem: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext, render in (("md", to_markdown), ("html", to_html), ("csv", to_csv), ("tex", to_latex)):
        path = out_dir / f"{stem}.{ext}"
        path.write_text(render(board))
        paths.append(path)
    return paths


def by_arm(table: pd.DataFrame, arms: dict, metrics: list[str] | None = None) -> Leaderboard:
    """Pure: a table with an `arm` column (`arms.load_arm_runs`) -> one row per arm, mean [95% t CI]
    clipped to the metric's range (`*`), from MIN_SEEDS_FOR_CI seeds up (below: the mean alone)."""
    if metrics is None:
        metrics = [m for m in metric_columns(table) if m.startswith(DEFAULT_PREFIXES) and "/" in m]
    metrics = [m for m in metrics if m not in ("arm", "pair")]
    order = arm_order(table, arms)
    ranges = {m: metric_range(m, run_samples(table, m)) for m in metrics}
    summary = arm_summary(table, metrics, order, ranges)
    rows = {"run_name": [f"{a} (n={max((e.n for e in summary[a].values()), default=0)})" for a in order]}
    for m in metrics:
        rows[m] = [summary[a][m].mean for a in order]
        rows[m + "_ci_lo"] = [summary[a][m].lo for a in order]
        rows[m + "_ci_hi"] = [summary[a][m].hi for a in order]
        rows[m + "_ci_clipped"] = [summary[a][m].clipped for a in order]
    return build(pd.DataFrame(rows), metrics, label="arm")


def leaderboard(
    experiment: str | None = None,
    sweep: str | None = None,
    per: str = "run",
    metrics: list[str] | None = None,
    uri: str | None = None,
    by: str = "run",
) -> Leaderboard:
    if by == "arm":
        if experiment is None:
            raise AnalysisError("--by arm needs an experiment: make leaderboard EXP=<name> BY=arm")
        runs, arms = load_arm_runs(experiment, sweep=sweep, uri=uri)
        return by_arm(runs, arms, metrics)
    runs = load_runs(experiment, sweep=None if sweep == ALL_SWEEPS else sweep, uri=uri)
    if per == "checkpoint":
        return build(checkpoint_table(runs, uri), metrics, label="checkpoint")
    return build(runs, metrics, label="run")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.leaderboard", description=__doc__.split("\n")[0])
    p.add_argument("--experiment", "-e", default=None, help="MLflow experiment name (default: all)")
    p.add_argument(
        "--sweep",
        default=None,
        help="a sweep id (tag rlpost.sweep) or `all`; default: every run, and with --by arm the newest sweep's",
    )
    p.add_argument("--per", choices=["run", "checkpoint"], default="run")
    p.add_argument(
        "--by", choices=["run", "arm"], default="run", help="arm: one row per arm, mean over seeds"
    )
    p.add_argument(
        "--metrics", default=None, help="comma-separated metric names (default: eval/*, val/*, ...)"
    )
    p.add_argument("--out", default="reports", help="output folder")
    args = p.parse_args(argv)
    try:
        board = leaderboard(
            args.experiment,
            args.sweep,
            args.per,
            args.metrics.split(",") if args.metrics else None,
            by=args.by,
        )
    except AnalysisError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    stem = (
        "leaderboard"
        + (f"_{args.experiment}" if args.experiment else "")
        + ("_checkpoints" if args.per == "checkpoint" else "")
        + ("_arms" if args.by == "arm" else "")
    )
    paths = write(board, Path(args.out), stem)
    print(to_markdown(board))
    if not board.rows:
        print("no runs found (an empty table was written)")
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
