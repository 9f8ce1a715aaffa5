"""Sweeps: grid expansion, bad input, a real 2-point sweep through submitit's local executor, a
SIGKILLed job seen as dead and resumed in its MLflow run, and a failed job marked FAILED in MLflow."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.models import PROJECT_ROOT
from orchestration.sweep import expand_grid, point_slug
from train.config import ConfigError
from train.rewards.base import RewardResult


class SlowVowelReward:
    """The vowel-share test reward, `delay_s` slower per batch: gives fault tests time to strike mid-run."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s

    def __call__(self, rows, responses, group_index):
        time.sleep(self.delay_s)
        scores = [sum(c in "aeiou" for c in r.lower()) / max(len(r), 1) for r in responses]
        return RewardResult(scores=scores, correct=[float(s > 0.2) for s in scores])


EXPERIMENT = """
config:
  experiment: {name}
  total_steps: {steps}
  save_every: {save_every}
  keep_last: null
  model: {{path: {model}}}
  data: {{prompts_per_step: 2, builtin_size: 16}}
  rollout:
    n: 2
    max_new_tokens: 6
    engine: {{_target_: train.rollout.hf_engine.HFEngine}}
  reward: {{_target_: tests.test_sweep.SlowVowelReward, delay_s: {delay}}}
sweep:
  grid:
    seed: [1, 2]
  max_parallel: {max_parallel}
"""


def sweep_env(tmp_path: Path, model: Path, name: str = "tinysweep", steps: int = 2, save_every: int = 0,
              delay: float = 0.0, max_parallel: int = 1) -> dict:  # fmt: skip
    """An experiments dir with one tiny experiment, outputs and a SQLite MLflow store, all in tmp_path."""
    (tmp_path / "exps").mkdir(exist_ok=True)
    text = EXPERIMENT.format(name=name, steps=steps, save_every=save_every, model=model, delay=delay,
                             max_parallel=max_parallel)  # fmt: skip
    (tmp_path / "exps" / f"{name}.yaml").write_text(text)
    return {
        **os.environ, "PYTHONPATH": str(PROJECT_ROOT), "RLPOST_EXPERIMENTS_DIR": str(tmp_path / "exps"),
        "RLPOST_OUTPUTS": str(tmp_path / "out"), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
    }  # fmt: skip


def sweep_cli(env: dict, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestration.sweep", *args], env=env, cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def sweep_info(env: dict, name: str = "tinysweep") -> dict:
    return json.loads(next((Path(env["RLPOST_OUTPUTS"]) / name / "sweeps").glob("*/sweep.json")).read_text())


def status_of(run_dir: str) -> dict:
    try:
        return json.loads((Path(run_dir) / "status.json").read_text())
    except (OSError, ValueError):
        return {"state": "unknown"}


def wait_for(what: str, predicate, timeout: float = 300, poll: float = 0.5):
    end = time.time() + timeout
    while time.time() < end:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def has_checkpoint(run_dir: str, step: int) -> bool:
    return (Path(run_dir) / "checkpoints" / f"step_{step:06d}" / "meta.json").is_file()


def children_of(env: dict, parent_run_id: str) -> list:
    import mlflow

    client = mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"])
    parent = client.get_run(parent_run_id)
    return client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_run_id}'")


def metric_steps(env: dict, run_id: str, key: str = "train/reward_mean") -> list[int]:
    import mlflow

    history = mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"]).get_metric_history(run_id, key)
    return sorted(m.step for m in history)


def steps_trained(run_dir: str, logs: str) -> int:
    """How many `[train] step` lines all attempts of this point printed (recomputed steps included)."""
    job_logs = list(Path(logs).glob("*_log.out"))
    return sum(p.read_text().count("[train] step ") for p in job_logs if run_dir in p.read_text())


def test_expand_grid_is_the_cartesian_product_in_file_order():
    points = expand_grid({"seed": [1, 2], "optim.lr": [1e-6, 1e-5]})
    assert points == [
        {"seed": 1, "optim.lr": 1e-6}, {"seed": 1, "optim.lr": 1e-5},
        {"seed": 2, "optim.lr": 1e-6}, {"seed": 2, "optim.lr": 1e-5},
    ]  # fmt: skip
    assert expand_grid({}) == [{}]
    assert point_slug({"seed": 2, "optim.lr": 1e-5}) == "seed2_lr1e-05"
    with pytest.raises(ConfigError, match="sweep.grid.seed"):
        expand_grid({"seed": []})


