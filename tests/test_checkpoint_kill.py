"""Checkpoints under kill -9 (issue 19 item 4): a real subprocess saving a real checkpoint (tiny model,
real tokenizer) is SIGKILLed at each point of the save (tests/ckpt_kill_worker.py pauses there); then the
run must fall back to its newest complete step everywhere (`latest_checkpoint`, the training loop's resume,
`--ckpt latest|RUN_ID|RUN_DIR`), list no gutted step, and the next save must clean what the kill left."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from evals.common.checkpoints import all_checkpoints_of_run, resolve
from infra.checkpoint import layout as layout
from infra.tracking import RUN_DIR_TAG, Tracker, mlflow_client
from train import checkpoint as ckpt
from train.loop import TrainingLoop

PROJECT_ROOT = Path(__file__).resolve().parents[1]
WORKER = PROJECT_ROOT / "tests" / "ckpt_kill_worker.py"


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory) -> Path:
    """A new SQLite MLflow store with its schema (made once: creating one takes seconds)."""
    path = tmp_path_factory.mktemp("store") / "mlflow.db"
    old = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{path}"
    try:
        mlflow_client().search_experiments()
    finally:
        if old is None:
            os.environ.pop("MLFLOW_TRACKING_URI")
        else:
            os.environ["MLFLOW_TRACKING_URI"] = old
    return path


@pytest.fixture()
def store(empty_store, tmp_path, monkeypatch) -> str:
    path = tmp_path / "mlflow.db"
    shutil.copy(empty_store, path)
    uri = f"sqlite:///{path}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def kill_at(point: str, model: Path, run_dir: Path, step: int, keep_last: int | None = None) -> dict:
    """Start the worker saving `step`, wait until it pauses at `point`, SIGKILL it; the pause report."""
    pause = run_dir.parent / f"pause-{point}-{step}.json"
    log = run_dir.parent / f"worker-{point}-{step}.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(PROJECT_ROOT)}
    argv = [sys.executable, str(WORKER), str(model), str(run_dir), str(step), str(keep_last or "none"), point,
            str(pause)]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    try:
        while not pause.is_file():
            if proc.poll() is not None:
                pytest.fail(f"worker exited ({proc.returncode}) before {point!r}: {log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"worker never reached {point!r}: {log.read_text()[-3000:]}")
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return json.loads(pause.read_text())


def tracked_run(run_dir: Path, saved: dict[int, Path]) -> str:
    """An MLflow run that recorded these checkpoints, as the training loop does after each save returns."""
    t = Tracker()
    run_id = t.start("kill", run_dir.name, tags={RUN_DIR_TAG: str(run_dir.resolve())})
    for step, path in sorted(saved.items()):
        t.record_checkpoint(step, path.resolve())
    return run_id


def resume(run_dir: Path):
    """What the training loop does with resume=true: (start step, trainer state, checkpoint)."""
    fake = SimpleNamespace(cfg=SimpleNamespace(resume=True), run_dir=run_dir, print=lambda msg: None)
    return TrainingLoop._resume_state(fake)


def loadable(step_folder: Path) -> bool:
    """Independently of train/checkpoint.py: the trainer state and the HF weights and config load."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig

    try:
        torch.load(step_folder / layout.TRAINER_STATE, map_location="cpu", weights_only=False)
        load_file(layout.hf_dir(step_folder) / "model.safetensors")
        AutoConfig.from_pretrained(layout.hf_dir(step_folder))
        return True
    except Exception:  # noqa: BLE001
        return False


def hidden(run_dir: Path) -> list[str]:
    return sorted(p.name for p in layout.checkpoints_root(run_dir).iterdir() if p.name.startswith("."))


def assert_falls_back(run_dir: Path, run_id: str, want: int, want_tracked: int | None = None) -> None:
    """Every reader lands on step `want` (the MLflow readers on `want_tracked`: the newest step the run
    recorded), and every listed checkpoint loads."""
    want_tracked = want if want_tracked is None else want_tracked
    listed = layout.list_checkpoints(run_dir)
    assert all(loadable(p) for _, p in listed), f"a listed checkpoint does not load: {listed}"
    assert layout.latest_checkpoint(run_dir) == layout.step_dir(run_dir, want)
    start, state, path = resume(run_dir)
    assert (start, state["step"], path) == (want, want, layout.step_dir(run_dir, want))
    assert [r.step for r in resolve(str(run_dir))] == [want]
    for spec in ("latest", run_id):
        refs = resolve(spec)
        assert [(r.step, r.path) for r in refs] == [
            (want_tracked, layout.hf_dir(layout.step_dir(run_dir, want_tracked)).resolve())
        ], spec
    run = mlflow_client().get_run(run_id)
    assert all(loadable(r.path.parent) for r in all_checkpoints_of_run(run))


