"""evals.watch: finds complete checkpoints only, evaluates each (checkpoint, suite) once, survives a
restart through its state file, follows sweeps/experiments in MLflow, and submits through submitit."""

from __future__ import annotations

import json
import time

import pytest

from evals.common.generation import VLLMGenerator
from evals.watch import WatchState, build_watch_parser, discover, main
from infra.tracking import Tracker


def _math_args(shared_dir, res):
    return ["--suites", "math", "--datasets", "gsm8k", "--limit", "2", "--max-tokens", "4",
            "--data-dir", str(shared_dir / "data" / "math"), "--results-dir", str(res)]  # fmt: skip


def _being_written(run_dir, step):
    """What a reader sees while train/checkpoint.py writes: a hidden temp folder, or (a crashed writer of
    an older layout) a step folder without meta.json."""
    tmp = run_dir / "checkpoints" / f".tmp-step_{step:06d}-abcd1234" / "hf"
    tmp.mkdir(parents=True)
    (tmp / "config.json").write_text("{}")
    partial = run_dir / "checkpoints" / f"step_{step + 1:06d}" / "hf"
    partial.mkdir(parents=True)
    (partial / "config.json").write_text("{}")


def test_discover_sweep_and_experiment_sources(make_checkpoint, mlflow_uri, tmp_path):
    a, b = tmp_path / "sw" / "runs" / "a", tmp_path / "sw" / "runs" / "b"
    cks = {("a", 1): make_checkpoint(a, 1), ("a", 2): make_checkpoint(a, 2), ("b", 1): make_checkpoint(b, 1)}
    _being_written(a, 5)
    for name, run_dir in (("a", a), ("b", b)):
        t = Tracker()
        t.start(
            "exp", name, tags={"rlpost.sweep": "sw9", "rlpost.kind": "train", "rlpost.run_dir": str(run_dir)}
        )
        for (n, step), path in cks.items():
            if n == name:
                t.record_checkpoint(step, path.resolve())
    Tracker().start("exp", "parent", tags={"rlpost.sweep": "sw9", "rlpost.kind": "sweep"})
    parse = build_watch_parser().parse_known_args
    want = {("a", 1), ("a", 2), ("b", 1)}
    for argv in (["--dir", str(tmp_path / "sw")], ["--sweep", "sw9"], ["--experiment", "exp"]):
        refs = discover(parse(argv)[0])
        assert {(r.name.split("-")[0], r.step) for r in refs} == want, argv
        assert all(r.run_id for r in refs)
    with pytest.raises(SystemExit, match="no MLflow experiment 'nope'"):
        discover(parse(["--experiment", "nope"])[0])


@pytest.mark.slow
def test_watch_dir_once_each_and_restart(
    shared_dir, make_checkpoint, tiny_model, vllm_engine, mlflow_uri, tmp_path
):
    run = tmp_path / "runs" / "r1"
    make_checkpoint(run, 2, seed=1)
    make_checkpoint(run, 4, seed=2)
    _being_written(run, 6)
    res = tmp_path / "res"
    argv = ["--dir", str(tmp_path / "runs"), "--once", *_math_args(shared_dir, res)]
    gen = VLLMGenerator(engine=vllm_engine)
    try:
        assert main(argv, generator=gen) == 0
        state = WatchState(res / "watch_state.json")
        assert sorted(e["step"] for e in state.entries.values()) == [2, 4]
        for step in (2, 4):
            rows = (res / f"r1-step_{step:06d}" / "math" / "samples.jsonl").read_text().splitlines()
            assert len(rows) == 2
        assert not (res / "r1-step_000006").exists() and not (res / "r1-step_000007").exists()
        mtime = (res / "r1-step_000002" / "math" / "summary.json").stat().st_mtime

        # A restarted watcher re-reads the state: nothing is evaluated again ...
        assert main(argv, generator=gen) == 0
        assert (res / "r1-step_000002" / "math" / "summary.json").stat().st_mtime == mtime
        # ... until training finishes a new checkpoint.
        time.sleep(0.01)
        make_checkpoint(run, 8, seed=3)
        assert main(argv, generator=gen) == 0
        state = WatchState(res / "watch_state.json")
        assert sorted(e["step"] for e in state.entries.values()) == [2, 4, 8]
        assert (res / "r1-step_000008" / "math" / "summary.json").stat().st_mtime > mtime
    finally:
        gen.load(tiny_model)


@pytest.mark.slow
def test_watch_submits_through_submitit(
    shared_dir, make_checkpoint, judge_server, mlflow_uri, tmp_path, monkeypatch
):
    """--launcher local: one submitit job per new checkpoint, generating through --server."""
    import submitit

    monkeypatch.setenv("EVAL_SERVER_KEY", judge_server.api_key)
    run = tmp_path / "runs" / "r2"
    make_checkpoint(run, 3)
    res = tmp_path / "res"
    argv = ["--dir", str(run), "--once", "--launcher", "local", "--server", judge_server.base_url,
            "--server-api-key-env", "EVAL_SERVER_KEY", *_math_args(shared_dir, res)]  # fmt: skip
    assert main(argv) == 0
    (entry,) = WatchState(res / "watch_state.json").entries.values()
    assert entry["status"] == "submitted" and entry["step"] == 3
    job = submitit.LocalJob(folder=res / "watch_logs", job_id=entry["job_id"])
    deadline = time.time() + 300
    while not job.paths.result_pickle.exists():
        assert time.time() < deadline, f"job did not finish: {job.paths.stderr.read_text()[-2000:]}"
        time.sleep(1)
    metrics = job.result()["math"]
    assert metrics["n"] == 2.0
    summary = json.loads((res / "r2-step_000003" / "math" / "summary.json").read_text())
    assert summary["metrics"] == metrics and summary["step"] == 3
    assert main(argv) == 0  # already submitted: no second job
    assert len(list((res / "watch_logs").glob("*_submission.sh"))) <= 1
