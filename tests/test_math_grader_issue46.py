"""The answer families of issue 46 (matrices, doubled backslashes, labels, negated choice letters, several
boxes, ordered answers, units on one side, empty boxes, inequalities, '1,\\!000', decimal commas): every
well-formed answer grades equal to itself (a seeded generator, no hypothesis), and the helpers that decide
each convention, on hand-computed values. The held-out cases are tests/grader_cases/heldout/i46_*.txt.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from math_grader import extract_answer, grade, is_equiv
from math_grader.forms import label_value, plain_number
from math_grader.text import negated_letter, undouble_backslashes

TIMEOUT_S = 30.0  # verdicts, not speed
PER_FAMILY = 25


def _num(rng: random.Random) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        return str(rng.randint(-20, 20))
    if kind == 1:
        return f"\\frac{{{rng.randint(1, 9)}}}{{{rng.randint(2, 9)}}}"
    if kind == 2:
        return f"{rng.randint(0, 9)}.{rng.randint(1, 99)}"
    return f"{rng.randint(1, 5)}\\sqrt{{{rng.choice([2, 3, 5, 7])}}}"


def _matrix(rng: random.Random) -> str:
    rows, cols = rng.randint(1, 3), rng.randint(1, 3)
    env = rng.choice(["pmatrix", "bmatrix"])
    cells = [[rng.choice([_num(rng), rng.choice("abxy")]) for _ in range(cols)] for _ in range(rows)]
    body = rng.choice([" \\\\ ", "\\\\"]).join(rng.choice([" & ", "&"]).join(r) for r in cells)
    text = f"\\begin{{{env}}}{body}\\end{{{env}}}"
    return rng.choice([text, f"${text}$", f"\\[{text}\\]"])


def _doubled(rng: random.Random) -> str:
    inner = rng.choice(
        [
            f"\\frac{{{rng.randint(1, 9)}}}{{{rng.randint(2, 9)}}}",
            f"\\left({rng.randint(0, 9)}, {rng.randint(0, 9)}\\right)",
            f"{rng.randint(2, 9)}\\sqrt{{{rng.randint(2, 7)}}}",
            f"\\boxed{{\\dfrac{{{rng.randint(1, 9)}}}{{{rng.randint(2, 9)}}}}}",
            f"\\begin{{pmatrix}}{rng.randint(0, 9)}\\\\{rng.randint(0, 9)}\\end{{pmatrix}}",
        ]
    )
    return inner.replace("\\", "\\\\")


def _labelled(rng: random.Random) -> str:
    label = rng.choice(
        ["|AB|", "AB", "V_{1}:V_{2}", "f(x)", "P(A)", "S_{10}", "\\angle ABC", "\\frac{NO}{BO}"]
    )
    value = rng.choice([_num(rng), f"{rng.randint(1, 30)}:{rng.randint(1, 30)}"])
    return rng.choice([f"{label}={value}", f"{label} = {value}", f"${label} = {value}$"])


def _choice(rng: random.Random) -> str:
    right, wrong = rng.sample("ABCDE", 2)
    return rng.choice(
        [
            f"It's not {wrong} because the slope is negative, so {right}.",
            f"{right}。不是 {wrong}",
            f"The answer is {right}, not {wrong}.",
            f"Not {wrong}; the correct option is {right}.",
            f"({wrong}) cannot hold since x > 0. Hence ({right}).",
            f"Rather than {wrong}, I choose {right}.",
        ]
    )


def _several_boxes(rng: random.Random) -> str:
    values = [_num(rng) for _ in range(rng.randint(2, 4))]
    joiner = rng.choice([" and ", ", ", " \\quad\\text{and}\\quad ", "\\) and \\("])
    boxes = joiner.join(f"\\boxed{{{v}}}" for v in values)
    prose = rng.choice(["", "The solutions are ", "If $x>0$ then $x=\\boxed{7}$; otherwise "])
    return prose + (f"\\({boxes}\\)" if "\\)" in joiner else boxes)


def _ordered(rng: random.Random) -> str:
    values = [str(rng.randint(-20, 20)) for _ in range(rng.randint(2, 4))]
    text = ", ".join(values)
    return rng.choice([text, f"({text})", f"\\boxed{{{text}}}", f"The ordered triple is $({text})$."])


def _unit(rng: random.Random) -> str:
    value = rng.choice([str(rng.randint(1, 500)), f"{rng.randint(1, 99)}.{rng.randint(1, 9)}"])
    unit = rng.choice(
        ["cm", "\\text{ cm}", "\\,\\mathrm{kg}", " km", "\\text{ hours}", "\\mbox{ cm}^2", "^\\circ"]
    )
    return rng.choice([f"{value}{unit}", f"The length is ${value}{unit}$."])


def _inequality(rng: random.Random) -> str:
    a, b = sorted(rng.sample(range(-20, 20), 2))
    var = rng.choice(["x", "y", "t", "f(x)"])
    lo, hi = rng.choice(["<", "\\le", "\\leq", "≤"]), rng.choice(["<", "\\le", "\\leq"])
    return rng.choice(
        [
            f"{var} > {a}",
            f"{var} \\ge {b}",
            f"{a} {lo} {var} {hi} {b}",
            f"{var} < {a} \\text{{ or }} {var} > {b}",
            f"{var} \\neq {a}",
            f"({a}, {b}]",
        ]
    )


def _thousands(rng: random.Random) -> str:
    n = rng.randint(1000, 99_999_999)
    text = f"{n:,}".replace(",", rng.choice([",\\!", "{,}"]))
    return rng.choice([text, f"\\boxed{{{text}}}", f"The total is ${text}$."])


def _decimal_comma(rng: random.Random) -> str:
    text = f"{rng.choice(['', '-'])}{rng.randint(0, 99)},{rng.randint(1, 999):0{rng.randint(1, 3)}d}"
    return rng.choice([text, f"\\boxed{{{text}}}", f"La respuesta es {text}."])


GENERATORS: dict[str, Callable[[random.Random], str]] = {
    "matrices": _matrix,
    "double_backslash": _doubled,
    "labelled": _labelled,
    "choice_negated": _choice,
    "several_boxes": _several_boxes,
    "ordered": _ordered,
    "units_one_side": _unit,
    "intervals_inequalities": _inequality,
    "thousands_bang": _thousands,
    "decimal_comma": _decimal_comma,
}


@pytest.mark.parametrize("family", sorted(GENERATORS))
def test_a_generated_answer_grades_equal_to_itself(family: str) -> None:
    """grade(s, s) == 1 and is_equiv(s, s) for well-formed answers of every family, in and out of a box
    and with ordered=True; 0 before the fix for matrices (read as their last number), doubled backslashes
    and labels inside boxes."""
    rng = random.Random(46 + sorted(GENERATORS).index(family))
    misses = []
    for _ in range(PER_FAMILY):
        s = GENERATORS[family](rng)
        ordered = family == "ordered"
        if grade(s, s, TIMEOUT_S, ordered=ordered) != 1.0 or not is_equiv(s, s, TIMEOUT_S, ordered=ordered):
            misses.append(s)
    assert not misses, misses[:5]


@pytest.mark.parametrize(
    "empty", ["\\boxed{}", "\\boxed{ }", "$\\boxed{}$.", "\\boxed{}\\boxed{}", "\\fbox{}"]
)
def test_an_empty_box_equals_nothing_not_even_itself(empty: str) -> None:
    """An empty answer is not a well-formed one: no reward for '\\boxed{}' against an empty gold (1.0 before)."""
    assert grade(empty, empty, TIMEOUT_S) == 0.0
    assert not is_equiv(empty, empty, TIMEOUT_S)
    assert grade("\\boxed{\\{\\}}", "\\emptyset", TIMEOUT_S) == 1.0  # the empty set is an answer


def test_doubled_backslashes_are_undoubled_only_when_every_backslash_is_doubled() -> None:
    assert undouble_backslashes("\\\\frac{1}{2}") == "\\frac{1}{2}"
    assert (
        undouble_backslashes("\\\\begin{pmatrix}1\\\\\\\\2\\\\end{pmatrix}")
        == "\\begin{pmatrix}1\\\\2\\end{pmatrix}"
    )
    assert (
        undouble_backslashes("\\begin{pmatrix}a\\\\b\\end{pmatrix}") == "\\begin{pmatrix}a\\\\b\\end{pmatrix}"
    )
    assert undouble_backslashes("1 & 2 \\\\ 3 & 4") == "1 & 2 \\\\ 3 & 4"  # row breaks only: written once


def test_labels_are_read_off_and_equations_are_not() -> None:
    assert label_value("|AB|=1") == ("|AB|", "1")
    assert label_value("V_{1}:V_{2}=11:21") == ("V_1:V_2", "11:21")
    assert label_value("\\frac{NO}{BO}=\\frac{1}{\\sqrt{6}}") == ("\\fracNOBO", "\\frac{1}{\\sqrt{6}}")
    assert label_value("x+y=5") is None
    assert label_value("2x - y = 5") is None
    assert not is_equiv("5", "x+y=5", TIMEOUT_S)


def test_a_negated_letter_is_not_the_choice() -> None:
    text = "It's not A because of the sign, so B."
    assert negated_letter(text, text.index("A"), text.index("A") + 1)
    assert not negated_letter(text, text.index("B"), text.index("B") + 1)
    assert extract_answer(text) == "B"
    assert extract_answer("B。不是 A") == "B"
    assert extract_answer("(A) cannot hold since x > 0. Hence (D).") == "D"
    assert grade("It is not A.", "A", TIMEOUT_S) == 0.0


def test_a_leading_zero_group_is_a_decimal_comma_not_thousands() -> None:
    assert plain_number("0,111") is None  # was '0111' = 111
    assert plain_number("1,234") == "1234"
    assert plain_number("1.234,5") == "1234.5"
    assert is_equiv("0,111", "0.111", TIMEOUT_S) and not is_equiv("0,111", "111", TIMEOUT_S)


def test_thousands_with_a_negative_thin_space_are_one_number() -> None:
    assert extract_answer("The total is $\\$1,\\!250$.") == "1250"
    assert grade("So there are $40,\\!320$ arrangements.", "40320", TIMEOUT_S) == 1.0
    assert grade("\\boxed{10,\\!080}", "1080", TIMEOUT_S) == 0.0


def test_a_response_that_is_only_a_matrix_answers_the_matrix() -> None:
    matrix = "\\begin{pmatrix}1\\\\2\\end{pmatrix}"
    assert extract_answer(matrix) == matrix  # was '1'
    assert grade(matrix, "2", TIMEOUT_S) == 0.0
    assert (
        grade(
            "\\begin{bmatrix}1 & 2\\\\3 & 4\\end{bmatrix}",
            "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}",
            TIMEOUT_S,
        )
        == 1.0
    )
