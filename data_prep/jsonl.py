"""Line-numbered JSONL reading shared by the loaders, so every malformed input fails as ``FILE:LINE: what``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from data_prep.schema import DatasetError


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[str, int, dict]]:
    """Yield ``("FILE:LINE", line number, record)`` for each non-blank line; raise ``DatasetError`` on bad input."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"dataset not found: {path}")
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DatasetError(f"{where}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(record, dict):
                raise DatasetError(f"{where}: expected a JSON object, got {type(record).__name__}")
            yield where, lineno, record


def get_field(
    record: Mapping, names: str | tuple[str, ...], types: type | tuple[type, ...], where: str
) -> Any:
    """Return the first of ``names`` present in ``record``, checking its type; error if none is present."""
    names = (names,) if isinstance(names, str) else names
    types = types if isinstance(types, tuple) else (types,)
    for name in names:
        if name in record:
            value = record[name]
            # bool is an int subclass; a JSON true is never a valid number or id here.
            if isinstance(value, bool) or not isinstance(value, types):
                expected = " or ".join(t.__name__ for t in types)
                raise DatasetError(f"{where}: field '{name}' is {type(value).__name__}, expected {expected}")
            return value
    expected = f"expected one of: {', '.join(names)}" if len(names) > 1 else "required"
    raise DatasetError(f"{where}: field '{names[0]}' missing ({expected})")


def get_optional(record: Mapping, name: str, types: type | tuple[type, ...], where: str) -> Any:
    """Like ``get_field`` for a single optional field: ``None`` when absent or JSON null."""
    if record.get(name) is None:
        return None
    return get_field(record, name, types, where)
