"""The one row schema every dataset in this repo uses, and Parquet I/O that enforces it.

A dataset is a Parquet file whose rows have exactly these four columns:

- ``data_source: str`` -- where the row comes from ("arithmetic", "gsm8k", "math500", "wildchat", ...);
  reward functions dispatch on it.
- ``prompt: list[{"role": str, "content": str}]`` -- chat messages fed to the policy's chat template;
  roles are "system", "user", "assistant" or "tool" (a tool's result, in multi-turn SFT traces); at least
  one message.
- ``ground_truth: str`` -- the gold answer as text; "" when there is none (open-ended chat).
- ``extra_info: str`` -- a JSON object encoded as a string (id, split, difficulty, subject, level, ...).
  It is a string, not a struct, so datasets with different metadata keys share one Parquet schema.

``read_parquet`` returns ``list[dict]`` (not a DataFrame): ``prompt`` stays a list of plain dicts,
whereas pandas would turn it into numpy object arrays that chat templates do not accept.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

FIELDS: tuple[str, ...] = ("data_source", "prompt", "ground_truth", "extra_info")
ROLES: frozenset[str] = frozenset(
    {"system", "user", "assistant", "tool"}
)  # tool: a result in a multi-turn trace

# the chat prompt column, shared by the prompt, SFT and preference files
PROMPT_FIELD = pa.field(
    "prompt",
    pa.list_(pa.struct([pa.field("role", pa.string()), pa.field("content", pa.string())])),
    nullable=False,
)
ARROW_SCHEMA = pa.schema(
    [
        pa.field("data_source", pa.string(), nullable=False),
        PROMPT_FIELD,
        pa.field("ground_truth", pa.string(), nullable=False),
        pa.field("extra_info", pa.string(), nullable=False),
    ]
)

DEFAULT_HINT = "python -m data_prep.arithmetic --out DIR, or python -m data_prep.math_jsonl"


class DatasetError(ValueError):
    """A dataset file or row is missing or malformed; the message is one line naming where and what."""


def _type_name(value: Any) -> str:
    return type(value).__name__


def make_row(data_source: str, prompt: list[dict[str, str]], ground_truth: str, extra_info: Mapping) -> dict:
    """Build a schema row; ``extra_info`` is given as a mapping and stored as compact JSON."""
    return {
        "data_source": data_source,
        "prompt": [{"role": m["role"], "content": m["content"]} for m in prompt],
        "ground_truth": ground_truth,
        "extra_info": json.dumps(dict(extra_info), ensure_ascii=False, sort_keys=True),
    }


def extra_info_of(row: Mapping) -> dict:
    """Decode a row's ``extra_info`` JSON string."""
    return json.loads(row["extra_info"])


def validate_row(row: Any, where: str) -> None:
    """Raise ``DatasetError("WHERE: what is wrong")`` unless ``row`` matches the schema exactly."""
    if not isinstance(row, Mapping):
        raise DatasetError(
            f"{where}: row is a {_type_name(row)}, expected a dict with fields {', '.join(FIELDS)}"
        )
    for name in FIELDS:
        if name not in row:
            raise DatasetError(f"{where}: field '{name}' missing (expected fields: {', '.join(FIELDS)})")
    unexpected = sorted(str(k) for k in row if k not in FIELDS)
    if unexpected:
        raise DatasetError(
            f"{where}: unexpected field(s) {', '.join(unexpected)} (expected: {', '.join(FIELDS)})"
        )
    for name in ("data_source", "ground_truth", "extra_info"):
        if not isinstance(row[name], str):
            raise DatasetError(f"{where}: field '{name}' is a {_type_name(row[name])}, expected str")
    if not row["data_source"]:
        raise DatasetError(f"{where}: field 'data_source' is empty")
    _validate_prompt(row["prompt"], where)
    try:
        info = json.loads(row["extra_info"])
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{where}: field 'extra_info' is not valid JSON ({exc.msg})") from None
    if not isinstance(info, dict):
        raise DatasetError(
            f"{where}: field 'extra_info' encodes a {_type_name(info)}, expected a JSON object"
        )


