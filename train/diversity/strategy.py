"""The strategy of an agent trajectory: which tools it called, in what order, and the shape of each calculator
expression, beside its final answer. What DARLING's `partition_by: strategy_and_answer` tells apart
(train/rewards/darling_reward.py) and what `distinct_correct_strategies_mean` counts.

Two trajectories that check a candidate with `37 * 54` and with `1998 / 37` took different paths to the same
answer; two that computed `37 * 54` and `37 * 27` took the same path. So a call is its tool's name, plus for
the calculator the operators of its expression in the order written (the numbers dropped):

    37 * 54            -> calculator:*
    1998 % 37          -> calculator:%
    1 + 9 + 9 + 8      -> calculator:+ + +
    (1998 - 74) // 37  -> calculator:- //
    1998               -> calculator:n         (no operator)
    37 *               -> calculator:?         (not an expression: the calculator refuses it)

Calls are read from the model's turns with the agent loop's own parser (train/env/tool_format.py), a
malformed call counting as the step `malformed`. The final answer is the math grader's reading of the last
model turn: the text the reward graded.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass

from train.env.tool_format import parse_tool_calls

CALCULATOR = "calculator"
MALFORMED = "malformed"
OPERATORS = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
    ast.USub: "neg",
}


@dataclass(frozen=True)
class Strategy:
    """A trajectory's tool path (one step per call) and its final answer ("" when it gave none)."""

    path: tuple[str, ...]
    answer: str

    def describe(self) -> str:
        return " > ".join(self.path) or "no tools"


def _operators(node: ast.AST) -> list[str]:
    """The operators of an expression tree in the order they are written (an in-order walk)."""
    if isinstance(node, ast.BinOp):
        return [*_operators(node.left), OPERATORS.get(type(node.op), "?"), *_operators(node.right)]
    if isinstance(node, ast.UnaryOp):
        return ([OPERATORS[ast.USub]] if isinstance(node.op, ast.USub) else []) + _operators(node.operand)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return []
    raise ValueError(f"{type(node).__name__} is not arithmetic")


def skeleton(expression: object) -> str:
    """The operator skeleton of a calculator expression: "+ + +", "n" without operators, "?" when unreadable."""
    if isinstance(expression, (int, float)) and not isinstance(expression, bool):
        return "n"
    if not isinstance(expression, str):
        return "?"
    # read as the calculator reads it (train/env/tools/calculator.py)
    text = expression.strip().replace("×", "*").replace("÷", "/").replace("−", "-")
    try:
        ops = _operators(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError, RecursionError):
        return "?"
    return " ".join(ops) or "n"


def tool_path(model_turns: Sequence[str]) -> tuple[str, ...]:
    """One step per call across the model's turns, in order: "calculator:<skeleton>", another tool's name."""
    path: list[str] = []
    for text in model_turns:
        parsed = parse_tool_calls(text)
        for call in parsed.calls:
            if call.name == CALCULATOR:
                path.append(f"{CALCULATOR}:{skeleton(call.arguments.get('expression'))}")
            else:
                path.append(call.name)
        path += [MALFORMED] * len(parsed.errors)
    return tuple(path)


def final_answer(text: str) -> str:
    """The final answer of a response as the math grader extracts and normalizes it ("" when none)."""
    from math_grader import extract_answer, normalize_answer

    answer = extract_answer(text or "")
    return normalize_answer(answer) if answer is not None else ""


def strategy_of(trajectory: dict) -> Strategy:
    """The strategy of one trajectory summary (the agent loop's `Trajectory.summary()`: its `segments`)."""
    turns = [s.get("text", "") for s in trajectory.get("segments", []) if s.get("role") == "model"]
    return Strategy(tool_path(turns), final_answer(turns[-1]) if turns else "")