def test_grid_overrides_replace_or_add_grid_keys():
    from orchestration.sweep import parse_grid_overrides, plan

    assert parse_grid_overrides(["seed=1,2", "optim.lr=1e-6"]) == {"seed": [1, 2], "optim.lr": [1e-6]}
    assert parse_grid_overrides(["reward.combine=quality"]) == {"reward.combine": ["quality"]}
    with pytest.raises(ConfigError, match="bad grid override 'seed'"):
        parse_grid_overrides(["seed"])
    _, points = plan("darling_math", [], {"seed": [3]})  # the file's grid: combine x seed [1, 2]
    assert [p for p, _ in points] == [{"reward.combine": "multiplicative", "seed": 3},
                                      {"reward.combine": "quality", "seed": 3}]  # fmt: skip
    assert [cfg.seed for _, cfg in points] == [3, 3]


@pytest.mark.slow
def test_two_point_sweep_runs_through_submitit_and_mlflow(tiny_model, tmp_path):
    import mlflow

    env = sweep_env(tmp_path, tiny_model)
    run = sweep_cli(env, "tinysweep", "--wait", "--poll", "2")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "2 job(s) via local" in run.stdout
    info = sweep_info(env)
    client = mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"])
    parent = client.get_run(info["mlflow_parent_run"])
    assert parent.data.tags["rlpost.kind"] == "sweep" and "rlpost.git_commit" in parent.data.tags
    assert parent.info.status == "FINISHED"  # --wait closes the sweep's run when every point is done
    children = children_of(env, parent.info.run_id)
    assert sorted(json.loads(c.data.tags["rlpost.grid_point"])["seed"] for c in children) == [1, 2]
    job_ids = {j["job_id"] for j in info["jobs"]}
    for child in children:
        assert child.info.status == "FINISHED"
        assert child.data.tags["rlpost.job_id"] in job_ids and child.data.tags["rlpost.scheduler"] == "local"
        assert metric_steps(env, child.info.run_id) == [1, 2]
    status = sweep_cli(env, "tinysweep", "--status", timeout=120)
    assert status.stdout.count(" done ") == 2, status.stdout
    # --wait's live table ends with both points done at step 2/2, one row each
    final_table = run.stdout[run.stdout.rindex("done=2") :]
    assert final_table.count(" done ") == 2 and final_table.count(" 2/2 ") == 2, run.stdout[-2000:]


def test_job_table_shows_each_points_state_step_and_last_metrics(tmp_path):
    from orchestration.sweep import job_table
    from train.progress import write_progress

    rows = []
    for k, state in enumerate(["running", "submitted"]):
        (tmp_path / str(k)).mkdir()
        rows.append(
            {"job_id": str(100 + k), "state": state, "run_dir": str(tmp_path / str(k)), "point": {"seed": k}}
        )
    write_progress(tmp_path / "0", 3, 8, {"train/accuracy": 0.25, "train/reward_mean": 0.5, "timing/step_s": 41.0,
                                          "actor/grad_norm": 1.0})  # fmt: skip
    lines = job_table(rows).splitlines()
    assert len(lines) == 3 and lines[0].split()[:3] == ["job", "state", "step"]
    assert lines[1].split() == ["100", "running", "3/8", "0.250", "0.500", "41.0", '{"seed":', "0}"]
    assert lines[2].split()[:6] == ["101", "submitted", "-", "-", "-", "-"]  # not started: no progress yet


