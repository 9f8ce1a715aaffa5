"""Every preset's paper mode starts as documented or is refused in one line before anything loads
(train/preflight.py): servers that do not answer, folders that do not exist."""

import socket
import subprocess
import sys
import time

import pytest

from infra.models import DEFAULT_MODEL, PROJECT_ROOT
from train.config import build_config
from train.plan import _servers
from train.preflight import refusal, unanswered_servers

PAPER = sorted(p.stem for p in (PROJECT_ROOT / "experiments").glob("*.yaml") if "\n  paper:" in p.read_text())


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_paper_presets_are_found():
    assert {"darling_math", "darling_wildchat", "classmate_sycophancy", "grpo_math"} <= set(PAPER)


@pytest.mark.parametrize("experiment", PAPER)
def test_each_paper_preset_starts_or_is_refused_in_one_line_naming_what_to_start(experiment):
    cfg = build_config(experiment, [], "paper")
    port = _closed_port()
    servers = _servers(cfg.get("reward"))
    for _, node in servers:  # wherever they point as shipped, a port nobody serves
        node.base_url = f"http://127.0.0.1:{port}"
    line = refusal(cfg)
    if not servers and cfg.model.path == DEFAULT_MODEL:  # the embedded model, builtin data: nothing to start
        assert line is None
        return
    assert line is not None and "\n" not in line
    if cfg.model.path != DEFAULT_MODEL:  # the published models are not on this machine
        assert f"model.path={cfg.model.path!r} is not a local HF folder" in line
    for path, _ in servers:
        assert f"{path}.base_url=http://127.0.0.1:{port}: nothing answers there" in line


def test_a_server_that_answers_passes():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        cfg = build_config("darling_math", [f"reward.judge.base_url=http://127.0.0.1:{port}"], "paper")
        assert unanswered_servers(cfg) == []


def test_python_m_train_refuses_the_paper_judge_before_the_policy_loads(tiny_model):
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "train", "experiment=darling_math", "preset=paper", "world_size=1",
         f"model.path={tiny_model}", "track=false", f"reward.judge.base_url=http://127.0.0.1:{_closed_port()}"],
        capture_output=True, text=True, timeout=120, cwd=PROJECT_ROOT,
    )  # fmt: skip
    took = time.perf_counter() - t0
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: cannot start: "), proc.stderr[-2000:]
    assert "reward.judge.tokenizer" in lines[0] and "reward.judge.base_url" in lines[0]
    assert took < 20, f"{took:.0f} s: something loaded before the refusal"
