"""What the model talks to in a multi-turn rollout: tools (stateless functions) and environments (stateful).

Tools follow the OpenAI function-calling convention: `schema()` is `{"type": "function", "function":
{"name", "description", "parameters": <JSON schema>}}`, the model calls one by name with a JSON object of
arguments, and the call's result is a string the model reads back. An environment is shaped like TRL's
`environment_factory` / OpenEnv and verl's interactions: `reset(task)` once per trajectory, then `step(turn)`
after every model turn that calls no tool, returning what the model sees next, a reward and whether it is done.

Adding a tool or an environment is one file: a class with these methods, named by its `_target_` in
`env.tools` / `env.interaction` (or by its short name in `train/env/registry.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


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