def _validate_prompt(prompt: Any, where: str) -> None:
    if not isinstance(prompt, list):
        raise DatasetError(f"{where}: field 'prompt' is a {_type_name(prompt)}, expected a list of messages")
    if not prompt:
        raise DatasetError(f"{where}: field 'prompt' is an empty list, expected at least one message")
    for i, msg in enumerate(prompt):
        if not isinstance(msg, Mapping) or set(msg) != {"role", "content"}:
            got = sorted(msg) if isinstance(msg, Mapping) else _type_name(msg)
            raise DatasetError(f"{where}: prompt[{i}] must be a dict with keys role, content (got {got})")
        if msg["role"] not in ROLES:
            raise DatasetError(
                f"{where}: prompt[{i}] has role {msg['role']!r}, expected one of {sorted(ROLES)}"
            )
        if not isinstance(msg["content"], str):
            raise DatasetError(
                f"{where}: prompt[{i}] content is a {_type_name(msg['content'])}, expected str"
            )


def write_parquet(rows: Iterable[Mapping], path: str | os.PathLike) -> Path:
    """Validate every row, then write them atomically (temp file + rename) so readers never see half a file."""
    path = Path(path)
    rows = list(rows)
    for i, row in enumerate(rows):
        validate_row(row, f"{path}: row {i}")
    table = pa.Table.from_pylist([{k: row[k] for k in FIELDS} for row in rows], schema=ARROW_SCHEMA)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_parquet(path: str | os.PathLike, hint: str = DEFAULT_HINT) -> list[dict]:
    """Read and validate a dataset; ``hint`` is the command named in the error when the file is missing."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"dataset not found: {path} (run {hint} to create it)")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DatasetError(f"{path}: not a readable Parquet file ({first_line})") from None
    columns = table.column_names
    missing = [c for c in FIELDS if c not in columns]
    unexpected = [c for c in columns if c not in FIELDS]
    if missing or unexpected:
        raise DatasetError(
            f"{path}: wrong columns {columns}; missing {missing}, unexpected {unexpected} "
            f"(expected exactly {list(FIELDS)})"
        )
    rows = table.select(list(FIELDS)).to_pylist()
    for i, row in enumerate(rows):
        validate_row(row, f"{path}: row {i}")
    return rows


def family_order(
    source: str, families: Iterable[str], known: Mapping, n: int, seed: int, split: str
) -> tuple[random.Random, list[str]]:
    """A generator's rng (seeded by source, seed and split) and the family of each of its `n` rows: `families`
    in equal shares, shuffled; a ValueError on an unknown split or family."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be one of ('train', 'test'), got {split!r}")
    names = list(families)
    unknown = [f for f in names if f not in known]
    if unknown:
        raise ValueError(f"unknown {source} families {unknown}: use some of {', '.join(known)}")
    rng = random.Random(f"{source}:{seed}:{split}")
    order = [names[i % len(names)] for i in range(n)]
    rng.shuffle(order)
    return rng, order


def draw_until(draw: Callable[[], Any], accept: Callable[[Any], bool], what: str, tries: int = 10_000) -> Any:
    """The first of `draw()`'s results that `accept` takes (a generator's rejection sampling); a RuntimeError
    naming `what` when none of `tries` is."""
    for _ in range(tries):
        value = draw()
        if accept(value):
            return value
    raise RuntimeError(f"no {what} found in {tries} draws")


def hashed_split(key: str | bytes, test_percent: int) -> str:
    """ "test" for `test_percent`% of keys, else "train", by a hash of the key: a problem's split is fixed by
    what it is (never by the seed or its position), so train and test never share one."""
    data = key.encode() if isinstance(key, str) else key
    return "test" if int(hashlib.sha256(data).hexdigest(), 16) % 100 < test_percent else "train"


def splits_parser(doc: str, train_size: int, test_size: int) -> argparse.ArgumentParser:
    """The command line every generator shares: `--out DIR` (train.parquet, test.parquet), the two split
    sizes and `--seed`; a generator adds its own options to it."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, required=True, help="directory for train.parquet and test.parquet"
    )
    parser.add_argument("--train-size", type=int, default=train_size)
    parser.add_argument("--test-size", type=int, default=test_size)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def write_splits(
    args: argparse.Namespace,
    make_rows: Callable[[int, str], list],
    what: str = "rows",
    write: Callable[[list, Path], Path] = write_parquet,
    tally: Callable[[Mapping], str] | None = None,
) -> None:
    """Write `args.out`/train.parquet and test.parquet from `make_rows(size, split)` (the sizes and seed of
    splits_parser), printing a line per split; `tally` names what each row counts towards in that line."""
    for split, size in (("train", args.train_size), ("test", args.test_size)):
        rows = make_rows(size, split)
        path = write(rows, args.out / f"{split}.parquet")
        counts = f"; {dict(sorted(Counter(map(tally, rows)).items()))}" if tally else ""
        print(f"wrote {len(rows)} {split} {what} to {path} (seed {args.seed}{counts})")
