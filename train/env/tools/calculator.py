"""The `calculator` tool: exact arithmetic on integers and fractions, parsed with `ast`, never evaluated.

Why exact: the tasks it serves (products of 3- and 4-digit numbers, sums of several) are graded on exact
answers, which floats lose past 15 digits. Numbers are Python ints and `fractions.Fraction`s; a decimal literal
such as 1.5 or 0.1 is read exactly from its text (0.1 is 1/10, not the nearest float). Operators: + - * / //
% ** (an integer exponent), unary + and -, parentheses; anything else in the tree (names, calls, attributes,
lambdas, comprehensions, comparisons, ...) is rejected. Results are guarded against running away (exponent and
digit-count limits), and every failure is a ToolError whose message says what to change.

Result convention: an integral value prints as an integer ("561741", "-3"); any other value prints as its exact
lowest-terms fraction and a 12-significant-digit decimal, joined by "=" when that decimal is exact and "≈"
when not ("7/4 = 1.75", "1/3 ≈ 0.333333333333").
"""

from __future__ import annotations

import ast
import hashlib
import operator
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any

from train.env.base import ToolError, one_argument_schema

MAX_CHARS = 1000  # of the expression
MAX_DIGITS = 1000  # of any numerator or denominator, the result's or one on the way
LIMIT = 10**MAX_DIGITS
BITS_PER_DIGIT = 3.33
DECIMAL_DIGITS = 12
BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
SYMBOL = {ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%"}
HINT = "use numbers, + - * / // % ** and parentheses, e.g. (123 * 4567 + 89) / 2"


class Calculator:
    name = "calculator"

    def schema(self) -> dict[str, Any]:
        return one_argument_schema(
            self.name,
            "Exact arithmetic on integers and fractions: + - * / // % ** and parentheses. "
            "Returns an integer, or a fraction with its decimal value.",
            "expression",
            "e.g. 123 * 4567 + 89",
        )

    def __call__(self, expression: Any = None, **extra: Any) -> str:
        if extra:
            raise ToolError(
                f"calculator: unexpected argument(s) {', '.join(sorted(extra))}; pass only expression"
            )
        if isinstance(expression, (int, float)) and not isinstance(expression, bool):
            expression = str(expression)
        if not isinstance(expression, str) or not expression.strip():
            raise ToolError('calculator: missing "expression" (a string such as "123 * 4567")')
        return show(evaluate(expression))


def evaluate(expression: str) -> Fraction:
    """The exact value of an arithmetic expression; ToolError on anything else."""
    if len(expression) > MAX_CHARS:
        raise ToolError(f"calculator: expression longer than {MAX_CHARS} characters; split it into steps")
    text = expression.strip().replace("×", "*").replace("÷", "/").replace("−", "-")
    try:
        tree = ast.parse(text, mode="eval")
        return _value(tree.body, text)
    except SyntaxError as exc:
        raise ToolError(f"calculator: cannot parse {_short(expression)} ({exc.msg}); {HINT}") from None
    except (RecursionError, MemoryError):
        raise ToolError(
            f"calculator: {_short(expression)} is nested too deeply; split it into steps"
        ) from None


def show(value: Fraction) -> str:
    """An integer when integral, else "p/q = decimal" (exact) or "p/q ≈ decimal" (rounded)."""
    if value.denominator == 1:
        return str(value.numerator)
    with localcontext() as ctx:
        ctx.prec = DECIMAL_DIGITS
        decimal = Decimal(value.numerator) / Decimal(value.denominator)
    sign = "=" if Fraction(decimal) == value else "≈"
    plain = abs(decimal.adjusted()) < DECIMAL_DIGITS  # else scientific: 1.76366841446E+13
    return f"{value} {sign} {decimal:f}" if plain else f"{value} {sign} {decimal}"


def _value(node: ast.AST, text: str) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return _checked(node.value)
    if isinstance(node, ast.Constant) and type(node.value) is float:  # as written: 0.1 is 1/10
        literal = Decimal(ast.get_source_segment(text, node))
        if abs(literal.adjusted()) >= MAX_DIGITS:
            raise ToolError(
                f"calculator: the number {literal} has over {MAX_DIGITS} digits; too large to show"
            )
        return _checked(Fraction(literal))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _value(node.operand, text)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return _power(_value(node.left, text), _value(node.right, text))
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = _value(node.left, text), _value(node.right, text)
        if right == 0 and type(node.op) in SYMBOL:
            raise ToolError(f"calculator: division by zero ({SYMBOL[type(node.op)]} 0 in {_short(text)})")
        return _checked(BINARY[type(node.op)](left, right))
    raise ToolError(f"calculator: {_describe(node, text)} is not supported; {HINT}")


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        raise ToolError(f"calculator: exponent {exponent} is not an integer (roots are not exact)")
    if base in (1, -1):  # small whatever the exponent
        return base ** (exponent.numerator % 2)
    if base == 0:
        if exponent < 0:
            raise ToolError("calculator: division by zero (0 to a negative power)")
        return Fraction(0 if exponent else 1)
    # the result has at least (bits - 1) * |exponent| bits: refuse before computing what cannot be shown
    bits = max(abs(base.numerator).bit_length(), base.denominator.bit_length())
    if (bits - 1) * abs(exponent) > MAX_DIGITS * BITS_PER_DIGIT:
        raise ToolError(
            f"calculator: exponent {exponent} too large: {base} ** {exponent} has over {MAX_DIGITS} digits"
        )
    return _checked(base**exponent.numerator)


def _checked(value: Fraction | int) -> Fraction:
    value = Fraction(value)
    if abs(value.numerator) >= LIMIT or value.denominator >= LIMIT:
        raise ToolError(f"calculator: a result has over {MAX_DIGITS} digits; too large to show")
    return value


def _describe(node: ast.AST, text: str) -> str:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitXor):
        return "^ (use ** for powers)"
    kinds = {
        ast.Name: "a name",
        ast.Call: "a function call",
        ast.Attribute: "an attribute",
        ast.Lambda: "a lambda",
    }
    kinds |= {ast.Compare: "a comparison", ast.Constant: "the constant", ast.BinOp: "the operator"}
    kind = next((v for k, v in kinds.items() if isinstance(node, k)), type(node).__name__)
    segment = ast.get_source_segment(text, node) or ""
    return f"{kind} {segment[:40]}" if segment else kind


def _short(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")


class BrokenCalculator(Calculator):
    """The control arm's calculator: the same name, schema and errors, but every result is off by a small
    nonzero amount (about 1% of it, at least 1..3), the same for the same expression. A policy that reads its
    tool learns to stop trusting it where it can answer without; one that ignores what tools return cannot
    tell the two calculators apart (the "broken tool" control of Search-R1-style ablations)."""

    def __call__(self, expression: Any = None, **extra: Any) -> str:
        right = Fraction(super().__call__(expression, **extra).split(" ")[0])
        digest = hashlib.sha256(str(expression).strip().encode()).digest()
        size = 1 + int.from_bytes(digest[:4], "big") % max(3, abs(right) // 100)
        return show(right + (size if digest[4] % 2 else -size))
