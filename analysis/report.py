"""A static HTML comparison report of an experiment's runs and checkpoints (opens offline).

`python -m analysis.report --experiment EXP [--out reports/EXP]` (`make report EXP=...`) writes
`index.html`: first the experiment's question answered when it has arms (analysis.arms: per arm mean and
95% CI over seeds for each headline metric, the paired difference per seed with its CI, a verdict line per
metric, curves with one band per arm; also `arms.csv` and `comparison.csv`), then the leaderboard (per run and per checkpoint), training curves, eval metrics against
step, a diversity-vs-quality plot (DARLING vs GRPO reads as two colours) and NoveltyBench per category,
the figures as PNG files beside it.
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from datetime import datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; notebooks keep their inline backend (figures.py sets none)
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from analysis import figures  # noqa: E402
from analysis.arms import Estimate, arm_order, arm_summary, comparisons, load_arm_runs  # noqa: E402
from analysis.leaderboard import build, by_arm, to_html, write  # noqa: E402
from analysis.store import (  # noqa: E402
    LAST_STEPS,
    AnalysisError,
    add_last_steps_means,
    checkpoint_table,
    load_history,
    metric_columns,
)
from analysis.view import report_links  # noqa: E402
from train.tracking import tracking_uri  # noqa: E402

TRAIN_CURVES = (
    "train/reward_mean", "train/accuracy", "val/accuracy", "train/response_length_mean", "actor/entropy",
    "actor/kl_loss", "timing/step_s",
)  # fmt: skip
DIVERSITY_KEYS = (r"^eval/novelty/distinct[^/]*$", r"^reward/.*distinct.*$", r"^reward/diversity_mean$")
QUALITY_KEYS = (
    r"^eval/math/.*acc[^/]*$",
    r"^val/accuracy$",
    r"^train/accuracy$",
    r"^eval/novelty/utility[^/]*$",
)
MAX_EVAL_PLOTS = 16
# What an arm comparison reports: held-out figures at the end of training (val/*, eval/*) and training
# curves summarised over their last LAST_STEPS steps; reward_mean is left out (its definition differs by arm).
HEADLINE = (
    r"^val/accuracy$", r"^val/distinct_correct_mean$", r"^val/pass_at_\d+$", r"^val/distinct_k$",
    r"^eval/[^/]+/(acc|pass_at_\d+|distinct[^/]*|utility[^/]*|flip_rate|[^/]*accuracy[^/]*)$",
)  # fmt: skip
SUMMARISED_CURVES = ("train/accuracy", "reward/distinct_correct_mean", "reward/distinct_classes_mean")
ARM_CURVES = (
    "train/accuracy",
    "reward/distinct_correct_mean",
    "reward/distinct_classes_mean",
    "val/accuracy",
)

CSS = """
body { font-family: sans-serif; margin: 2em; color: #222; }
table.leaderboard { border-collapse: collapse; font-size: 12px; margin-bottom: 1em; }
table.leaderboard th, table.leaderboard td { border: 1px solid #ccc; padding: 3px 6px; text-align: right; }
table.leaderboard td:first-child { text-align: left; }
td.best { background: #e6f4ea; }
.figs { display: flex; flex-wrap: wrap; gap: 12px; }
.figs img { max-width: 560px; border: 1px solid #eee; }
.meta { color: #666; font-size: 12px; }
"""
# Marks the page once every image has loaded, so a headless browser test can check rendering.
LOAD_CHECK = """
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  document.body.setAttribute('data-images-loaded', ok + '/' + imgs.length);
});
"""


def _first(columns: list[str], patterns: tuple[str, ...]) -> str | None:
    for pat in patterns:
        for c in columns:
            if re.match(pat, c):
                return c
    return None


def _save(fig, path: Path) -> str:
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path.name


def build_report(experiment: str, out_dir: Path, sweep: str | None = None, uri: str | None = None) -> Path:
    """Write `out_dir/index.html` and its figures; returns the page's path."""
    runs, arms = load_arm_runs(experiment, sweep=sweep, uri=uri)
    out_dir.mkdir(parents=True, exist_ok=True)
    fig_dir = out_dir / "fig"
    fig_dir.mkdir(exist_ok=True)
    for old in fig_dir.glob("*.png"):
        old.unlink()
    sections: list[tuple[str, str]] = []
    order = arm_order(runs, arms)
    if len(order) >= 2:
        sections += _arm_sections(experiment, runs, arms, order, out_dir, fig_dir, uri)
    elif arms:
        declared = "; ".join(f"{a}: {v}" for a, v in arms.items())
        sections.append(("Arms", f"<p>No two arms have runs yet (declared: {html.escape(declared)}).</p>"))

    board = build(runs, label="run")
    write(board, out_dir, "leaderboard")
    sections.append(("Leaderboard (latest value per run)", to_html(board)))
    ckpts = checkpoint_table(runs, uri)
    if not ckpts.empty:
        ck_board = build(ckpts, label="checkpoint")
        write(ck_board, out_dir, "leaderboard_checkpoints")
        sections.append(("Leaderboard per checkpoint", to_html(ck_board)))

    columns = metric_columns(runs)
    run_ids = list(runs["run_id"])
    curve_keys = [k for k in TRAIN_CURVES if k in columns] + [k for k in columns if k.startswith("reward/")]
    if curve_keys:
        hist = load_history(run_ids, curve_keys, uri)
        imgs = [
            _save(figures.curves(hist, runs, k, smooth=3), fig_dir / f"train_{i:02d}.png")
            for i, k in enumerate(curve_keys)
        ]
        sections.append(("Training curves", _figs(imgs)))

    eval_keys = [k for k in columns if k.startswith("eval/") and not figures.NOVELTY_CATEGORY.match(k)]
    if eval_keys:
        eval_keys = eval_keys[:MAX_EVAL_PLOTS]
        hist = load_history(run_ids, eval_keys, uri)
        imgs = [
            _save(figures.curves(hist, runs, k), fig_dir / f"eval_{i:02d}.png")
            for i, k in enumerate(eval_keys)
        ]
        sections.append(("Eval metrics against checkpoint step", _figs(imgs)))

    diversity, quality = _first(columns, DIVERSITY_KEYS), _first(columns, QUALITY_KEYS)
    if diversity and quality:
        img = _save(figures.diversity_vs_quality(runs, diversity, quality), fig_dir / "diversity_quality.png")
        sections.append(("Diversity vs quality", _figs([img])))

    if any(figures.NOVELTY_CATEGORY.match(c) for c in columns):
        imgs = [
            _save(figures.novelty_by_category(runs, m), fig_dir / f"novelty_{m}.png")
            for m in ("distinct", "utility")
        ]
        sections.append(("NoveltyBench by category", _figs(imgs)))

    if runs.empty:
        sections.append(("No runs", "<p>The experiment has no runs yet.</p>"))
    sections.append(
        ("Samples behind the numbers", report_links(runs, order, metric_columns(runs)))
    )  # analysis.view
    page = out_dir / "index.html"
    page.write_text(_page(experiment, runs, sections, uri, sweep))
    return page


def headline_metrics(table: pd.DataFrame) -> list[str]:
    """The metrics an arm comparison reports, in HEADLINE order (pass@k by k), then the curves' ends."""
    columns = metric_columns(table)
    picked = [c for pat in HEADLINE for c in sorted(columns, key=_natural) if re.match(pat, c)]
    ends = [c for key in SUMMARISED_CURVES for c in (f"{key}@first{LAST_STEPS}", f"{key}@last{LAST_STEPS}")]
    return list(dict.fromkeys(picked + [c for c in ends if c in table]))


def _natural(name: str) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def _arm_sections(experiment, runs, arms, order, out_dir, fig_dir, uri) -> list[tuple[str, str]]:
    """The question answered: verdicts, the per-arm table with paired differences, curves with bands."""
    table = add_last_steps_means(runs, list(SUMMARISED_CURVES), uri=uri)
    metrics = headline_metrics(table)
    summary = arm_summary(table, metrics, order)
    diffs = comparisons(table, metrics, order)
    first = order[0]
    question = f"Does {first} differ from {', '.join(order[1:])}? (experiments/{experiment}.yaml `arms:`)"
    verdicts = "".join(f"<li>{html.escape(d['verdict'])}</li>" for d in diffs)
    head = "".join(f"<th>{html.escape(a)} mean [95% CI]</th>" for a in order)
    rows = []
    for m in metrics:
        cells = "".join(f"<td>{html.escape(summary[a][m].text())}</td>" for a in order)
        for d in (d for d in diffs if d["metric"] == m):
            per_seed = _per_seed(table, m, first, d["baseline"])
            rows.append(
                f"<tr><td>{html.escape(m)}</td>{cells}<td>{html.escape(d['baseline'])}</td>"
                f"<td>{html.escape(per_seed)}</td><td>{html.escape(_signed(d['diff']))}</td></tr>"
            )
    table_html = (
        f'<table class="leaderboard"><thead><tr><th>metric</th>{head}<th>baseline</th>'
        f"<th>{html.escape(first)} - baseline per seed</th><th>paired mean [95% CI]</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )
    _write_arm_tables(out_dir, summary, diffs, order)
    counts = ", ".join(f"{a} {int((runs['arm'] == a).sum())}" for a in order)
    note = (
        f"<p class='meta'>Runs per arm: {counts}. "
        f"CIs: Student t over seeds (95%); <code>@last{LAST_STEPS}</code> / <code>@first{LAST_STEPS}</code>: mean "
        f"of a training curve over its last / first {LAST_STEPS} steps; val/* on held-out prompts at the end.</p>"
    )
    sections = [
        ("The question", f"<p><b>{html.escape(question)}</b></p><ul class='verdicts'>{verdicts}</ul>{note}"),
        ("Arms: mean over seeds and paired differences", table_html),
    ]
    board = by_arm(table, arms)
    write(board, out_dir, "leaderboard_arms")
    sections.append(("Leaderboard by arm", to_html(board)))
    keys = [k for k in ARM_CURVES if k in runs.columns]
    if keys:
        hist = load_history(list(runs["run_id"]), keys, uri)
        imgs = [
            _save(figures.arm_curves(hist, runs, k, order, smooth=3), fig_dir / f"arm_{i:02d}.png")
            for i, k in enumerate(keys)
        ]
        sections.append(("Curves per arm (band: 95% CI over seeds)", _figs(imgs)))
    return sections


def _selection(runs: pd.DataFrame, sweep: str | None) -> str:
    sweeps = sorted({s for s in runs.get("sweep", []) if s})
    if sweep is None and len(sweeps) == 1:
        return f"sweep {sweeps[0]}, the newest; --sweep all: every run"
    if not sweeps:
        return "runs outside sweeps"
    return f"sweeps {', '.join(sweeps)}; the newest run per arm and seed"


def _per_seed(table: pd.DataFrame, metric: str, first: str, other: str) -> str:
    a = table[table["arm"] == first].set_index("pair")[metric] if metric in table else pd.Series(dtype=float)
    b = table[table["arm"] == other].set_index("pair")[metric] if metric in table else pd.Series(dtype=float)
    common = [k for k in a.index if k in b.index]
    return ", ".join(f"{a[k] - b[k]:+.3g}" for k in common) or "-"


def _signed(e: Estimate) -> str:
    if e.n == 0:
        return "-"
    if e.n == 1:
        return f"{e.mean:+.3g} (one seed)"
    return f"{e.mean:+.3g} [{e.lo:+.3g}, {e.hi:+.3g}]"


def _write_arm_tables(out_dir: Path, summary: dict, diffs: list[dict], order: list[str]) -> None:
    """arms.csv (arm, metric, mean, ci_lo, ci_hi, n) and comparison.csv (the paired differences, verdicts)."""
    arm_rows = [
        {"arm": a, "metric": m, "mean": e.mean, "ci_lo": e.lo, "ci_hi": e.hi, "n": e.n}
        for a in order
        for m, e in summary[a].items()
    ]
    pd.DataFrame(arm_rows).to_csv(out_dir / "arms.csv", index=False)
    comp = [
        {"metric": d["metric"], "arm": d["arm"], "baseline": d["baseline"], "diff": d["diff"].mean,
         "ci_lo": d["diff"].lo, "ci_hi": d["diff"].hi, "n": d["diff"].n, "verdict": d["verdict"]}
        for d in diffs
    ]  # fmt: skip
    pd.DataFrame(comp).to_csv(out_dir / "comparison.csv", index=False)


def _figs(names: list[str]) -> str:
    return (
        '<div class="figs">'
        + "".join(f'<img src="fig/{html.escape(n)}" alt="{n}">' for n in names)
        + "</div>"
    )


def _page(
    experiment: str,
    runs: pd.DataFrame,
    sections: list[tuple[str, str]],
    uri: str | None,
    sweep: str | None = None,
) -> str:
    body = "\n".join(f"<h2>{html.escape(title)}</h2>\n{content}" for title, content in sections)
    groups = ", ".join(sorted(set(runs["group"]))) if not runs.empty else "-"
    if "arm" in runs and not runs.empty:
        groups = ", ".join(sorted({str(a) for a in runs["arm"]}))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(experiment)} report</title>
<style>{CSS}</style></head>
<body>
<h1>{html.escape(experiment)}</h1>
<p class="meta">{len(runs)} runs ({html.escape(_selection(runs, sweep))}); groups: {html.escape(groups)}; store {html.escape(uri or tracking_uri())};
built {datetime.now().isoformat(timespec="seconds")}</p>
{body}
<script>{LOAD_CHECK}</script>
</body></html>
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__.split("\n")[0])
    p.add_argument("--experiment", "-e", required=True, help="MLflow experiment name (e.g. darling_math)")
    p.add_argument(
        "--sweep", default=None, help="a sweep id, or `all` for every run (default: the newest sweep's runs)"
    )
    p.add_argument("--out", default=None, help="output folder (default reports/<experiment>)")
    args = p.parse_args(argv)
    try:
        page = build_report(args.experiment, Path(args.out or f"reports/{args.experiment}"), args.sweep)
    except AnalysisError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {page} (open it in a browser; it needs no network)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
