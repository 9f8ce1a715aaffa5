"""JSON lines a user or a crash can damage, read by the samples viewer (analysis/view_sources.py,
analysis/sample_index.py): a bad line is one problem naming its line (and field), never an exception,
and what goes back to the page is valid JSON.

Python's parser accepts what a browser's rejects (bare NaN and Infinity) and raises RecursionError on
deeply nested input; records nested deeper than MAX_DEPTH are refused here so that writing them out
later (json.dumps, itself recursive) cannot fail either.
"""

from __future__ import annotations

import json
import math

MAX_DEPTH = 32  # records nest 3-4 levels (record -> responses -> response -> value)


def _kind(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number"
    )


def describe(value) -> str:
    """`value` for a one-line message: its JSON kind and a short repr."""
    text = repr(value)
    return f"{_kind(value)} ({text[:40]}{'...' if len(text) > 40 else ''})"


def too_deep(value, limit: int = MAX_DEPTH) -> str | None:
    """The top-level field under which `value` nests deeper than `limit` levels (None: it does not)."""
    todo = [(v, 2, k) for k, v in value.items()] if isinstance(value, dict) else [(value, 1, None)]
    while todo:
        v, depth, field = todo.pop()
        if depth > limit:
            return field or "(the record)"
        if isinstance(v, dict):
            todo += [(x, depth + 1, field) for x in v.values()]
        elif isinstance(v, list):
            todo += [(x, depth + 1, field) for x in v]
    return None


def parse_line(line: str | bytes) -> tuple[object, str | None]:
    """(the parsed value, None), or (None, why it is not JSON) for a line that is not (or nests too deep)."""
    try:
        value = json.loads(line)
    except RecursionError:
        return None, f"is nested deeper than {MAX_DEPTH} levels"
    except ValueError as exc:  # JSONDecodeError, and bytes that are not UTF-8
        msg = getattr(exc, "msg", None)
        where = f" at column {exc.colno}" if msg else ""
        return None, f"is not JSON ({msg or str(exc)[:80]}{where})"
    field = too_deep(value)
    if field is not None:
        return None, f"field {field!r} is nested deeper than {MAX_DEPTH} levels"
    return value, None


def json_safe(value):
    """`value` with every NaN / Infinity / -Infinity float replaced by the string "NaN" / "Infinity" /
    "-Infinity" (what the page shows), so that `json.dumps` writes JSON a browser parses. Iterative:
    any depth."""
    if isinstance(value, float):
        return value if math.isfinite(value) else _name(value)
    if not isinstance(value, (dict, list, tuple)):
        return value
    root: list = [value]
    todo = [(root, 0)]
    while todo:
        parent, key = todo.pop()
        v = parent[key]
        if isinstance(v, float) and not math.isfinite(v):
            parent[key] = _name(v)
        elif isinstance(v, dict):
            copy = dict(v)
            parent[key] = copy
            todo += [(copy, k) for k in copy]
        elif isinstance(v, (list, tuple)):
            copy = list(v)
            parent[key] = copy
            todo += [(copy, i) for i in range(len(copy))]
    return root[0]


def _name(x: float) -> str:
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")
