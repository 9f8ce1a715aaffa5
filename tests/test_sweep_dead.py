"""A sweep job that dies before it can write a word in status.json (issue 52): a job pickled under a module
path that no longer exists (Slurm requeues the pickle written before an update) ends in ModuleNotFoundError,
in its stderr only. `--status` showed `dead  []`; it must name the cause and the log's path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from infra.executors import make_executor
from infra.models import PROJECT_ROOT
from orchestration.job import read_status, write_status
from orchestration.sweep import _write_sweep_json

GONE = "old_layout_job"  # the module the pickled job names; the job's interpreter cannot import it


def test_a_dead_jobs_status_names_its_cause_and_log(tmp_path):
    """A real submitit local job whose pickle names a module only the submitting process could import."""
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "RLPOST_OUTPUTS": str(tmp_path / "out"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}  # fmt: skip
    sweep_dir = Path(env["RLPOST_OUTPUTS"]) / "deadsweep" / "sweeps" / "deadsweep-1"
    run_dir = sweep_dir / "runs" / "single"
    write_status(run_dir, "submitted")  # what the sweep writes at submission; the job never gets further
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / f"{GONE}.py").write_text("def train_point():\n    return {}\n")
    sys.path.insert(0, str(tmp_path / "old"))
    try:
        module = __import__(GONE)
        job = make_executor("local", sweep_dir / "logs").submit(module.train_point)
    finally:
        sys.path.remove(str(tmp_path / "old"))
        sys.modules.pop(GONE, None)
    job.wait()  # the job's controller process has ended (the job id is its pid)
    assert read_status(run_dir)["state"] == "submitted"
    info = {"sweep_id": "deadsweep-1", "experiment": "deadsweep", "launcher": "local", "cluster": None,
            "mlflow_parent_run": "", "logs": str(sweep_dir / "logs"), "started": 0.0,
            "jobs": [{"point": {}, "run_dir": str(run_dir), "run_name": "deadsweep-single",
                      "job_id": str(job.job_id), "past_job_ids": []}]}  # fmt: skip
    _write_sweep_json(sweep_dir, info)

    out = subprocess.run([sys.executable, "-m", "orchestration.sweep", "deadsweep", "--status"], env=env,
                         cwd=PROJECT_ROOT, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    row = next(i for i, line in enumerate(lines) if f" {job.job_id} " in f" {line} ")
    assert lines[row].split()[1] == "dead" and "[]" not in lines[row], lines[row]
    assert lines[row + 1].strip() == f"| ModuleNotFoundError: No module named '{GONE}'", out.stdout
    assert lines[row + 2].strip() == f"| log {job.paths.stderr}", out.stdout
    assert job.paths.stderr.is_file()


def test_the_cause_is_the_last_error_a_log_shows(tmp_path):
    """Slurm's own word after a traceback wins (it is later); a log without an error gives its last line."""
    from orchestration.job import last_error

    log = tmp_path / "7_0_log.err"
    assert last_error(log) is None  # no log at all: the caller falls back to the scheduler's state
    log.write_text(
        "submitit ERROR (2026) - Submitted job triggered an exception\nTraceback (most recent call last):\n"
        '  File "x/errors.py", line 3, in <module>\n    raise OSError("error in a frame")\n'
        "OSError: [Errno 28] No space left on device\n\n"
    )
    assert last_error(log) == "OSError: [Errno 28] No space left on device"
    with open(log, "a") as f:
        f.write("slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2026-12-06T07:00:00 DUE TO TIME LIMIT ***\n")
    assert last_error(log).endswith("DUE TO TIME LIMIT ***")
    log.write_text("[train] step 3/8 reward 0.4\nloading shards 2/2\n")
    assert last_error(log) == "loading shards 2/2"
