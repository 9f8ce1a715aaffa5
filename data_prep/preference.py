"""Preference pairs for DPO: the schema, JSONL/Parquet I/O, and the embedded arithmetic pairs.

A pair has exactly these fields:

- ``prompt: list[{"role", "content"}]`` -- the chat messages before the answer (at least one);
- ``chosen: str`` / ``rejected: str`` -- the preferred and the dispreferred assistant reply (non-empty,
  different);
- ``extra_info: str`` -- a JSON object as a string (id, split, ...), as in data_prep/schema.py.

JSONL input is more lenient, to read common public formats: ``prompt`` may be a string (one user
message), and ``chosen`` / ``rejected`` may be message lists whose last message is the assistant reply
(then ``prompt`` defaults to the messages before it, as in HH-RLHF/UltraFeedback-style files).

The embedded set (``builtin:arithmetic_pairs``): arithmetic problems (data_prep/arithmetic.py) with the
worked solution of data_prep/sft_math.py as ``chosen`` and the same steps ending in a wrong result
(data_prep/sycophancy.wrong_answer: never equivalent to gold by the math grader) as ``rejected``.

    python -m data_prep.preference --out data/arithmetic_pairs --train-size 2000 --test-size 200
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from data_prep import arithmetic
from data_prep.jsonl import get_field, get_optional, iter_jsonl
from data_prep.schema import PROMPT_FIELD, ROLES, DatasetError, extra_info_of, splits_parser, write_splits
from data_prep.sft_math import worked_solution
from data_prep.sycophancy import wrong_answer

BUILTIN = "builtin:arithmetic_pairs"
FIELDS: tuple[str, ...] = ("prompt", "chosen", "rejected", "extra_info")
ARROW_SCHEMA = pa.schema(
    [
        PROMPT_FIELD,
        pa.field("chosen", pa.string(), nullable=False),
        pa.field("rejected", pa.string(), nullable=False),
        pa.field("extra_info", pa.string(), nullable=False),
    ]
)
HINT = "python -m data_prep.preference --out DIR"


def make_pair(prompt: list[dict[str, str]], chosen: str, rejected: str, extra_info: Mapping) -> dict:
    return {
        "prompt": [{"role": m["role"], "content": m["content"]} for m in prompt],
        "chosen": chosen,
        "rejected": rejected,
        "extra_info": json.dumps(dict(extra_info), ensure_ascii=False, sort_keys=True),
    }


def validate_pair(pair: Any, where: str) -> None:
    """Raise ``DatasetError("WHERE: what is wrong")`` unless ``pair`` matches the schema exactly."""
    if not isinstance(pair, Mapping) or set(pair) != set(FIELDS):
        got = sorted(pair) if isinstance(pair, Mapping) else type(pair).__name__
        raise DatasetError(f"{where}: a preference pair has exactly the fields {list(FIELDS)} (got {got})")
    prompt = pair["prompt"]
    if not isinstance(prompt, list) or not prompt:
        raise DatasetError(f"{where}: field 'prompt' must be a non-empty list of messages")
    for i, m in enumerate(prompt):
        if not isinstance(m, Mapping) or set(m) != {"role", "content"} or m["role"] not in ROLES:
            raise DatasetError(f"{where}: prompt[{i}] must be {{role: one of {sorted(ROLES)}, content: str}}")
        if not isinstance(m["content"], str):
            raise DatasetError(f"{where}: prompt[{i}] content must be a str")
    for name in ("chosen", "rejected"):
        if not isinstance(pair[name], str) or not pair[name].strip():
            raise DatasetError(f"{where}: field '{name}' must be a non-empty str")
    if pair["chosen"] == pair["rejected"]:
        raise DatasetError(f"{where}: chosen and rejected are the same text (no preference to learn)")
    try:
        info = json.loads(pair["extra_info"]) if isinstance(pair["extra_info"], str) else None
    except json.JSONDecodeError:
        info = None
    if not isinstance(info, dict):
        raise DatasetError(f"{where}: field 'extra_info' must be a JSON object encoded as a str")


def _reply(value: str | list, name: str, where: str) -> tuple[str, list[dict] | None]:
    """A JSONL chosen/rejected value -> (reply text, the messages before it, if given as messages)."""
    if isinstance(value, str):
        return value, None
    if not value or not isinstance(value[-1], Mapping) or value[-1].get("role") != "assistant":
        raise DatasetError(f"{where}: field '{name}' as a message list must end with an assistant message")
    return value[-1].get("content"), list(value[:-1])


def read_pairs_jsonl(path: str | os.PathLike) -> list[dict]:
    pairs = []
    for where, line, record in iter_jsonl(path):
        chosen, chosen_ctx = _reply(get_field(record, "chosen", (str, list), where), "chosen", where)
        rejected, _ = _reply(get_field(record, "rejected", (str, list), where), "rejected", where)
        prompt = get_optional(record, "prompt", (str, list), where)
        if prompt is None:
            if not chosen_ctx:
                raise DatasetError(
                    f"{where}: field 'prompt' missing (and 'chosen' has no messages before it)"
                )
            prompt = chosen_ctx
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        info = get_optional(record, "extra_info", (dict, str), where) or {}
        if isinstance(info, str):  # as write_pairs stores it
            try:
                info = json.loads(info)
            except json.JSONDecodeError:
                raise DatasetError(f"{where}: field 'extra_info' is not valid JSON") from None
        if not isinstance(info, dict):
            raise DatasetError(f"{where}: field 'extra_info' must be a JSON object")
        info = {"id": get_optional(record, "id", (str, int), where) or f"pair-{line}", "line": line, **info}
        try:
            pair = make_pair(prompt, chosen, rejected, info)
        except (KeyError, TypeError):
            raise DatasetError(f"{where}: prompt messages must be dicts with role and content") from None
        validate_pair(pair, where)
        pairs.append(pair)
    return pairs


def read_pairs(path: str | os.PathLike) -> list[dict]:
    """Pairs from a ``.jsonl`` or Parquet file, every one validated (errors name the file and row)."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"preference data not found: {path} (run {HINT} to create the embedded set)")
    if path.suffix == ".jsonl":
        return read_pairs_jsonl(path)
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(f"{path}: not a readable Parquet file ({str(exc).splitlines()[0]})") from None
    if sorted(table.column_names) != sorted(FIELDS):
        raise DatasetError(f"{path}: columns {table.column_names}, expected exactly {list(FIELDS)}")
    pairs = table.select(list(FIELDS)).to_pylist()
    for i, pair in enumerate(pairs):
        validate_pair(pair, f"{path}: row {i}")
    return pairs


