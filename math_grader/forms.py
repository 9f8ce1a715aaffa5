"""Answer forms whose meaning is not plain arithmetic: locale-written numbers, numbers in other bases, clock
times, quantities with units, multiple-choice letters. Each parser reads a raw answer (before
`normalize_answer`) and returns a canonical value or None; `equiv` compares the values.

Conventions (the tests in tests/grader_cases/ spell them out per family):
- numbers: thousands may be grouped by ',' (1,000 and Indian 1,00,000), '.' (only with several groups or a
  decimal comma: 1.000.000, 1.234,5), spaces (also no-break/thin), apostrophes (1'000); a single '.' is
  always a decimal point; a lone ',' with digits after it is a decimal comma only when the other answer
  is a single number (`decimal_comma`); a ',' followed by a space separates list items ('12, 345').
- bases: 1011_2, 1011_{(2)}, 1011_{\\text{two}}, 0x2A, 0b1011. The same digits with or without the base
  match; two answers with explicit bases match when their values agree.
- clock times: h:mm with optional AM/PM; 12 AM is midnight; an answer without AM/PM and below 13:00
  matches either half of the day.
- units: a unit on both sides converts within its kind (km/m, h/min, kg/g, L/mL, ft/in); a unit on one
  side only is dropped by normalisation, since the question fixed the unit, whichever side carries it.
- choices: '(B)', 'B)', 'B.', 'option B', 'B Paris' (a letter and its option text) are the letter B; a
  marked letter (B', B^*) is another label.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

_SPACES = "\u00a0\u2009\u202f\u2007\u2008\u200a"
_SPACE_RE = re.compile(f"[{_SPACES}]")


def unify_spaces(s: str) -> str:
    """No-break, thin and narrow spaces become plain spaces."""
    return _SPACE_RE.sub(" ", s)


# ---------------------------------------------------------------------------------------------------
# numbers written with locale separators
# ---------------------------------------------------------------------------------------------------
# the first group of a grouped number never starts with 0: '0,111' is a decimal comma, not 111
_LEAD = r"[1-9]\d{0,2}"
_LOCALE_NUMBER_RES = (
    (re.compile(rf"(-?)({_LEAD}(?:,\d{{3}})+)(\.\d+)?"), ","),  # 1,234,567.5
    (re.compile(r"(-?)([1-9]\d?(?:,\d{2})+,\d{3})(\.\d+)?"), ","),  # Indian 12,34,567
    (re.compile(rf"(-?)({_LEAD}(?:\.\d{{3}}){{2,}})(,\d+)?"), "."),  # 1.234.567,5
    (re.compile(rf"(-?)({_LEAD}(?:\.\d{{3}})+)(,\d+)"), "."),  # 1.234,5
    (re.compile(rf"(-?)({_LEAD}(?:'\d{{3}})+)(\.\d+)?"), "'"),  # 1'234'567.5
    (re.compile(rf"(-?)({_LEAD}(?: \d{{3}})+)([.,]\d+)?"), " "),  # 1 234 567,5
)


def plain_number(s: str) -> str | None:
    """'1.234,5' -> '1234.5', "1'000" -> '1000', '1,00,000' -> '100000'; None unless s is such a number."""
    s = unify_spaces(s).replace("’", "'").replace("{,}", ",").strip()
    if len(s) > 60:
        return None
    for pattern, sep in _LOCALE_NUMBER_RES:
        m = pattern.fullmatch(s)
        if m:
            frac = (m.group(3) or "").replace(",", ".")
            return m.group(1) + m.group(2).replace(sep, "") + frac
    return None


_DECIMAL_COMMA_RE = re.compile(r"-?\d+,\d+")


def decimal_comma(s: str) -> Fraction | None:
    """'3,5' read as 3.5 (call only when the other answer is a single decimal number)."""
    s = s.strip()
    if not _DECIMAL_COMMA_RE.fullmatch(s) or len(s) > 40:
        return None
    return Fraction(s.replace(",", "."))


# ---------------------------------------------------------------------------------------------------
# numbers in other bases
# ---------------------------------------------------------------------------------------------------
_BASE_WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9}
_BASE_WORDS |= {"ten": 10, "twelve": 12, "sixteen": 16, "binary": 2, "octal": 8, "decimal": 10, "hex": 16}
_BASED_RE = re.compile(
    r"(?:\\(?:text|mathrm|mathtt|texttt)\{)?([0-9A-Za-z]{1,40})\}?"
    r"_\{?\(?(?:\\(?:text|mathrm)\{)?(\d{1,2}|[a-z]+)\}?\)?\}?"
)
_PREFIXED_RE = re.compile(r"0([xbo])([0-9A-Fa-f]{1,40})")


@dataclass(frozen=True)
class BasedNumber:
    digits: str  # upper case, no leading zeros
    base: int | None  # None: written without a base

    @property
    def value(self) -> int | None:
        if self.base is None:
            return None
        return int(self.digits, self.base)


def _valid_digits(digits: str, base: int) -> bool:
    try:
        int(digits, base)
    except ValueError:
        return False
    return True


def based_number(s: str) -> BasedNumber | None:
    """'1011_2' -> BasedNumber('1011', 2), '0x2A' -> ('2A', 16), '2A' -> ('2A', None); else None."""
    s = s.replace(" ", "").replace("$", "")
    if len(s) > 80:
        return None
    m = _PREFIXED_RE.fullmatch(s)
    if m:
        base = {"x": 16, "b": 2, "o": 8}[m.group(1)]
        digits = m.group(2).upper()
        return BasedNumber(digits.lstrip("0") or "0", base) if _valid_digits(digits, base) else None
    m = _BASED_RE.fullmatch(s)
    if m:
        digits, base_text = m.group(1).upper(), m.group(2)
        base = int(base_text) if base_text.isdigit() else _BASE_WORDS.get(base_text)
        if base is None or not 2 <= base <= 36 or not _valid_digits(digits, base):
            return None
        if (
            not re.search(r"\d", digits) and m.group(1) != digits
        ):  # 'c_{16}' is a variable, 'FF_{16}' a number
            return None
        return BasedNumber(digits.lstrip("0") or "0", base)
    m = re.fullmatch(r"(?:\\(?:text|mathrm)\{)?([0-9A-F]{1,40})\}?", s)
    if m and re.search(r"\d", m.group(1)):
        return BasedNumber(m.group(1).lstrip("0") or "0", None)
    return None


def based_equal(pred: str, gold: str) -> bool | None:
    """Verdict when at least one side is written with an explicit base, else None."""
    p, g = based_number(pred), based_number(gold)
    if p is None or g is None or (p.base is None and g.base is None):
        return None
    if p.base is not None and g.base is not None:
        return p.value == g.value
    return p.digits == g.digits


# ---------------------------------------------------------------------------------------------------
# clock times
# ---------------------------------------------------------------------------------------------------
_CLOCK_RE = re.compile(r"(\d{1,2})(?::(\d{2}))?(?:\s*([ap])\.?\s*m\.?)?", re.IGNORECASE)
_TEXT_WRAP_RE = re.compile(r"\\(?:text|mathrm|textrm|mbox)\s*\{([^{}]*)\}")


@dataclass(frozen=True)
class ClockTime:
    minutes: int  # since midnight; for a time without AM/PM, the morning reading
    explicit: bool  # AM/PM given, or a 24-hour time (13:00, or a leading zero as in 09:05)


def clock_time(s: str) -> ClockTime | None:
    """'3:00 PM' -> 900 (explicit), '15:00' -> 900 (explicit), '9:05' -> 545 (not explicit); else None."""
    s = _TEXT_WRAP_RE.sub(r" \1 ", unify_spaces(s)).replace("\\,", " ").replace("\\ ", " ").replace("~", " ")
    s = s.replace("$", "").strip()
    if len(s) > 40:
        return None
    m = _CLOCK_RE.fullmatch(s)
    if not m or (m.group(2) is None and m.group(3) is None):
        return None
    hour, minute, half = int(m.group(1)), int(m.group(2) or 0), (m.group(3) or "").lower()
    if minute > 59:
        return None
    if half:
        if not 1 <= hour <= 12:
            return None
        return ClockTime((hour % 12 + (12 if half == "p" else 0)) * 60 + minute, True)
    if hour > 23:
        return None
    return ClockTime(hour * 60 + minute, hour >= 13 or m.group(1).startswith("0"))


def clock_equal(pred: str, gold: str) -> bool | None:
    """Verdict when both sides are clock times (an unmarked side matches either half of the day)."""
    p, g = clock_time(pred), clock_time(gold)
    if p is None or g is None:
        return None
    if p.explicit and g.explicit:
        return p.minutes == g.minutes
    return p.minutes % 720 == g.minutes % 720


# ---------------------------------------------------------------------------------------------------
# quantities with units
# ---------------------------------------------------------------------------------------------------
_UNITS: dict[str, tuple[str, Fraction]] = {}


def _add_units(kind: str, factor: Fraction | int, *names: str) -> None:
    for name in names:
        _UNITS[name] = (kind, Fraction(factor))


_add_units("length", 1000, "km", "kilometer", "kilometers", "kilometre", "kilometres")
_add_units("length", 1, "m", "meter", "meters", "metre", "metres")
_add_units("length", Fraction(1, 100), "cm", "centimeter", "centimeters", "centimetre", "centimetres")
_add_units("length", Fraction(1, 1000), "mm", "millimeter", "millimeters", "millimetre", "millimetres")
_add_units("length", Fraction(1609344, 1000), "mi", "mile", "miles")
_add_units("length", Fraction(9144, 10000), "yd", "yard", "yards")
_add_units("length", Fraction(3048, 10000), "ft", "foot", "feet")
_add_units("length", Fraction(254, 10000), "in", "inch", "inches")
_add_units("time", 86400, "day", "days")
_add_units("time", 3600, "h", "hr", "hrs", "hour", "hours")
_add_units("time", 60, "min", "mins", "minute", "minutes")
_add_units("time", 1, "s", "sec", "secs", "second", "seconds")
_add_units("mass", 1000, "kg", "kilogram", "kilograms")
_add_units("mass", 1, "g", "gram", "grams")
_add_units("mass", Fraction(1, 1000), "mg", "milligram", "milligrams")
_add_units("mass", Fraction(45359237, 100000), "lb", "lbs", "pound", "pounds")
_add_units("mass", Fraction(45359237, 1600000), "oz", "ounce", "ounces")
_add_units("volume", 1000, "l", "liter", "liters", "litre", "litres")
_add_units("volume", 1, "ml", "milliliter", "milliliters", "millilitre", "millilitres")

_QUANTITY_RE = re.compile(
    r"(.*?(?:\d|\}|\)|\\pi))\s*(?:\\[,;!: ]|~|\\quad)*\s*"
    r"(?:\\(?:text|mathrm|mbox|textnormal|textrm)\s*\{\s*~?\s*([A-Za-z]+)\s*\}|([A-Za-z]+))\.?"
)


def quantity(s: str) -> tuple[str, str, Fraction] | None:
    """'2 \\text{ km}' -> ('2', 'length', 1000): the value text, the unit's kind and its factor."""
    s = unify_spaces(s).replace("$", "").strip()
    if len(s) > 80:
        return None
    m = _QUANTITY_RE.fullmatch(s)
    if not m:
        return None
    unit = m.group(2) or m.group(3)
    found = _UNITS.get(unit) or _UNITS.get(unit.lower())
    if found is None or (unit.lower() == "in" and m.group(3)):  # '5 in' is too often a phrase
        return None
    return m.group(1).strip(), found[0], found[1]


