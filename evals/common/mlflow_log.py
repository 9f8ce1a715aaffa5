"""Eval metrics into MLflow: `eval/<suite>/<metric>` on the checkpoint's training run at its step.

MLflow names allow only alphanumerics and `_-. :/`: `metric_name` spells `@` as `_at_` (`pass@4` ->
`pass_at_4`) and replaces any other character with `_`; summary.json keeps the suite's own names.

A bare model folder (no training run) gets an eval-only run in experiment `evals`, found again by its
path tag on later evals, so all suites of one folder land in one run.
"""

from __future__ import annotations

import math
import re
import time

from evals.common.checkpoints import CheckpointRef
from infra.tracking import experiment_id, mlflow_client, tag_filter

EVAL_EXPERIMENT = "evals"
EVAL_OF_TAG = "rlpost.eval_of"


def metric_name(suite: str, name: str) -> str:
    """The MLflow key of a suite metric: `eval/<suite>/<name>` with only characters MLflow accepts."""
    return re.sub(r"[^A-Za-z0-9_\-. :/]", "_", f"eval/{suite}/{name}".replace("@", "_at_"))


def _client():
    return mlflow_client()


def eval_only_run(client, checkpoint: CheckpointRef) -> str:
    """The eval-only run of a bare folder (created on first use)."""
    exp_id = experiment_id(client, EVAL_EXPERIMENT)
    query = tag_filter(EVAL_OF_TAG, str(checkpoint.path))
    if query is None:  # both quote kinds in the path: compare in Python
        found = client.search_runs([exp_id], f"tags.`{EVAL_OF_TAG}` != ''", max_results=10_000)
        found = [r for r in found if r.data.tags.get(EVAL_OF_TAG) == str(checkpoint.path)]
    else:
        found = client.search_runs([exp_id], query, max_results=1)
    if found:
        return found[0].info.run_id
    run = client.create_run(
        exp_id,
        run_name=f"eval-{checkpoint.name}",
        tags={EVAL_OF_TAG: str(checkpoint.path), "rlpost.kind": "eval"},
    )
    client.set_terminated(run.info.run_id, status="FINISHED")
    return run.info.run_id


def log_eval_metrics(checkpoint: CheckpointRef, suite: str, metrics: dict[str, float]) -> str:
    """Log `eval/<suite>/<name>` at the checkpoint's step (0 for a bare folder); returns the run id."""
    from mlflow.entities import Metric

    client = _client()
    run_id = checkpoint.run_id or eval_only_run(client, checkpoint)
    step = checkpoint.step or 0
    ts = int(time.time() * 1000)
    items = [
        Metric(metric_name(suite, k), float(v), ts, step)
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
    ]
    for i in range(0, len(items), 200):
        client.log_batch(run_id, metrics=items[i : i + 200])
    return run_id
