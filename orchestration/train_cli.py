"""`python -m train [experiment=NAME] [preset=NAME] [key=value ...]` — one training run (train/__main__.py
is the entry point; starting the run, its ranks and its refusals are orchestration's).

`--help` lists every key with its default (and, given an experiment, its components' arguments);
`--validate` checks the config as a sweep's planning does and exits. world_size > 1 re-launches itself
under torchrun.
"""

from __future__ import annotations

import sys

USAGE = """usage: python -m train [experiment=NAME] [preset=NAME] [key=value ...] [--validate | --help]

Trains a policy with GRPO (or another estimator) and tracks it in MLflow.
  experiment=NAME   start from experiments/NAME.yaml (its `config:` block)
  preset=NAME       then apply that experiment's `presets.NAME` block (e.g. paper)
  key=value         then override any key below (dotted, e.g. optim.lr=1e-5 rollout.n=8)
  --validate        check everything that can be checked before a model loads (key names and types,
                    ranges, mode names, `_target_` imports and arguments), print one line, exit (2 = bad)

Options (key=default  # meaning):
"""


FLAGS = ("-h", "--help", "help", "--validate")


def parse_args(argv: list[str]) -> tuple[str | None, str | None, list[str]]:
    from train.config import split_cli

    return split_cli([a for a in argv if a not in FLAGS])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from train.config import ConfigError, build_config

    experiment, preset, overrides = parse_args(argv)
    if any(a in ("-h", "--help", "help") for a in argv):
        return _help(experiment, preset, overrides)
    try:
        cfg = build_config(experiment, overrides, preset)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if "--validate" in argv:
        a = cfg.algorithm
        print(
            f"config ok: {cfg.experiment}, {cfg.total_steps} steps, estimator {a.adv_estimator}, "
            f"loss {a.policy_loss_mode}/{a.loss_agg_mode}, reward {cfg.reward._target_}"
        )
        return 0

    from infra.models import ModelNotFoundError
    from train.checkpoint import CheckpointError
    from train.preemption import Preempted
    from train.preflight import refusal

    refused = refusal(cfg)  # servers that do not answer, folders that do not exist: before anything loads
    if refused:
        print(f"error: {refused}", file=sys.stderr)
        return 2
    try:
        if cfg.world_size > 1:  # torchrun starts the ranks (across a Slurm job's nodes when it has several)
            from orchestration.ranks import launch_ranks

            return launch_ranks(cfg)
        from train.stages.grpo import run

        run(cfg)
    except (ModelNotFoundError, FileNotFoundError, ValueError) as exc:
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    except CheckpointError as exc:  # e.g. the final save on a full disk (the run is FAILED with it)
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    except Preempted as stop:  # checkpointed (or abandoned) and the MLflow run marked: the shell's code
        return 128 + stop.signum
    return 0


def _help(experiment: str | None, preset: str | None, overrides: list[str]) -> int:
    from omegaconf import OmegaConf

    from train.config import ConfigError, build_config, train_schema
    from train.help import describe

    try:  # the configured components' arguments; the plain defaults when the config does not build
        cfg = build_config(experiment, overrides, preset) if (experiment or overrides or preset) else None
    except ConfigError as exc:
        print(f"(config not built: {exc}; showing the defaults)", file=sys.stderr)
        cfg = OmegaConf.structured(train_schema())
    print(USAGE + describe(cfg))
    return 0
