"""One SQLite MLflow store, many independent processes (no parent that made the store first):

- N processes start at the same moment on a store that does not exist yet (a sweep's jobs, an eval and
  the watcher started by hand): every one succeeds, and so does every later client;
- the same on a store left at an old schema revision (an upgrade of the pinned mlflow);
- readers (sweep status, `--ckpt latest`, the leaderboard's tables) while a trainer logs metrics and
  checkpoints, evals log into that still-training run, and several processes set tags and params on it.

Real processes against a real SQLite file; they wait for a "go" file so they really collide.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from infra.models import PROJECT_ROOT
from tests.children import python_child

PRELUDE = """
import json, os, sys, time
from pathlib import Path
work = Path(sys.argv[1]); me = sys.argv[2]
from infra.tracking import Tracker  # noqa: E402  (imports done before the go signal)
import mlflow  # noqa: F401
(work / f"ready-{me}").touch()
while not (work / "go").exists():
    time.sleep(0.005)
"""

FIRST_USER = (
    PRELUDE
    + """
t = Tracker()
run_id = t.start("first-use", me, tags={"rlpost.kind": "train", "who": me})
t.log_params({"optim.lr": 1e-6, "who": me})
t.log_metrics({"train/reward_mean": 0.5}, 1)
t.set_tags({"done": "yes"})
t.finish()
print(run_id)
"""
)


def _spawn(script: str, work: Path, names: list[str], uri: str, extra: list[str] | None = None):
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "MLFLOW_TRACKING_URI": uri, "OMP_NUM_THREADS": "1"}
    return [python_child(["-c", script, str(work), n, *(extra or [])], env) for n in names]


def _go(work: Path, procs: list, timeout_s: float = 300) -> None:
    """Wait until every process has imported everything, then release them together."""
    deadline = time.time() + timeout_s
    while len(list(work.glob("ready-*"))) < len(procs):
        dead = [p for p in procs if p.poll() is not None]
        assert not dead, dead[0].communicate()[1][-3000:]
        assert time.time() < deadline, "workers did not get ready"
        time.sleep(0.1)
    (work / "go").touch()


def _finish(procs: list, timeout_s: float = 600) -> list[tuple[int, str, str]]:
    return [(p.wait(timeout=timeout_s), *p.communicate()) for p in procs]


def _first_users(tmp_path: Path, n: int, uri: str) -> list[tuple[int, str, str]]:
    work = tmp_path / "work"
    work.mkdir()
    procs = _spawn(FIRST_USER, work, [f"w{i:02d}" for i in range(n)], uri)
    _go(work, procs)
    return _finish(procs)


@pytest.mark.slow
@pytest.mark.parametrize("n", [6, pytest.param(16, marks=pytest.mark.heavy)])
def test_concurrent_first_users_of_a_new_store_all_succeed(tmp_path, n):
    import mlflow

    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    uri = f"sqlite:///{db}"
    results = _first_users(tmp_path, n, uri)
    ok = [r for r in results if r[0] == 0]
    print(f"\n[measure] {n} concurrent first users of a new SQLite store: {len(ok)}/{n} succeeded")
    assert len(ok) == n, next(err for code, _, err in results if code)[-3000:]
    client = mlflow.MlflowClient(uri)  # a later client works too
    runs = client.search_runs([client.get_experiment_by_name("first-use").experiment_id], max_results=100)
    assert sorted(r.info.run_name for r in runs) == [f"w{i:02d}" for i in range(n)]
    assert all(r.data.tags["done"] == "yes" and r.info.status == "FINISHED" for r in runs)
    assert {r.info.run_id for r in runs} == {out.strip() for _, out, _ in results}


@pytest.mark.slow
@pytest.mark.heavy  # make test-all: a long integration run (docs/commands.md, Tests)
def test_concurrent_first_users_upgrade_an_old_schema_once(tmp_path):
    import mlflow
    import sqlalchemy
    from alembic import command
    from mlflow.store.db.base_sql_model import Base
    from mlflow.store.db.utils import _get_alembic_config, _get_schema_version
    from mlflow.store.tracking.dbmodels.initial_models import Base as InitialBase

    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    engine = sqlalchemy.create_engine(uri)
    InitialBase.metadata.create_all(engine)  # what an mlflow 1.x store starts as ...
    config = _get_alembic_config(uri)
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "2b4d017a5e9b")  # ... a few migrations in
    old = _get_schema_version(engine)
    assert old == "2b4d017a5e9b" and set(Base.metadata.tables) - set(
        sqlalchemy.inspect(engine).get_table_names()
    )

    results = _first_users(tmp_path, 6, uri)
    assert all(code == 0 for code, _, _ in results), next(err for code, _, err in results if code)[-3000:]
    client = mlflow.MlflowClient(uri)
    assert len(client.search_runs([client.get_experiment_by_name("first-use").experiment_id])) == 6


TRAINER = (
    PRELUDE
    + """
