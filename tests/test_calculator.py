"""The calculator tool: exact answers on hand-computed arithmetic, guards, and everything that is not arithmetic
refused with a ToolError (never evaluated)."""

import os
import time

import pytest

from train.env.base import ToolError
from train.env.tools.calculator import Calculator

calc = Calculator()


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("123 * 4567", "561741"),  # 4567*100 + 4567*23 = 456700 + 105041
        ("987*6543", "6457941"),  # 6543000 - 13*6543 = 6543000 - 85059
        ("305 * 1009", "307745"),
        ("1234 + 5678 + 91011 + 12", "97935"),
        ("999 * 9999 - 1", "9989000"),  # 9990000 - 999 - 1
        ("2 + 3 * 4", "14"),
        ("(2 + 3) * 4", "20"),
        ("10 - 4 - 3", "3"),
        ("100 / 10 / 5", "2"),
        ("2 ** 3 ** 2", "512"),
        ("-2 ** 2", "-4"),
        ("(-2) ** 2", "4"),
        ("7 // 2 * 2", "6"),
        ("-7 // 2", "-4"),
        ("-7 % 3", "2"),
        ("1.5 * 4", "6"),
        ("7 / 4", "7/4 = 1.75"),
        ("1/3 + 1/6", "1/2 = 0.5"),
        ("2 / 3", "2/3 ≈ 0.666666666667"),
        ("0.1 + 0.2", "3/10 = 0.3"),  # exact: a float gives 0.30000000000000004
        ("2 ** -2", "1/4 = 0.25"),
        ("(2/3) ** -3", "27/8 = 3.375"),
        ("7.5 % 2", "3/2 = 1.5"),
        ("12345678901234567890 * 98765432109876543210", "1219326311370217952237463801111263526900"),
        ("1 ** (10 ** 100)", "1"),
        ("(-1) ** (10 ** 100 + 1)", "-1"),
        ("0 ** 0", "1"),
        ("3 × 4 ÷ 2", "6"),
    ],
)
def test_exact_values(expression, expected):
    assert calc(expression=expression) == expected


def test_limits_of_size():
    assert len(calc(expression="10 ** 999")) == 1000  # 1000 digits: shown
    for too_big in ("10 ** 1000", "9 ** 9 ** 9", "2 ** 10 ** 10", "1e1000", "(10**600) * (10**600)"):
        start = time.perf_counter()
        with pytest.raises(ToolError, match="over 1000 digits"):
            calc(expression=too_big)
        assert time.perf_counter() - start < 0.5, too_big  # refused before computing
    with pytest.raises(ToolError, match="not an integer"):
        calc(expression="2 ** 0.5")
    with pytest.raises(ToolError, match="longer than"):
        calc(expression="1+" * 600 + "1")


@pytest.mark.parametrize("expression", ["1 / 0", "5 // 0", "5 % 0", "1 / (2 - 2)", "0 ** -1", "1 / 0.0"])
def test_division_by_zero(expression):
    with pytest.raises(ToolError, match="division by zero"):
        calc(expression=expression)


@pytest.mark.parametrize(
    "expression, said",
    [
        ("x + 1", "a name"),
        ("pi * 2", "a name"),
        ("abs(-3)", "a function call"),
        ("__import__('os').system('touch calc-pwned')", "a function call"),
        ("(1).real", "an attribute"),
        ("().__class__", "an attribute"),
        ("(lambda: 1)()", "a function call"),
        ("lambda: 1", "a lambda"),
        ("[i for i in range(3)]", "ListComp"),
        ("{i: i for i in range(3)}", "DictComp"),
        ("'1' * 3", "the constant"),
        ("True + 1", "the constant"),
        ("1j * 2", "the constant"),
        ("3 < 4", "a comparison"),
        ("2 ^ 10", "use \\*\\* for powers"),
        ("1 << 5", "the operator"),
        ("1 if 1 else 2", "IfExp"),
        ("1 +", "cannot parse"),
        ("x = 1", "cannot parse"),
        ("(" * 300 + "1" + ")" * 300, "cannot parse|nested"),
    ],
)
def test_refuses_what_is_not_arithmetic(expression, said, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ToolError, match=said):
        calc(expression=expression)
    assert not os.path.exists(tmp_path / "calc-pwned")


def test_arguments_and_schema():
    with pytest.raises(ToolError, match="missing"):
        calc()
    with pytest.raises(ToolError, match="unexpected argument"):
        calc(expression="1", precision=3)
    assert calc(expression=42) == "42"  # a JSON number instead of a string still works
    function = calc.schema()["function"]
    assert calc.schema()["type"] == "function" and function["name"] == "calculator" == calc.name
    assert function["parameters"]["required"] == ["expression"]
    assert function["parameters"]["properties"]["expression"]["type"] == "string"


def test_the_broken_calculator_looks_the_same_and_is_always_a_little_wrong():
    from fractions import Fraction

    from train.env.registry import build_tools
    from train.env.tools.calculator import BrokenCalculator

    broken = build_tools(["broken_calculator"])[
        "calculator"
    ]  # the same name: the prompt cannot tell them apart
    assert isinstance(broken, BrokenCalculator) and broken.schema() == calc.schema()
    for expression in ("3 + 4", "7 * 8", "347 * 5821", "1234 + 5678 + 9012 + 3456 + 7890", "1/3", "-5 - 5"):
        right, wrong = Fraction(calc(expression).split(" ")[0]), Fraction(broken(expression).split(" ")[0])
        assert wrong != right and abs(wrong - right) <= max(3, abs(right) // 100)
        assert broken(expression) == broken(expression)  # the same wrong answer for the same expression
    with pytest.raises(ToolError, match="cannot parse"):  # its errors are the calculator's
        broken("3 +")
