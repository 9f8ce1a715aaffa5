"""What an experiment reports first, and the range each metric lives in.

An experiment file declares its headline metrics next to `arms:`, each with the direction that is better
(and optionally a label for the sentence and the metric's range):

    headline:
      val/distinct_correct_mean: {better: higher, label: distinct correct answers per prompt (of 8)}
      val/accuracy: higher

A metric's range keeps its intervals inside the values it can take: the declared `range: [lo, hi]`, else
from its name (`metric_range`): accuracies, pass@k, rates and fractions lie in [0, 1]; distinct-answer
counts in [0, n] with n the samples per prompt (`data.val_n` for val/*, `rollout.n` for training curves)
when the runs agree on it, else >= 0; counts, lengths and entropies >= 0; anything else is unbounded.
Pure, except `experiment_headline` (reads the YAML).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import pandas as pd
from omegaconf import OmegaConf

from analysis.store import AnalysisError

DIRECTIONS = ("higher", "lower")
# a logged metric name (`val/accuracy`, `eval/math/acc`), optionally a training curve's mean over its first or
# last k steps (`train/accuracy@last5`, what analysis.store.add_last_steps_means computes)
METRIC_NAME = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+(@(first|last)[1-9][0-9]*)?$")
STEPS_SUFFIX = re.compile(r"@(first|last)([1-9][0-9]*)$")

Range = tuple[float, float]
UNIT = (0.0, 1.0)
NON_NEGATIVE = (0.0, math.inf)
# last path segment (suffix @first/@last removed) -> range; the first rule that matches decides
UNIT_NAMES = re.compile(r"(^|_)(acc|accuracy|pass_at_\d+|rate|frac|fraction|share|prob|probability)(_|$)")
PER_SAMPLE_COUNTS = re.compile(r"^(distinct_correct_mean|distinct_classes_mean|distinct_k)$")
COUNT_NAMES = re.compile(r"(^|_)(count|num|len|length|tokens|distinct|entropy)(_|$)")


@dataclass(frozen=True)
class Headline:
    """One headline metric: which direction is better, the words the sentence uses, its declared range."""

    metric: str
    better: str  # "higher" | "lower"
    label: str
    range: Range | None = None


def parse_headline(raw: object, where: str) -> list[Headline]:
    """The `headline:` mapping of an experiment file -> Headlines in file order; AnalysisError (one line,
    naming the metric and the fix) on anything else."""
    if raw is None:
        return []
    example = "e.g. headline: {val/accuracy: higher}"
    if not isinstance(raw, dict):
        raise AnalysisError(f"{where}: headline must map metric names to higher|lower, {example}")
    out = []
    for metric, spec in raw.items():
        metric = str(metric)
        if not METRIC_NAME.match(metric):
            raise AnalysisError(
                f"{where}: headline metric {metric!r} is not a logged metric name (prefix/name, optionally "
                f"@last5 or @first5), {example}"
            )
        if isinstance(spec, str):
            spec = {"better": spec}
        if not isinstance(spec, dict):
            raise AnalysisError(f"{where}: headline metric {metric!r} needs higher|lower, {example}")
        unknown = sorted(set(spec) - {"better", "label", "range"})
        if unknown:
            raise AnalysisError(
                f"{where}: headline metric {metric!r} has unknown keys {unknown} (allowed: better, label, range)"
            )
        better = spec.get("better")
        if better not in DIRECTIONS:
            raise AnalysisError(
                f"{where}: headline metric {metric!r} has better={better!r}; write higher or lower, "
                f"e.g. {metric}: higher"
            )
        out.append(
            Headline(metric, better, str(spec.get("label") or metric), _declared_range(spec, metric, where))
        )
    return out


def _declared_range(spec: dict, metric: str, where: str) -> Range | None:
    if "range" not in spec:
        return None
    r = spec["range"]
    ok = isinstance(r, (list, tuple)) and len(r) == 2 and all(isinstance(v, (int, float)) for v in r)
    if not ok or not r[0] < r[1]:
        raise AnalysisError(
            f"{where}: headline metric {metric!r} has range {r!r}; write range: [lo, hi] with lo < hi"
        )
    return (float(r[0]), float(r[1]))


def experiment_headline(experiment: str) -> list[Headline]:
    """`headline:` of experiments/<experiment>.yaml, or [] when it declares none (or has no file)."""
    from train.config import ConfigError, experiment_file

    try:
        path = experiment_file(experiment)
    except ConfigError:
        return []
    raw = OmegaConf.load(path).get("headline")
    return parse_headline(OmegaConf.to_container(raw, resolve=True) if raw is not None else None, str(path))


def base_metric(metric: str) -> tuple[str, int | None]:
    """`train/accuracy@last5` -> ("train/accuracy", 5); a plain name -> (name, None)."""
    m = STEPS_SUFFIX.search(metric)
    return (metric[: m.start()], int(m.group(2))) if m else (metric, None)


def samples_param(metric: str) -> str:
    """The config key holding how many samples a per-prompt count of `metric` is taken over."""
    return "data.val_n" if metric.startswith("val/") else "rollout.n"


def run_samples(table: pd.DataFrame, metric: str) -> int | None:
    """n of a per-prompt count of `metric` when every run has the same one (param data.val_n/rollout.n)."""
    col = f"param:{samples_param(metric)}"
    if col not in table:
        return None
    values = {str(v) for v in table[col].dropna()}
    if len(values) != 1:
        return None
    try:
        return int(float(values.pop()))
    except ValueError:
        return None


def metric_range(metric: str, samples: int | None = None, declared: Range | None = None) -> Range | None:
    """The values `metric` can take (see the module doc); `samples`: n for per-prompt counts when known."""
    if declared is not None:
        return declared
    name = base_metric(metric)[0].rsplit("/", 1)[-1]
    if UNIT_NAMES.search(name):
        return UNIT
    if PER_SAMPLE_COUNTS.match(name):
        return (0.0, float(samples)) if samples else NON_NEGATIVE
    if COUNT_NAMES.search(name):
        return NON_NEGATIVE
    return None


def difference_range(r: Range | None) -> Range | None:
    """The range of a difference of two values in `r`."""
    if r is None:
        return None
    width = r[1] - r[0]
    return (-width, width)


def describe_range(r: Range | None) -> str:
    if r is None:
        return "unbounded"
    if math.isinf(r[1]):
        return f">= {r[0]:g}"
    return f"[{r[0]:g}, {r[1]:g}]"
