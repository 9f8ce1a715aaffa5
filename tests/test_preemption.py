"""Preemption through real processes and real signals (train/preemption.py): SIGTERM to a training run,
SIGUSR2 to every process of a two-rank torchrun job (what Slurm does), and a checkpoint save on a full
disk (a real 3 MiB tmpfs). Each run checkpoints where it stopped, marks its MLflow run, exits in bounded
time with one line, and resumes in the same MLflow run with every step logged once. The Slurm round
trip (USR2 and `scontrol requeue` of sweep jobs) is tests/test_slurm_sweep.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.checkpoint import layout as ckpt
from infra.models import PROJECT_ROOT

pytestmark = pytest.mark.slow


def overrides(model: Path, run_dir: Path, steps: int, save_every: int, delay: float) -> list[str]:
    return [
        f"model.path={model}", f"run_dir={run_dir}", "run_name=preempt", f"total_steps={steps}",
        f"save_every={save_every}", "keep_last=null", "rollout.engine._target_=train.rollout.hf_engine.HFEngine",
        "reward._target_=tests.test_sweep.SlowVowelReward", f"reward.delay_s={delay}",
        "data.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=6", "data.builtin_size=16",
        "policy.precision=fp32",
    ]  # fmt: skip


def env_for(tmp_path: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "OMP_NUM_THREADS": "1",
            "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}  # fmt: skip


def progress_step(run_dir: Path) -> int:
    try:
        return int(json.loads((run_dir / "progress.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def start(cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:  # its own session: the test signals it (or its whole group) alone
        return subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip


def signal_after_step(proc: subprocess.Popen, run_dir: Path, log: Path, step: int, sig: int, group: bool):
    """Wait for `step` to be logged, send `sig` (to the process group when `group`, as Slurm signals every
    process of a job); returns (exit code, seconds from the signal to the exit)."""
    deadline = time.time() + 600
    while progress_step(run_dir) < step:
        if proc.poll() is not None or time.time() > deadline:
            pytest.fail(f"run ended or stalled before step {step}: {log.read_text()[-3000:]}")
        time.sleep(0.2)
    sent = time.time()
    if group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    try:
        code = proc.wait(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"still running 240 s after {signal.Signals(sig).name}: {log.read_text()[-3000:]}")
    return code, time.time() - sent


def train_then_signal(
    tmp_path: Path,
    model: Path,
    steps: int,
    save_every: int,
    delay: float,
    *extra: str,
    after: int,
    sig: int,
    group: bool,
) -> tuple[int, float, str, int]:
    """A training run in tmp_path/run (its log tmp_path/train.log) sent `sig` once step `after` is logged:
    (exit code, seconds from the signal to the exit, the log, the last step logged)."""
    run_dir, log = tmp_path / "run", tmp_path / "train.log"
    cmd = [sys.executable, "-m", "train", *overrides(model, run_dir, steps, save_every, delay), *extra]
    code, secs = signal_after_step(start(cmd, env_for(tmp_path), log), run_dir, log, after, sig, group)
    return code, secs, log.read_text(), progress_step(run_dir)


def run_of(tmp_path: Path, run_dir: Path):
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    return client, client.get_run((run_dir / "mlflow_run_id").read_text().strip())


def test_sigterm_checkpoints_marks_killed_and_resumes_past_a_damaged_step(tiny_model, tmp_path):
    """SIGTERM (Slurm's preemption, scancel, time limit) after step >= 4 of 8, saves every 3 steps:
    before, the process died of the signal with nothing saved past step 4 and the run RUNNING forever."""
    run_dir, env = tmp_path / "run", env_for(tmp_path)
    code, secs, out, stopped = train_then_signal(tmp_path, tiny_model, 8, 3, 1.0, after=4, sig=signal.SIGTERM,
                                                 group=False)  # fmt: skip
    print(f"\n[measure] SIGTERM after step 4: exit {code} {secs:.1f} s after the signal, stopped after step "
          f"{stopped}, checkpoints {[s for s, _ in ckpt.list_checkpoints(run_dir)]}")  # fmt: skip
    assert code == 128 + signal.SIGTERM, out[-3000:]
    assert "SIGTERM received: finishing step" in out and "Traceback" not in out, out[-3000:]
    assert f"SIGTERM: stopped after step {stopped}, checkpoint" in out
    assert 4 <= stopped < 8 and ckpt.latest_checkpoint(run_dir) == ckpt.step_dir(run_dir, stopped)
    client, run = run_of(tmp_path, run_dir)
    assert run.info.status == "KILLED" and "preempted" in run.data.tags["rlpost.status_note"]

    # the newest step's optimizer shard cut short (a full disk, a lost node): resume takes step 3 instead
    shard = max(
        (ckpt.step_dir(run_dir, stopped) / ckpt.STATE).glob("*.distcp"), key=lambda p: p.stat().st_size
    )
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    again = [sys.executable, "-m", "train", *overrides(tiny_model, run_dir, 8, 3, 0.0), "resume=true"]
    resumed = subprocess.run(again, cwd=PROJECT_ROOT, env=env,
                             capture_output=True, text=True, timeout=900)  # fmt: skip
    text = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, text[-3000:]
    damaged = [ln for ln in text.splitlines() if "is damaged" in ln]
    assert len(damaged) == 1 and f"step_{stopped:06d} is damaged (state/{shard.name} is" in damaged[0], text[
        -3000:
    ]
    assert "using step_000003 instead" in damaged[0] and "resuming from" in text
    run = client.get_run(run.info.run_id)
    assert run.info.status == "FINISHED"
    steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/reward_mean"))
    assert steps == list(range(1, 9)), steps  # the same MLflow run: no step lost, none twice


def test_a_step_longer_than_the_grace_is_abandoned(tiny_model, tmp_path):
    """preempt_grace_s=1, a step needing ~6 s: the step is abandoned (no half-updated state is saved), the
    checkpoint of step 1 stays the newest, and the process exits without waiting for the step."""
    run_dir, log, env = tmp_path / "run", tmp_path / "train.log", env_for(tmp_path)
    cmd = [sys.executable, "-m", "train", *overrides(tiny_model, run_dir, 4, 1, 6.0), "preempt_grace_s=1"]
    proc = start(cmd, env, log)
    deadline = time.time() + 600
    while f"checkpoint {ckpt.step_dir(run_dir, 1)}" not in log.read_text():  # the save of step 1 ended
        if proc.poll() is not None or time.time() > deadline:
            pytest.fail(f"no checkpoint 1: {log.read_text()[-3000:]}")
        time.sleep(0.2)
    time.sleep(0.5)  # into step 2 (a signal during the save would stop after it, step 2 never started)
    code, secs = signal_after_step(proc, run_dir, log, 1, signal.SIGTERM, group=False)
    out = log.read_text()
    print(
        f"\n[measure] SIGTERM during a 6 s step, preempt_grace_s=1: exit {code} {secs:.1f} s after the signal"
    )
    assert code == 128 + signal.SIGTERM and "Traceback" not in out, out[-3000:]
    assert "SIGTERM: the step after 1 abandoned, no checkpoint written on the way out" in out, out[-3000:]
    assert progress_step(run_dir) == 1 and [s for s, _ in ckpt.list_checkpoints(run_dir)] == [1]
    _, run = run_of(tmp_path, run_dir)
    assert run.info.status == "KILLED"


@pytest.mark.heavy  # make test-all: a long integration run (docs/commands.md, Tests)
def test_usr2_to_every_process_of_a_two_rank_job_is_handled_once_by_the_launcher(tiny_model, tmp_path):
    """submitit's USR2 reaches every process of the job (torchrun and its ranks too). Before: torchrun and
    the ranks died of it, no checkpoint. Now the launcher handles it once; both ranks stop after the same
    step and write one checkpoint together (world_size 2 in its meta.json)."""
    run_dir = tmp_path / "run"
    code, secs, out, stopped = train_then_signal(tmp_path, tiny_model, 20, 0, 0.5, "world_size=2", after=2,
                                                 sig=signal.SIGUSR2, group=True)  # fmt: skip
    print(f"\n[measure] USR2 to the 2-rank job's process group after step 2: exit {code} {secs:.1f} s after "
          f"the signal, stopped after step {stopped}")  # fmt: skip
    assert code == 128 + signal.SIGUSR2, out[-4000:]
    assert out.count("SIGUSR2 received by the launcher") == 1, out[-4000:]
    assert "SIGUSR2 received: finishing step" not in out  # no rank handled it itself
    assert f"SIGUSR2: stopped after step {stopped}, checkpoint" in out and "Traceback" not in out, out[-4000:]
    step = ckpt.latest_checkpoint(run_dir)
    assert step == ckpt.step_dir(run_dir, stopped) and ckpt.read_meta(step)["world_size"] == 2
    assert {p.name for p in (step / ckpt.STATE).glob("*.distcp")} == {"__0_0.distcp", "__1_0.distcp"}
    _, run = run_of(tmp_path, run_dir)
    assert run.info.status == "KILLED"


@pytest.fixture()
def tiny_disk(tmp_path):
    """A real 3 MiB tmpfs (smaller than one checkpoint of the tiny model); needs root to mount."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode()[-200:]}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_save_on_a_full_disk_removes_its_temporary_folder_and_says_what_ran_out(tiny_model, tmp_path,
                                                                                     tiny_disk):  # fmt: skip
    """Before: a 22-line traceback and the half-written .tmp-step folder left on the full disk. Now the
    periodic saves are one warning line each (training goes on), the final one a one-line error."""
    run_dir, env = tiny_disk / "run", env_for(tmp_path)
    cmd = [sys.executable, "-m", "train", *overrides(tiny_model, run_dir, 3, 1, 0.0)]
    done = subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=600)
    said = [
        ln for ln in done.stderr.splitlines() if ln.startswith(("error", "warning", "Traceback", "  File"))
    ]
    print(f"\n[measure] full disk: exit {done.returncode}; stderr's error lines: {said}")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert len(said) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]  # one line, no traceback
    assert said[0].startswith("error: checkpoint step 3 not saved: no space left on device")
    done.stderr = said[0]
    assert "its temporary folder was removed" in done.stderr and "MiB written before it failed" in done.stderr
    warnings = [ln for ln in done.stdout.splitlines() if "not saved: no space left on device" in ln]
    assert [w.split("checkpoint step ")[1][:1] for w in warnings] == ["1", "2"], done.stdout[-3000:]
    assert "[train] step 3/3" in done.stdout  # training went on past the failed saves
    assert [p.name for p in ckpt.checkpoints_root(run_dir).iterdir() if p.name.startswith(".tmp-")] == []
    _, run = run_of(tmp_path, run_dir)
    assert run.info.status == "FAILED" and "no space left on device" in run.data.tags["rlpost.error"]
