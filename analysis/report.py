"""A static HTML comparison report of an experiment's runs and checkpoints (opens offline).

`python -m analysis.report --experiment EXP [--out reports/EXP]` (`make report EXP=...`) writes
`index.html`: first, when the experiment has arms, its question answered (analysis.results): one sentence
per headline metric declared in the experiment file (`headline:`, analysis.headline) with the seeds a
decisive answer needs (analysis.power), the results table (also `leaderboard.{tex,md,csv}`, and
`results.md`, the README's row); then every other metric after training (duplicates shown once), the
`@first` means under "before training", curves per arm (`arms.csv`, `comparison.csv`); then the
leaderboards (per run: `leaderboard_runs.*`; per checkpoint), training curves, eval metrics against step,
a diversity-vs-quality plot and NoveltyBench per category, the figures as PNG files beside it.
Right after the headline, what RL changed (analysis.rl_change): each held-out (`val/*`) headline metric
per arm at step 0 and at the end and the change, a sentence each, the table (`rl_change.csv`) and the
per-arm curves with each seed.
"""

from __future__ import annotations

import argparse
import difflib
import html
import re
import sys
from datetime import datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; notebooks keep their inline backend (figures.py sets none)
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from analysis import figures, rl_change  # noqa: E402
from analysis.arms import arm_order, load_arm_runs, reading  # noqa: E402
from analysis.headline import (  # noqa: E402
    base_metric,
    describe_range,
    experiment_headline,
    metric_range,
    run_samples,
)
from analysis.leaderboard import build, by_arm, to_html, write  # noqa: E402
from analysis.results import (  # noqa: E402
    compare,
    headline_sentence,
    method_note,
    power_sentence,
    readme_table,
    results_table,
    to_csv,
    to_latex,
    to_markdown,
)
from analysis.store import (  # noqa: E402
    LAST_STEPS,
    AnalysisError,
    add_last_steps_means,
    checkpoint_table,
    load_history,
    metric_columns,
)
from analysis.view import report_links  # noqa: E402
from infra.tracking import tracking_uri  # noqa: E402

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
p.question { font-size: 18px; margin-bottom: 0.3em; }
ol.headline { font-size: 16px; line-height: 1.4; }
ol.headline li { margin-bottom: 0.6em; }
ol.headline .power { color: #555; font-size: 13px; }
table.results { font-size: 14px; }
"""
# Marks the page once every image has loaded, and where the results table ends, so a headless browser test can
# check rendering and what the first screen holds.
LOAD_CHECK = """
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  document.body.setAttribute('data-images-loaded', ok + '/' + imgs.length);
  var results = document.querySelector('table.results');  // where the first screen's answer ends
  if (results) document.body.setAttribute('data-results-bottom', Math.round(results.getBoundingClientRect().bottom));
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
    headline = experiment_headline(experiment)  # a bad declaration fails before the store is read
    runs, arms = load_arm_runs(experiment, sweep=sweep, uri=uri)
    out_dir.mkdir(parents=True, exist_ok=True)
    fig_dir = out_dir / "fig"
    fig_dir.mkdir(exist_ok=True)
    for old in fig_dir.glob("*.png"):
        old.unlink()
    # a result is a finished run: a killed or running one holds its last logged values (step 0's val/*)
    finished = runs[runs["status"] == "FINISHED"].reset_index(drop=True) if "status" in runs else runs
    order = arm_order(finished, arms)
    sections = _comparison_sections(experiment, runs, finished, arms, order, headline, out_dir, fig_dir, uri)
    sections += _leaderboard_sections(runs, compared=len(order) >= 2, out_dir=out_dir, uri=uri)
    sections += _figure_sections(runs, fig_dir, uri)
    if runs.empty:
        sections.append(("No runs", "<p>The experiment has no runs yet.</p>"))
    sections.append(
        ("Samples behind the numbers", report_links(runs, order, metric_columns(runs)))
    )  # analysis.view
    page = out_dir / "index.html"
    page.write_text(_page(experiment, runs, sections, uri, sweep))
    return page


def _comparison_sections(
    experiment, runs, finished, arms, order, headline, out_dir, fig_dir, uri
) -> list[tuple[str, str]]:
    """The arm comparison of the finished runs where two arms have some, else a note on the declared arms."""
    if len(order) >= 2:
        sweeps = sorted({str(s) for s in finished.get("sweep", []) if s})
        selection = f"sweep {', '.join(sweeps)}" if sweeps else "runs outside sweeps"
        sections = _arm_sections(
            experiment, finished, arms, order, headline, out_dir, fig_dir, uri, selection
        )
        title, content = sections[0]
        sections[0] = (title, _unfinished_note(runs) + content)
        return sections
    if arms:
        declared = "; ".join(f"{a}: {v}" for a, v in arms.items())
        return [
            (
                "Arms",
                f"<p>No two arms have finished runs yet (declared: {html.escape(declared)}).</p>"
                + _unfinished_note(runs),
            )
        ]
    return []


def _leaderboard_sections(runs, compared: bool, out_dir: Path, uri) -> list[tuple[str, str]]:
    """The per-run leaderboard (the leaderboard itself when there is no arm comparison) and, where runs
    saved checkpoints, the per-checkpoint one; each also written as files."""
    board = build(runs, label="run")
    write(board, out_dir, "leaderboard_runs")
    if not compared:  # no arm comparison: the per-run table is the leaderboard
        write(board, out_dir, "leaderboard")
    sections = [("Leaderboard (latest value per run)", to_html(board))]
    ckpts = checkpoint_table(runs, uri)
    if not ckpts.empty:
        ck_board = build(ckpts, label="checkpoint")
        write(ck_board, out_dir, "leaderboard_checkpoints")
        sections.append(("Leaderboard per checkpoint", to_html(ck_board)))
    return sections


def _figure_sections(runs, fig_dir: Path, uri) -> list[tuple[str, str]]:
    """Training curves, eval metrics per checkpoint step, diversity against quality, NoveltyBench by
    category: each where some run logged its metrics."""
    sections = []
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
    return sections


def headline_metrics(table: pd.DataFrame) -> list[str]:
    """The metrics an arm comparison reports, in HEADLINE order (pass@k by k), then the curves' ends."""
    columns = metric_columns(table)
    picked = [c for pat in HEADLINE for c in sorted(columns, key=_natural) if re.match(pat, c)]
    ends = [c for key in SUMMARISED_CURVES for c in (f"{key}@first{LAST_STEPS}", f"{key}@last{LAST_STEPS}")]
    return list(dict.fromkeys(picked + [c for c in ends if c in table]))


def _natural(name: str) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def _arm_sections(
    experiment, runs, arms, order, headline, out_dir, fig_dir, uri, selection
) -> list[tuple[str, str]]:
    """The question answered: the headline sentences with their power lines and the results table, then
    every metric after training, the `@first` means before training, curves per arm."""
    table = runs
    steps = {LAST_STEPS: list(SUMMARISED_CURVES)}  # k -> curves to summarise over their first/last k steps
    for h in headline:
        key, k = base_metric(h.metric)
        if k is not None:
            steps.setdefault(k, []).append(key)
    held_out = rl_change.rl_headline(headline)  # their first (step 0) and last validation: what RL changed
    steps.setdefault(rl_change.ENDS, []).extend(h.metric for h in held_out)
    for k, keys in sorted(steps.items()):
        table = add_last_steps_means(table, list(dict.fromkeys(keys)), k=k, uri=uri)
    candidates = headline_metrics(table)
    plain = [
        m for m in dict.fromkeys([h.metric for h in headline] + candidates) if m in table and "@" not in m
    ]
    history = load_history(list(table["run_id"]), plain, uri)
    r = compare(table, order, candidates, headline, history)
    missing = missing_headline(experiment, r, runs)
    for line in missing:
        print(f"warning: {line}", file=sys.stderr)

    _write_arm_tables(out_dir, r)
    results = results_table(r)
    (out_dir / "leaderboard.md").write_text(to_markdown(results))
    (out_dir / "leaderboard.tex").write_text(to_latex(results, method_note(r)))
    (out_dir / "leaderboard.csv").write_text(to_csv(r))
    (out_dir / "results.md").write_text(readme_table(r, experiment, selection))

    sections = [("Headline", _headline_html(experiment, r, results, missing))]
    found = rl_change.changes(table, history, held_out, order)
    if found:
        (out_dir / "rl_change.csv").write_text(rl_change.to_csv(found))
        figs = _arm_figures(runs, [h.metric for h in held_out], order, fig_dir, "rl", uri, seeds=True)
        sections.append(
            ("What RL changed: held-out figures at step 0 and at the end", _changes_html(found, figs))
        )
    sections.append(("All metrics after training", _metrics_table(r, r.metrics)))
    if r.before:
        sections.append(
            (
                f"Before training (means over the first {LAST_STEPS} steps)",
                _metrics_table(r, r.before),
            )
        )
    # the arm leaderboard as files only (`make leaderboard BY=arm` writes it too): the tables above say it
    write(by_arm(table, arms), out_dir, "leaderboard_arms")
    drawn = {h.metric for h in held_out} if found else set()  # already in "What RL changed"
    imgs = _arm_figures(runs, [k for k in ARM_CURVES if k not in drawn], order, fig_dir, "arm", uri)
    if imgs:
        sections.append(("Curves per arm (bold: mean over seeds)", _figs(imgs)))
    return sections


def _arm_figures(runs, keys, order, fig_dir: Path, prefix: str, uri, seeds: bool = False) -> list[str]:
    """`<prefix>_NN.png`: per logged key, each arm's curve (figures.arm_curves); the files' names."""
    keys = [k for k in keys if k in runs.columns]
    if not keys:
        return []
    hist = load_history(list(runs["run_id"]), keys, uri)
    return [
        _save(
            figures.arm_curves(
                hist, runs, k, order, smooth=3, bounds=metric_range(k, run_samples(runs, k)), seeds=seeds
            ),
            fig_dir / f"{prefix}_{i:02d}.png",
        )
        for i, k in enumerate(keys)
    ]


def _changes_html(found, figs: list[str]) -> str:
    """A sentence per held-out headline metric and arm, the table of both ends and the change, the curves."""
    items = "".join(f"<li>{html.escape(rl_change.sentence(c))}</li>" for c in found)
    rows = "".join(
        f"<tr><td>{html.escape(c.metric)}</td><td>{html.escape(c.arm)}</td>"
        f"<td>{html.escape(rl_change.steps_text(c.first_steps))} &rarr; {html.escape(rl_change.steps_text(c.last_steps))}</td>"
        f"<td>{html.escape(c.start.text())}</td><td>{html.escape(c.end.text())}</td>"
        f"<td>{html.escape(c.change.text(signed=True))}</td><td>{html.escape(rl_change.reading(c.change))}</td></tr>"
        for c in found
    )
    table = (
        '<table class="leaderboard rl-change"><thead><tr><th>metric</th><th>arm</th><th>steps</th>'
        "<th>first validation (before RL)</th><th>last validation (the end)</th><th>change (end - start per seed)</th>"
        f"<th>reading</th></tr></thead><tbody>{rows}</tbody></table>"
    )
    note = (
        "<p class='meta'>Each run validates on the same held-out prompts at step 0 (after any warm-up, before RL) "
        "and later to the end; the change is end minus start per run, its mean with a 95% Student t interval "
        "over seeds (clipped to the difference's range, marked *). The table is <code>rl_change.csv</code>; "
        "the curves show each arm's mean (bold), its band over seeds and each seed (thin).</p>"
    )
    return f"<ol class='rl-change'>{items}</ol>{table}{note}{_figs(figs)}"


def missing_headline(experiment: str, r, runs: pd.DataFrame) -> list[str]:
    """A line per declared headline metric no run has logged: a typo (the closest logged names) or a run
    that does not log it (yet, or with an override such as val_every=0). Shown on the page and on stderr;
    the rest of the report is still written."""
    known = metric_columns(runs)
    lines = []
    for m in r.missing:
        close = difflib.get_close_matches(m, known, n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        lines.append(
            f"headline metric {m!r} (experiments/{experiment}.yaml) is not logged by any of the {len(runs)} runs: "
            f"{hint}fix the name under headline:, or wait for the runs to log it"
        )
    return lines


def _unfinished_note(runs: pd.DataFrame) -> str:
    """The runs left out of the comparison because they have not finished, by name and state."""
    if "status" not in runs:
        return ""
    left = runs[runs["status"] != "FINISHED"]
    if left.empty:
        return ""
    names = ", ".join(f"{n} ({s})" for n, s in zip(left["run_name"], left["status"]))
    return f"<p class='meta unfinished'>Left out, not finished: {html.escape(names)}.</p>"


def _headline_html(experiment: str, r, results, missing: list[str]) -> str:
    """The first screen: the question, one sentence per headline metric with its power line, the table."""
    question = f"Does {r.first} differ from {', '.join(r.baselines)}?"
    items = []
    for h in r.headline:
        for base in r.baselines:
            items.append(
                f"<li><span class='sentence'>{html.escape(headline_sentence(r, h, base))}</span>"
                f"<br><span class='power'>{html.escape(power_sentence(r, h.metric, base))}</span></li>"
            )
    items += [f"<li><span class='sentence missing'>{html.escape(line)}</span></li>" for line in missing]
    if not items:
        items.append(
            f"<li>No headline metrics declared: add <code>headline:</code> next to <code>arms:</code> in "
            f"experiments/{html.escape(experiment)}.yaml (e.g. <code>val/accuracy: higher</code>); every "
            'metric is under "All metrics".</li>'
        )
    counts = ", ".join(f"{a} {n}" for a, n in r.runs_per_arm.items())
    note = (
        f"<p class='meta'>Runs per arm: {html.escape(counts)}. {html.escape(method_note(r))}. "
        f"<code>@last{LAST_STEPS}</code>: a training curve's mean over its last {LAST_STEPS} steps; val/* on "
        "held-out prompts at the end. The table is <code>leaderboard.tex</code> / <code>leaderboard.md</code>; "
        "<code>results.md</code> is the README row (experiments/"
        f"{html.escape(experiment)}.yaml: <code>arms:</code>, <code>headline:</code>).</p>"
    )
    return (
        f"<p class='question'><b>{html.escape(question)}</b></p><ol class='headline'>{''.join(items)}</ol>"
        f"{_results_html(results)}{note}"
    )


def _results_html(results) -> str:
    header, rows, bold = results
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td class='best'><b>{html.escape(c)}</b></td>" if b else f"<td>{html.escape(c)}</td>"
                          for c, b in zip(row, marks)) + "</tr>"
        for row, marks in zip(rows, bold)
    )  # fmt: skip
    return f'<table class="leaderboard results"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def metric_cell(r, metric: str) -> str:
    """A metric's name cell: the name, the names it equals, its range (one place to add a link)."""
    same = r.same_as.get(metric, [])
    text = html.escape(metric) + "".join(f" = {html.escape(s)}" for s in same)
    star = " <b>(headline)</b>" if r.better(metric) else ""
    return f"<td>{text}{star}</td><td>{html.escape(describe_range(r.ranges.get(metric)))}</td>"


