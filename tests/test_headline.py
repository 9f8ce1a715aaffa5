"""The report as a results table: headline declarations, metric ranges, clipped intervals, seeds needed
(hand-computed), duplicate series, and the page, the LaTeX table and the README row from a real MLflow
store of darling_math's 2- and 3-seed sweeps (tests/analysis_store.darling_math_store)."""

from __future__ import annotations

import html
import math
import re

import pandas as pd
import pytest
from matplotlib.collections import PolyCollection

from analysis import arms as A
from analysis import figures
from analysis.headline import Headline, experiment_headline, metric_range, parse_headline
from analysis.power import power_at, seeds_needed
from analysis.report import build_report
from analysis.results import equal_series
from analysis.store import AnalysisError
from tests.analysis_store import darling_math_store

T2 = 4.302652729911275  # t_{0.975, 2}


# ---- declarations and ranges -----------------------------------------------------------------------


def test_headline_is_declared_next_to_arms():
    heads = experiment_headline("darling_math")
    assert [(h.metric, h.better) for h in heads] == [
        ("val/distinct_correct_mean", "higher"),
        ("val/accuracy", "higher"),
    ]
    for name in ("classmate_sycophancy", "darling_wildchat", "dpo_darling_math"):  # every file with arms:
        assert experiment_headline(name), name
    assert experiment_headline("no_such_experiment_file") == []
    assert parse_headline({"val/accuracy": "lower", "train/accuracy@last5": {"better": "higher"}}, "x") == [
        Headline("val/accuracy", "lower", "val/accuracy"),
        Headline("train/accuracy@last5", "higher", "train/accuracy@last5"),
    ]
    assert parse_headline({"m/x": {"better": "higher", "range": [0, 8]}}, "x")[0].range == (0.0, 8.0)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"val/accuracy": "up"}, r"'val/accuracy' has better='up'; write higher or lower"),
        ({"accuracy": "higher"}, r"'accuracy' is not a logged metric name"),
        ({"val/accuracy@last": "higher"}, r"'val/accuracy@last' is not a logged metric name"),
        (
            {"val/accuracy": {"better": "higher", "rnage": [0, 1]}},
            r"'val/accuracy' has unknown keys \['rnage'\]",
        ),
        ({"val/accuracy": {"better": "higher", "range": [1, 0]}}, r"'val/accuracy' has range \[1, 0\]"),
        (["val/accuracy"], r"headline must map metric names to higher\|lower"),
    ],
)
def test_a_bad_headline_is_one_line_naming_the_metric(raw, message):
    with pytest.raises(AnalysisError, match=message) as info:
        parse_headline(raw, "experiments/x.yaml")
    assert "\n" not in str(info.value) and str(info.value).startswith("experiments/x.yaml: ")


def test_a_bad_headline_in_the_experiment_file_stops_the_report(tmp_path, monkeypatch, mlflow_uri):
    import train.config

    (tmp_path / "bad.yaml").write_text("arms:\n  A: {seed: 1}\nheadline:\n  val/accuracy: more\n")
    monkeypatch.setattr(train.config, "EXPERIMENTS_DIR", tmp_path)
    with pytest.raises(AnalysisError, match=r"bad.yaml: headline metric 'val/accuracy' has better='more'"):
        build_report("bad", tmp_path / "rep")


def test_metric_ranges_from_names_and_declarations():
    for unit in ("val/accuracy", "val/pass_at_8", "eval/math/acc", "eval/sycophancy/flip_rate",
                 "train/accuracy@last5", "reward/distinct_share_mean"):  # fmt: skip
        assert metric_range(unit) == (0.0, 1.0), unit
    assert metric_range("val/distinct_correct_mean", samples=8) == (0.0, 8.0)
    assert metric_range("reward/distinct_classes_mean@first5", samples=6) == (0.0, 6.0)
    assert metric_range("val/distinct_k") == (0.0, math.inf)  # n unknown: only >= 0
    assert metric_range("train/response_length_mean") == (0.0, math.inf)
    assert metric_range("eval/novelty/distinct") == (0.0, math.inf)
    assert metric_range("train/reward_mean") is None and metric_range("actor/kl_loss") is None
    assert metric_range("val/accuracy", declared=(0.0, 0.5)) == (0.0, 0.5)


