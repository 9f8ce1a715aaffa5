"""The method's checks (`algorithm.*`, `critic.*`): mode names against the method table, knob values, the
step plug-ins' own checks and what the estimator needs from the reward."""

from __future__ import annotations

from omegaconf import DictConfig

from train.config.errors import ConfigError, fail_first


def _validate_critic(cfg: DictConfig, has_critic: bool) -> None:
    """The critic's warm-up against the run; a critic exists where the estimator needs `values` (GAE)."""
    crit = cfg.critic
    fail_first(
        [
            (
                crit.warmup_steps < cfg.total_steps or not has_critic,
                f"critic.warmup_steps={crit.warmup_steps} leaves no actor step in total_steps={cfg.total_steps}",
            ),
            (
                crit.warmup_steps == 0 or has_critic,
                "critic.warmup_steps needs a critic: use an estimator that needs values, e.g. "
                "algorithm.adv_estimator=gae (or critic.warmup_steps=0)",
            ),
        ]
    )


def validate_algorithm(
    algo: DictConfig, reward_target: str | None = None, run: DictConfig | None = None
) -> None:
    """Mode names against the method table, knob values, the enabled step plug-ins' checks (with the run
    config `run`), and what the estimator needs from the reward: the one check of an estimator's needs."""
    estimator = _check_modes(algo)
    _check_knobs(algo)
    if run is not None:
        _check_against_run(algo, run, "values" in estimator.needs)
    _check_reward_signals(estimator, reward_target)


def _check_modes(algo: DictConfig):
    """The estimator, policy loss, loss aggregation and KL estimator are known names; the estimator."""
    from train.algorithms import registry
    from train.algorithms.aggregation import LOSS_AGG_MODES
    from train.algorithms.kl import KL_PENALTIES

    try:
        estimator = registry.adv_estimator(algo.adv_estimator)
        registry.policy_loss(algo.policy_loss_mode)
    except ValueError as exc:
        raise ConfigError(f"bad config value: {exc}") from None
    for key, value, allowed in (
        ("loss_agg_mode", algo.loss_agg_mode, LOSS_AGG_MODES),
        ("kl_loss_type", algo.kl_loss_type, (*KL_PENALTIES, *(f"{k}+" for k in KL_PENALTIES))),
    ):
        if value not in allowed:
            raise ConfigError(f"bad config value: algorithm.{key}={value!r} (known: {', '.join(allowed)})")
    return estimator


def _check_knobs(algo: DictConfig) -> None:
    """Each registered knob's declared range, then the knobs that only make sense together."""
    from train.algorithms import registry

    for name, knob in registry.knobs().items():
        problem = knob.problem(algo[name])
        if problem:
            raise ConfigError(f"bad config value: algorithm.{name}={algo[name]!r} {problem} ({knob.doc})")
    if algo.rollout_rs is not None:  # the thresholds' shape depends on the criteria
        from train.algorithms.rollout_correction import parse_rejection

        try:
            parse_rejection(
                algo.rollout_rs, algo.rollout_rs_threshold, algo.rollout_rs_lower, algo.rollout_rs_upper
            )
        except ValueError as exc:
            raise ConfigError(f"bad config value: {exc}") from None
    if algo.filter_groups_metric == "seq_final_reward" and algo.use_kl_in_reward:
        raise ConfigError(
            "bad config value: algorithm.filter_groups_metric=seq_final_reward with use_kl_in_reward=true is "
            "not supported (the in-reward KL is computed after dynamic sampling); use seq_reward"
        )


def _check_against_run(algo: DictConfig, run: DictConfig, has_critic: bool) -> None:
    """The enabled step plug-ins' own checks with the run config, then the critic's warm-up."""
    from train.algorithms import registry

    for plugin in registry.step_plugins(algo):
        problem = plugin.check(algo, run) if plugin.check else None
        if problem:
            raise ConfigError(f"bad config value: {problem}")
    _validate_critic(run, has_critic)


def _check_reward_signals(estimator, reward_target: str | None) -> None:
    """Every reward signal the estimator reads is one the reward provides (`provides_signals`; a `<x>_spans`
    signal also provides `<x>_token_mask`)."""
    from train.algorithms import registry
    from train.components import class_constant

    provided = set(class_constant(reward_target, "provides_signals") if reward_target else ())
    provided |= {f"{n.removesuffix('_spans')}_token_mask" for n in provided if n.endswith("_spans")}
    hint = f": use {estimator.hint}" if estimator.hint else ""
    for need in estimator.needs:
        if (
            registry.input_row(need) == registry.SIGNALS
            and need.removeprefix(registry.SIGNALS) not in provided
        ):
            name = (reward_target or "the reward").rpartition(".")[2]
            raise ConfigError(
                f"algorithm.adv_estimator={estimator.name} needs the reward signal "
                f"{need.removeprefix(registry.SIGNALS)}, which {name} does not provide{hint}"
            )
