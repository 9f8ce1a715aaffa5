"""Read training runs and eval results out of MLflow into pandas tables.

The one helper module the leaderboard, the report and the notebooks share. It only reads; the
naming conventions it relies on are written by infra/tracking.py, orchestration/sweep.py and evals/common:
metrics `train/*`, `val/*`, `reward/*`, `eval/<suite>/<metric>` (CI bounds `<metric>_ci_lo/_ci_hi`),
tags `rlpost.sweep`, `rlpost.kind` (sweep | train), `rlpost.grid_point` (JSON).
"""

from __future__ import annotations

import json
from functools import lru_cache

import pandas as pd

from infra.tracking import mlflow_client, tracking_uri

CI_SUFFIXES = ("_ci_lo", "_ci_hi")
RUN_COLUMNS = ["run_id", "run_name", "experiment", "status", "sweep", "group", "grid_point", "start_time"]


class AnalysisError(ValueError):
    """Bad input to an analysis command (unknown experiment, ...): its message is one line for the user."""


def client(uri: str | None = None):
    return _client(uri or tracking_uri())


@lru_cache(maxsize=8)
def _client(uri: str):
    """One client per store: building one opens the database and checks its schema (seconds)."""
    return mlflow_client(uri)


def experiment_ids(experiment: str | None = None, uri: str | None = None) -> dict[str, str]:
    """Experiment id -> name: the named one, or every experiment in the store.

    An unknown name raises AnalysisError listing the known ones; an empty store gives {}.
    """
    from mlflow.entities import ViewType

    exps = client(uri).search_experiments(view_type=ViewType.ACTIVE_ONLY)
    by_name = {e.name: e.experiment_id for e in exps}
    if experiment is None:
        return {eid: name for name, eid in by_name.items()}
    if experiment not in by_name:
        known = ", ".join(sorted(n for n in by_name if n != "Default")) or "none"
        raise AnalysisError(
            f"unknown MLflow experiment {experiment!r} in {uri or tracking_uri()} (known: {known}); "
            "pass EXP=<one of them> or set MLFLOW_TRACKING_URI"
        )
    return {by_name[experiment]: experiment}


def group_label(grid_point: str | None, run_name: str) -> str:
    """What a run is an instance of: its grid point without the seed (runs differing only by seed pool)."""
    if not grid_point:
        return run_name
    try:
        point = json.loads(grid_point)
    except json.JSONDecodeError:
        return grid_point
    point = {k: v for k, v in point.items() if k.split(".")[-1] != "seed"}
    return ",".join(f"{k.split('.')[-1]}={v}" for k, v in sorted(point.items())) or "default"


def load_runs(
    experiment: str | None = None,
    sweep: str | None = None,
    uri: str | None = None,
    include_sweep_parents: bool = False,
) -> pd.DataFrame:
    """One row per run: RUN_COLUMNS, then `param:<key>` columns, then one column per metric (latest value).

    Runs with different metric sets simply have NaN where a metric is missing.
    """
    ids = experiment_ids(experiment, uri)
    if not ids:
        return pd.DataFrame(columns=RUN_COLUMNS)
    filter_string = f"tags.`rlpost.sweep` = '{sweep}'" if sweep else ""
    runs = []
    page_token = None
    c = client(uri)
    while True:
        page = c.search_runs(list(ids), filter_string=filter_string, max_results=1000, page_token=page_token)
        runs.extend(page)
        page_token = page.token
        if not page_token:
            break
    rows = []
    for r in runs:
        tags = r.data.tags
        if tags.get("rlpost.kind") == "sweep" and not include_sweep_parents:
            continue
        name = r.info.run_name or r.info.run_id[:8]
        row = {
            "run_id": r.info.run_id,
            "run_name": name,
            "experiment": ids.get(r.info.experiment_id, r.info.experiment_id),
            "status": r.info.status,
            "sweep": tags.get("rlpost.sweep", ""),
            "group": group_label(tags.get("rlpost.grid_point"), name),
            "grid_point": tags.get("rlpost.grid_point", ""),
            "start_time": pd.to_datetime(r.info.start_time, unit="ms"),
        }
        row.update({f"param:{k}": v for k, v in r.data.params.items()})
        row.update(r.data.metrics)
        rows.append(row)
    if not rows:
        return pd.DataFrame(columns=RUN_COLUMNS)
    return pd.DataFrame(rows).sort_values(["experiment", "start_time"], kind="stable").reset_index(drop=True)


def metric_columns(df: pd.DataFrame, prefix: str = "") -> list[str]:
    """Metric columns of a `load_runs` table (CI-bound columns excluded), optionally by prefix."""
    skip = set(RUN_COLUMNS)
    return [
        c
        for c in df.columns
        if c not in skip
        and not c.startswith("param:")
        and c.startswith(prefix)
        and not c.endswith(CI_SUFFIXES)
    ]


def load_history(run_ids: list[str], keys: list[str], uri: str | None = None) -> pd.DataFrame:
    """Long table (run_id, key, step, value) of every logged value of `keys` for `run_ids`."""
    c = client(uri)
    rows = [
        (rid, key, m.step, m.value) for rid in run_ids for key in keys for m in c.get_metric_history(rid, key)
    ]
    df = pd.DataFrame(rows, columns=["run_id", "key", "step", "value"])
    return df.sort_values(["run_id", "key", "step"], kind="stable").reset_index(drop=True)


def checkpoint_table(runs: pd.DataFrame, uri: str | None = None) -> pd.DataFrame:
    """One row per (run, evaluated checkpoint step): the eval metrics logged at that step."""
    eval_keys = [c for c in runs.columns if c.startswith("eval/")]
    if runs.empty or not eval_keys:
        return pd.DataFrame(columns=["run_id", "run_name", "group", "step"])
    hist = load_history(list(runs["run_id"]), eval_keys, uri)
    if hist.empty:
        return pd.DataFrame(columns=["run_id", "run_name", "group", "step"])
    wide = hist.pivot_table(
        index=["run_id", "step"], columns="key", values="value", aggfunc="last"
    ).reset_index()
    wide.columns.name = None
    meta = runs[["run_id", "run_name", "group"]]
    out = meta.merge(wide, on="run_id", how="inner")
    out["run_name"] = out["run_name"] + "@" + out["step"].astype(int).astype(str)
    return out.sort_values(["group", "run_name"], kind="stable").reset_index(drop=True)


LAST_STEPS = 5  # training curves are summarised by their mean over the last LAST_STEPS logged steps


def add_last_steps_means(
    runs: pd.DataFrame, keys: list[str], k: int = LAST_STEPS, uri: str | None = None
) -> pd.DataFrame:
    """`runs` plus a `<key>@last<k>` column per key: the mean of its last k logged steps (noisy per-step
    training metrics compared at the end of training) and `<key>@first<k>` (the start, for contrast)."""
    out = runs.copy()
    keys = [key for key in keys if key in out.columns]
    if out.empty or not keys:
        return out
    hist = load_history(list(out["run_id"]), keys, uri)
    for key in keys:
        h = hist[hist["key"] == key].sort_values("step")
        last = h.groupby("run_id")["value"].apply(lambda v: v.tail(k).mean())
        first = h.groupby("run_id")["value"].apply(lambda v: v.head(k).mean())
        out[f"{key}@first{k}"] = out["run_id"].map(first)
        out[f"{key}@last{k}"] = out["run_id"].map(last)
    return out
