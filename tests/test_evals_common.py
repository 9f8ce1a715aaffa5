"""evals/common: --ckpt resolution against a real MLflow store, resumable results, weight swaps in one
vLLM engine, MLflow logging at the checkpoint's step, and generation through a real OpenAI-compatible server."""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from pathlib import Path

import pytest

from evals.common.checkpoints import CheckpointNotFound, resolve
from evals.common.cli import main
from evals.common.generation import GenerationError, Sampling, ServerGenerator, VLLMGenerator
from evals.common.metrics import mean_ci
from evals.common.mlflow_log import metric_name
from evals.common.results import ResultsStore
from infra.tracking import Tracker
from tests.judge_servers import free_port


def _client():
    import mlflow

    return mlflow.MlflowClient()


def _training_run(run_dir: Path, ckpts: dict[int, Path], tags: dict | None = None, parent: str | None = None):
    """An MLflow run tagged the way the trainer tags it, recording `ckpts`."""
    tracker = Tracker()
    run_id = tracker.start("exp", run_dir.name, tags={"rlpost.run_dir": str(run_dir.resolve()), **(tags or {})},
                           parent_run_id=parent)  # fmt: skip
    for step, path in sorted(ckpts.items()):
        tracker.record_checkpoint(step, path.resolve())
    tracker.finish()
    return run_id


# ---------------------------------------------------------------- pure pieces


def test_results_store_skips_done_ids_and_drops_torn_last_line(tmp_path):
    store = ResultsStore(tmp_path, "ck", "s")
    store.append([{"id": "a", "x": 1}, {"id": "b", "x": 2}])
    with store.samples_path.open("a") as f:
        f.write('{"id": "c", "x"')  # killed mid-write
    again = ResultsStore(tmp_path, "ck", "s")
    assert again.done_ids == {"a", "b"}
    assert again.samples_path.read_text().count("\n") == 2  # the torn line is gone, so appends stay valid
    again.append([{"id": "c", "x": 3}])
    assert [r["x"] for r in ResultsStore(tmp_path, "ck", "s").records(["c", "a", "zz"])] == [3, 1]
    with pytest.raises(ValueError, match="no 'id'"):
        again.append([{"x": 4}])


def test_mlflow_metric_names_are_valid():
    assert metric_name("math", "math500/pass@4") == "eval/math/math500/pass_at_4"
    assert (
        metric_name("x", "subject/Counting & Probability (b)/acc")
        == "eval/x/subject/Counting _ Probability _b_/acc"
    )


def test_mean_ci_hand_computed():
    assert all(math.isnan(v) for v in mean_ci([]))
    assert mean_ci([0.5]) == (0.5, 0.5, 0.5)
    mean, lo, hi = mean_ci([0.0, 1.0] * 50, resamples=400)
    assert mean == 0.5 and 0.35 < lo < 0.5 < hi < 0.65
    assert mean_ci([1.0, 1.0, 1.0]) == (1.0, 1.0, 1.0)


# ---------------------------------------------------------------- --ckpt resolution


