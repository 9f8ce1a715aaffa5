"""Measure the launcher: jobs submitted per minute, and time from the sweep command to the first job
training, on the real submit path (`orchestration.sweep.submit`). Submits a throw-away grid of N points of a
tiny experiment, waits for the first to train, then cancels every job it submitted.

    python -m bench.submit --launcher slurm --cluster local --points 50
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

EXPERIMENT = """
config:
  experiment: submit_bench
  total_steps: 1
  save_every: 0
  track: false
  model: {{path: {model}}}
  data: {{prompts_per_step: 2, builtin_size: 16}}
  rollout: {{n: 2, max_new_tokens: 4, engine: {{_target_: train.rollout.hf_engine.HFEngine}}}}
sweep:
  grid:
    seed: {seeds}
  max_parallel: 1
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.submit", description=__doc__.splitlines()[0])
    parser.add_argument("--launcher", default="local", choices=["local", "slurm"])
    parser.add_argument("--cluster", default=None)
    parser.add_argument("--points", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for the first job")
    args = parser.parse_args(argv)
    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="submit_bench-"))
    from infra.models import build_tiny_model

    model = build_tiny_model(work / "model")
    (work / "exps").mkdir()
    (work / "exps" / "submit_bench.yaml").write_text(
        EXPERIMENT.format(model=model, seeds=json.dumps(list(range(1, args.points + 1))))
    )
    os.environ.update(RLPOST_EXPERIMENTS_DIR=str(work / "exps"), RLPOST_OUTPUTS=str(work / "out"),
                      MLFLOW_TRACKING_URI=f"sqlite:///{work / 'mlflow.db'}")  # fmt: skip
    import train.config

    train.config.EXPERIMENTS_DIR = work / "exps"
    from infra.executors import cancel_jobs
    from orchestration.job import read_status
    from orchestration.sweep import submit

    t_cmd = time.time()
    info = submit("submit_bench", args.launcher, args.cluster, started=t_cmd)
    try:
        end = time.time() + args.timeout
        first = None
        while first is None and time.time() < end:
            running = [
                s["running_at"]
                for j in info["jobs"]
                if "running_at" in (s := read_status(Path(j["run_dir"])))
            ]
            first = min(running) if running else None
            time.sleep(0.2)
    finally:
        cancel_jobs(info["launcher"], [j["job_id"] for j in info["jobs"]])
    print(f"{args.launcher}{':' + args.cluster if args.cluster else ''}: submitted {args.points} jobs in "
          f"{info['submit_s']:.2f} s = {args.points / max(info['submit_s'], 1e-9) * 60:.0f} jobs/min; "
          f"submit() call to first job training: {'%.1f s' % (first - t_cmd) if first else 'timed out'}; "
          f"setup (tiny model) {t_cmd - started:.1f} s; work dir {work}")  # fmt: skip
    return 0 if first else 1


if __name__ == "__main__":
    raise SystemExit(main())