def assert_next_save_cleans(run_dir: Path, make_checkpoint, step: int) -> None:
    path = make_checkpoint(run_dir, step)
    assert hidden(run_dir) == [], "the next save left stale temporary/trash folders"
    assert layout.latest_checkpoint(run_dir) == path and loadable(path)
    assert resume(run_dir)[0] == step


def test_kill_mid_write(tiny_model, make_checkpoint, store, tmp_path):
    run = tmp_path / "run"
    saved = {s: make_checkpoint(run, s) for s in (1, 2)}
    run_id = tracked_run(run, saved)
    kill_at("write", tiny_model, run, 3)
    assert [n for n in hidden(run) if n.startswith(".tmp-step_000003")], "the kill was not mid-write"
    assert_falls_back(run, run_id, want=2)
    assert_next_save_cleans(run, make_checkpoint, 3)


@pytest.mark.parametrize("step, want", [(3, 2), (2, 1)], ids=["new-step", "replacing-a-step"])
def test_kill_before_rename_after_fsync(tiny_model, make_checkpoint, store, tmp_path, step, want):
    """Saving a new step, or saving step 2 again (a resumed run): killed just before the temporary folder
    becomes the step. Replacing, the old copy is already out of sight: the run falls back to step 1."""
    run = tmp_path / "run"
    saved = {s: make_checkpoint(run, s) for s in (1, 2)}
    run_id = tracked_run(run, saved)
    info = kill_at("rename", tiny_model, run, step)
    tmp = Path(info["src"])
    needed = {str(p) for p in tmp.rglob("*")} | {str(tmp)}
    missing = sorted(needed - set(info["fsynced"]))
    assert not missing, f"not fsynced before the rename: {missing}"
    assert_falls_back(run, run_id, want=want)
    assert_next_save_cleans(run, make_checkpoint, 3)


def test_kill_while_removing_the_step_being_replaced(tiny_model, make_checkpoint, store, tmp_path):
    """A resumed run saves a step again: the old copy is removed while it is replaced."""
    run = tmp_path / "run"
    saved = {s: make_checkpoint(run, s) for s in (1, 2)}
    run_id = tracked_run(run, saved)
    kill_at("remove", tiny_model, run, 2)
    assert_falls_back(run, run_id, want=2)  # the new copy was complete before the old one was removed
    assert_next_save_cleans(run, make_checkpoint, 3)


def test_kill_while_pruning(tiny_model, make_checkpoint, store, tmp_path):
    run = tmp_path / "run"
    saved = {s: make_checkpoint(run, s) for s in (1, 2)}
    run_id = tracked_run(run, saved)
    kill_at("remove", tiny_model, run, 3, keep_last=2)  # pruning step 1
    assert [s for s, _ in layout.list_checkpoints(run)] == [2, 3]
    assert_falls_back(run, run_id, want=3, want_tracked=2)  # the killed save never returned: 3 not recorded
    assert_next_save_cleans(run, make_checkpoint, 4)


# ---- in-process: the one completeness check, and resume past an unreadable trainer state ----------------


def test_completeness_is_every_file_of_the_manifest(make_checkpoint, tmp_path):
    step = make_checkpoint(tmp_path / "run", 1)
    files = layout.read_meta(step)[layout.MANIFEST]
    on_disk = {p.relative_to(step).as_posix() for p in step.rglob("*") if p.is_file()} - {layout.META}
    assert set(files) == on_disk and layout.TRAINER_STATE in files
    assert layout.is_complete(step)
    for rel in files:  # any one file missing, or emptied (a power loss before writeback), is incomplete
        data = (step / rel).read_bytes()
        (step / rel).unlink()
        assert not layout.is_complete(step), rel
        (step / rel).write_bytes(b"")
        assert not layout.is_complete(step) or files[rel] == 0, rel
        (step / rel).write_bytes(data)
    assert layout.is_complete(step)
    (step / layout.META).write_text('{"step": 1, "fil')  # a torn meta.json
    assert not layout.is_complete(step)


def test_a_step_of_the_older_writer_needs_its_weights_config_and_trainer_state(make_checkpoint, tmp_path):
    step = make_checkpoint(tmp_path / "run", 1)
    meta = layout.read_meta(step)
    del meta[layout.MANIFEST]
    (step / layout.META).write_text(json.dumps(meta))
    assert layout.is_complete(step)
    (step / layout.TRAINER_STATE).unlink()  # what a kill inside shutil.rmtree left (meta.json and hf/)
    assert not layout.is_complete(step)
    assert layout.list_checkpoints(tmp_path / "run") == []