def test_resolve_folders_runs_sweeps_and_latest(make_checkpoint, mlflow_uri, tmp_path):
    a, b = tmp_path / "runs" / "a", tmp_path / "runs" / "b"
    a2, a4 = make_checkpoint(a, 2, seed=1), make_checkpoint(a, 4, seed=2)
    time.sleep(0.02)
    b2 = make_checkpoint(b, 2, seed=3)

    # Folders: a step folder, its hf/, a run folder (latest or --step), a plain HF folder.
    (ref,) = resolve(str(a2))
    assert (ref.path, ref.step, ref.run_id, ref.name) == (a2.resolve() / "hf", 2, None, "a-step_000002")
    assert resolve(str(a2 / "hf"))[0].step == 2
    assert resolve(str(a))[0].step == 4
    assert resolve(str(a), step=2)[0].path == a2.resolve() / "hf"
    bare = resolve(str(a4 / "hf" / ".." / "hf"))[0]
    assert bare.step == 4
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text("{}")
    assert resolve(str(plain))[0].step is None

    sweep_tags = {"rlpost.sweep": "sw1", "rlpost.kind": "train"}
    parent = Tracker()
    parent_id = parent.start("exp", "sw1", tags={"rlpost.sweep": "sw1", "rlpost.kind": "sweep"})
    run_a = _training_run(a, {2: a2, 4: a4}, sweep_tags, parent_id)
    run_b = _training_run(b, {2: b2}, sweep_tags, parent_id)

    # A folder finds its training run through the run folder's tag.
    assert resolve(str(a2))[0].run_id == run_a
    # Run id: latest checkpoint, or --step.
    assert resolve(run_a)[0].step == 4
    assert resolve(run_a, step=2)[0].path == a2.resolve() / "hf"
    with pytest.raises(CheckpointNotFound, match=r"no checkpoint on disk for step 3 \(available: \[2, 4\]\)"):
        resolve(run_a, step=3)
    # Sweep name and sweep parent run id: every training run of it.
    assert {(r.run_id, r.step) for r in resolve("sw1")} == {(run_a, 4), (run_b, 2)}
    assert {r.run_id for r in resolve(parent_id)} == {run_a, run_b}
    assert {r.step for r in resolve("sw1", step=2)} == {2}
    # latest: the newest checkpoint in the store (b's step 2 was written last).
    assert resolve("latest")[0].run_id == run_b


