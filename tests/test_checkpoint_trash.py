"""No checkpoint trash after a run (issue 52): pruning (`keep_last`) renames an old step to `.trash-step_*` and
deletes it in a thread, which the final `os._exit` used to cut short, leaving the last pruned step behind
(1.7 GB for the default model) after a finished run and after a preempted one. Real `python -m train` runs
of the tiny model whose deletions of trash start late (tests/slow_prune_train.py); a run killed (SIGKILL)
during a deletion leaves trash that the next start deletes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.checkpoint import layout
from infra.models import PROJECT_ROOT
from tests.test_preemption import env_for, overrides, progress_step, signal_after_step, start

pytestmark = pytest.mark.slow

WORKER = str(PROJECT_ROOT / "tests" / "slow_prune_train.py")


def args(model: Path, run_dir: Path, steps: int, delay: float, *extra: str) -> list[str]:
    """The preemption tests' tiny run, saving every step and keeping the newest one."""
    base = [o for o in overrides(model, run_dir, steps, 1, delay) if not o.startswith("keep_last=")]
    return [WORKER, *base, "keep_last=1", *extra]


def trash(run_dir: Path) -> dict[str, int]:
    """Each trash folder left in the run's checkpoints folder, with the bytes it holds."""
    root = layout.checkpoints_root(run_dir)
    return {p.name: sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
            for p in root.glob(f"{layout.TRASH}*")}  # fmt: skip


def test_a_finished_run_leaves_no_trash(tiny_model, tmp_path):
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, *args(tiny_model, run_dir, 3, 0.0)], cwd=PROJECT_ROOT,
                          env=env_for(tmp_path), capture_output=True, text=True, timeout=600)  # fmt: skip
    print(f"\n[measure] finished run, keep_last=1, 3 saves: trash left {trash(run_dir)}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert [s for s, _ in layout.list_checkpoints(run_dir)] == [3]
    assert trash(run_dir) == {}


def test_a_preempted_run_leaves_no_trash(tiny_model, tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "train.log"
    proc = start([sys.executable, *args(tiny_model, run_dir, 20, 1.0)], env_for(tmp_path), log)
    code, _ = signal_after_step(proc, run_dir, log, 2, signal.SIGTERM, group=False)
    stopped = progress_step(run_dir)
    print(f"\n[measure] SIGTERM after step 2, keep_last=1: trash left {trash(run_dir)}")
    assert code == 128 + signal.SIGTERM, log.read_text()[-3000:]
    assert [s for s, _ in layout.list_checkpoints(run_dir)] == [stopped] and stopped < 20
    assert trash(run_dir) == {}


def test_trash_a_killed_run_left_is_deleted_at_the_next_start(tiny_model, tmp_path):
    """SIGKILL while a pruned step waits for its deletion (which never starts before the kill); the next run
    (resumed, no step left to train, so no save that would clean it) deletes it as it starts."""
    run_dir, log, env = tmp_path / "run", tmp_path / "train.log", env_for(tmp_path)
    env["SLOW_TRASH_S"] = "3600"
    proc = start([sys.executable, *args(tiny_model, run_dir, 20, 1.0)], env, log)
    deadline = time.time() + 600
    while not trash(run_dir):
        if proc.poll() is not None or time.time() > deadline:
            pytest.fail(f"no step pruned: {log.read_text()[-3000:]}")
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    left = trash(run_dir)
    assert left, "the kill came after the deletion"
    newest = layout.step_of(layout.latest_checkpoint(run_dir))
    again = subprocess.run([sys.executable, *args(tiny_model, run_dir, newest, 0.0, "resume=true")],
                           cwd=PROJECT_ROOT, env=env_for(tmp_path), capture_output=True, text=True,
                           timeout=600)  # fmt: skip
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"resuming from {layout.step_dir(run_dir, newest)}" in again.stdout
    assert trash(run_dir) == {}, f"left by the kill: {left}"