# ---------------------------------------------------------------------------------------------------
# multiple choice
# ---------------------------------------------------------------------------------------------------
_CHOICE_RE = re.compile(
    r"(?:(?:option|choice|answer)\s*:?\s*)?"
    r"(?:\(([A-E])\)|\[([A-E])\]|([A-E])(?:[.):](?=\s|$|[^A-Za-z])|$|\s+(?=[A-Z][a-z]{2,})))\s*(.*)",
    re.IGNORECASE | re.DOTALL,
)
_CHOICE_WRAP_RE = re.compile(r"\\(?:text|textbf|mathrm|mathbf|textrm|mbox)\s*\{([^{}]*)\}")


@dataclass(frozen=True)
class Choice:
    letter: str
    text: str  # '' when only the letter is given


def choice(s: str) -> Choice | None:
    """'(B)', 'B)', 'B.', 'option B', '\\text{(B) } 12', '**B**', 'B Paris' -> Choice('B', text)."""
    s = _CHOICE_WRAP_RE.sub(r"\1", s).replace("**", "").replace("$", " ").strip()
    if len(s) > 300:
        return None
    m = _CHOICE_RE.fullmatch(s)
    if not m:
        return None
    letter = m.group(1) or m.group(2) or m.group(3)
    prefixed = re.match(r"(?:option|choice|answer)", s, re.IGNORECASE) is not None
    if not letter.isupper() and not prefixed:
        return None
    return Choice(letter.upper(), m.group(4).strip().rstrip(".").strip())