def test_resolve_errors_are_one_line(make_checkpoint, mlflow_uri, tmp_path):
    cases = {
        str(tmp_path / "nope"): "is not a folder, an MLflow run id, a sweep name",
        "0" * 32: "no MLflow run 0000",
        "latest": "no run in",
    }
    for spec, msg in cases.items():
        with pytest.raises(CheckpointNotFound, match=msg) as err:
            resolve(spec)
        assert "\n" not in str(err.value)
    # A checkpoint still being written (no meta.json yet) is never read.
    partial = tmp_path / "r" / "checkpoints" / "step_000001"
    (partial / "hf").mkdir(parents=True)
    with pytest.raises(CheckpointNotFound, match="incomplete"):
        resolve(str(partial))
    with pytest.raises(CheckpointNotFound, match="no complete checkpoint yet"):
        resolve(str(tmp_path / "r"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointNotFound, match="not a checkpoint"):
        resolve(str(empty))


# ---------------------------------------------------------------- runner with a real engine


class EchoSuite:
    """A minimal suite: greedy 6-token continuations of fixed prompts; fails on purpose after `fail_after`
    batches (a crash mid-run)."""

    name = "echo"

    def __init__(self, n_items: int = 4, fail_after: int | None = None):
        self.n_items, self.fail_after, self.batches = n_items, fail_after, 0

    def add_args(self, parser):
        parser.add_argument("--tokens", type=int, default=6)

    def load_items(self, args):
        return [{"id": f"q{i}", "q": f"Count to {i + 3}."} for i in range(self.n_items)]

    def run_batch(self, items, ctx):
        if self.fail_after is not None and self.batches >= self.fail_after:
            raise RuntimeError("crash")
        self.batches += 1
        convs = [[{"role": "user", "content": it["q"]}] for it in items]
        outs = ctx.generate(convs, Sampling(n=2, temperature=0.0, max_tokens=ctx.args.tokens))
        return [{"id": it["id"], "text": o[0], "same": o[0] == o[1]} for it, o in zip(items, outs)]

    def summarize(self, records, args):
        return {"chars": sum(len(r["text"]) for r in records) / len(records), "n": float(len(records))}


def test_item_fingerprint_covers_item_content_and_the_suites_own_options():
    from evals.common.cli import item_fingerprint, result_settings

    args = argparse.Namespace(tokens=6, seed=0, ckpt="a", results_dir="r", batch_size=2, limit=None)
    settings = result_settings(EchoSuite(), args)
    assert settings == {"seed": 0, "tokens": 6}  # not where results go or how they are batched
    item = {"id": "q0", "q": "Count to 3."}
    fp = item_fingerprint(item, settings)
    assert fp == item_fingerprint(dict(item), {"tokens": 6, "seed": 0})
    assert fp != item_fingerprint({**item, "q": "Count to 4."}, settings)
    assert fp != item_fingerprint(item, {**settings, "tokens": 7})
    assert fp != item_fingerprint(item, {**settings, "seed": 1})


@pytest.fixture()
def generator(vllm_engine, tiny_model):
    gen = VLLMGenerator(engine=vllm_engine)
    yield gen
    gen.load(tiny_model)  # leave the shared engine with the weights other tests expect


@pytest.mark.slow
def test_cli_sweep_swaps_weights_logs_at_step_and_resumes(make_checkpoint, mlflow_uri, tmp_path, generator):
    a2, b6 = make_checkpoint(tmp_path / "a", 2, seed=11), make_checkpoint(tmp_path / "b", 6, seed=12)
    tags = {"rlpost.sweep": "sw", "rlpost.kind": "train"}
    run_a = _training_run(tmp_path / "a", {2: a2}, tags)
    run_b = _training_run(tmp_path / "b", {6: b6}, tags)
    res = tmp_path / "results"
    common = ["--results-dir", str(res), "--batch-size", "2"]

    summaries = main(EchoSuite(), ["--ckpt", "sw", *common], generator=generator)
    assert [(s["run_id"], s["step"]) for s in summaries] == [(run_a, 2), (run_b, 6)]
    texts = {}
    for name in ("a-step_000002", "b-step_000006"):
        rows = [json.loads(x) for x in (res / name / "echo" / "samples.jsonl").read_text().splitlines()]
        assert [r["id"] for r in rows] == ["q0", "q1", "q2", "q3"] and all(r["same"] for r in rows)
        texts[name] = [r["text"] for r in rows]
        summary = json.loads((res / name / "echo" / "summary.json").read_text())
        assert summary["metrics"]["n"] == 4.0
    assert texts["a-step_000002"] != texts["b-step_000006"]  # the second checkpoint's weights were loaded
    client = _client()
    for run_id, step in ((run_a, 2), (run_b, 6)):
        hist = client.get_metric_history(run_id, "eval/echo/chars")
        assert [m.step for m in hist] == [step]

    # Swapping back to a's weights reproduces a's generations exactly.
    again = main(EchoSuite(), ["--ckpt", str(a2), "--results-dir", str(tmp_path / "r2"), "--no-mlflow"],
                 generator=generator)  # fmt: skip
    assert again[0]["run_id"] == run_a
    rows = (tmp_path / "r2" / "a-step_000002" / "echo" / "samples.jsonl").read_text().splitlines()
    assert [json.loads(x)["text"] for x in rows] == texts["a-step_000002"]

    # Crash after one batch: the finished batch is kept, the rerun does only the rest.
    crash = tmp_path / "crash"
    crashing = EchoSuite(fail_after=1)
    with pytest.raises(RuntimeError, match="crash"):
        main(crashing, ["--ckpt", str(a2), "--results-dir", str(crash), *common[2:]], generator=generator)
    samples = crash / "a-step_000002" / "echo" / "samples.jsonl"
    assert [json.loads(x)["id"] for x in samples.read_text().splitlines()] == ["q0", "q1"]
    resumed = EchoSuite()
    (s,) = main(resumed, ["--ckpt", str(a2), "--results-dir", str(crash), *common[2:]], generator=generator)
    assert resumed.batches == 1 and s["n_new"] == 2 and s["n_items"] == 4
    assert [json.loads(x)["text"] for x in samples.read_text().splitlines()] == texts["a-step_000002"]
    # --limit evaluates (and summarises) only the first items.
    (s,) = main(
        EchoSuite(), ["--ckpt", str(a2), "--results-dir", str(crash), "--limit", "3"], generator=generator
    )
    assert s["n_new"] == 0 and s["metrics"]["n"] == 3.0
    # Under the same ids, other options or other item contents are not reused: those items are redone.
    short = ["--ckpt", str(a2), "--results-dir", str(crash), "--tokens", "2"]
    (s,) = main(EchoSuite(), short, generator=generator)
    assert s["n_new"] == 4 and s["metrics"]["chars"] < summary["metrics"]["chars"]
    changed = EchoSuite()
    changed.load_items = lambda args: [{"id": "q0", "q": "Say hi."}, *EchoSuite().load_items(args)[1:]]
    (s,) = main(changed, short, generator=generator)
    assert s["n_new"] == 1 and changed.batches == 1


@pytest.mark.slow
def test_unloadable_checkpoint_is_a_one_line_error(make_checkpoint, tmp_path, generator, mlflow_uri):
    bad = make_checkpoint(tmp_path / "bad", 1)
    (bad / "hf" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(GenerationError, match=r"checkpoint .*hf cannot be loaded") as err:
        generator.load(bad / "hf")
    assert "\n" not in str(err.value)
    # its size no longer matches meta.json: refused when resolving --ckpt, before any load
    with pytest.raises(
        SystemExit, match=r"^error: checkpoint .* is damaged .*hf/model.safetensors is 22 bytes"
    ):
        main(EchoSuite(), ["--ckpt", str(bad), "--results-dir", str(tmp_path / "r")], generator=generator)
    bare = shutil.copytree(bad / "hf", tmp_path / "bare")  # a plain HF folder that does not load
    with pytest.raises(SystemExit, match=r"^error: checkpoint .* cannot be loaded"):
        main(
            EchoSuite(),
            ["--ckpt", str(bare), "--results-dir", str(tmp_path / "r")],
            generator=generator,
        )
    no_tok = tmp_path / "no_tok"
    no_tok.mkdir()
    (no_tok / "config.json").write_text((bad / "hf" / "config.json").read_text())
    with pytest.raises(GenerationError, match="cannot be loaded"):
        generator.load(no_tok)


# ---------------------------------------------------------------- --server


@pytest.mark.slow
def test_server_generation_and_eval_only_run(judge_server, tiny_model, tmp_path, mlflow_uri, monkeypatch):
    """--server against a real OpenAI-compatible server on loopback (llm-katan, the session's judge server)."""
    monkeypatch.setenv("EVAL_SERVER_KEY", judge_server.api_key)
    gen = ServerGenerator(judge_server.base_url, api_key_env="EVAL_SERVER_KEY")
    assert gen.model == judge_server.model
    outs = gen.generate([[{"role": "user", "content": "Hi"}], [{"role": "user", "content": "2+2?"}]],
                        Sampling(n=3, temperature=0.0, max_tokens=5))  # fmt: skip
    assert [len(o) for o in outs] == [3, 3] and all(isinstance(t, str) for o in outs for t in o)
    assert gen.stats.samples == 2  # greedy: one request per prompt, copied n times

    res = tmp_path / "res"
    argv = [
        "--ckpt",
        str(tiny_model),
        "--server",
        judge_server.base_url,
        "--server-api-key-env",
        "EVAL_SERVER_KEY",
    ]
    (s,) = main(EchoSuite(n_items=2), [*argv, "--results-dir", str(res)])
    assert s["step"] is None and s["metrics"]["n"] == 2.0
    run = _client().get_run(s["mlflow_run_id"])
    assert run.data.tags["rlpost.eval_of"] == str(tiny_model.resolve())
    assert [m.step for m in _client().get_metric_history(run.info.run_id, "eval/echo/chars")] == [0]

    monkeypatch.setenv("EVAL_SERVER_KEY", "wrong-key")
    with pytest.raises(SystemExit, match=r"^error: server .* (not reachable|request failed).*401"):
        main(EchoSuite(n_items=1), [*argv, "--server-model", "x", "--results-dir", str(tmp_path / "r2")])
    with pytest.raises(GenerationError, match="not reachable"):
        ServerGenerator(f"http://127.0.0.1:{free_port()}", timeout_s=2)
