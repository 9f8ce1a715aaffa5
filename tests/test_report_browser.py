"""The report page in headless Chromium: no console errors, every image renders, tables present; a screenshot.

Chromium comes from Debian's `chromium` package; the fixture installs it when missing (as root with
apt-get, as on CI) and skips with the reason otherwise.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from analysis.report import build_report
from tests.analysis_store import darling_math_store, darling_vs_grpo_store

pytestmark = pytest.mark.slow

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


@pytest.fixture(scope="session")
def chromium() -> str:
    path = shutil.which("chromium")
    if path:
        return path
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip(
            "chromium is not installed and cannot be (needs root and apt-get: apt-get install chromium)"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "chromium"]
    if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"apt-get install chromium failed: {done.stderr.strip().splitlines()[-1:]}")
    return shutil.which("chromium") or pytest.skip("chromium still not on PATH after apt-get install")


def load_in_browser(
    chromium: str, page: Path, profile: Path, size: str = "1280,900"
) -> tuple[str, list[str]]:
    """The page's DOM after load in a `size` window, and every console message Chromium logged meanwhile."""
    done = subprocess.run(
        [chromium, *FLAGS, f"--user-data-dir={profile}", f"--window-size={size}", "--enable-logging=stderr", "--v=0",
         "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return done.stdout, console


def screenshot(chromium: str, page: Path, profile: Path, shot: Path, size: str) -> int:
    """Chromium's screenshot of the page in a `size` window, written to `shot`; its size in bytes."""
    subprocess.run(
        [chromium, *FLAGS, f"--user-data-dir={profile}", f"--window-size={size}", f"--screenshot={shot}",
         page.as_uri()],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    return shot.stat().st_size


def test_browser_check_catches_a_broken_page(chromium, tmp_path):
    """The check itself can fail: a missing image and a script error are caught."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<html><body><img src="fig/missing.png"><script>undefinedFn();</script>'
        "<script>window.addEventListener('load', function () { var i = document.images;"
        " document.body.setAttribute('data-images-loaded', (i[0].naturalWidth > 0 ? 1 : 0) + '/' + i.length);"
        " });</script></body></html>"
    )
    dom, console = load_in_browser(chromium, bad, tmp_path / "profile")
    assert any("undefinedFn" in line for line in console)
    assert 'data-images-loaded="0/1"' in dom


def test_report_renders_in_headless_chromium(chromium, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    darling_vs_grpo_store()
    page = build_report("darling_math", tmp_path / "report")
    dom, console = load_in_browser(chromium, page, tmp_path / "profile")
    assert console == [], console
    loaded = re.search(r'data-images-loaded="(\d+)/(\d+)"', dom)
    assert loaded, "the page's load handler did not run"
    ok, total = map(int, loaded.groups())
    assert total >= 8 and ok == total, f"{ok}/{total} images rendered"
    # all metrics, before training, per run, per checkpoint; and the results table
    assert (
        dom.count('<table class="leaderboard">') == 4
        and dom.count('<table class="leaderboard results">') == 1
    )
    assert "Does DARLING differ from GRPO?" in dom
    assert "DARLING" in dom and "GRPO" in dom
    shot = tmp_path / "report" / "screenshot.png"
    assert screenshot(chromium, page, tmp_path / "profile2", shot, "1280,2400") > 20_000


@pytest.mark.parametrize("seeds", [2, 3])
def test_first_screen_is_the_headline(chromium, tmp_path, monkeypatch, seeds):
    """What a reader sees on opening the page (1280x900): the question, one sentence per headline metric
    with its power line, the results table; intervals only from 3 seeds. The screenshot is kept for a person
    to look at (its path printed; RLPOST_SCREENSHOTS=DIR keeps it there instead of beside the page)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    darling_math_store(seeds=tuple(range(1, seeds + 1)))
    page = build_report("darling_math", tmp_path / "report")
    dom, console = load_in_browser(chromium, page, tmp_path / "profile")
    assert console == [], console
    assert re.findall(r"<h2>(.*?)</h2>", dom)[0] == "Headline"
    bottom = re.search(r'data-results-bottom="(\d+)"', dom)
    assert bottom and int(bottom.group(1)) <= 900, "the results table is not on the first screen"
    items = re.findall(
        r"<li><span class=\"sentence\">(.*?)</span><br><span class=\"power\">(.*?)</span></li>", dom
    )
    assert [s.split(",")[0] for s, _ in items] == [
        "distinct correct answers per held-out prompt (of 8 samples)",
        "held-out accuracy (= pass@1)",
    ]
    assert all(p.startswith("Seeds needed to tell ") for _, p in items)
    intervals = [re.findall(r"\[([-+0-9.e]+), ([-+0-9.e]+)\]", s) for s, _ in items]
    if seeds == 2:
        assert intervals == [[], []] and all("an interval needs 3 or more seeds" in s for s, _ in items)
    else:
        accuracy = intervals[1][:2]  # DARLING's and GRPO's: cut at 1, never 1.04
        assert accuracy == [("0.788", "1"), ("0.935", "1")] and "1]*" in items[1][0]
    keep = Path(os.environ.get("RLPOST_SCREENSHOTS", tmp_path / "report"))  # pytest's tmp folders rotate
    keep.mkdir(parents=True, exist_ok=True)
    shot = keep / f"first_screen_{seeds}_seeds.png"
    assert screenshot(chromium, page, tmp_path / "profile2", shot, "1280,900") > 20_000
    print(f"first screen, {seeds} seeds: {shot}")