# ---------------------------------------------------------------------------------------------------
# labelled answers
# ---------------------------------------------------------------------------------------------------
# a label names the quantity an answer states: a length '|AB|', a segment 'AB', an angle '\\angle ABC', a
# function value 'f(x)' or 'P(A)', an indexed name 'S_{10}', a ratio 'V_{1}:V_{2}' or quotient of those
_LABEL_ATOM = (
    r"\|[A-Za-z]{1,4}\||[A-Z]{2,4}|(?:m\s*)?\\angle\s*[A-Z]{1,3}|\\overline\{[A-Z]{2}\}"
    r"|[a-zA-Z](?:_\{?\w{1,6}\}?)?(?:\([A-Za-z0-9]{1,3}\))?|\\[a-zA-Z]+"
)
_LABEL_RE = re.compile(
    rf"\s*((?:{_LABEL_ATOM})(?:\s*:\s*(?:{_LABEL_ATOM}))*"
    rf"|\\[dt]?frac\{{(?:{_LABEL_ATOM})\}}\{{(?:{_LABEL_ATOM})\}})\s*=\s*([^=<>]+?)\s*"
)


def label_value(s: str) -> tuple[str, str] | None:
    """'|AB| = 1' -> ('|AB|', '1'), 'V_{1}:V_{2}=11:21' -> ('V_1:V_2', '11:21'): an answer that names
    what it states (Math-Verify unwraps such an assignment). None for an equation whose left side computes
    something ('x+y=5', '2x-y=5'): that is the answer itself."""
    s = re.sub(r"\$", "", s)
    if len(s) > 300:
        return None
    m = _LABEL_RE.fullmatch(s)
    return (re.sub(r"\s|[{}]", "", m.group(1)), m.group(2)) if m else None
