"""The samples viewer under hostile input (issue 44): every request gets an answer, a bad line of a run's
samples or of an eval's samples.jsonl is one line naming file, line and field while the rest (of the run,
and the other runs) is shown, and NaN / Infinity go out as JSON a browser parses. Plus seeded fuzzing of
both readers: every damaged line is a skipped record with one line, never an exception."""

from __future__ import annotations

import http.client
import json
import random
import threading
import urllib.parse

import pytest

from analysis.json_lines import json_safe
from analysis.sample_index import SampleIndex
from analysis.view import Viewer, serve
from analysis.view_sources import EvalSamples, RunSamples, _read_jsonl

NESTED = "[" * 100_000 + "]" * 100_000  # RecursionError in Python's parser
GOOD = {"kind": "val", "step": 10, "group": 0, "prompt": "2+2?", "gold": "4",
        "responses": [{"text": "4", "answer": "4", "reward": 1.0, "class": 0},
                      {"text": "5", "answer": "5", "reward": float("nan"), "class": 1}]}  # fmt: skip
HOSTILE_SAMPLES = [  # (line, what its one line must name)
    ('{"step": 10, "responses": ' + NESTED + "}", "nested deeper"),
    (json.dumps(GOOD | {"step": "two"}), "field 'step' is a string ('two')"),
    (json.dumps(GOOD | {"group": [0]}), "field 'group' is a list ([0])"),
    (json.dumps(GOOD | {"responses": [5]}), "field 'responses' item 0 is a number (5)"),
]
EVAL = {"id": "a/1", "dataset": "a", "gold": "1", "responses": ["1"], "answers": ["1"], "correct": [1.0]}