from pathlib import Path
run_id, ckpts, steps = sys.argv[3], json.loads(sys.argv[4]), int(sys.argv[5])
t = Tracker()
t.start("shared", "train", run_id=run_id)
t.log_params({"optim.lr": 1e-6, "seed": 1})
for step in range(1, steps + 1):
    t.log_metrics({"train/reward_mean": step / steps, "train/loss": -step, "timing/step_s": 0.1}, step)
    if str(step) in ckpts:
        t.record_checkpoint(step, Path(ckpts[str(step)]))
t.finish()
"""
)

EVALUATOR = (
    PRELUDE
    + """
from pathlib import Path
from evals.common.checkpoints import CheckpointRef
from evals.common.mlflow_log import log_eval_metrics
run_id, ckpts = sys.argv[3], json.loads(sys.argv[4])
for step, path in sorted(ckpts.items(), key=lambda kv: int(kv[0])):
    ref = CheckpointRef(Path(path) / "hf", run_id, int(step), f"train-step_{int(step):06d}")
    for rep in range(5):
        assert log_eval_metrics(ref, me, {"acc": int(step) / 100, "rep": float(rep)}) == run_id
t = Tracker(); t.run_id = run_id  # attach without touching the run status
t.set_tags({f"rlpost.{me}.{i}": str(i) for i in range(20)})
t.log_params({"optim.lr": 1e-6, f"{me}.param": me})  # a key the trainer also logs: same value, no error
"""
)

READER = (
    PRELUDE
    + """
from analysis.store import load_runs
from evals.common.checkpoints import CheckpointNotFound, all_checkpoints_of_run, resolve
from infra.tracking import LATEST_CHECKPOINT_TAG, mlflow_client
run_id = sys.argv[3]
client = mlflow_client()
reads = resolved = 0
while not (work / "writers-done").exists() or reads < 3:
    frame = load_runs("shared")  # what the leaderboard and the report read
    assert "train" in set(frame["run_name"]), frame
    # before the trainer's first checkpoint there is no latest; once its tag is on the run there must be
    # (read before resolving: the tag only ever goes from unset to set)
    tagged = bool(client.get_run(run_id).data.tags.get(LATEST_CHECKPOINT_TAG))
    try:
        resolve("latest")  # evals --ckpt latest
        resolved += 1
    except CheckpointNotFound:
        assert not tagged, "the run has a checkpoint tag but --ckpt latest found none"
    all_checkpoints_of_run(client.get_run(run_id))  # evals.watch
    assert client.get_run(run_id).info.status in ("RUNNING", "FINISHED")  # sweep-status
    reads += 1
assert resolved, "--ckpt latest never resolved, even after every writer finished"
print(reads)
"""
)


@pytest.mark.slow
@pytest.mark.heavy  # make test-all: a long integration run (docs/commands.md, Tests)
def test_readers_while_a_trainer_evals_and_taggers_write(tmp_path):
    import mlflow

    from infra.tracking import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        tracker = Tracker()
        run_id = tracker.start("shared", "train", tags={"rlpost.kind": "train"})
    finally:
        del os.environ["MLFLOW_TRACKING_URI"]
    ckpts = {}
    for step in (25, 50, 75, 100):  # complete step folders: meta.json's manifest lists hf/config.json
        folder = tmp_path / "run" / "checkpoints" / f"step_{step:06d}"
        (folder / "hf").mkdir(parents=True)
        (folder / "hf" / "config.json").write_text("{}")
        manifest = {"hf/config.json": 2}
        (folder / "meta.json").write_text(json.dumps({"step": step, "time": step, "files": manifest}))
        ckpts[str(step)] = str(folder)
    work = tmp_path / "work"
    work.mkdir()
    steps = 100
    writers = _spawn(TRAINER, work, ["trainer"], uri, [run_id, json.dumps(ckpts), str(steps)])
    evaluators = [f"suite{i}" for i in range(3)]
    writers += _spawn(EVALUATOR, work, evaluators, uri, [run_id, json.dumps(ckpts)])
    readers = _spawn(READER, work, ["r0", "r1"], uri, [run_id])
    _go(work, writers + readers)
    written = _finish(writers)
    (work / "writers-done").touch()
    read = _finish(readers)
    for code, _, err in written + read:
        assert code == 0, err[-3000:]
    print(f"\n[measure] readers completed {[int(out) for _, out, _ in read]} read rounds during the writes")

    client = mlflow.MlflowClient(uri)
    run = client.get_run(run_id)
    for key in ("train/reward_mean", "train/loss", "timing/step_s"):
        assert sorted(m.step for m in client.get_metric_history(run_id, key)) == list(range(1, steps + 1))
    for suite in evaluators:
        history = client.get_metric_history(run_id, f"eval/{suite}/acc")
        assert sorted({m.step for m in history}) == [25, 50, 75, 100] and len(history) == 20
        assert all(run.data.tags[f"rlpost.{suite}.{i}"] == str(i) for i in range(20))
        assert run.data.params[f"{suite}.param"] == suite
    assert run.data.params["optim.lr"] == "1e-06" and run.data.params["seed"] == "1"
    assert run.data.tags["rlpost.checkpoint_latest"] == ckpts["100"]
    assert run.info.status == "FINISHED"