# ---- intervals and seeds needed, by hand --------------------------------------------------------


def test_intervals_stay_in_range_and_need_three_seeds():
    # DARLING accuracy over 3 seeds: mean 0.91333, sd 0.050332; t interval 0.91333 -+ 4.3027 * 0.050332 / sqrt 3
    e = A.interval([0.92, 0.96, 0.86], (0.0, 1.0))
    half = T2 * 0.0503322295684717 / math.sqrt(3)
    assert e.lo == pytest.approx(0.9133333 - half) and e.hi == 1.0 and e.clipped  # 1.0383 cut at 1
    assert e.text() == "0.913 [0.788, 1]*" and isinstance(e.hi, float)
    inside = A.interval([0.3, 0.4, 0.5], (0.0, 1.0))
    assert not inside.clipped and inside.text() == "0.4 [0.152, 0.648]"
    two = A.interval([0.92, 0.96], (0.0, 1.0))  # t over 2 seeds: 0.94 -+ 12.7 * 0.028 / 1.41 = [0.686, 1.19]
    assert not two.has_ci and math.isnan(two.lo) and two.text() == "0.94 (seeds 0.92, 0.96)"
    assert A.interval([0.7]).text() == "0.7 (one seed)"
    diff = A.paired_difference({"1": 0.92, "2": 0.96, "3": 0.86}, {"1": 0.1, "2": 0.12, "3": 0.05}, (-1, 1))
    assert diff.values == pytest.approx((0.82, 0.84, 0.81)) and diff.hi <= 1.0


def test_verdicts_below_three_seeds_give_the_seeds_not_an_interval():
    both = A.paired_difference({"1": 5.5, "2": 5.1}, {"1": 1.5, "2": 2.4})
    assert A.verdict("m", "DARLING", "GRPO", both, better="higher") == (
        "m: DARLING better than GRPO in both seeds (+4, +2.7); an interval needs 3 or more seeds"
    )
    assert A.verdict("m", "DARLING", "GRPO", both, better="lower").startswith("m: DARLING worse than GRPO")
    mixed = A.paired_difference({"1": 0.5, "2": 0.3}, {"1": 0.4, "2": 0.4})
    assert A.verdict("m", "X", "Y", mixed) == (
        "m: X - Y changes sign across the 2 seeds (+0.1, -0.1); an interval needs 3 or more seeds"
    )
    assert A.reading(both) == "higher in both seeds" and A.reading(mixed) == "sign varies"
    tie = A.paired_difference({"1": 0.781, "2": 0.828}, {"1": 0.781, "2": 0.805})  # the real 4-step sweep
    assert A.verdict("m", "DARLING", "GRPO", tie, better="higher") == (
        "m: DARLING better than GRPO in 1 of 2 seeds, equal in the rest (+0, +0.023); an interval needs 3 or "
        "more seeds"
    )
    assert A.reading(tie) == "higher or equal"


def test_seeds_needed_by_hand():
    # differences 0, 1, 2: mean 1, sd 1. t_{.975,5} / sqrt 6 = 1.0495 > 1, t_{.975,6} / sqrt 7 = 0.9248 < 1
    p = seeds_needed([0.0, 1.0, 2.0])
    assert (p.mean, p.sd, p.n, p.to_detect) == (1.0, 1.0, 3, 7)
    # 80% power for effect size 1: 10 seeds (power 0.803; 9 seeds: 0.748), as in power tables for d = 1
    assert p.for_power == 10 and power_at(10, 1.0) == pytest.approx(0.8031, abs=1e-3)
    assert power_at(9, 1.0) < 0.8
    assert seeds_needed([0.0, -1.0, -2.0]).to_detect == 7  # the sign does not matter
    big = seeds_needed(
        [4.0, 2.7], min_seeds=3
    )  # mean 3.35, sd 0.919: 3 seeds already (t_2 * sd / sqrt 3 = 2.28)
    assert big.to_detect == 3
    assert seeds_needed([1.0, 1.0, 1.0]).reason == "no spread between seeds observed"
    assert seeds_needed([0.1, -0.1]).to_detect is None and seeds_needed([0.1, -0.1]).reason
    assert seeds_needed([0.3]).to_detect is None and "2 or more seeds" in seeds_needed([0.3]).reason
    tiny = seeds_needed([0.001, -0.0009, 0.0011])
    assert tiny.to_detect is not None and tiny.to_detect > 3  # small effect, large spread: many seeds


