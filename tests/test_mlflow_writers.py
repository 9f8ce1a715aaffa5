"""Many writers: concurrent processes (what sweep jobs are), each logging 200 steps of metrics through
infra.tracking.Tracker to ONE store, lose nothing. Run against the SQLite default: 4 writers in make test,
8 in make test-all. They start logging together: each says it is ready, then waits for the go."""

import json
import os
import time

import pytest

from infra.models import PROJECT_ROOT
from tests.children import python_child

STEPS, KEYS = 200, ("train/reward_mean", "train/loss", "timing/step_s")

WRITER = """
import json, sys, time
from infra.tracking import Tracker
from pathlib import Path
name, gate, steps, keys = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
tracker = Tracker()
tracker.start("writers", name, tags={"rlpost.kind": "train"})
(gate / f"ready-{name}").touch()
while not (gate / "go").exists():  # every writer starts logging at the same moment
    time.sleep(0.01)
t0 = time.time()
for step in range(1, steps + 1):
    tracker.log_metrics({k: step * 0.5 for k in keys}, step)
tracker.finish("FINISHED")
print(f"{name} {time.time() - t0:.2f}")
"""


@pytest.mark.slow
@pytest.mark.parametrize("writers", [4, pytest.param(8, marks=pytest.mark.heavy)])
def test_concurrent_writers_lose_no_metric(tmp_path, writers):
    import mlflow

    WRITERS = writers  # noqa: N806

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "MLFLOW_TRACKING_URI": uri}
    mlflow.MlflowClient(uri).create_experiment("writers")  # schema made once, not raced by the writers
    gate = tmp_path / "gate"
    gate.mkdir()
    procs = [
        python_child(["-c", WRITER, f"w{i}", str(gate), str(STEPS), json.dumps(KEYS)], env)
        for i in range(WRITERS)
    ]
    deadline = time.time() + 300  # every interpreter has imported mlflow and made its run
    while (
        len(list(gate.glob("ready-*"))) < WRITERS
        and time.time() < deadline
        and all(p.poll() is None for p in procs)
    ):
        time.sleep(0.05)
    (gate / "go").touch()
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    late = [o for o, _ in outs if not o.strip()]
    assert not late
    durations = [float(o.split()[1]) for o, _ in outs]
    print(f"\n[measure] {WRITERS} writers x {STEPS} steps x {len(KEYS)} metrics on SQLite: "
          f"slowest writer {max(durations):.1f} s, mean {sum(durations) / len(durations):.1f} s")  # fmt: skip

    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("writers").experiment_id])
    assert len(runs) == WRITERS and all(r.info.status == "FINISHED" for r in runs)
    for run in runs:
        for key in KEYS:
            history = client.get_metric_history(run.info.run_id, key)
            assert sorted(m.step for m in history) == list(range(1, STEPS + 1)), (run.info.run_name, key)
            assert all(m.value == m.step * 0.5 for m in history)
