"""Short names for the tools and environments this project ships, and building them from `env.*` config.

`env.tools=[calculator]` is the same as `env.tools=[{_target_: train.env.tools.calculator.Calculator}]`;
any other tool or environment is named by its `_target_` (one file of your own), with its keyword arguments
beside it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TOOLS = {
    "calculator": "train.env.tools.calculator.Calculator",
    "broken_calculator": "train.env.tools.calculator.BrokenCalculator",
    "python": "train.env.tools.python.PythonTool",
    "catalog": "train.env.tools.catalog.Catalog",
}
INTERACTIONS = {
    "answer_check": "train.env.interactions.answer_check.AnswerCheck",
}


def tool_entries(value: Any) -> list:
    """`env.tools` as a list: a list as given, or a comma list of names ("calculator,python"; "" or "none": none)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [n.strip() for n in value.split(",") if n.strip() and n.strip() != "none"]
    return list(value)


def enabled(env_cfg: Any) -> bool:
    """Whether `env` asks for multi-turn rollouts: `env.multi_turn`, or (null) any tool or an interaction."""
    if env_cfg is None:
        return False
    multi_turn = env_cfg["multi_turn"] if "multi_turn" in env_cfg else None
    if multi_turn is not None:
        return bool(multi_turn)
    return bool(tool_entries(env_cfg.get("tools"))) or env_cfg.get("interaction") is not None


def spec_of(entry: Any, names: dict[str, str], key: str) -> dict:
    """A `_target_` dict for a short name or a component entry; a ValueError naming `key` otherwise."""
    if isinstance(entry, str):
        if entry in names:
            return {"_target_": names[entry]}
        if "." in entry:
            return {"_target_": entry}
        raise ValueError(
            f"{key}={entry!r}: unknown name (known: {', '.join(sorted(names))}; or give a _target_)"
        )
    if isinstance(entry, dict) and "_target_" in entry:
        return dict(entry)
    raise ValueError(f"{key}={entry!r}: expected a name ({', '.join(sorted(names))}) or {{_target_: ...}}")


def build_tools(entries: list[Any]) -> dict[str, Any]:
    """The configured tools by their `name` (two tools of one name: a ValueError)."""
    from hydra.utils import instantiate

    tools: dict[str, Any] = {}
    for i, entry in enumerate(entries or []):
        tool = instantiate(spec_of(entry, TOOLS, f"env.tools[{i}]"))
        if tool.name in tools:
            raise ValueError(f"env.tools[{i}]: a second tool named {tool.name!r}")
        tools[tool.name] = tool
    return tools


def interaction_factory(entry: Any) -> Callable[[], Any] | None:
    """A callable making a fresh environment per trajectory, or None."""
    if entry is None:
        return None
    from hydra.utils import instantiate

    spec = spec_of(entry, INTERACTIONS, "env.interaction")
    instantiate({**spec, "_partial_": True})  # fails now, at start, on a bad target or argument
    return lambda: instantiate(spec)


def build_agent(env_cfg: Any, engine, tokenizer, say=print):
    """The multi-turn rollout of `env` over `engine` (train/rollout/agent_loop.py)."""
    from omegaconf import OmegaConf

    from train.rollout.agent_loop import AgentRollout

    cfg = OmegaConf.to_container(env_cfg, resolve=True) if not isinstance(env_cfg, dict) else env_cfg
    return AgentRollout(
        engine,
        tokenizer,
        build_tools(tool_entries(cfg.get("tools"))),
        interaction_factory(cfg.get("interaction")),
        max_turns=cfg.get("max_turns", 4),
        max_total_tokens=cfg.get("max_total_tokens"),
        max_observation_tokens=cfg.get("max_observation_tokens", 256),
        max_calls_per_turn=cfg.get("max_calls_per_turn", 4),
        tool_timeout_s=cfg.get("tool_timeout_s", 10.0),
        tool_workers=cfg.get("tool_workers", 8),
        schedule=cfg.get("schedule", "async"),
        tool_format=cfg.get("tool_format", "auto"),
        say=say,
    )