def test_power_sentences_say_when_the_seeds_cannot_tell():
    from types import SimpleNamespace

    from analysis.results import power_sentence

    def line(diffs):
        return power_sentence(SimpleNamespace(power={("m", "b"): seeds_needed(diffs, min_seeds=3)}), "m", "b")

    assert line([0.3]) == "Seeds needed: not estimable (the spread needs 2 or more seeds)."
    assert line([0.1, -0.1]) == "Seeds needed: not estimable (the observed difference is 0)."
    assert line([1.0, 1.0, 1.0]).endswith(
        ": 3 (no spread between seeds observed; 3 seeds say little about it)."
    )
    # mean 0.0004, sd 0.0011269: effect 0.35494; t_{.975,31} / sqrt 32 = 0.36054 > it, t_{.975,32} / sqrt 33 = 0.35458 <
    assert line([0.001, -0.0009, 0.0011]) == (
        "Seeds needed to tell +0.0004 (per-seed sd 0.00113 over 3 seeds) from 0 at 95% (two-sided paired t): 33; "
        "for 80% power: 65."
    )


def test_equal_series_are_detected_and_saturated_ones_kept():
    rows = []
    for run, (acc, pass8) in {"a": (0.7, 1.0), "b": (0.9, 1.0)}.items():
        for step, scale in ((0, 0.9), (10, 1.0)):
            rows += [
                (run, "val/accuracy", step, acc * scale),
                (run, "val/pass_at_1", step, acc * scale),
                (run, "val/pass_at_7", step, pass8),
                (run, "val/pass_at_8", step, pass8),
                (run, "val/distinct_k", step, acc * scale * 8),
            ]
    hist = pd.DataFrame(rows, columns=["run_id", "key", "step", "value"])
    metrics = ["val/accuracy", "val/pass_at_1", "val/pass_at_7", "val/pass_at_8", "val/distinct_k"]
    assert equal_series(hist, metrics) == {"val/pass_at_1": "val/accuracy"}
    shifted = hist.copy()
    shifted.loc[(shifted["key"] == "val/pass_at_1") & (shifted["step"] == 0), "value"] += 0.01
    assert equal_series(shifted, metrics) == {}  # equal at the end but not at step 0: two metrics


def test_arm_curves_show_seeds_below_three_and_a_clipped_light_band_from_three():
    def history(seeds):
        return pd.DataFrame(
            [
                (f"r{s}", "val/accuracy", step, v)
                for s, vals in seeds.items()
                for step, v in zip((0, 10), vals)
            ],
            columns=["run_id", "key", "step", "value"],
        )

    two = {1: (0.7, 0.92), 2: (0.7, 0.99)}
    runs = pd.DataFrame({"run_id": ["r1", "r2"], "arm": ["A", "A"]})
    fig = figures.arm_curves(history(two), runs, "val/accuracy", ["A"], bounds=(0.0, 1.0))
    ax = fig.axes[0]
    assert not [c for c in ax.collections if isinstance(c, PolyCollection)]  # no band from 2 seeds
    assert len(ax.lines) == 3 and "each seed" in ax.get_title()  # 2 thin seed lines + the mean
    three = {1: (0.7, 0.92), 2: (0.72, 0.99), 3: (0.69, 0.86)}
    runs3 = pd.DataFrame({"run_id": ["r1", "r2", "r3"], "arm": ["A"] * 3})
    ax = figures.arm_curves(history(three), runs3, "val/accuracy", ["A"], bounds=(0.0, 1.0)).axes[0]
    (band,) = [c for c in ax.collections if isinstance(c, PolyCollection)]
    ys = band.get_paths()[0].vertices[:, 1]
    assert ys.max() == pytest.approx(1.0) and ys.min() >= 0.0  # the unclipped t band reaches 1.038
    assert band.get_alpha() <= 0.15 and "clipped to [0, 1]" in ax.get_title()


# ---- the page, the table and the README row from a real store -----------------------------------


