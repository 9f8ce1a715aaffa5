"""`env.*` (multi-turn rollouts): the tools and the interaction resolve, and the trajectories fit."""

from __future__ import annotations

from omegaconf import DictConfig, ListConfig, OmegaConf

from train.config.errors import ConfigError


def validate_env(cfg: DictConfig) -> None:
    """`env.*` (multi-turn rollouts): the tools and the interaction resolve, and the trajectories fit."""
    from train.env import registry

    tools = OmegaConf.select(cfg, "env.tools")
    if tools is not None and not isinstance(tools, (str, ListConfig)):
        raise ConfigError(
            f"bad config value: env.tools={str(tools)[:60]}: expected a list ([calculator, python], or "
            "{_target_: ...} entries) or a comma list of names (calculator,python)"
        )
    if not registry.enabled(cfg.get("env")):
        return
    from train.components import check

    env = OmegaConf.to_container(cfg.env, resolve=True)
    try:  # short names resolved, then every component checked where it sits
        entries = registry.tool_entries(env["tools"])
        tools = [registry.spec_of(e, registry.TOOLS, f"env.tools[{i}]") for i, e in enumerate(entries)]
        interaction = env["interaction"]
        if interaction is not None:
            interaction = registry.spec_of(interaction, registry.INTERACTIONS, "env.interaction")
        check({"env": {"tools": tools, "interaction": interaction}})
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    for i, spec in enumerate(tools):  # the sandbox's own kill must come first, so the model reads why
        own = spec.get("timeout_s")
        if (
            spec["_target_"] == registry.TOOLS["python"]
            and own is not None
            and own + 0.5 > env["tool_timeout_s"]
        ):
            raise ConfigError(
                f"env.tools[{i}].timeout_s={own} must be at least 0.5 s below env.tool_timeout_s={env['tool_timeout_s']}"
                " (the sandbox's kill message would never reach the model): raise env.tool_timeout_s"
            )
    if cfg.data.prompt_template is not None:
        raise ConfigError(
            f"env.tools / env.interaction need the chat template: data.prompt_template={cfg.data.prompt_template} "
            "is plain text; set data.prompt_template=null"
        )
    budget = env["max_total_tokens"] or env["max_turns"] * cfg.rollout.max_new_tokens
    max_len = cfg.rollout.engine.get("max_model_len")
    if max_len is not None and cfg.data.max_prompt_tokens + budget > max_len:
        raise ConfigError(
            f"env: data.max_prompt_tokens={cfg.data.max_prompt_tokens} + a trajectory's {budget} response tokens "
            f"(env.max_total_tokens, or env.max_turns x rollout.max_new_tokens) exceed rollout.engine.max_model_len="
            f"{max_len}; raise max_model_len or lower env.max_total_tokens"
        )
