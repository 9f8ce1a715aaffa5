"""The samples viewer's server side: the eval index (filters, pages, a growing file, bad lines, every
suite's records), checkpoint comparison, and the HTTP API over a real MLflow store of logged samples."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from analysis.sample_index import Filters, SampleIndex, compare, samples_of
from analysis.view import build_viewer, serve, viewer_url
from tests.view_data import PROMPTS, log_arm_run, write_eval


def _math_file(tmp_path, records):
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


RECORDS = [
    {"id": "a/1", "dataset": "a", "gold": "1", "responses": ["1", "2"], "answers": ["1", "2"], "correct": [1.0, 0.0]},
    {"id": "b/2", "dataset": "b", "gold": "3", "responses": ["?"], "answers": [None], "correct": [0.0], "rm_scores": [0.2]},
    {"id": "b/3", "dataset": "b", "gold": "4", "responses": ["4"], "answers": ["4"], "correct": [1.0], "rm_scores": [0.9]},
]  # fmt: skip


def test_index_filters_and_pages_the_samples(tmp_path):
    idx = SampleIndex(_math_file(tmp_path, RECORDS), "math").refresh()
    assert len(idx.entries) == 4 and idx.datasets() == ["a", "b"]
    ids = lambda f: [(idx.entries[i]["id"], idx.entries[i]["k"]) for i in idx.select(f)]  # noqa: E731
    assert ids(Filters(wrong=True)) == [("a/1", 1), ("b/2", 0)]
    assert ids(Filters(unparsed=True)) == [("b/2", 0)]
    assert ids(Filters(score_min=0.5)) == [("b/3", 0)]
    assert ids(Filters(score_max=0.5, dataset="b")) == [("b/2", 0)]
    page = idx.page(Filters(), offset=1, limit=2)
    assert page["total"] == 4 and page["matched"] == 4
    assert [(s["id"], s["k"], s["response"], s["answer"]) for s in page["samples"]] == [
        ("a/1", 1, "2", "2"),
        ("b/2", 0, "?", None),
    ]


def test_index_follows_a_growing_file_and_reports_bad_lines(tmp_path):
    path = _math_file(tmp_path, RECORDS[:1])
    idx = SampleIndex(path, "math").refresh()
    assert len(idx.entries) == 2
    with path.open("a") as f:
        f.write(
            "not json\n" + json.dumps(RECORDS[1]) + "\n" + '{"id": "half'
        )  # the last line still being written
    idx.refresh()
    assert len(idx.entries) == 3 and idx.errors == [
        f"{path}: line 2 is not JSON (Expecting value at column 1) (skipped)"
    ]
    with path.open("a") as f:
        f.write('", "responses": ["x"], "answers": ["x"], "correct": [1.0]}\n')
        f.write(json.dumps(RECORDS[0] | {"correct": [0.0, 0.0]}) + "\n")  # a rerun's record of a/1
    idx.refresh()
    assert len(idx.entries) == 4 and idx.entries[0]["correct"] == 0.0  # the newer record wins


def test_every_suites_records_become_samples():
    are_you_sure = {
        "id": "s1", "part": "are_you_sure", "gold": "7", "first_response": "7", "second_response": "8",
        "first_answer": "7", "second_answer": "8", "first_correct": 1.0, "second_correct": 0.0,
        "admits_mistake": True, "judge_reply": "It apologised.", "flipped": True,
    }  # fmt: skip
    [s] = samples_of("sycophancy", are_you_sure)
    assert (s["answer"], s["correct"], s["score"], s["rationale"], s["dataset"]) == (
        "7 → 8",
        0.0,
        1.0,
        "It apologised.",
        "are_you_sure",
    )
    [m] = samples_of(
        "sycophancy", {"id": "m", "part": "mwe", "response": "(A)", "choice": "A", "matches_user": True}
    )
    assert m["correct"] == 0.0  # agreeing with the user is the failure
    novelty = {
        "id": "n",
        "category": "poems",
        "prompt": "p",
        "generations": ["x", "y"],
        "classes": [0, 0],
        "ratings": [3, 5],
    }
    assert [(s["response"], s["score"], s["extra"]["class"]) for s in samples_of("novelty", novelty)] == [
        ("x", 3.0, 0),
        ("y", 5.0, 0),
    ]
    piece = {
        "id": "c",
        "prompt": "write",
        "piece": "Once",
        "piece_score": 14.5,
        "judge_reply": "Vivid.",
        "status": "ok",
    }
    [c] = samples_of("creative_writing", piece)
    assert (c["prompt"], c["response"], c["score"], c["rationale"]) == ("write", "Once", 14.5, "Vivid.")


def test_compare_pairs_the_same_items_and_what_changed(tmp_path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    a = SampleIndex(_math_file(tmp_path / "a", RECORDS), "math").refresh()
    later = [
        RECORDS[0] | {"correct": [1.0, 1.0]},
        RECORDS[1] | {"correct": [1.0]},
        RECORDS[2] | {"correct": [0.0]},
    ]
    b = SampleIndex(_math_file(tmp_path / "b", later), "math").refresh()
    pairs = lambda only: [(x["id"], x["k"]) for x, _ in compare(a, b, only)["pairs"]]  # noqa: E731
    assert pairs("fixed") == [("a/1", 1), ("b/2", 0)]
    assert pairs("broken") == [("b/3", 0)]
    assert pairs("changed") == [("a/1", 1), ("b/2", 0), ("b/3", 0)]
    (tmp_path / "c").mkdir()
    reworded = [
        RECORDS[0] | {"answers": ["1", "7"]},
        RECORDS[1],
        RECORDS[2],
    ]  # a wrong answer, another wrong one
    c = SampleIndex(_math_file(tmp_path / "c", reworded), "math").refresh()
    assert [(x["id"], x["k"], x["answer"], y["answer"]) for x, y in compare(a, c)["pairs"]] == [
        ("a/1", 1, "2", "7")
    ]
    assert compare(a, b, "all")["common"] == 4


# ---- the HTTP API over a real store ---------------------------------------------------------------


@pytest.fixture
def viewer_server(tmp_path, monkeypatch):
    """A viewer on a free loopback port over a store with DARLING and GRPO runs, a run without samples,
    and two checkpoints' math results (one with a torn line)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.chdir(tmp_path)
    darling = log_arm_run("darling_math", "DARLING", kinds=("val", "train"))
    grpo = log_arm_run("darling_math", "GRPO")
    bare = log_arm_run("darling_math", "GRPO", seed=2, steps=())
    write_eval(tmp_path / "evals", "darling-step_30", 60, run_id=darling, step=30, bad_line=True)
    write_eval(tmp_path / "evals", "grpo-step_30", 60, seed=1, run_id=grpo, step=30)
    viewer = build_viewer("darling_math", results_dir=tmp_path / "evals")
    server = serve(viewer, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", {"DARLING": darling, "GRPO": grpo, "bare": bare}
    server.shutdown()
    server.server_close()


def get(base: str, path: str, **query) -> dict:
    url = f"{base}{path}?" + "&".join(f"{k}={urllib.request.quote(str(v))}" for k, v in query.items())
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def test_api_serves_the_collapse_of_one_prompt_across_steps(viewer_server):
    base, runs = viewer_server
    index = get(base, "/api/index")
    assert sorted(r["label"] for r in index["runs"]) == ["DARLING seed 1", "GRPO seed 1", "GRPO seed 2"]
    assert all(r["link"].endswith(f"/runs/{r['run_id']}") for r in index["runs"])
    chosen = f"{runs['DARLING']},{runs['GRPO']}"
    prompts = get(base, "/api/prompts", runs=chosen, kind="val")["prompts"]
    assert [p["contrast"] for p in prompts] == [7, 7]  # 8 classes vs 1 at the last step
    data = get(base, "/api/collapse", runs=chosen, kind="val", key=prompts[0]["key"])
    assert data["steps"] == [0, 10, 20, 30] and data["errors"] == []
    spread = {
        r["label"]: [len({x["class"] for x in r["cells"][str(s)]["responses"]}) for s in data["steps"]]
        for r in data["runs"]
    }
    assert spread == {"DARLING seed 1": [8, 8, 8, 8], "GRPO seed 1": [8, 6, 3, 1]}
    train = get(base, "/api/prompts", runs=runs["DARLING"], kind="train")["prompts"]
    assert [p["key"] for p in train[:2]] == ["group:0", "group:1"]  # training prompts: by position first
    group = get(base, "/api/collapse", runs=runs["DARLING"], kind="train", key="group:1")
    assert [group["runs"][0]["cells"][str(s)]["prompt"] for s in group["steps"]] == [PROMPTS[1]] * 4


def test_api_says_in_one_line_what_is_missing_or_bad(viewer_server, tmp_path):
    base, runs = viewer_server
    data = get(base, "/api/collapse", runs=runs["bare"], kind="val", key="prompt:x")
    assert data["errors"] == [
        "run GRPO seed 2: no val samples logged (a run from before sample logging, or track=false, "
        "log_samples_every=0, val_every=0)"
    ]
    page = get(base, "/api/evals", eval="darling-step_30/math")
    assert page["total"] == 60 and len(page["errors"]) == 1 and "line 31 is not JSON" in page["errors"][0]
    with pytest.raises(urllib.error.HTTPError) as bad:
        get(base, "/api/evals", eval="nope/math")
    assert bad.value.code == 400
    assert json.loads(bad.value.read()) == {
        "error": "no eval results 'nope/math' (known: darling-step_30/math, grpo-step_30/math)"
    }


def test_api_pages_filtered_eval_samples_and_compares_checkpoints(viewer_server):
    base, _ = viewer_server
    full = get(base, "/api/evals", eval="grpo-step_30/math", limit=1000)
    wrong = get(base, "/api/evals", eval="grpo-step_30/math", wrong=1, dataset="gsm8k", offset=5, limit=10)
    want = [s["id"] for s in full["samples"] if s["correct"] == 0.0 and s["dataset"] == "gsm8k"]
    assert wrong["matched"] == len(want) and [s["id"] for s in wrong["samples"]] == want[5:15]
    assert len(full["samples"]) == 60  # at most PAGE_MAX per page; the index holds all
    diff = get(base, "/api/compare", a="darling-step_30/math", b="grpo-step_30/math", only="fixed")
    assert diff["common"] == 60 and all(x["correct"] == 0.0 and y["correct"] == 1.0 for x, y in diff["pairs"])


def test_viewer_links_and_listens_on_loopback_only(viewer_server):
    base, _ = viewer_server
    assert base.startswith("http://127.0.0.1:")
    with urllib.request.urlopen(base + "/", timeout=30) as r:
        page = r.read().decode()
    assert '<script src="view.js"></script>' in page and "http" not in page.split("<body>")[1]  # no CDN
    assert viewer_url("evals", suite="math", run="abc") == "http://127.0.0.1:8765/#evals?suite=math&run=abc"


def test_report_links_each_arm_and_metric_to_the_viewer(tmp_path, monkeypatch):
    import html
    import re

    from analysis.report import build_report
    from tests.analysis_store import darling_vs_grpo_store

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    ids = darling_vs_grpo_store()
    page = build_report("darling_math", tmp_path / "report").read_text()
    links = {
        html.unescape(text): html.unescape(href)
        for href, text in re.findall(r'<a href="([^"]+)">([^<]+)</a>', page)
    }
    darling, grpo = f"{ids['darling-s1']},{ids['darling-s2']}", f"{ids['grpo-s1']},{ids['grpo-s2']}"
    hrefs = set(links.values()) | {html.unescape(h) for h in re.findall(r'href="([^"]+)"', page)}
    for runs in (darling, grpo):
        assert viewer_url("collapse", runs=runs, kind="val") in hrefs
        assert viewer_url("collapse", runs=runs, kind="train") in hrefs
    assert viewer_url("evals", run=ids["darling-s2"]) in hrefs  # each arm's latest run's eval samples
    paired = f"{ids['darling-s1']},{ids['grpo-s1']}"
    assert links["eval/math/acc"] == viewer_url("evals", suite="math", run=ids["darling-s1"])
    assert links["train/accuracy"] == viewer_url("collapse", kind="train", runs=paired)
    assert links["reward/distinct_classes_mean"] == viewer_url("collapse", kind="train", runs=paired)


def test_runs_and_results_of_a_sweep_still_going_show_up_on_reload(viewer_server, tmp_path, monkeypatch):
    import analysis.view

    base, _ = viewer_server
    before = get(base, "/api/evals", eval="grpo-step_30/math")["total"]
    monkeypatch.setattr(analysis.view, "REDISCOVER_S", 0.0)
    late = log_arm_run("darling_math", "DARLING", seed=2)
    write_eval(tmp_path / "evals", "darling-s2-step_30", 10, run_id=late, step=30)
    index = get(base, "/api/index")
    assert late in {r["run_id"] for r in index["runs"]}
    assert "darling-s2-step_30/math" in {e["key"] for e in index["evals"]}
    assert get(base, "/api/evals", eval="grpo-step_30/math")["total"] == before == 60


def test_a_prompt_held_twice_by_the_data_is_two_choices(tmp_path):
    from analysis.view_sources import RunSamples

    folder = tmp_path / "samples" / "val"
    folder.mkdir(parents=True)
    for step in (0, 10):
        groups = [
            {"step": step, "group": g, "prompt": "P", "responses": [{"text": str(g), "answer": str(g)}]}
            for g in range(2)
        ]
        (folder / f"{step:06d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in groups))
    run = {"run_id": "r", "label": "L", "arm": "A", "link": "", "artifact_uri": str(tmp_path)}
    samples = RunSamples([run])
    prompts, errors = samples.prompts(["r"], "val")
    assert [p["key"] for p in prompts] == ["prompt:P", "prompt:P (#2)"] and errors == []
    cells = samples.collapse(["r"], "val", "prompt:P (#2)")["runs"][0]["cells"]
    assert {s: c["group"] for s, c in cells.items()} == {"0": 1, "10": 1}
