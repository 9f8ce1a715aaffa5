"""Answer extraction used to build gold answers (minerva) and to grade calibration runs.

The rule mirrors the project's grader: the content of the LAST ``\\boxed{...}`` (brace-matched, so
``\\boxed{\\frac{1}{2}}`` works), or else the last number in the text.
"""

from __future__ import annotations

import re

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def last_boxed(text: str) -> str | None:
    """Content of the last closed ``\\boxed{...}`` (or ``\\fbox{...}``), nested braces matched; None if absent."""
    for match in reversed(list(_BOXED.finditer(text))):
        depth = 1
        for j in range(match.end(), len(text)):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    return text[match.end() : j].strip()
    return None


def last_number(text: str) -> str | None:
    """The last number in ``text`` with thousands separators removed; None if there is none."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "").rstrip(".") if found else None


def extract_answer(text: str) -> str | None:
    """The grader's final answer: last boxed content if any, else the last number."""
    boxed = last_boxed(text)
    return boxed if boxed is not None else last_number(text)


def as_integer(answer: str | None) -> int | None:
    """Parse "42", "1,000", "42.0", "$42$" or "42." as an integer; None for anything else."""
    if answer is None:
        return None
    cleaned = re.sub(r"[\s,$]", "", answer).rstrip(".")
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return int(value) if value.is_integer() else None