def _text(html_page: str) -> str:
    body = re.sub(r"<(style|script)>.*?</\1>", "", html_page, flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body)).replace("&#x27;", "'").replace("&quot;", '"')


def test_two_seed_report_opens_with_the_headline_and_draws_no_interval(mlflow_uri, tmp_path):
    darling_math_store(seeds=(1, 2))
    out = tmp_path / "rep"
    page = build_report("darling_math", out).read_text()
    titles = re.findall(r"<h2>(.*?)</h2>", page)
    assert titles[:4] == [
        "Headline",
        "What RL changed: held-out figures at step 0 and at the end",
        "All metrics after training",
        "Before training (means over the first 5 steps)",
    ]
    text = _text(page)
    head = text[text.index("Does DARLING differ from GRPO?") : text.index("What RL changed")]
    # each arm's held-out accuracy from step 0 (0.7 in every run) to the end: +0.22, +0.26 for DARLING
    assert (
        "DARLING: held-out accuracy (= pass@1) 0.7 -> 0.94 under RL (step 0 -> step 8; +0.24, seeds +0.22, "
        "+0.26: rose in both seeds; an interval needs 3 or more seeds)" in html.unescape(text)
    )
    first = (
        "distinct correct answers per held-out prompt (of 8 samples), higher is better: DARLING 5.3 (seeds 5.5, "
        "5.1) vs GRPO 1.95 (seeds 1.5, 2.4); DARLING better than GRPO in both seeds (+4, +2.7); an interval "
        "needs 3 or more seeds."
    )
    second = "held-out accuracy (= pass@1), higher is better: DARLING 0.94 (seeds 0.92, 0.96) vs GRPO 0.975"
    assert head.index(first) < head.index(second)
    # power: differences +4, +2.7 (mean 3.35, sd 0.919); accuracy -0.04, -0.03 (sd 0.00707)
    assert (
        "Seeds needed to tell +3.35 (per-seed sd 0.919 over 2 seeds) from 0 at 95% (two-sided paired t): 3"
        in head
    )
    assert (
        "Seeds needed to tell -0.035 (per-seed sd 0.00707 over 2 seeds) from 0 at 95% (two-sided paired t): 3; for 80% power: 4"
        in head
    )
    assert not re.search(r"\[[-+0-9.e]+, [-+0-9.e]+\]", head)  # no interval anywhere in the headline
    rows = [r.strip() for r in re.findall(r"<tr><td>(val/[^<]*|train/[^<]*|reward/[^<]*)<", page)]
    assert "val/accuracy = val/pass_at_1" in rows and "val/pass_at_1" not in rows  # pass@1 shown once
    before = page[page.index("<h2>Before training") :]
    assert (
        "train/accuracy@first5" in before
        and "train/accuracy@first5" not in page[: page.index("<h2>Before training")]
    )
    comparison = pd.read_csv(out / "comparison.csv")
    assert comparison["ci_lo"].isna().all()  # no interval from 2 seeds, in the files either


