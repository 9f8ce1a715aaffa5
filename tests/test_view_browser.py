"""The samples viewer in headless Chromium (driven over the DevTools pipe, tests/cdp_browser.py): the
pages render, the filters work when clicked, nothing reaches the console, bad or missing inputs are one
line on the page; screenshots are left in the test's tmp_path (the path is printed)."""

from __future__ import annotations

import threading

import pytest

from analysis.view import build_viewer, serve
from tests.cdp_browser import Browser
from tests.test_report_browser import chromium  # noqa: F401 - the fixture (installs Debian's chromium)
from tests.test_view import get, viewer_server  # noqa: F401 - the fixture: a store, evals and a server
from tests.view_data import log_arm_run

pytestmark = pytest.mark.slow


@pytest.fixture
def browser(chromium, tmp_path):  # noqa: F811 - the imported fixture
    b = Browser(chromium, tmp_path / "profile")
    yield b
    b.close()


def _renders(browser) -> int:
    return browser.eval("window.rlpostRenders || 0")


def _count(browser, box: str) -> str:
    return browser.eval(f"document.getElementById('{box}-pager-count').textContent")


def test_the_browser_check_sees_a_script_error(browser):
    browser.goto("data:text/html,<script>undefinedViewerFn()</script>")
    browser.wait_for("document.readyState === 'complete'")
    browser.drain()
    assert any("undefinedViewerFn" in line for line in browser.console), browser.console


def test_viewer_pages_render_and_filter_in_chromium(browser, viewer_server, tmp_path):  # noqa: F811
    base, runs = viewer_server
    browser.goto(f"{base}/#collapse")
    browser.wait_rendered("collapse")
    labels = browser.eval("[...document.querySelectorAll('#collapse-table th')].map(t => t.textContent)")
    assert labels == ["step", "DARLING seed 1 MLflow", "GRPO seed 1 MLflow"]  # one run per arm by default
    classes = browser.eval(
        "[...document.querySelectorAll('#collapse-table tr')].slice(1)"
        ".map(r => [...r.querySelectorAll('td[data-classes]')].map(td => +td.dataset.classes))"
    )
    assert classes == [[8, 8], [8, 6], [8, 3], [8, 1]]  # DARLING spread, GRPO collapsing
    print("screenshot", browser.screenshot(tmp_path / "collapse.png"))

    n = _renders(browser)  # the other prompt, chosen in its select
    browser.eval(
        "const s = document.getElementById('c-key'); s.value = s.options[1].value;"
        " s.dispatchEvent(new Event('change'))"
    )
    browser.wait_rendered("collapse", n)
    assert browser.eval("location.hash").startswith("#collapse?") and "key=prompt" in browser.eval(
        "location.hash"
    )

    n = _renders(browser)
    browser.goto(f"{base}/#evals?eval=grpo-step_30%2Fmath")
    browser.wait_rendered("evals", n)
    assert _count(browser, "e") == "1–25 of 60 matching (60 samples)"
    assert browser.eval("document.querySelectorAll('#e-list .card').length") == 25
    n = _renders(browser)
    browser.eval("document.getElementById('e-wrong').click()")
    browser.wait_rendered("evals", n)
    wrong = get(base, "/api/evals", eval="grpo-step_30/math", wrong=1)["matched"]
    assert _count(browser, "e").endswith(f"of {wrong} matching (60 samples)") and 0 < wrong < 60
    n = _renders(browser)
    browser.eval(
        "const d = document.getElementById('e-dataset'); d.value = 'gsm8k'; d.dispatchEvent(new Event('change'))"
    )
    browser.wait_rendered("evals", n)
    badges = browser.eval("[...document.querySelectorAll('#e-list .badge')].map(b => b.textContent)")
    shown = browser.eval("[...document.querySelectorAll('#e-list .meta')].map(m => m.textContent)")
    assert badges and set(badges) == {"wrong"} and all("dataset gsm8k" in m for m in shown)
    print("screenshot", browser.screenshot(tmp_path / "evals.png"))
    n = _renders(browser)
    browser.eval(
        "const m = document.getElementById('e-smin'); m.value = '0.5'; m.dispatchEvent(new Event('change'))"
    )
    browser.wait_rendered("evals", n)
    assert _count(browser, "e").startswith("0 of 0")  # math samples have no judge score
    assert "no sample matches" in browser.eval("document.getElementById('e-list').textContent")

    n = _renders(browser)
    browser.goto(f"{base}/#compare?a=darling-step_30%2Fmath&b=grpo-step_30%2Fmath&only=fixed")
    browser.wait_rendered("compare", n)
    fixed = get(base, "/api/compare", a="darling-step_30/math", b="grpo-step_30/math", only="fixed")
    assert browser.eval("document.querySelectorAll('#p-list .pair .card').length") == 2 * min(
        25, fixed["matched"]
    )
    assert (
        browser.eval("[...document.querySelectorAll('#p-list h3 a')].map(a => a.textContent)")
        == ["MLflow run"] * 2
    )
    print("screenshot", browser.screenshot(tmp_path / "compare.png"))
    browser.drain()
    assert browser.console == []
    errors = browser.eval("[...document.querySelectorAll('#errors div')].map(d => d.textContent)")
    assert (
        len(errors) == 1 and "darling-step_30/math/samples.jsonl: line 31 is not JSON" in errors[0]
    )  # the torn line


