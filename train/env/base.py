"""What the model talks to in a multi-turn rollout: tools (stateless functions) and environments (stateful).

Tools follow the OpenAI function-calling convention: `schema()` is `{"type": "function", "function":
{"name", "description", "parameters": <JSON schema>}}`, the model calls one by name with a JSON object of
arguments, and the call's result is a string the model reads back. An environment is shaped like TRL's
`environment_factory` / OpenEnv and verl's interactions: `reset(task)` once per trajectory, then `step(turn)`
after every model turn that calls no tool, returning what the model sees next, a reward and whether it is done,
and `close()` (optional) when the trajectory ends. What they answer is checked against these types
(`checked_step`, `checked_observation`) in the thread that called them, so a wrong one is that trajectory's
failure (train/rollout/agent_loop.py), never the trainer's.

Adding a tool or an environment is one file: a class with these methods, named by its `_target_` in
`env.tools` / `env.interaction` (or by its short name in `train/env/registry.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from train.env.calls import CallFailed


class ToolError(Exception):
    """A failure the model should see as an error observation (bad arguments, a sandboxed program that
    crashed or timed out), not a crash of the trainer. The message is what the model reads."""


class Tool(Protocol):
    name: str

    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema: {"type": "function", "function": {"name", "description", "parameters"}}."""
        ...

    def __call__(self, **arguments: Any) -> str:
        """The call's result as text; raises ToolError (or anything else: reported the same way)."""
        ...


def one_argument_schema(
    name: str, description: str, argument: str, argument_description: str
) -> dict[str, Any]:
    """A tool's function schema when it takes one required string argument (calculator, python, catalog)."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {argument: {"type": "string", "description": argument_description}},
                "required": [argument],
            },
        },
    }


@dataclass
class ToolResult:
    """What a tool may return instead of plain text: the text the model reads and a reward for the call
    (summed into the trajectory's environment reward, which reaches training through env.reward_weight:
    train/rewards/trajectory.py). A non-finite or non-numeric reward counts 0."""

    text: str
    reward: float = 0.0


def finite_or_zero(value: Any) -> float:
    """A reward from user code as a float; 0 for anything that is not a finite number."""
    if isinstance(value, (str, bytes)):
        return 0.0
    try:
        x = float(value)
    except Exception:  # noqa: BLE001 -- whatever __float__ raises, it is not a reward
        return 0.0
    return x if math.isfinite(x) else 0.0


@dataclass
class EnvStep:
    """What an environment answers a model turn with. `observation` None: nothing more to say."""

    observation: str | None
    reward: float = 0.0
    done: bool = False


class Environment(Protocol):
    """One trajectory's stateful counterpart (a new instance per trajectory: `env.interaction` is a factory)."""

    def reset(self, task: dict[str, Any]) -> str | None:
        """Start a trajectory on a data row; an observation shown before the first model turn, or None."""
        ...

    def step(self, model_turn: str) -> EnvStep:
        """The model's turn (its text, tool calls already handled) -> observation, reward, done."""
        ...

    def close(self) -> None:
        """Optional: release what the trajectory held (called once, at its end, bounded by env.tool_timeout_s)."""
        ...


def checked_observation(value: Any, what: str) -> str | None:
    """`value` if it is a str or None; CallFailed("bad_type") otherwise."""
    if value is None or isinstance(value, str):
        return value
    raise CallFailed("bad_type", f"{what} is {type(value).__name__}, expected str or None")


def checked_step(value: Any) -> EnvStep:
    """A plain EnvStep of `step`'s answer: CallFailed "bad_type" (not an EnvStep, a reward that is not a
    number, an observation that is not text) or "non_finite_reward" (NaN, inf) otherwise."""
    if not isinstance(value, EnvStep):
        raise CallFailed("bad_type", f"step returned {type(value).__name__}, expected EnvStep")
    observation = checked_observation(value.observation, "step's observation")
    reward, done = value.reward, value.done
    not_a_number = CallFailed("bad_type", f"step's reward is {type(reward).__name__}, expected a number")
    if isinstance(reward, (str, bytes)):  # float("1.5") reads it, but a reward of text is a bug
        raise not_a_number
    try:
        reward = float(reward)
    except Exception:  # noqa: BLE001 -- whatever a reward's __float__ raises, it is not a number
        raise not_a_number from None
    try:
        done = bool(done)
    except Exception:  # noqa: BLE001
        raise CallFailed("bad_type", f"step's done is {type(done).__name__}, expected a bool") from None
    if not math.isfinite(reward):
        raise CallFailed("non_finite_reward", f"step's reward is {reward}")
    return EnvStep(observation, reward, done)