def arm_cell(r, arm: str, metric: str) -> str:
    """An arm's value of a metric (one place to add a link to its samples)."""
    return f"<td>{html.escape(r.summary[arm][metric].text())}</td>"


def _metrics_table(r, metrics: list[str]) -> str:
    """A row per metric and baseline: each arm's value, the paired difference, its reading, seeds needed."""
    head = "".join(f"<th>{html.escape(a)}</th>" for a in r.order)
    rows = []
    for m in metrics:
        arms = "".join(arm_cell(r, a, m) for a in r.order)
        for base in r.baselines:
            d, p = r.diffs[(m, base)]["diff"], r.power[(m, base)]
            need = str(p.to_detect) if p.to_detect else "-"
            rows.append(
                f"<tr>{metric_cell(r, m)}{arms}<td>{html.escape(base)}</td>"
                f"<td>{html.escape(d.text(signed=True))}</td><td>{html.escape(reading(d))}</td>"
                f"<td>{need}</td></tr>"
            )
    return (
        f'<table class="leaderboard"><thead><tr><th>metric</th><th>range</th>{head}<th>baseline</th>'
        f"<th>{html.escape(r.first)} - baseline (paired)</th><th>reading</th><th>seeds to tell from 0</th>"
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _selection(runs: pd.DataFrame, sweep: str | None) -> str:
    sweeps = sorted({s for s in runs.get("sweep", []) if s})
    if sweep is None and len(sweeps) == 1:
        return f"sweep {sweeps[0]}, the newest; --sweep all: every run"
    if not sweeps:
        return "runs outside sweeps"
    return f"sweeps {', '.join(sweeps)}; the newest run per arm and seed"


def _write_arm_tables(out_dir: Path, r) -> None:
    """arms.csv (arm, metric, mean, ci_lo, ci_hi, clipped, n, seeds) and comparison.csv (the paired
    differences, verdicts and the seeds a decisive comparison needs), every metric compared."""
    metrics = r.metrics + r.before
    arm_rows = [
        {"arm": a, "metric": m, "mean": e.mean, "ci_lo": e.lo, "ci_hi": e.hi, "clipped": e.clipped, "n": e.n,
         "seeds": " ".join(f"{v:.6g}" for v in e.values)}
        for a in r.order
        for m in metrics
        for e in [r.summary[a][m]]
    ]  # fmt: skip
    pd.DataFrame(arm_rows).to_csv(out_dir / "arms.csv", index=False)
    comp = [
        {"metric": m, "arm": r.first, "baseline": b, "diff": d.mean, "ci_lo": d.lo, "ci_hi": d.hi,
         "clipped": d.clipped, "n": d.n, "seeds": " ".join(f"{v:.6g}" for v in d.values),
         "verdict": r.diffs[(m, b)]["verdict"], "seeds_to_detect": p.to_detect,
         "seeds_for_80pct_power": p.for_power}
        for m in metrics
        for b in r.baselines
        for d, p in [(r.diffs[(m, b)]["diff"], r.power[(m, b)])]
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