def _strict(text: str):
    """The browser's JSON.parse: no NaN, Infinity or -Infinity."""

    def refuse(name: str):
        raise ValueError(f"bare {name} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def hostile_viewer(tmp_path):
    """A good run, a run whose val/000010.jsonl holds a good record and the issue's four bad lines, and
    two checkpoints' math results, one with deeply nested and NaN-scored lines among good ones."""

    def run(name: str, lines: list[str]) -> dict:
        folder = tmp_path / name / "artifacts" / "samples" / "val"
        folder.mkdir(parents=True)
        (folder / "000010.jsonl").write_text("\n".join(lines) + "\n")
        return {"run_id": name, "label": name, "arm": name, "seed": "1", "link": "",
                "artifact_uri": str(tmp_path / name / "artifacts")}  # fmt: skip

    runs = [run("good", [json.dumps(GOOD)]), run("bad", [json.dumps(GOOD)] + [h[0] for h in HOSTILE_SAMPLES])]
    for ckpt, extra in (("a", ['{"id": "deep", "responses": ' + NESTED + "}"]), ("b", [])):
        folder = tmp_path / "evals" / ckpt / "math"
        folder.mkdir(parents=True)
        nan = json.dumps(EVAL | {"id": "a/2", "rm_scores": [float("nan")], "correct": [float("inf")]})
        (folder / "samples.jsonl").write_text("\n".join([json.dumps(EVAL), *extra, nan]) + "\n")
    viewer = Viewer(lambda: (runs, [], EvalSamples(tmp_path / "evals")))
    server = serve(viewer, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _get(port: int, path: str, **query) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path + ("?" + urllib.parse.urlencode(query) if query else ""))
        response = conn.getresponse()  # a dropped connection raises here
        return response.status, _strict(response.read().decode())
    finally:
        conn.close()


def test_a_bad_samples_line_is_one_line_and_the_rest_renders(hostile_viewer):
    status, prompts = _get(hostile_viewer, "/api/prompts", runs="good,bad", kind="val")
    assert status == 200 and [p["key"] for p in prompts["prompts"]] == ["prompt:2+2?"]
    assert len(prompts["errors"]) == len(HOSTILE_SAMPLES)
    for n, ((_, named), line) in enumerate(zip(HOSTILE_SAMPLES, prompts["errors"]), start=2):
        assert line.startswith(f"run bad: val/000010.jsonl: line {n} ") and named in line, line
        assert line.endswith("(skipped)") and "\n" not in line
    status, data = _get(hostile_viewer, "/api/collapse", runs="good,bad", kind="val", key="prompt:2+2?")
    assert status == 200 and data["steps"] == [10] and len(data["errors"]) == len(HOSTILE_SAMPLES)
    cells = {r["run_id"]: r["cells"]["10"] for r in data["runs"]}
    assert [x["reward"] for x in cells["good"]["responses"]] == [1.0, "NaN"]  # valid JSON, shown as NaN
    assert cells["bad"]["prompt"] == "2+2?"  # the bad run's good record is still there


def test_a_deeply_nested_eval_line_is_one_line_and_nan_is_valid_json(hostile_viewer):
    status, page = _get(hostile_viewer, "/api/evals", eval="a/math")
    assert status == 200 and page["total"] == 2
    [line] = page["errors"]
    assert "a/math/samples.jsonl: line 2 " in line and "nested deeper" in line and "\n" not in line
    nan = next(s for s in page["samples"] if s["id"] == "a/2")
    assert (nan["score"], nan["correct"]) == ("NaN", "Infinity")
    status, pairs = _get(hostile_viewer, "/api/compare", a="a/math", b="b/math", only="all")
    assert status == 200 and pairs["common"] == 2 and len(pairs["errors"]) == 1


HOSTILE_REQUESTS = [
    ("/api/evals", {"eval": ""}),  # KeyError('') has no text
    ("/api/evals", {"eval": "a/math", "offset": "x"}),
    ("/api/evals", {"eval": "a/math", "limit": "9" * 5000}),
    ("/api/evals", {"eval": "a/math", "score_min": "nan", "score_max": "inf"}),
    ("/api/compare", {"a": "a/math", "b": "", "only": "everything"}),
    ("/api/collapse", {"runs": ",,bad,,nope", "kind": "val", "key": "group:\x00"}),
    ("/api/collapse", {"runs": "bad", "kind": "train"}),
    ("/api/prompts", {"runs": "bad" * 1000, "kind": "val"}),
    ("/api/nothing", {}),
]


@pytest.mark.parametrize(("path", "query"), HOSTILE_REQUESTS)
def test_every_hostile_request_gets_an_answer(hostile_viewer, path, query):
    status, body = _get(hostile_viewer, path, **query)
    assert status in (200, 400, 500)
    assert status == 200 or (isinstance(body["error"], str) and "\n" not in body["error"])


def test_json_safe_names_non_finite_floats_at_any_depth():
    deep: list = [float("-inf")]
    for _ in range(500):  # json.dumps itself stops near 1000
        deep = [deep]
    value = {"a": [1.5, float("nan"), {"b": (float("inf"),)}], "deep": deep}
    out = json.dumps(json_safe(value))
    assert json_safe({"a": [1.5, float("nan"), {"b": (float("inf"),)}]}) == {
        "a": [1.5, "NaN", {"b": ["Infinity"]}]
    }
    assert '"-Infinity"' in out and "NaN" not in out.replace('"NaN"', "")


# ---- fuzzing: seeded damage to both readers' files ------------------------------------------------

FUZZ_INPUTS = 300


def damaged(rng: random.Random, record: dict) -> str:
    """One damaged line: cut short, a field of the wrong type, nested deep, a huge or non-finite value."""
    line = json.dumps(record)
    how = rng.randrange(6)
    if how == 0:
        return line[: rng.randrange(len(line))]
    key = rng.choice(list(record))
    wrong = rng.choice(
        ["two", [0], {"x": 1}, None, True, -1, 10**400, float("nan"), 1e308 * 10, [[[]]], "", [5]]
    )
    if how == 1:
        return json.dumps(record | {key: wrong})
    if how == 2:
        depth = rng.choice([40, 500, 5000, 100_000])
        return json.dumps(record)[:-1] + f', "{key}": ' + "[" * depth + "]" * depth + "}"
    if how == 3:
        inner = record.get("responses")
        if isinstance(inner, list) and inner:
            inner = list(inner)
            inner[rng.randrange(len(inner))] = wrong
            return json.dumps(record | {"responses": inner})
        return json.dumps(wrong)
    if how == 4:
        return json.dumps(record | {key: "x" * rng.choice([10, 100_000])})
    return rng.choice(["", "null", "[]", "{}", "\x00\xff", "NaN", '"text"', "1e999", line + line])


def _fuzz_file(tmp_path, rng, record, n: int):
    lines = [damaged(rng, record) for _ in range(n)]
    path = tmp_path / "samples.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path, sum(1 for line in lines if line.strip())


def test_fuzzed_training_samples_lines_are_records_or_one_line_each(tmp_path):
    rng = random.Random(44)
    path, nonblank = _fuzz_file(tmp_path, rng, GOOD, FUZZ_INPUTS)
    records, errors = _read_jsonl(path, "run r: val/000010.jsonl")
    assert len(records) + len(errors) == nonblank and errors and records
    assert all("\n" not in e and e.endswith("(skipped)") and " line " in e for e in errors)
    runs = RunSamples([{"run_id": "r", "label": "r", "arm": "r", "link": "", "artifact_uri": str(tmp_path)}])
    (tmp_path / "samples" / "val").mkdir(parents=True)
    path.rename(tmp_path / "samples" / "val" / "000010.jsonl")
    prompts, _ = runs.prompts(["r"], "val")  # what the page asks for next: no exception on what was kept
    for p in prompts:
        json.dumps(json_safe(runs.collapse(["r"], "val", p["key"])), allow_nan=False)


def test_fuzzed_eval_records_are_indexed_or_one_line_each(tmp_path):
    from analysis.sample_index import Filters, compare

    rng = random.Random(45)
    record = EVAL | {"rm_scores": [0.5], "judge_reply": "ok", "subject": "algebra"}
    path, nonblank = _fuzz_file(tmp_path, rng, record, FUZZ_INPUTS)
    idx = SampleIndex(path, "math").refresh()
    assert idx.errors and all("\n" not in e and e.endswith("(skipped)") for e in idx.errors)
    assert len(idx.errors) + len({e["offset"] for e in idx.entries}) <= nonblank
    page = idx.page(Filters(), 0, 200)  # reading back what was indexed: no exception
    json.dumps(json_safe(page), allow_nan=False)
    json.dumps(json_safe(compare(idx, idx, "all", 0, 200)), allow_nan=False)