def test_three_seed_report_clips_intervals_and_the_table_and_readme_row_share_its_numbers(
    mlflow_uri, tmp_path
):
    darling_math_store(seeds=(1, 2, 3))
    out = tmp_path / "rep"
    text = _text(build_report("darling_math", out).read_text())
    head = text[text.index("Does DARLING differ from GRPO?") : text.index("All metrics after training")]
    # accuracy DARLING 0.92, 0.96, 0.86 -> t interval [0.788, 1.038]; GRPO 0.96, 0.99, 0.97 -> [0.935, 1.011]
    assert "DARLING 0.913 [0.788, 1]* vs GRPO 0.973 [0.935, 1]*" in head
    # distinct correct: paired differences 4.0, 2.7, 4.2: mean 3.633, sd 0.8145 -> 3.633 -+ 4.303 * 0.8145 / sqrt 3
    assert "DARLING better than GRPO by 3.63 [+1.61, +5.66], 3 seeds." in head
    assert (
        "Seeds needed to tell +3.63 (per-seed sd 0.814 over 3 seeds) from 0 at 95% (two-sided paired t): 3 (the 3 seeds here suffice)"
        in head
    )
    # accuracy differences -0.04, -0.03, -0.11: mean -0.06, sd 0.0436; t_{.975,4} * 0.0436 / sqrt 5 = 0.054 < 0.06
    assert (
        "Seeds needed to tell -0.06 (per-seed sd 0.0436 over 3 seeds) from 0 at 95% (two-sided paired t): 5; for 80% power: 7."
        in head
    )
    all_metrics = text[text.index("All metrics after training") : text.index("Curves per arm")]
    for lo, hi in re.findall(r"(?<![-+])\[([0-9.e-]+), ([0-9.e-]+)\]", all_metrics):  # per-arm intervals
        assert 0.0 <= float(lo) and float(hi) <= 8.0
    for name in ("val/pass_at_2", "train/accuracy@last5"):  # unit metrics: no bound past 1
        row = all_metrics[all_metrics.index(name) :].split(" GRPO ")[0]
        assert all(float(hi) <= 1.0 for _, hi in re.findall(r"\[([0-9.e-]+), ([0-9.e-]+)\]", row)), row
    tex = (out / "leaderboard.tex").read_text()
    assert "DARLING (n=3) & \\textbf{5.33 [4.82, 5.85]} & 0.913 [0.788, 1]* \\\\" in tex
    assert "DARLING - GRPO (paired) & +3.63 [+1.61, +5.66] & -0.06 [-0.168, +0.0483] \\\\" in tex
    assert "val/distinct\\_correct\\_mean $\\uparrow$" in tex
    md = (out / "leaderboard.md").read_text()
    assert "| DARLING (n=3) | **5.33 [4.82, 5.85]** | 0.913 [0.788, 1]* |" in md
    readme = (out / "results.md").read_text().splitlines()
    assert readme[:2] == ["| experiment | result |", "|---|---|"]
    assert readme[2].startswith(
        "| `darling_math` (DARLING vs GRPO, 3 seeds; sweep s1) | distinct correct answers"
    )
    assert (
        "DARLING better than GRPO by 3.63 [+1.61, +5.66], 3 seeds [seeds to tell it from 0 at 95%: 3]."
        in readme[2]
    )
    csv = pd.read_csv(out / "leaderboard.csv")
    acc = csv[(csv["row"] == "DARLING") & (csv["metric"] == "val/accuracy")].iloc[0]
    assert acc["ci_hi"] == 1.0 and bool(acc["clipped"]) and acc["seeds"] == "0.92 0.96 0.86"


def test_a_headline_metric_no_run_logs_is_named_on_the_page(mlflow_uri, tmp_path, monkeypatch, capsys):
    import train.config

    (tmp_path / "darling_math.yaml").write_text(
        (train.config.EXPERIMENTS_DIR / "darling_math.yaml")
        .read_text()
        .replace("val/accuracy: {better", "val/acuracy: {better")
    )
    monkeypatch.setattr(train.config, "EXPERIMENTS_DIR", tmp_path)
    darling_math_store(seeds=(1, 2))
    text = _text(build_report("darling_math", tmp_path / "rep").read_text())
    line = ("headline metric 'val/acuracy' (experiments/darling_math.yaml) is not logged by any of the 4 runs: "
            "did you mean val/accuracy")  # fmt: skip
    assert line in text and line in capsys.readouterr().err
    assert "distinct correct answers per held-out prompt" in text  # the rest is still reported


def test_a_run_that_did_not_finish_is_left_out_of_the_comparison(mlflow_uri, tmp_path):
    """A killed run's latest val/* are its step-0 values: counted, they would pose as an untrained seed."""
    from analysis.store import client
    from tests.analysis_store import log_run

    darling_math_store(seeds=(1, 2))
    killed = log_run(
        "darling_math", "darling_math-darling-s3", {"reward.combine": "multiplicative", "seed": 3},
        {"train/accuracy": [0.6]}, {0: {"val/accuracy": 0.45, "val/distinct_correct_mean": 3.2}},
    )  # fmt: skip
    client().set_terminated(killed, "KILLED")
    text = _text(build_report("darling_math", tmp_path / "rep").read_text())
    assert "Left out, not finished: darling_math-darling-s3 (KILLED)." in text
    assert "DARLING 5.3 (seeds 5.5, 5.1) vs GRPO 1.95" in text  # not 4.6 (seeds 5.5, 5.1, 3.2)
    assert "DARLING (n=2)" in text
