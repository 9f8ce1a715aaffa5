"""The viewer's "step 0 vs the end" view: one held-out prompt's multi-turn trajectories at the first and
the last logged validation, each turn labelled model / tool / user (analysis/turns.py), over the HTTP API
of a real store whose runs logged their val samples through train.samples as GRPO does."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from analysis.sample_index import samples_of
from analysis.turns import labelled
from analysis.view import build_viewer, serve
from infra.tracking import Tracker
from tests.test_report_browser import chromium  # noqa: F401 - the fixture (installs Debian's chromium)
from tests.test_view import get
from train.samples import sample_records, write_samples

PROMPT = "What is 123 * 4567?"
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "123 * 4567"}}</tool_call>'


def _episode(turns: list[tuple[str, str]], calls: int) -> dict:
    return {"segments": [{"role": r, "text": t} for r, t in turns], "tool_calls": calls, "stop": "answered"}


# per arm and step: the group of 2 answers (final text, episode); step 10 lies between the ends
EPISODES = {
    "calculator": {
        0: [("561000", _episode([("model", "561000")], 0)),
            ("561741", _episode([("model", CALL), ("env", "561741"), ("model", "561741")], 1))],
        10: [("1", _episode([("model", "1")], 0))] * 2,
        20: [("561741", _episode([("model", CALL), ("env", "<tool_response>\n561741\n</tool_response>"),
                                  ("model", "561741")], 1))] * 2,
    },
    "feedback": {  # an interaction's user, no tools: "try again"
        0: [("5", _episode([("model", "5"), ("env", "That is not right, try again."), ("model", "6")], 0))] * 2,
        20: [("561741", _episode([("model", "561741")], 0))] * 2,
    },
}  # fmt: skip


def _log_run(arm: str, seed: int = 1) -> str:
    tracker = Tracker()
    point = json.dumps({"grpo.env.tools": arm, "grpo.seed": seed})
    run_id = tracker.start(
        "tool_view", f"{arm}-s{seed}", tags={"rlpost.sweep": "sw", "rlpost.grid_point": point}
    )
    tracker.log_params({"seed": seed})
    for step, group in EPISODES[arm].items():
        rows = [{"prompt": [{"role": "user", "content": PROMPT}], "ground_truth": "561741"}] * len(group)
        texts, episodes = [t for t, _ in group], [e for _, e in group]
        correct = [float(t == "561741") for t in texts]
        records = sample_records(
            "val", step, rows, texts, [0] * len(group), correct, correct, episodes=episodes
        )
        write_samples(tracker, "val", step, records)
    tracker.finish()
    return run_id


@pytest.fixture
def trajectories_server(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.chdir(tmp_path)
    runs = {arm: _log_run(arm) for arm in EPISODES}
    server = serve(build_viewer("tool_view", results_dir=tmp_path / "evals"), port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", runs
    server.shutdown()
    server.server_close()


def test_the_same_prompt_at_the_first_and_last_step_with_turns_labelled(trajectories_server):
    base, runs = trajectories_server
    chosen = f"{runs['calculator']},{runs['feedback']}"
    [prompt] = get(base, "/api/prompts", runs=chosen, kind="val")["prompts"]
    data = get(base, "/api/collapse", runs=chosen, kind="val", key=prompt["key"], steps="ends")
    assert data["steps"] == [0, 20] and data["errors"] == []  # step 10 left out
    calc, feedback = data["runs"]
    assert list(calc["cells"]) == ["0", "20"] and list(feedback["cells"]) == ["0", "20"]

    def who(cell: dict) -> list[list[str]]:
        return [[t["who"] for t in r["turns"]] for r in cell["responses"]]

    # before RL: one answer without a call, one with (a native result: the text alone, after a call)
    assert who(calc["cells"]["0"]) == [["model"], ["model", "tool", "model"]]
    # at the end: both call, the results in the fallback format's <tool_response> blocks
    assert who(calc["cells"]["20"]) == [["model", "tool", "model"]] * 2
    assert [r["correct"] for r in calc["cells"]["20"]["responses"]] == [1.0, 1.0]
    assert [r["tool_calls"] for r in calc["cells"]["0"]["responses"]] == [0, 1]
    # an environment's reply to a turn without a call is a user's
    assert who(feedback["cells"]["0"]) == [["model", "user", "model"]] * 2
    assert feedback["cells"]["0"]["responses"][0]["turns"][1]["text"] == "That is not right, try again."

    every = get(base, "/api/collapse", runs=chosen, kind="val", key=prompt["key"])
    assert every["steps"] == [0, 10, 20] and every["runs"][1]["cells"]["10"] is None  # not logged there
    with pytest.raises(urllib.error.HTTPError) as bad:
        get(base, "/api/collapse", runs=chosen, kind="val", key=prompt["key"], steps="last")
    assert bad.value.code == 400 and json.loads(bad.value.read()) == {
        "error": "steps='last': use all or ends"
    }


def test_the_page_has_the_view(trajectories_server):
    base, _ = trajectories_server
    with urllib.request.urlopen(base + "/", timeout=30) as r:
        page = r.read().decode()
    with urllib.request.urlopen(base + "/view.js", timeout=30) as r:
        script = r.read().decode()
    assert 'href="#trajectories"' in page and 'id="page-trajectories"' in page and 'id="t-key"' in page
    assert 'chooseGroups("trajectories", "t", q, "ends")' in script


def test_turns_are_told_apart_by_what_the_model_wrote_and_the_tool_format():
    turns = [
        {"role": "model", "text": CALL},
        {"role": "env", "text": "561741"},  # native format: the result alone, after a call
        {"role": "model", "text": "Let me check."},
        {"role": "env", "text": "<tool_response>\nerror: unknown tool\n</tool_response>"},  # fallback format
        {"role": "model", "text": "561741"},
        {"role": "env", "text": "Correct!"},  # no call before it: an interaction's user
    ]
    assert [t["who"] for t in labelled(turns)] == ["model", "tool", "model", "tool", "model", "user"]
    assert labelled(["odd"]) == ["odd"]  # not a turn: kept as it is
    # eval records of evals.math --tools read the same way
    record = {"id": "x/1", "gold": "561741", "responses": ["561741"], "answers": ["561741"], "correct": [1.0],
              "trajectories": [turns[:2] + [{"role": "model", "text": "561741"}]]}  # fmt: skip
    [sample] = samples_of("math", record)
    assert sample["response"] == f"[model]\n{CALL}\n\n[tool]\n561741\n\n[model]\n561741"


@pytest.mark.slow
def test_both_ends_render_with_labelled_turns(trajectories_server, chromium, tmp_path):  # noqa: F811
    """In headless Chromium (tests/cdp_browser.py): a row per run, the first and the last step as columns,
    each turn headed by model / tool / user; a click on the nav reaches it; nothing on the console."""
    from tests.cdp_browser import Browser

    base, runs = trajectories_server
    browser = Browser(chromium, tmp_path / "profile")
    try:
        browser.goto(f"{base}/#collapse")
        browser.wait_rendered("collapse")
        n = browser.eval("window.rlpostRenders")
        browser.eval("document.querySelector('nav a[data-page=trajectories]').click()")
        browser.wait_rendered("trajectories", n)
        table = "document.getElementById('trajectories-table')"
        heads = browser.eval(f"[...{table}.querySelectorAll('th')].map(t => t.textContent)")
        assert heads == ["run", "step 0 (first logged)", "step 20 (last logged)"]
        cells = browser.eval(
            f"[...{table}.querySelectorAll('tr')].slice(1).map(r => [...r.querySelectorAll('td[data-step]')]"
            ".map(td => [...td.querySelectorAll('.traj')].map(t => [...t.querySelectorAll('.turn')]"
            ".map(u => u.dataset.who).join(' '))))"
        )
        assert cells == [  # the runs sorted by arm: calculator, then feedback
            [["model", "model tool model"], ["model tool model", "model tool model"]],
            [["model user model", "model user model"], ["model", "model"]],
        ]
        notes = browser.eval(f"[...{table}.querySelectorAll('.cellnote')].map(c => c.textContent)")
        assert notes == ["1 of 2 correct · 1 called a tool", "2 of 2 correct · 2 called a tool",
                         "0 of 2 correct · 0 called a tool", "2 of 2 correct · 0 called a tool"]  # fmt: skip
        assert browser.eval("document.querySelector('#t-grid .prompt').textContent") == PROMPT
        print("screenshot", browser.screenshot(tmp_path / "trajectories.png"))
        n = browser.eval("window.rlpostRenders")  # one run chosen: its row only
        browser.goto(f"{base}/#trajectories?kind=val&runs={runs['feedback']}")
        browser.wait_rendered("trajectories", n)
        assert browser.eval(f"{table}.querySelectorAll('tr').length") == 2
        browser.drain()
        assert browser.console == []
        errors = browser.eval("[...document.querySelectorAll('#errors div')].map(d => d.textContent)")
        assert errors == [f"no eval results in {tmp_path / 'evals'} (run python -m evals.<suite> --ckpt ...)"]
    finally:
        browser.close()