def write_pairs(pairs: Iterable[Mapping], path: str | os.PathLike) -> Path:
    """Validate, then write Parquet (or JSONL for a ``.jsonl`` path) atomically."""
    path = Path(path)
    pairs = list(pairs)
    for i, pair in enumerate(pairs):
        validate_pair(pair, f"{path}: row {i}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        if path.suffix == ".jsonl":
            tmp.write_text("".join(json.dumps(dict(p), ensure_ascii=False) + "\n" for p in pairs))
        else:
            table = pa.Table.from_pylist([{k: p[k] for k in FIELDS} for p in pairs], schema=ARROW_SCHEMA)
            pq.write_table(table, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def arithmetic_pairs(n: int, seed: int, split: str = "train") -> list[dict]:
    """``n`` embedded pairs: worked solution (chosen) vs the same steps with a wrong final result."""
    rows = arithmetic.generate(n, seed, split=split)
    golds = [r["ground_truth"] for r in rows]
    rng = random.Random(f"arithmetic_pairs:{seed}:{split}")
    pairs = []
    for row in rows:
        info = extra_info_of(row)
        wrong = wrong_answer(row["ground_truth"], golds, rng)
        chosen = worked_solution(info["operands"], info["operators"])
        rejected = worked_solution(info["operands"], info["operators"], final=wrong)
        pairs.append(
            make_pair(row["prompt"], chosen, rejected, {**info, "ground_truth": row["ground_truth"]})
        )
    return pairs


def main(argv: Sequence[str] | None = None) -> None:
    parser = splits_parser(__doc__, train_size=2000, test_size=200)
    args = parser.parse_args(argv)
    write_splits(
        args,
        lambda size, split: arithmetic_pairs(size, args.seed, split=split),
        "preference pairs",
        write_pairs,
    )


if __name__ == "__main__":
    main()
