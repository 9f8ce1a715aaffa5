"""A run's last step in `<run_dir>/progress.json`, for the live job table of `make sweep WAIT=1`."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

PROGRESS_FILE = "progress.json"
PROGRESS_KEYS = (
    "train/accuracy",
    "train/reward_mean",
    "val/accuracy",
    "train/loss",
    "val/loss",
    "timing/step_s",
)


def write_progress(run_dir: Path, step: int, total: int, metrics: dict[str, float]) -> None:
    """`<run_dir>/progress.json`: the last step and a few of its metrics, for `make sweep WAIT=1`'s table
    (written atomically: a reader never sees half a file)."""
    shown = {k: float(metrics[k]) for k in PROGRESS_KEYS if k in metrics}
    tmp = Path(run_dir) / f".{PROGRESS_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps({"step": step, "total": total, "time": time.time(), "metrics": shown}))
    tmp.replace(Path(run_dir) / PROGRESS_FILE)


def read_progress(run_dir: Path) -> dict:
    try:
        return json.loads((Path(run_dir) / PROGRESS_FILE).read_text())
    except (OSError, ValueError):
        return {}
