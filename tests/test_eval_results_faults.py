"""Eval results under hostile conditions, each through a real `python -m evals.math` process talking to a
loopback OpenAI-compatible server (which counts the generation requests it receives):

- a corrupt line in samples.jsonl loses no good record: it is set aside in samples.jsonl.bad with a
  warning naming the file and line, and only the missing items are generated again;
- an unwritable results folder is refused before any generation, in one line; a summary.json that cannot
  be written is one line too, and keeps every generated record;
- an empty data file and a `--ckpt` holding a quote are one-line errors (exit 1), not an `n_items: 0`
  success or an MLflow traceback, and resolving a `--ckpt` that names nothing creates no MLflow store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.models import PROJECT_ROOT
from tests.recording_server import RecordingServer

PROBLEMS = [
    {"question": f"What is {a} + {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}", "idx": i}
    for i, (a, b) in enumerate([(1, 1), (2, 3), (4, 4), (5, 2), (6, 1), (7, 2)])
]


@pytest.fixture()
def server():
    with RecordingServer(reply="So the answer is \\boxed{2}.") as srv:
        yield srv


@pytest.fixture()
def setup(tmp_path):
    data = tmp_path / "data"
    (data / "gsm8k").mkdir(parents=True)
    (data / "gsm8k" / "test.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROBLEMS))
    model = tmp_path / "model"  # --server generates; the folder only names the checkpoint
    model.mkdir()
    (model / "config.json").write_text("{}")
    return {"data": data, "model": model, "results": tmp_path / "results", "tmp": tmp_path}


def run_eval(setup, server, *extra: str, data: Path | None = None, results: Path | None = None):
    cmd = [
        sys.executable, "-m", "evals.math", "--ckpt", str(setup["model"]), "--server", server.base_url,
        "--data-dir", str(data or setup["data"]), "--datasets", "gsm8k",
        "--results-dir", str(results or setup["results"]), "--no-mlflow", *extra,
    ]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": str(PROJECT_ROOT),
        "MLFLOW_TRACKING_URI": f"sqlite:///{setup['tmp'] / 'mlflow.db'}",
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300)


def chat_requests(server) -> int:
    return sum(r["path"].endswith("/chat/completions") for r in server.requests)


def error_lines(proc) -> list[str]:
    """stderr without tqdm's progress bars: what the user reads."""
    return [ln for ln in proc.stderr.replace("\r", "\n").splitlines() if ln.strip() and "it/s" not in ln
            and "item/s" not in ln and "?item" not in ln]  # fmt: skip


def test_a_corrupt_line_loses_no_good_record(setup, server):
    first = run_eval(setup, server)
    assert first.returncode == 0, first.stderr[-2000:]
    assert chat_requests(server) == 6
    samples = setup["results"] / "model" / "math" / "samples.jsonl"
    lines = samples.read_text().splitlines(keepends=True)
    assert len(lines) == 6
    corrupt = '{"id": "gsm8k-1", "broken\n'
    samples.write_text("".join([lines[0], corrupt, *lines[2:]]))

    again = run_eval(setup, server)
    assert again.returncode == 0, again.stderr[-2000:]
    assert chat_requests(server) == 7  # only the corrupted item was generated again
    warning = [ln for ln in error_lines(again) if "line 2" in ln]
    assert warning and str(samples) in warning[0] and "samples.jsonl.bad" in warning[0], again.stderr
    bad = samples.with_name("samples.jsonl.bad")
    assert bad.read_text() == corrupt  # set aside verbatim, not lost
    records = [json.loads(x) for x in samples.read_text().splitlines()]
    assert sorted(r["id"] for r in records) == sorted(json.loads(x)["id"] for x in lines)
    kept = {json.loads(x)["id"]: x for x in lines}
    assert all(kept[json.loads(x)["id"]] == x for x in samples.read_text().splitlines(keepends=True)
               if json.loads(x)["id"] != json.loads(lines[1])["id"])  # fmt: skip
    summary = json.loads(samples.with_name("summary.json").read_text())
    assert (summary["n_items"], summary["n_new"]) == (6, 1)

    # A torn last line (a kill mid-append) and a record without an id are set aside the same way.
    with samples.open("a") as f:
        f.write('["no id"]\n{"id": "gsm8k-5", "torn')
    third = run_eval(setup, server)
    assert third.returncode == 0, third.stderr[-2000:]
    assert chat_requests(server) == 7  # both bad lines' items are already stored as good records
    assert bad.read_text() == corrupt + '["no id"]\n{"id": "gsm8k-5", "torn\n'
    assert len(samples.read_text().splitlines()) == 6