def test_bad_or_missing_artifacts_are_one_line_each_on_the_page(browser, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.chdir(tmp_path)
    run_id = log_arm_run("darling_math", "GRPO", steps=(0, 10))
    artifact = next(tmp_path.glob("mlruns/*/*/artifacts/samples/val/000010.jsonl"))
    artifact.write_text(artifact.read_text().splitlines()[0] + "\n{torn\n")
    viewer = build_viewer(run_ids=[run_id, "f" * 32], results_dir=tmp_path / "no-evals")
    server = serve(viewer, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        browser.goto(f"{base}/#collapse?runs={run_id}")
        browser.wait_rendered("collapse")
        lines = browser.eval("[...document.querySelectorAll('#errors div')].map(d => d.textContent)")
        assert lines[:2] == [
            f"--run {'f' * 32}: no such MLflow run in sqlite:///{tmp_path / 'mlflow.db'}",
            f"no eval results in {tmp_path / 'no-evals'} (run python -m evals.<suite> --ckpt ...)",
        ]
        assert (
            lines[2]
            == "run combine=quality seed 1: val/000010.jsonl: line 2 is not JSON (Expecting property name "
            "enclosed in double quotes at column 2) (skipped)"
        )
        assert (
            browser.eval("document.querySelectorAll('#collapse-table tr').length") == 3
        )  # steps 0, 10 still shown
        n = _renders(browser)
        browser.goto(f"{base}/#evals")
        browser.wait_rendered("evals", n)
        assert "no eval results to show" in browser.eval("document.getElementById('e-list').textContent")
        print("screenshot", browser.screenshot(tmp_path / "errors.png"))
        browser.drain()
        assert browser.console == []
    finally:
        server.shutdown()
        server.server_close()


def test_the_command_serves_on_loopback_and_a_busy_port_is_one_line(tmp_path):
    """`python -m analysis.view` as `make view` runs it: the page and its API on 127.0.0.1; no store and no
    results are lines on the page; a port in use is a one-line error naming the fix."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'none.db'}"}
    cmd = [sys.executable, "-m", "analysis.view", "--results-dir", str(tmp_path / "evals"), "--no-browser"]
    proc = subprocess.Popen([*cmd, "--port", "0"], cwd=root, env=env, stdout=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        found = re.search(r"serving http://127\.0\.0\.1:(\d+)/", first)
        assert found, first
        port = found.group(1)
        index = get(f"http://127.0.0.1:{port}", "/api/index")
        assert index["errors"] == [
            f"no MLflow store at sqlite:///{tmp_path / 'none.db'} (train a run first, or set MLFLOW_TRACKING_URI)",
            f"no eval results in {tmp_path / 'evals'} (run python -m evals.<suite> --ckpt ...)",
        ]
        busy = subprocess.run(
            [*cmd, "--port", port], cwd=root, env=env, capture_output=True, text=True, timeout=300
        )
        assert busy.returncode == 1
        assert busy.stderr.strip().splitlines()[-1] == (
            f"error: cannot listen on 127.0.0.1:{port}: Address already in use (pass --port 0)"
        )
    finally:
        proc.terminate()
        proc.wait(timeout=60)