@pytest.mark.slow
@pytest.mark.heavy  # make test-all: a long integration run (docs/commands.md, Tests)
def test_sigkilled_local_job_is_dead_then_resumes_in_its_mlflow_run(tiny_model, tmp_path):
    """SIGKILL leaves status.json at `running`: --status must say dead (controller pid gone), MLflow
    marks it KILLED, and --resume continues from the checkpoint in the same run, no step twice or lost."""
    env = sweep_env(tmp_path, tiny_model, steps=5, save_every=2, delay=1.0)
    (tmp_path / "exps" / "tinysweep.yaml").write_text(
        (tmp_path / "exps" / "tinysweep.yaml").read_text().replace("seed: [1, 2]", "seed: [1]")
    )
    run = sweep_cli(env, "tinysweep", timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    info = sweep_info(env)
    job = info["jobs"][0]
    wait_for("checkpoint 2", lambda: has_checkpoint(job["run_dir"], 2), timeout=300)
    st = status_of(job["run_dir"])
    assert st["state"] == "running" and not has_checkpoint(job["run_dir"], 5)
    os.kill(st["pid"], signal.SIGKILL)
    wait_for(
        "status dead", lambda: " dead " in sweep_cli(env, "tinysweep", "--status", timeout=60).stdout, 60, 1
    )
    assert status_of(job["run_dir"])["state"] == "running"  # the job itself could not say anything
    children = children_of(env, info["mlflow_parent_run"])
    assert [c.info.status for c in children] == ["KILLED"]
    resumed = sweep_cli(env, "tinysweep", "--resume", timeout=120)
    assert resumed.returncode == 0 and "resubmitted 1 point(s)" in resumed.stdout, (
        resumed.stdout + resumed.stderr
    )
    wait_for("resumed job done", lambda: status_of(job["run_dir"])["state"] == "done", timeout=400, poll=1)
    children = children_of(env, info["mlflow_parent_run"])
    assert len(children) == 1 and children[0].info.status == "FINISHED"  # the same MLflow run
    assert metric_steps(env, children[0].info.run_id) == [1, 2, 3, 4, 5]  # none lost, none twice
    new_info = sweep_info(env)
    assert new_info["jobs"][0]["past_job_ids"] == [job["job_id"]]
    assert children[0].data.tags["rlpost.job_id"] == new_info["jobs"][0]["job_id"]
    again = sweep_cli(env, "tinysweep", "--resume", timeout=60)
    assert "nothing to resume" in again.stdout


@pytest.mark.slow
def test_failed_job_is_failed_in_mlflow_with_its_error(tiny_model, tmp_path):
    """The model path is checked in the job (a cluster path need not exist where the sweep is launched):
    the job fails before the trainer makes its MLflow run; the sweep still records a FAILED child run."""
    env = sweep_env(tmp_path, tiny_model)
    run = sweep_cli(env, "tinysweep", "model.path=/nonexistent/model", "--wait", "--poll", "1")
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    info = sweep_info(env)
    children = children_of(env, info["mlflow_parent_run"])
    assert len(children) == 2
    for child in children:
        assert child.info.status == "FAILED"
        assert "/nonexistent/model" in child.data.tags["rlpost.error"]
    status = sweep_cli(env, "tinysweep", "--status", timeout=60)
    assert status.stdout.count(" failed ") == 2 and "/nonexistent/model" in status.stdout
    assert "make sweep-resume EXP=tinysweep" in status.stdout


def test_an_override_of_a_grid_key_is_refused_in_one_line():
    """`make sweep EXP=darling_math OVERRIDES="seed=2"` ran the grid's seeds 1 and 2, with no word."""
    from orchestration.sweep import plan

    with pytest.raises(ConfigError) as caught:
        plan("darling_math", ["seed=2"])
    assert str(caught.value) == (
        "seed=2: seed is also a grid key of darling_math (sweep.grid.seed: [1, 2]), whose values would replace "
        'it; to run only that value give it as GRID="seed=2" (--grid seed=2), not as an override'
    )
    with pytest.raises(ConfigError, match=r"^\+\+reward.combine=quality: reward.combine is also a grid key"):
        plan("darling_math", ["++reward.combine=quality"])
    with pytest.raises(
        ConfigError, match=r"^optim.lr=1e-6: optim.lr is also a --grid key \(sweep.grid.optim.lr: \[1e-05\]"
    ):
        plan("darling_math", ["optim.lr=1e-6"], {"optim.lr": [1e-5]})
    assert [p["seed"] for p, _ in plan("darling_math", [], {"seed": [2]})[1]] == [2, 2]  # the way to do it


def test_bad_sweep_input_submits_nothing(tmp_path, monkeypatch, capsys):
    """Each bad input is one `error:` line and exit status 2, nothing submitted. In process (`main(argv)`, what
    `python -m orchestration.sweep` runs after the allocator re-exec; the CLI itself is exercised by the sweeps above):
    an exception that escaped would fail the test instead of printing a traceback."""
    from orchestration.sweep import main as sweep_main

    monkeypatch.setenv("RLPOST_OUTPUTS", str(tmp_path / "out"))
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-slurm.conf"))
    monkeypatch.setenv("RLPOST_SLURM_PROBE_S", "3")  # an unreachable controller: sinfo would retry for 30 s
    for args, fragment in [
        (["nope"], "unknown experiment 'nope'"),
        (["grpo_math", "optim.lr=abc"], "optim.lr"),
        (["grpo_math", "notakeyvalue"], "bad override 'notakeyvalue'"),
        (["grpo_math", "--grid", "seed"], "bad grid override 'seed'"),
        (["grpo_math", "--grid", "optim.lr=abc"], "optim.lr"),
        (
            ["grpo_math", "--grid", "seed=1", "optim.lr=abc"],
            "optim.lr",
        ),  # overrides after --grid (Makefile order)
        (
            ["grpo_math", "--launcher", "slurm", "--cluster", "nocluster"],
            "unknown cluster profile 'nocluster'",
        ),
        (["grpo_math", "--cluster", "local"], "--cluster local needs --launcher slurm"),
        (["darling_math", "seed=2"], "seed=2: seed is also a grid key of darling_math"),
        (["grpo_math", "--launcher", "slurm", "--cluster", "local"], "Slurm is not"),  # SLURM_CONF: nowhere
        (["grpo_math", "--resume"], "no sweep of 'grpo_math' to resume"),
    ]:
        try:
            code = sweep_main(args)
        except SystemExit as exc:  # argparse's own refusals exit 2 with one usage error line
            code = exc.code
        err = capsys.readouterr().err
        assert code == 2 and fragment in err, (args, err[-500:])
        assert len([line for line in err.strip().splitlines() if not line.startswith("usage:")]) == 1, err
    assert not (tmp_path / "out").exists()


SAME_SECOND_DRIVER = """
import sys, time
from pathlib import Path
import orchestration.sweep  # imported before the release: the sweeps then differ only by their own work
go, second = Path(sys.argv[1]), time.localtime(float(sys.argv[2]))
_strftime = time.strftime
time.strftime = lambda fmt, t=None: _strftime(fmt, second if t is None else t)  # one second for all
while not go.exists():
    time.sleep(0.005)
sys.exit(orchestration.sweep.main(sys.argv[3:]))
"""


@pytest.mark.slow
@pytest.mark.heavy  # make test-all: a long integration run (docs/commands.md, Tests)
def test_sweeps_started_in_the_same_second_never_share_a_folder(tmp_path):
    """Three `make sweep` of one experiment released in the same second, each with its own learning
    rate: three sweep ids, each folder holding only its own sweep.json, jobs and frozen point config."""
    from omegaconf import OmegaConf

    from infra.executors import cancel_jobs, pid_alive
    from tests.children import python_child

    env = sweep_env(tmp_path, Path("/nonexistent/model"))  # the jobs fail at once: only folders matter here
    go = tmp_path / "go"
    lrs = ["1e-06", "2e-06", "3e-06"]
    now = str(time.time())  # every sweep's clock reads this second
    procs = [
        python_child(
            ["-c", SAME_SECOND_DRIVER, str(go), now, "tinysweep", "--grid", "seed=1", f"optim.lr={lr}"], env
        )
        for lr in lrs
    ]
    time.sleep(5)  # every driver has imported orchestration.sweep (then they start together)
    go.touch()
    outs = [p.communicate(timeout=300) for p in procs]
    infos = [
        json.loads(p.read_text()) for p in (tmp_path / "out" / "tinysweep" / "sweeps").glob("*/sweep.json")
    ]
    try:
        assert all(p.returncode == 0 for p in procs), [o[1][-800:] for o in outs]
        ids = [o[0].split()[1].rstrip(":") for o in outs]  # "sweep <id>: 1 job(s) via local ..."
        print(f"\n[measure] sweep ids of 3 sweeps started in one second: {ids}")
        assert len(set(ids)) == 3 and len(infos) == 3, f"{len(infos)} sweep folder(s) for 3 sweeps: {ids}"
        by_lr = {}
        for info in infos:
            sweep_dir = Path(info["logs"]).parent
            assert sweep_dir.name == info["sweep_id"]
            (job,) = info["jobs"]
            assert Path(job["run_dir"]).parent.parent == sweep_dir  # its points live in its own folder
            frozen = OmegaConf.load(Path(job["run_dir"]) / "sweep_point.yaml")
            lr = f"{frozen.optim.lr:.0e}"
            by_lr[lr] = info["overrides"]
        assert sorted(by_lr) == lrs and all(by_lr[lr] == [f"optim.lr={lr}"] for lr in lrs), by_lr
        assert len({i["mlflow_parent_run"] for i in infos}) == 3
    finally:
        for info in infos:
            cancel_jobs("local", [j["job_id"] for j in info["jobs"]])
        wait_for("the jobs ended", lambda: not any(pid_alive(int(j["job_id"])) for i in infos for j in i["jobs"]),
                 timeout=120)  # fmt: skip


def test_keys_a_sweep_sets_itself_are_refused_in_one_line(tmp_path):
    """output_dir= (and the other placement keys) would be silently replaced by the sweep's own folders."""
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "RLPOST_OUTPUTS": str(tmp_path / "out"),
           "SLURM_CONF": str(tmp_path / "no-slurm.conf")}  # fmt: skip
    slurm = ["--launcher", "slurm", "--cluster", "local"]  # unreachable: had a key passed, nothing runs
    for args, fragment in [
        (
            ["grpo_math", "output_dir=/elsewhere"],
            "output_dir= is not honoured by a sweep: each point runs in",
        ),
        (["grpo_math", "--grid", "run_dir=/a,/b"], "run_dir= is not honoured by a sweep"),
        (["grpo_math", "resume=false"], "resume= is not honoured by a sweep"),
        (["sft_grpo_math", "grpo.output_dir=/elsewhere"], "grpo.output_dir= is not honoured by a sweep"),
    ]:
        run = sweep_cli(env, *args, *slurm, timeout=120)
        assert run.returncode == 2 and fragment in run.stderr, (args, run.stderr[-500:])
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr
        if "output_dir" in fragment:
            assert "set RLPOST_OUTPUTS=DIR" in run.stderr  # the fix, in the same line
    assert not (tmp_path / "out").exists()
