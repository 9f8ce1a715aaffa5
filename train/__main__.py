"""`python -m train [experiment=NAME] [preset=NAME] [key=value ...]` — one training run.

`--help` lists every key with its default. world_size > 1 re-launches itself under torchrun.
"""

from __future__ import annotations

import os
import sys

USAGE = """usage: python -m train [experiment=NAME] [preset=NAME] [key=value ...]

Trains a policy with GRPO (or another estimator) and tracks it in MLflow.
  experiment=NAME   start from experiments/NAME.yaml (its `config:` block)
  preset=NAME       then apply that experiment's `presets.NAME` block (e.g. paper)
  key=value         then override any key below (dotted, e.g. optim.lr=1e-5 rollout.n=8)

Options (key=default  # meaning):
"""


def parse_args(argv: list[str]) -> tuple[str | None, str | None, list[str]]:
    experiment = preset = None
    overrides = []
    for arg in argv:
        if arg.startswith("experiment="):
            experiment = arg.split("=", 1)[1]
        elif arg.startswith("preset="):
            preset = arg.split("=", 1)[1]
        else:
            overrides.append(arg)
    return experiment, preset, overrides


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from train.config import ConfigError, build_config, describe

    if any(a in ("-h", "--help", "help") for a in argv):
        print(USAGE + describe())
        return 0
    experiment, preset, overrides = parse_args(argv)
    try:
        cfg = build_config(experiment, overrides, preset)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    from train.models import ModelNotFoundError

    if cfg.world_size > 1:  # torchrun starts the ranks (across a Slurm job's nodes when it has several)
        from train.launch.ranks import launch_ranks

        return launch_ranks(cfg)
    from train.trainer import run

    try:
        run(cfg)
    except (ModelNotFoundError, FileNotFoundError, ValueError) as exc:
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # vLLM's in-process engine can keep non-daemon threads alive at exit