def test_any_layout_plugs_into_the_manifest(tmp_path):
    """A sharded (DCP-like) step: whatever files the temporary folder holds at commit are the step."""
    run = tmp_path / "run"
    tmp = layout.checkpoints_root(run) / f"{layout.TMP}{layout.step_name(4)}-x"
    (tmp / "shards").mkdir(parents=True)
    for name, data in {"shards/__0_0.distcp": b"a" * 10, "shards/.metadata": b"m", "empty": b""}.items():
        (tmp / name).write_bytes(data)
    ckpt.commit(tmp, layout.step_dir(run, 4), {"step": 4})
    step = layout.step_dir(run, 4)
    assert layout.read_meta(step)[layout.MANIFEST] == {
        "empty": 0,
        "shards/.metadata": 1,
        "shards/__0_0.distcp": 10,
    }
    assert layout.is_complete(step) and not tmp.exists()
    (step / "shards" / "__0_0.distcp").unlink()
    assert not layout.is_complete(step)


def test_resume_skips_an_unreadable_trainer_state(make_checkpoint, tmp_path):
    run = tmp_path / "run"
    for s in (1, 2, 3):
        make_checkpoint(run, s)
    state = layout.step_dir(run, 3) / layout.TRAINER_STATE
    state.write_bytes(b"\0" * state.stat().st_size)  # complete by its manifest, but garbage
    warned = []
    path, loaded = ckpt.resume_point(run, warn=warned.append)
    assert (path, loaded["step"]) == (layout.step_dir(run, 2), 2)
    assert len(warned) == 1 and "step_000003" in warned[0]
    for s in (1, 2):
        (layout.step_dir(run, s) / layout.TRAINER_STATE).write_bytes(b"x")
    with pytest.raises(ckpt.CheckpointError, match="no checkpoint of .* can be resumed from"):
        ckpt.resume_point(run, warn=warned.append)
    assert ckpt.resume_point(tmp_path / "empty") is None


# ---- a file cut short or overwritten after the save: the step is damaged, every reader falls back -------


def test_a_shard_cut_short_is_damaged_and_every_reader_falls_back_naming_it(make_checkpoint, store, tmp_path,
                                                                               capsys):  # fmt: skip
    """A full disk or a node lost mid-write on a file system without our guarantees: the newest step's
    optimizer shard is shorter than meta.json records. Resume, the run folder, `--ckpt latest` and the
    run id all land on the step before, each with one line naming the damaged step and file."""
    run = tmp_path / "run"
    saved = {s: make_checkpoint(run, s) for s in (1, 2)}
    run_id = tracked_run(run, saved)
    shard = max((saved[2] / layout.STATE).glob("*.distcp"), key=lambda p: p.stat().st_size)
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(size - 4096)
    rel = shard.relative_to(saved[2]).as_posix()
    assert layout.damage(saved[2]) == f"{rel} is {size - 4096:,} bytes, meta.json records {size:,}"
    warned = []
    assert layout.latest_checkpoint(run, warn=warned.append) == saved[1]
    assert warned == [
        f"checkpoint {saved[2]} is damaged ({layout.damage(saved[2])}); using step_000001 instead"
    ]
    path, state = ckpt.resume_point(run, warn=warned.append)
    assert (path, state["step"]) == (saved[1], 1) and len(warned) == 2
    capsys.readouterr()
    for spec in (str(run), "latest", run_id):
        refs = resolve(spec)
        assert [(r.step, r.path) for r in refs] == [(1, layout.hf_dir(saved[1]).resolve())], spec
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "step_000002 " in err[0] and rel in err[0] and "damaged" in err[0], (
            spec,
            err,
        )
    with pytest.raises(Exception, match="damaged"):  # named explicitly: refused in one line, not loaded
        resolve(str(saved[2]))


def test_a_tail_overwritten_with_zeros_is_caught_by_the_checksum(make_checkpoint, tmp_path):
    """Same size as recorded (a crash that left a preallocated, zero-filled tail): the CRC-32 of the
    file's ends differs from the one meta.json recorded."""
    step = make_checkpoint(tmp_path / "run", 1)
    weights = layout.hf_dir(step) / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as f:
        f.seek(size - 1000)
        f.write(b"\0" * 1000)
    assert weights.stat().st_size == size
    assert "hf/model.safetensors has other bytes" in layout.damage(step)
    assert layout.latest_checkpoint(tmp_path / "run") is None
    with pytest.raises(ckpt.CheckpointError, match="no checkpoint of .* can be resumed from: step_000001"):
        ckpt.resume_point(tmp_path / "run")
