"""What RL changed, per arm (analysis.rl_change): held-out figures at step 0 and at the end, their change
with a t interval over seeds, the sentences, `rl_change.csv` and the per-arm curves with each seed, from a
real MLflow store of tool_math's 3 arms x 3 seeds (tests/analysis_store.py) and on hand-made tables."""

from __future__ import annotations

import html
import math
import re

import pandas as pd
import pytest

from analysis import figures, rl_change
from analysis.arms import Estimate
from analysis.headline import Headline
from analysis.report import build_report
from analysis.view import viewer_url
from tests.analysis_store import tool_math_store

T2 = 4.302652729911275  # t_{0.975, 2}
ACC = "held-out accuracy (4 samples at T=1, with the arm's tools)"  # experiments/tool_math.yaml's labels
RATE = "share of held-out answers that called a tool"


def test_report_gives_each_arms_step_0_end_and_change_with_its_interval(mlflow_uri, tmp_path):
    ids = tool_math_store()
    page = html.unescape(build_report("tool_math", tmp_path / "rep").read_text())
    titles = re.findall(r"<h2>(.*?)</h2>", page)
    assert titles[:2] == ["Headline", "What RL changed: held-out figures at step 0 and at the end"]

    table = pd.read_csv(tmp_path / "rep" / "rl_change.csv", dtype={"first_step": str, "last_step": str})
    rows = {(r.arm, r.metric): r for r in table.itertuples()}
    assert list(zip(table["metric"], table["arm"])) == [
        (m, a)
        for m in ("val/accuracy", "val/tool_call_rate")
        for a in ("calculator", "broken_calculator", "no_tools")
    ]
    assert set(table["first_step"]) == {"0"} and set(table["last_step"]) == {"20"}  # step 10 is neither end
    want = {  # (start, end, change) means and the per-seed changes, from TOOL_MATH_VAL
        ("calculator", "val/accuracy"): (0.3, 0.75, 0.45, "0.5 0.45 0.4"),
        ("broken_calculator", "val/accuracy"): (0.3, 0.3, 0.0, "0.05 0 -0.05"),
        ("no_tools", "val/accuracy"): (0.05, 0.05, 0.0, "0 0.05 -0.05"),
        ("calculator", "val/tool_call_rate"): (0.4, 0.95, 0.55, "0.5 0.55 0.6"),
        ("broken_calculator", "val/tool_call_rate"): (0.4, 0.1, -0.3, "-0.3 -0.2 -0.4"),
        ("no_tools", "val/tool_call_rate"): (0.0, 0.0, 0.0, "0 0 0"),
    }
    for key, (start, end, change, seeds) in want.items():
        r = rows[key]
        assert (r.start_mean, r.end_mean, r.change_mean) == pytest.approx((start, end, change), abs=1e-12), (
            key
        )
        assert (r.change_seeds, r.change_n) == (seeds, 3), key
    # the change's interval: mean +- t_{0.975,2} sd / sqrt(3) over the seeds' changes (sd 0.05, then 0.1)
    calc = rows[("calculator", "val/accuracy")]
    half = T2 * 0.05 / math.sqrt(3)
    assert (calc.change_ci_lo, calc.change_ci_hi) == pytest.approx((0.45 - half, 0.45 + half))
    broken = rows[("broken_calculator", "val/tool_call_rate")]
    half = T2 * 0.1 / math.sqrt(3)
    assert (broken.change_ci_lo, broken.change_ci_hi) == pytest.approx((-0.3 - half, -0.3 + half))
    # an end's interval is clipped to the rate's range [0, 1]: 0.95 + 0.124 is cut at 1
    end = rows[("calculator", "val/tool_call_rate")]
    assert end.end_ci_hi == 1.0 and end.end_clipped and not end.change_clipped

    for line in (
        f"calculator: {ACC} 0.3 -> 0.75 under RL (step 0 -> step 20; +0.45, 95% interval [+0.326, +0.574] "
        "over 3 seeds: rose)",
        f"broken_calculator: {ACC} 0.3 -> 0.3 under RL (step 0 -> step 20; 0, 95% interval [-0.124, +0.124] "
        "over 3 seeds: no change beyond seed noise)",
        f"calculator: {RATE} 0.4 -> 0.95 under RL (step 0 -> step 20; +0.55, 95% interval [+0.426, +0.674] "
        "over 3 seeds: rose)",
        f"broken_calculator: {RATE} 0.4 -> 0.1 under RL (step 0 -> step 20; -0.3, 95% interval "
        "[-0.548, -0.0516] over 3 seeds: fell)",
        f"no_tools: {RATE} 0 -> 0 under RL (step 0 -> step 20; no change in any of the 3 seeds)",
    ):
        assert f"<li>{line}</li>" in page, line
    # the curves of both held-out metrics per arm, with each seed; val/accuracy is not drawn twice
    section = page[page.index("What RL changed") : page.index("<h2>All metrics")]
    assert re.findall(r'src="fig/(rl_\d+\.png)"', section) == ["rl_00.png", "rl_01.png"]
    assert all((tmp_path / "rep" / "fig" / f"rl_{i:02d}.png").stat().st_size > 10_000 for i in (0, 1))
    assert len(list((tmp_path / "rep" / "fig").glob("arm_*.png"))) == 1  # train/accuracy only
    # and the viewer's trajectories at step 0 and at the end, one run per arm
    paired = ",".join(ids[f"{a}-s1"] for a in ("calculator", "broken_calculator", "no_tools"))
    assert f'href="{viewer_url("trajectories", runs=paired, kind="val")}"' in page


