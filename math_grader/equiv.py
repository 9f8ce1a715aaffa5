"""Equivalence of two (already extracted) answers: cheap string/number checks and the full structural +
sympy comparison.

`quick_equiv` never touches sympy, so the trainer process can decide the common cases itself;
`full_equiv` may call simplify() and therefore runs in a worker process under a time limit
(see `_math_pool`). Expressions are built by the safe parser in `math_grader.parse`, never by sympify.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from fractions import Fraction

from math_grader import forms
from math_grader.text import has_percent, match_brace, normalize_answer

REL_TOL = 1e-4
Percent = tuple[bool, bool]  # (prediction written in percent, gold written in percent)

# ---------------------------------------------------------------------------------------------------
# cheap checks (no sympy)
# ---------------------------------------------------------------------------------------------------
_DEC = r"-?(?:\d+(?:\.\d*)?|\.\d+)"
_SCI_RE = re.compile(
    rf"({_DEC})(?:[eE]([+-]?\d{{1,3}})|(?:\\times|\\cdot|\*|x)10\^\{{?([+-]?\d{{1,3}})\}}?)?"
)
_FRAC_RE = re.compile(r"(-?)\\frac\{(-?\d{1,30})\}\{(-?\d{1,30})\}|(-?\d{1,30})/(-?\d{1,30})")


def quick_number(s: str) -> Fraction | None:
    """Exact value of a plain number ('2.5e3', '3\\times10^{4}', '\\frac{1}{2}', '-3/4'), else None. Called on
    normalised answers, where thousands separators are gone and a comma left separates list items."""
    if len(s) > 80:
        return None
    m = _SCI_RE.fullmatch(s)
    if m:
        value = Fraction(m.group(1))
        exp = m.group(2) or m.group(3)
        return value * Fraction(10) ** int(exp) if exp else value
    m = _FRAC_RE.fullmatch(s)
    if m:
        num, den = (m.group(2), m.group(3)) if m.group(2) is not None else (m.group(4), m.group(5))
        if int(den) == 0:
            return None
        value = Fraction(int(num), int(den))
        return -value if m.group(1) else value
    return None


def numbers_close(a: complex | float, b: complex | float, rel_tol: float = REL_TOL) -> bool:
    """Relative tolerance as in the Qwen harness (math.isclose rel_tol=1e-4); an absolute 1e-12 only
    against an exact zero (float noise such as sin(pi)), so 9.11e-31 is not 9.11e-13."""
    floor = 1e-12 if a == 0 or b == 0 else 0.0
    return abs(a - b) <= max(rel_tol * max(abs(a), abs(b)), floor)


_LITERAL_RE = re.compile(
    r"-?\d+(?:\.(\d*))?(?:[eE]([+-]?\d{1,3})|(?:\\times|\\cdot|\*)10\^\{?([+-]?\d{1,3})\}?)?"
)


def literal_decimals(s: str) -> tuple[int, bool] | None:
    """(decimal places, has a decimal point) of a number literal: '33.3' -> (1, True), '6.02e23' -> (-21,
    True), '27' -> (0, False); None for anything else. A gold with a decimal point is taken as rounded."""
    m = _LITERAL_RE.fullmatch(s)
    if not m:
        return None
    exp = int(m.group(2) or m.group(3) or 0)
    return len(m.group(1) or "") - exp, m.group(1) is not None


def gold_decimals(gold: str) -> int | None:
    """Decimal places of a gold written as a decimal ('33.3' -> 1, '6.02e23' -> -21): such golds are rounded."""
    d = literal_decimals(gold)
    return d[0] if d and d[1] else None


def _rounds_to(pred: complex, gold: complex, decimals: int | None) -> bool:
    """A more precise prediction that rounds to a rounded decimal gold ('\\frac{100}{3}' vs '33.3')."""
    if decimals is None or abs(pred.imag) > 0 or abs(gold.imag) > 0:
        return False
    diff = abs(pred.real - gold.real)
    return diff <= 0.5 * 10.0**-decimals * (1 + 1e-9) and diff <= 5e-3 * abs(gold.real)


def percent_readings(pred: object, gold: object, percent: Percent) -> list[tuple[object, object]]:
    """The (pred, gold) value pairs to try. Convention: 'p%' is p/100, and an answer with the sign also
    matches the same numeral without it (the question asked for a percentage): 50% = 50 = 0.5; with the
    sign on both sides or on neither, the numbers must agree (0.5% != 50%, 50 != 0.5)."""
    p_pct, g_pct = percent
    if p_pct == g_pct:
        return [(pred, gold)]
    return [(pred, gold), (pred / 100, gold)] if p_pct else [(pred, gold), (pred, gold / 100)]


def numbers_match(
    pred: Fraction | complex,
    gold: Fraction | complex,
    percent: Percent = (False, False),
    decimals: int | None = None,
    exact: bool = False,
) -> bool:
    """Equal, close within REL_TOL, or rounding to a rounded decimal gold, under the percent convention.
    exact: both are literals written to the same precision, so only equality counts (1234.56 != 1234.65)."""
    for p, g in percent_readings(pred, gold, percent):
        if p == g:
            return True
        if exact:
            continue
        if numbers_close(complex(p), complex(g)) or _rounds_to(complex(p), complex(g), decimals):
            return True
    return False


def written_number(raw: str) -> str:
    """The answer as written, minus spacing and math delimiters: '3.00 \\times 10^8' keeps its zeros
    (normalisation drops them), which say to what precision a gold was rounded."""
    return re.sub(r"\s|\\[,;!]|\$", "", raw)


def _pred_finer(p: str, g: str) -> int | None:
    """Gold decimals when the prediction is more precise than the rounded decimal gold."""
    d = gold_decimals(g)
    if d is None:
        return None
    pd = literal_decimals(p)
    return d if pd is None or pd[0] > d else None


def _same_precision(p: str, g: str) -> bool:
    """Both plain literals written to the same decimal place: compare exactly."""
    pd, gd = literal_decimals(p), literal_decimals(g)
    return pd is not None and gd is not None and pd[0] == gd[0]


def _pred_choice(pred: str) -> str | None:
    """Qwen's choice_answer_clean: the last standalone capital A-E in the prediction; a marked letter
    (B', B^*, B_1) is another label, not B."""
    lone = re.fullmatch(r"\s*\(?([a-e])\)?\.?\s*", pred)  # 'c' alone is the choice C (Qwen, Math-Verify)
    if lone:
        return lone.group(1).upper()
    found = re.findall(r"(?<![A-Za-z0-9_\\])([A-E])(?![A-Za-z0-9_'*^′])", pred)
    return found[-1] if found else None


def _percent(pred: str, gold: str) -> Percent:
    return has_percent(pred), has_percent(gold)


_DEGREE_RE = re.compile(r"\^\s*\{?\s*\\circ|°|\\degree|\bdeg(?:rees?)?\b", re.IGNORECASE)


def _lhs_name(s: str) -> str | None:
    m = re.fullmatch(r"\s*([a-zA-Z](?:_\{?\w+\}?)?)\s*=[^=]+", s)
    return m.group(1).replace("{", "").replace("}", "") if m else None


_NAME = r"[a-zA-Z](?:_\{?\w+\}?)?|\\[a-zA-Z]+|[A-Z]{2,3}|\|[A-Za-z]{1,4}\|"
_NAMED_TUPLE_RE = re.compile(rf"\(\s*((?:{_NAME})(?:\s*,\s*(?:{_NAME}))+)\s*\)\s*=\s*(.+)", re.DOTALL)
_NAMED_ITEM_RE = re.compile(rf"\s*({_NAME})\s*=\s*([^=<>]+?)\s*")


def named_values(s: str) -> list[tuple[str, str]] | None:
    """'(x, y) = (1, 4)' or 'x = 1, y = 4' -> [('x', '1'), ('y', '4')]: an answer that names each of its
    values (Math-Verify unwraps an assignment whose left side is only symbols); None otherwise, also for
    'x = 2, x = 3' (one unknown's solutions are a list, not names)."""
    s = re.sub(r"\\left|\\right|\$", "", s).strip()
    if len(s) > 300:
        return None
    m = _NAMED_TUPLE_RE.fullmatch(s)
    if m:
        names = [n.strip() for n in m.group(1).split(",")]
        w = _wrapped(m.group(2).strip())
        values = split_top(w[1], ",") if w and w[0] == "(" else []
        pairs = list(zip(names, (v.strip() for v in values)))
    else:
        items = [
            i for part in split_top(s, ",") for i in re.split(r"\s+(?:and|\\text\{\s*and\s*\})\s+", part)
        ]
        matches = [_NAMED_ITEM_RE.fullmatch(i) for i in items]
        if len(items) < 2 or not all(matches):
            return None
        pairs = [(mm.group(1), mm.group(2)) for mm in matches]
        values = [v for _, v in pairs]
    names = [n for n, _ in pairs]
    if len(names) != len(values) or len(set(names)) != len(names) or not all(v for _, v in pairs):
        return None
    if not m and len({re.sub(r"_.*", "", n) for n in names}) == 1:
        return None  # 'x_1 = 3, x_2 = 5': the roots of one unknown, a list in any order
    return pairs


def _labelled_forms(pred: str, gold: str) -> tuple[str, str]:
    """A label on one side, or the same label on both, is dropped: '|AB|=1' states 1. Two different labels
    are left to the rules after this one ('x = 3' is not 'y = 3')."""
    pl, gl = forms.label_value(pred), forms.label_value(gold)
    if pl and gl:
        return (pl[1], gl[1]) if pl[0].lower() == gl[0].lower() else (pred, gold)
    if pl and "=" not in gold:
        return pl[1], gold
    if gl and "=" not in pred:
        return pred, gl[1]
    return pred, gold


def _named_forms(pred: str, gold: str) -> bool | tuple[str, str]:
    """Named answers compare value by name ('y = 4, x = 1' is '(x, y) = (1, 4)'); a named side against a
    plain tuple compares in the named side's order."""
    pn, gn = named_values(pred), named_values(gold)
    if pn is None and gn is None:
        return pred, gold
    if pn is not None and gn is not None:
        pd, gd = dict(pn), dict(gn)
        if set(pd) != set(gd):
            return False
        return "(" + ", ".join(pd[n] for n, _ in gn) + ")", "(" + ", ".join(v for _, v in gn) + ")"
    if pn is not None:
        return "(" + ", ".join(v for _, v in pn) + ")", gold
    return pred, "(" + ", ".join(v for _, v in gn) + ")"


def answer_forms(pred: str, gold: str) -> bool | tuple[str, str]:
    """Rules decided on the raw answers: a verdict, or the (pred, gold) to compare from here on.

    Clock times and numbers in other bases compare by value; a choice letter by letter (a gold '(B) 12'
    also accepts its text); named values by name ('(x, y) = (1, 4)'); two quantities with units convert to one unit; a degree answer against a
    radian one (with pi) is converted; 'x = 3' against 'y = 3' names a different unknown.
    """
    for rule in (forms.clock_equal, forms.based_equal):
        verdict = rule(pred, gold)
        if verdict is not None:
            return verdict
    g_choice, p_choice = forms.choice(gold), forms.choice(pred)
    lone = re.fullmatch(r"\s*\(?([a-e])\)?\.?\s*", pred)  # 'c' alone is the choice C (Qwen, Math-Verify)
    if g_choice is not None and p_choice is None and lone:
        return lone.group(1).upper() == g_choice.letter
    if g_choice is not None:
        if p_choice is not None:
            return p_choice.letter == g_choice.letter
        if not g_choice.text:
            return _pred_choice(normalize_answer(pred)) == g_choice.letter
        gold = g_choice.text
    elif p_choice is not None and p_choice.text:
        pred = p_choice.text
    named = _named_forms(pred, gold)
    if isinstance(named, bool):
        return named
    pred, gold = _labelled_forms(*named)
    p_name, g_name = _lhs_name(pred), _lhs_name(gold)
    if p_name and g_name and p_name.lower() != g_name.lower():
        return False
    pq, gq = forms.quantity(pred), forms.quantity(gold)
    if pq is not None and gq is not None:
        if pq[1] != gq[1]:
            return False
        value_text = normalize_answer(pq[0])
        pn, factor = quick_number(value_text) or forms.decimal_comma(value_text), pq[2] / gq[2]
        if factor == 1:
            pred = pq[0]
        elif pn is not None:
            value = pn * factor
            pred = f"{value.numerator}/{value.denominator}" if value.denominator != 1 else str(value)
        else:
            pred = f"({pq[0]})\\cdot\\frac{{{factor.numerator}}}{{{factor.denominator}}}"
        gold = gq[0]
    p_deg, g_deg = bool(_DEGREE_RE.search(pred)), bool(_DEGREE_RE.search(gold))
    if p_deg != g_deg:
        deg, other = (pred, gold) if p_deg else (gold, pred)
        if "\\pi" in other or "π" in other:
            radians = f"\\frac{{({normalize_answer(deg)})\\pi}}{{180}}"
            pred, gold = (radians, gold) if p_deg else (pred, radians)
    return pred, gold


def quick_equiv(pred: str, gold: str, ordered: bool = False) -> bool | None:
    """Decide without sympy when possible (equal strings, plain numbers, choices, words); None = undecided."""
    prepared = answer_forms(pred, gold)
    if isinstance(prepared, bool):
        return prepared
    pred, gold = prepared
    p, g = normalize_answer(pred), normalize_answer(gold)
    if p == g or p.lower() == g.lower():
        return True
    if not p or not g:
        return False
    pn, gn = quick_number(p), quick_number(g)
    if gn is not None and pn is None:
        pn = forms.decimal_comma(p)  # '3,5' against the single number 3.5 (or 7/2): a decimal comma
    elif pn is not None and gn is None:
        gn = forms.decimal_comma(g)
    if pn is not None and gn is not None:
        pw, gw = written_number(pred), written_number(gold)
        pw, gw = (pw, gw) if literal_decimals(pw) and literal_decimals(gw) else (p, g)
        return numbers_match(pn, gn, _percent(pred, gold), _pred_finer(pw, gw), _same_precision(pw, gw))
    if re.fullmatch(r"[A-Za-z]{4,}", p) and re.fullmatch(r"[A-Za-z]{4,}", g):
        return False
    return None


# ---------------------------------------------------------------------------------------------------
# structure: lists, tuples, intervals, sets, matrices, equations
# ---------------------------------------------------------------------------------------------------
_OPEN, _CLOSE = "([{", ")]}"


def split_top(s: str, sep: str) -> list[str]:
    """Split on `sep` outside any brackets (bracket types are not matched, so '[0,1)' nests fine)."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        c = s[i]
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
        elif depth == 0 and s.startswith(sep, i):
            parts.append(s[start:i])
            i += len(sep)
            start = i
            continue
        i += 1
    parts.append(s[start:])
    return parts


def _wrapped(s: str) -> tuple[str, str, str] | None:
    """(open, inner, close) when one bracket pair encloses the whole string."""
    if len(s) < 2 or s[0] not in "([{" or s[-1] not in ")]}":
        return None
    depth = 0
    for i, c in enumerate(s):
        depth += c in _OPEN
        depth -= c in _CLOSE
        if depth == 0 and i < len(s) - 1:
            return None
    return s[0], s[1:-1], s[-1]


def _expand_pm(items: list[str]) -> list[str]:
    out = []
    for item in items:
        if item.count("\\pm") == 1 or item.count("\\mp") == 1:
            out += [
                item.replace("\\pm", "+").replace("\\mp", "-"),
                item.replace("\\pm", "-").replace("\\mp", "+"),
            ]
        else:
            out.append(item)
    return [re.sub(r"^\+-|^-\+", "-", o).lstrip("+") or o for o in out]


def _strip_name(item: str) -> str:
    """'x=1' -> '1' inside lists ('x=1, y=2')."""
    m = re.fullmatch(r"(?:[a-zA-Z](?:_\{?\w+\}?)?|\\[a-zA-Z]+)=(.+)", item)
    return m.group(1) if m else item


def _is_chain(s: str) -> bool:
    return len(re.findall(r"<|>|\\le|\\ge", s)) > 1


def _interval_from_inequality(s: str) -> str | None:
    """'x>3' -> '(3,\\infty)', '-1\\lex<2' -> '[-1,2)'; None when s is not a simple inequality."""
    s = s.replace(" ", "")
    rel = r"(<|>|\\le|\\ge|\\leqslant|\\geqslant)"
    m = re.fullmatch(rf"(.+?){rel}([a-zA-Z](?:\([a-z]\))?){rel}(.+)", s)  # '0<f(x)<1' too
    less = ("<", "\\le", "\\leqslant")
    if m and (m.group(2) in less) == (m.group(4) in less) and "=" not in s:
        lo, hi = (m.group(1), m.group(5)) if m.group(2) in ("<", "\\le") else (m.group(5), m.group(1))
        strict_lo, strict_hi = (m.group(2) in "<>"), (m.group(4) in "<>")
        if m.group(2) not in ("<", "\\le"):
            strict_lo, strict_hi = strict_hi, strict_lo
        return ("(" if strict_lo else "[") + f"{lo},{hi}" + (")" if strict_hi else "]")
    ne = re.fullmatch(r"([a-zA-Z])\\ne(.+)", s) or re.fullmatch(r"(.+?)\\ne([a-zA-Z])", s)
    if ne:
        v = ne.group(2) if len(ne.group(1)) == 1 and ne.group(1).isalpha() else ne.group(1)
        return f"(-\\infty,{v})\\cup({v},\\infty)"
    m = re.fullmatch(rf"([a-zA-Z]){rel}(.+)", s)
    flipped = re.fullmatch(rf"(.+?){rel}([a-zA-Z])", s) if not m else None
    if flipped:
        flip = {
            "<": ">",
            ">": "<",
            "\\le": "\\ge",
            "\\ge": "\\le",
            "\\leqslant": "\\ge",
            "\\geqslant": "\\le",
        }
        m = re.fullmatch(
            rf"([a-zA-Z]){rel}(.+)", f"{flipped.group(3)}{flip[flipped.group(2)]}{flipped.group(1)}"
        )
    if m:
        op, v = m.group(2), m.group(3)
        if op in (">", "\\ge", "\\geqslant"):
            return ("(" if op == ">" else "[") + f"{v},\\infty)"
        return f"(-\\infty,{v}" + (")" if op == "<" else "]")
    return None


def _matrix_cells(s: str, env: str = "pmatrix") -> list[list[str]] | None:
    """Rows of cells of a matrix environment, or of a nested list '[[1,2],[3,4]]'."""
    m = re.fullmatch(rf"[(\[]?\\begin\{{{env}\}}(.*)\\end\{{{env}\}}[)\]]?", s)
    if not m:
        return _nested_list_cells(s) if env == "pmatrix" else None
    rows = [r for r in m.group(1).split("\\\\") if r.strip()]
    return [[c.strip() for c in split_top(r, "&")] for r in rows]


def _nested_list_cells(s: str) -> list[list[str]] | None:
    w = _wrapped(s)
    if not w or w[0] != "[" or w[2] != "]":
        return None
    rows = []
    for item in split_top(w[1], ","):
        inner = _wrapped(item)
        if not inner or inner[0] != "[" or inner[2] != "]":
            return None
        rows.append(split_top(inner[1], ","))
    return rows if rows and len({len(r) for r in rows}) == 1 else None


MAX_DETERMINANT_SIZE = 4


def determinant_text(s: str) -> str | None:
    """A vmatrix is a determinant: its Laplace expansion as an expression (up to 4x4), else None."""
    cells = _matrix_cells(s, "vmatrix")
    if not cells or len(cells) > MAX_DETERMINANT_SIZE or any(len(r) != len(cells) for r in cells):
        return None

    def det(rows: list[list[str]]) -> str:
        if len(rows) == 1:
            return f"({rows[0][0]})"
        terms = []
        for j, cell in enumerate(rows[0]):
            minor = [r[:j] + r[j + 1 :] for r in rows[1:]]
            terms.append(("-" if j % 2 else "+") + f"({cell})*{det(minor)}")
        return "(" + "".join(terms) + ")"

    return det(cells)


def _union_parts(s: str) -> list[str]:
    """'A\\cupB' -> [A, B]; a list of inequalities ('x<-1,x>1') or 'x\\ne0' is the union of their intervals."""
    parts = split_top(s, "\\cup")
    if len(parts) > 1:
        return parts
    items = split_top(s, ",")
    intervals = [_interval_from_inequality(i) for i in items]
    if all(intervals) and (len(items) > 1 or "\\cup" in (intervals[0] or "")):
        return [part for i in intervals for part in split_top(i, "\\cup")]
    return parts


class Comparer:
    """Full recursive comparison of two normalised answers; scalars go to `scalar_eq` (sympy)."""

    def __init__(
        self,
        scalar_eq: Callable[[str, str, Percent, int | None], bool],
        percent: Percent,
        ordered: bool = False,
    ):
        self.scalar_eq = scalar_eq
        self.percent = percent
        self.ordered = ordered

    def equal(self, p: str, g: str, depth: int = 0) -> bool:
        if p == g or p.lower() == g.lower():
            return True
        if depth > 6 or not p or not g:
            return False
        p, g = determinant_text(p) or p, determinant_text(g) or g
        for handler in (self._matrix, self._union, self._sequence):
            verdict = handler(p, g, depth)
            if verdict is not None:
                return verdict
        return self._scalar(p, g, depth)

    def _matrix(self, p: str, g: str, depth: int) -> bool | None:
        pm, gm = _matrix_cells(p), _matrix_cells(g)
        if pm is None and gm is None:
            return None
        if pm is None or gm is None:
            cells, other = (pm or gm), (g if pm is not None else p)
            flat = [c for row in cells for c in row]
            if len(cells[0]) != 1 and len(cells) != 1:
                return False
            w = _wrapped(other)
            items = split_top(w[1] if w else other, ",")
            return len(items) == len(flat) and all(self.equal(a, b, depth + 1) for a, b in zip(flat, items))
        if [len(r) for r in pm] != [len(r) for r in gm]:
            return False
        return all(self.equal(a, b, depth + 1) for ra, rb in zip(pm, gm) for a, b in zip(ra, rb))

    def _union(self, p: str, g: str, depth: int) -> bool | None:
        if "\\cup" not in p + g and not ("\\ne" in p + g and "=" not in p + g):
            return None
        pu, gu = _union_parts(p), _union_parts(g)
        if len(pu) == 1 and len(gu) == 1:
            return None
        return self._unordered(pu, gu, depth)

    def _items(self, s: str) -> tuple[str, list[str]]:
        """('bare'|'()'|'[]'|'[)'|'(]'|'{}'|'scalar', items)."""
        w = _wrapped(s)
        if w:
            items = split_top(w[1], ",")
            if len(items) > 1 or w[0] == "{":
                return w[0] + w[2], _expand_pm([_strip_name(x) for x in items if x != ""])
        items = split_top(s, ",")
        if len(items) > 1:
            return "bare", _expand_pm([_strip_name(x) for x in items if x != ""])
        items = _expand_pm([s])
        return ("bare", items) if len(items) > 1 else ("scalar", items)

    def _sequence(self, p: str, g: str, depth: int) -> bool | None:
        pk, pi = self._items(p)
        gk, gi = self._items(g)
        if pk == "scalar" and gk == "scalar":
            return None
        if pk == "scalar" or gk == "scalar":
            pi_i, gi_i = _interval_from_inequality(p), _interval_from_inequality(g)
            if pi_i or gi_i:
                return self.equal(pi_i or p, gi_i or g, depth + 1)
            if gk == "{}" and len(gi) == 1 or pk == "{}" and len(pi) == 1:
                return self.equal(pi[0], gi[0], depth + 1)
            return False
        if len(pi) != len(gi):
            return False
        unordered = {"bare", "{}"}
        if pk in unordered and gk in unordered and not self.ordered:
            return self._unordered(pi, gi, depth)
        if pk in unordered and gk in unordered:
            return all(self.equal(a, b, depth + 1) for a, b in zip(pi, gi))
        if pk != gk and not ({pk, gk} == {"bare", "()"}):
            return False
        return all(self.equal(a, b, depth + 1) for a, b in zip(pi, gi))

    def _unordered(self, ps: list[str], gs: list[str], depth: int) -> bool:
        if len(ps) != len(gs):
            return False
        remaining = list(gs)
        for a in ps:
            hit = next((j for j, b in enumerate(remaining) if self.equal(a, b, depth + 1)), None)
            if hit is None:
                return False
            remaining.pop(hit)
        return True

    def _scalar(self, p: str, g: str, depth: int) -> bool:
        pn, gn = quick_number(p), quick_number(g)
        if pn is not None and gn is not None:  # list items, interval ends: no sympy for plain numbers
            return numbers_match(pn, gn, self.percent, _pred_finer(p, g), _same_precision(p, g))
        if relation(reduce_chain(p)) and relation(reduce_chain(g)) and not (_is_chain(p) or _is_chain(g)):
            return self.scalar_eq(p, g, self.percent, None)
        pi_i, gi_i = _interval_from_inequality(p), _interval_from_inequality(g)
        if (pi_i is None) != (gi_i is None):
            return self.equal(pi_i or p, gi_i or g, depth + 1)
        if pi_i is not None and gi_i is not None and self.equal(pi_i, gi_i, depth + 1):
            return True
        pl, gl = _choice_or_text(p), _choice_or_text(g)
        if pl is not None and gl is not None:
            return pl == gl
        return self.scalar_eq(p, g, self.percent, _pred_finer(p, g))


def _choice_or_text(s: str) -> str | None:
    """Lower-cased plain words ('yes', 'Evelyn', 'no solution'), which sympy should not see."""
    return s.lower() if re.fullmatch(r"[A-Za-z][A-Za-z' ]{2,}", s) else None


def structural_equiv(
    pred: str, gold: str, scalar_eq: Callable[[str, str, Percent, int | None], bool], ordered: bool = False
) -> bool:
    """Normalise both sides, then compare structure (lists/intervals/sets/matrices) and scalars."""
    p, g = normalize_answer(pred, strip_var=False), normalize_answer(gold, strip_var=False)
    return Comparer(scalar_eq, _percent(pred, gold), ordered).equal(p, g)


# ---------------------------------------------------------------------------------------------------
# sympy scalars (worker side)
# ---------------------------------------------------------------------------------------------------
_NAME_RE = re.compile(r"(?:[a-zA-Z](?:_\{?\w+\}?)?|\\[a-zA-Z]+|[a-zA-Z]\([a-z]\))")
_REL_OPS = ("\\le", "\\ge", "\\ne", "<", ">", "=")


def is_name(s: str) -> bool:
    """A variable-like left-hand side: 'x', 'k', 'a_1', '\\theta', 'f(x)'."""
    return _NAME_RE.fullmatch(s.strip()) is not None


def reduce_chain(s: str) -> str:
    """'x=5+5+1=11' -> 'x=11', '1=y=0' -> '0', 'x\\approx 11' -> '11', '1/3\\approx0.33' -> '1/3'."""
    parts = split_top(s, "\\approx")
    if len(parts) > 1:
        s = parts[-1] if is_name(parts[0]) else parts[0]
    eq = split_top(s, "=")
    if len(eq) > 2:
        s = f"{eq[0]}={eq[-1]}" if is_name(eq[0]) else eq[-1]
    return s


def relation(s: str) -> tuple[str, str, str] | None:
    """(op, lhs, rhs) for one top-level relation (=, <, >, \\le, \\ge, \\ne), else None."""
    found = None
    for op in _REL_OPS:
        parts = split_top(s, op)
        if len(parts) == 2 and (op != "=" or not re.search(r"\\[lgn]e$", parts[0])):
            if found is not None:
                return None
            found = (op, parts[0], parts[1])
        elif len(parts) > 2:
            return None
    if found and found[0] in ("<", ">") and ("\\le" in s or "\\ge" in s):
        return None
    return found


def sympy_scalar_eq(p: str, g: str, percent: Percent, decimals: int | None = None) -> bool:
    """Scalars, equations, inequalities via the safe parser; numbers within REL_TOL, symbols via points."""
    import sympy

    from math_grader.parse import ParseError, parse_math

    p, g = reduce_chain(p), reduce_chain(g)
    pr, gr = relation(p), relation(g)
    if (pr is None) != (gr is None):
        rel, other = (pr, g) if pr else (gr, p)
        if rel[0] != "=" or not is_name(rel[1]):
            return False
        p, g = (rel[2], other) if pr else (other, rel[2])
        pr = gr = None
    symbols: dict[str, sympy.Symbol] = {}
    try:
        if pr and gr:
            return _relations_equal(pr, gr, lambda t: parse_math(t, symbols))
        a, b = parse_math(p, symbols), parse_math(g, symbols)
    except ParseError:
        return False
    return expr_equal(a, b, percent, decimals)


def _relations_equal(pr: tuple[str, str, str], gr: tuple[str, str, str], parse: Callable) -> bool:
    """Equations up to a nonzero factor; inequalities up to a positive factor (x<1 == -x>-1)."""
    pk, pd = _canonical(pr, parse)
    gk, gd = _canonical(gr, parse)
    if pk != gk:
        return False
    ratio = _constant_ratio(pd, gd)
    if ratio is None or abs(ratio) < 1e-12:
        return False
    return pk in ("=", "ne") or (abs(ratio.imag) < 1e-9 and ratio.real > 0)


def _canonical(rel: tuple[str, str, str], parse: Callable) -> tuple[str, object]:
    op, lhs, rhs = rel
    left, right = parse(lhs), parse(rhs)
    if op in ("<", "\\le"):
        return ("strict" if op == "<" else "weak"), right - left
    if op in (">", "\\ge"):
        return ("strict" if op == ">" else "weak"), left - right
    return ("=" if op == "=" else "ne"), left - right


def _to_complex(x: object) -> complex | None:
    import sympy

    try:
        v = complex(sympy.N(x, 20))
    except (TypeError, ValueError, OverflowError, ZeroDivisionError, AttributeError):
        return None
    return v if math.isfinite(v.real) and math.isfinite(v.imag) else None


def _points(symbols: set, n: int = 4) -> list[dict]:
    rng = random.Random(1234)
    ordered = sorted(symbols, key=lambda s: s.name)
    return [{s: rng.uniform(0.3, 2.7) for s in ordered} for _ in range(n)]


def expr_equal(a: object, b: object, percent: Percent = (False, False), decimals: int | None = None) -> bool:
    """sympy equality: exact, numeric (REL_TOL, percent variants), random-point test, then simplify."""
    import sympy

    if a == b:
        return True
    if a.has(sympy.oo, -sympy.oo, sympy.zoo) or b.has(sympy.oo, -sympy.oo, sympy.zoo):
        return sympy.simplify(a - b) == 0 if not (a.is_number and b.is_number) else False
    syms = a.free_symbols | b.free_symbols
    if not syms:
        va, vb = _to_complex(a), _to_complex(b)
        if va is None or vb is None:
            return False
        return numbers_match(va, vb, percent, decimals)
    verdict = _random_point_test(a, b, syms)
    if verdict is not None:
        return verdict
    return sympy.simplify(a - b) == 0


def _random_point_test(a: object, b: object, syms: set) -> bool | None:
    good = 0
    for point in _points(syms):
        va, vb = _to_complex(a.subs(point)), _to_complex(b.subs(point))
        if va is None or vb is None:
            continue
        if not numbers_close(va, vb, 1e-6):
            return False
        good += 1
    return True if good >= 2 else None


def _constant_ratio(dp: object, dg: object) -> complex | None:
    """dp/dg when it is the same constant at every sample point (None otherwise)."""
    if expr_equal(dp, dg):
        return 1 + 0j
    if expr_equal(dp, -dg):
        return -1 + 0j
    syms = dp.free_symbols | dg.free_symbols
    if not syms:
        va, vb = _to_complex(dp), _to_complex(dg)
        return va / vb if va is not None and vb and abs(vb) > 1e-12 else None
    ratios = []
    for point in _points(syms):
        va, vb = _to_complex(dp.subs(point)), _to_complex(dg.subs(point))
        if va is None or vb is None or abs(vb) < 1e-12 or abs(va) < 1e-12:
            continue
        ratios.append(va / vb)
    if len(ratios) >= 2 and all(numbers_close(r, ratios[0], 1e-6) for r in ratios):
        return ratios[0]
    return None


def full_equiv(pred: str, gold: str, ordered: bool = False) -> bool:
    """Everything: cheap checks, then structure and sympy (call under a time limit)."""
    quick = quick_equiv(pred, gold, ordered)
    if quick is not None:
        return quick
    prepared = answer_forms(pred, gold)
    if isinstance(prepared, bool):
        return prepared
    return structural_equiv(*prepared, sympy_scalar_eq, ordered)


__all__ = ["full_equiv", "quick_equiv", "quick_number", "match_brace", "numbers_match"]