def test_a_record_of_the_wrong_types_is_set_aside_like_a_torn_line(setup, server):
    """Valid JSON, wrong types (`"correct": "yes"`, `"responses": null`): before, every rerun died in a
    21-line TypeError in evals/math.py naming neither file nor line; now each such line is set aside with
    one warning line naming file, line and field, and only its item is generated again."""
    first = run_eval(setup, server)
    assert first.returncode == 0, first.stderr[-2000:]
    samples = setup["results"] / "model" / "math" / "samples.jsonl"
    lines = samples.read_text().splitlines(keepends=True)
    wrong = [json.loads(x) for x in lines]
    wrong[1]["correct"] = "yes"
    wrong[3]["responses"] = None
    bad_lines = [json.dumps(wrong[1]) + "\n", json.dumps(wrong[3]) + "\n"]
    samples.write_text("".join([lines[0], bad_lines[0], lines[2], bad_lines[1], *lines[4:]]))

    again = run_eval(setup, server)
    assert again.returncode == 0, again.stderr[-3000:]
    assert chat_requests(server) == 8  # only the two bad records' items were generated again
    warnings = [ln for ln in error_lines(again) if ln.startswith("warning: ")]
    assert len(warnings) == 2 and all(str(samples) in w and "samples.jsonl.bad" in w for w in warnings), (
        warnings
    )
    assert ": line 2: field 'correct' must be list+[number], got str" in warnings[0], warnings
    assert ": line 4: field 'responses' must be list+[str], got NoneType" in warnings[1], warnings
    assert samples.with_name("samples.jsonl.bad").read_text() == "".join(bad_lines)  # kept verbatim
    summary = json.loads(samples.with_name("summary.json").read_text())
    assert (summary["n_items"], summary["n_new"]) == (6, 2)
    assert all(isinstance(json.loads(x)["correct"], list) for x in samples.read_text().splitlines())


def _make_unwritable(folder: Path) -> None:
    """chmod for a normal user; root ignores modes, so it gets the immutable attribute (chattr +i)."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
    elif subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("running as root where chattr +i is not available: no way to make a folder unwritable")
    try:
        (folder / ".probe").write_text("x")
    except OSError:
        return
    (folder / ".probe").unlink()
    pytest.skip(f"{folder} stayed writable after chmod/chattr")


def _make_writable(folder: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
    folder.chmod(0o755)


def test_unwritable_results_folder_is_refused_before_generating(setup, server):
    first = run_eval(setup, server, "--limit", "3")
    assert first.returncode == 0, first.stderr[-2000:]
    suite_dir = setup["results"] / "model" / "math"
    before = (suite_dir / "samples.jsonl").read_text()
    _make_unwritable(suite_dir)
    try:
        proc = run_eval(setup, server)
    finally:
        _make_writable(suite_dir)
    assert proc.returncode == 1
    lines = error_lines(proc)
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(suite_dir) in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert chat_requests(server) == 3  # nothing was generated for the refused run
    assert (suite_dir / "samples.jsonl").read_text() == before

    # A results root that cannot be created at all (a file in the way) is one line too.
    blocker = setup["tmp"] / "blocker"
    blocker.write_text("")
    proc = run_eval(setup, server, results=blocker / "results")
    assert proc.returncode == 1 and len(error_lines(proc)) == 1, proc.stderr
    assert error_lines(proc)[0].startswith("error: ") and chat_requests(server) == 3


def test_summary_that_cannot_be_written_is_one_line_and_keeps_the_samples(setup, server):
    suite_dir = setup["results"] / "model" / "math"
    (suite_dir / "summary.json" / "in_the_way").mkdir(parents=True)  # os.replace onto it fails
    proc = run_eval(setup, server)
    assert proc.returncode == 1
    lines = error_lines(proc)
    assert len(lines) == 1 and "summary.json" in lines[0] and lines[0].startswith("error: "), proc.stderr
    assert len((suite_dir / "samples.jsonl").read_text().splitlines()) == 6  # the work is kept
    (suite_dir / "summary.json" / "in_the_way").rmdir()
    (suite_dir / "summary.json").rmdir()
    again = run_eval(setup, server)
    assert again.returncode == 0 and chat_requests(server) == 6  # the rerun only summarises
    assert json.loads((suite_dir / "summary.json").read_text())["n_new"] == 0


def test_empty_data_file_is_an_error_not_a_zero_item_success(setup, server):
    empty = setup["tmp"] / "empty"
    (empty / "gsm8k").mkdir(parents=True)
    (empty / "gsm8k" / "test.jsonl").write_text("")
    proc = run_eval(setup, server, data=empty)
    assert proc.returncode == 1
    lines = error_lines(proc)
    assert len(lines) == 1 and lines[0].startswith("error: ") and "no items" in lines[0], proc.stderr
    assert not (setup["results"] / "model" / "math" / "summary.json").exists()
    proc = run_eval(setup, server, "--limit", "0")
    assert proc.returncode == 1 and "no items" in error_lines(proc)[0]


def test_ckpt_with_a_quote_is_one_line_and_creates_no_store(setup, server):
    store = setup["tmp"] / "mlflow.db"
    for spec in ("it's", 'say "hi"', "nope"):
        proc = run_eval(setup, server, "--ckpt", spec)
        assert proc.returncode == 1
        lines = error_lines(proc)
        assert len(lines) == 1 and lines[0].startswith("error: --ckpt"), proc.stderr
        assert "Traceback" not in proc.stderr
        assert not store.exists()  # naming nothing must not create an MLflow store
    assert chat_requests(server) == 0