HEAD = Headline("val/accuracy", "higher", "held-out accuracy")


def _table(values: dict[str, tuple[float, float]]) -> pd.DataFrame:
    """A report table of one arm's runs: run id -> (first value, last value)."""
    return pd.DataFrame(
        {
            "run_id": list(values),
            "arm": ["A"] * len(values),
            "pair": [f"seed {i}" for i in range(1, len(values) + 1)],
            "val/accuracy@first1": [a for a, _ in values.values()],
            "val/accuracy@last1": [b for _, b in values.values()],
        }
    )


def _history(steps: dict[str, list[int]]) -> pd.DataFrame:
    rows = [(rid, "val/accuracy", s, 0.0) for rid, logged in steps.items() for s in logged]
    return pd.DataFrame(rows, columns=["run_id", "key", "step", "value"])


def test_below_three_seeds_each_seeds_change_and_a_single_validation_has_none():
    table = _table({"r1": (0.2, 0.3), "r2": (0.4, 0.6), "r3": (0.5, 0.5)})
    # r3 validated once (a run stopped after step 0): its value is both ends, and no change
    (c,) = rl_change.changes(table, _history({"r1": [0, 10], "r2": [0, 10], "r3": [0]}), [HEAD], ["A"])
    assert c.change.n == 2 and c.change.values == pytest.approx((0.1, 0.2)) and not c.change.has_ci
    assert (c.start.n, c.end.n, c.first_steps, c.last_steps) == (3, 3, (0,), (0, 10))
    assert rl_change.sentence(c) == (
        "A: held-out accuracy 0.367 -> 0.467 under RL (step 0 -> step 0/10; +0.15, seeds +0.1, +0.2: "
        "rose in both seeds; an interval needs 3 or more seeds)"
    )
    (once,) = rl_change.changes(table, _history({"r1": [0], "r2": [0], "r3": [0]}), [HEAD], ["A"])
    assert rl_change.sentence(once).endswith(
        "(step 0 -> step 0; every run validated once: no change to tell)"
    )
    none = Estimate(math.nan, math.nan, math.nan, 0)
    missing = rl_change.Change("B", "val/accuracy", "held-out accuracy", none, none, none, (), ())
    assert rl_change.sentence(missing) == "B: held-out accuracy not logged"


def test_readings_of_a_change():
    e = lambda *v: Estimate(sum(v) / len(v), math.nan, math.nan, len(v), v)  # noqa: E731 - no interval
    assert rl_change.reading(e(-0.1, -0.2)) == "fell in both seeds"
    assert rl_change.reading(e(0.1, 0.0)) == "rose in some seeds, unchanged in the rest"
    assert rl_change.reading(e(0.1, -0.1)) == "the sign varies across seeds"
    assert rl_change.reading(Estimate(0.1, -0.01, 0.2, 3, (0.0, 0.1, 0.2))) == "no change beyond seed noise"
    assert rl_change.reading(Estimate(-0.1, -0.2, -0.01, 3, (-0.1, -0.1, -0.1))) == "fell"


def test_only_held_out_headline_metrics_are_compared_across_steps():
    heads = [HEAD, Headline("train/accuracy@last5", "higher", "x"), Headline("eval/math/acc", "higher", "y")]
    assert rl_change.rl_headline(heads) == [HEAD]


def test_arm_curves_draw_each_seed_beside_the_band_when_asked():
    hist = pd.DataFrame(
        {
            "run_id": ["a", "a", "b", "b", "c", "c"],
            "key": ["val/accuracy"] * 6,
            "step": [0, 20] * 3,
            "value": [0.3, 0.8, 0.25, 0.7, 0.35, 0.75],
        }
    )
    runs = pd.DataFrame({"run_id": ["a", "b", "c"], "arm": ["calc"] * 3})
    fig = figures.arm_curves(hist, runs, "val/accuracy", ["calc"], seeds=True, bounds=(0.0, 1.0))
    ax = fig.axes[0]
    lines = [list(line.get_ydata()) for line in ax.lines]
    assert lines[:3] == [[0.3, 0.8], [0.25, 0.7], [0.35, 0.75]]  # each seed, thin
    assert lines[3] == pytest.approx([0.3, 0.75]) and ax.lines[3].get_linewidth() == 2  # the mean, bold
    assert len(ax.collections) == 1 and "thin: each seed" in ax.get_title()  # the band over 3 seeds
    banded = figures.arm_curves(hist, runs, "val/accuracy", ["calc"], bounds=(0.0, 1.0))
    assert len(banded.axes[0].lines) == 1  # without `seeds`: the band and the mean only, as before
