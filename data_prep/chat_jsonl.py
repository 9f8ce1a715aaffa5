"""Convert open-ended chat prompts (WildChat / NoveltyBench JSONL: ``id``, ``prompt``, optional ``category``)
to schema rows with an empty ground truth: these tasks are scored for quality/diversity, not correctness.

    python -m data_prep.chat_jsonl --input ../shared/data/novelty-bench/wildchat-1k.jsonl \\
        --source wildchat --out data/wildchat/test.parquet
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from data_prep.jsonl import get_field, get_optional, iter_jsonl
from data_prep.schema import DatasetError, make_row, write_parquet


def load_chat_jsonl(path: str | os.PathLike, source: str = "wildchat", split: str = "test") -> list[dict]:
    """Read chat-prompt JSONL as schema rows (one user message each); errors name ``FILE:LINE``."""
    rows = []
    for where, line, record in iter_jsonl(path):
        prompt = get_field(record, "prompt", str, where)
        if not prompt.strip():
            raise DatasetError(f"{where}: field 'prompt' is empty")
        info = {
            "id": get_field(record, "id", (str, int), where),
            "split": split,
            "line": line,
        }
        category = get_optional(record, "category", str, where)
        if category is not None:
            info["category"] = category
        rows.append(make_row(source, [{"role": "user", "content": prompt}], "", info))
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, required=True, help="chat-prompt JSONL file")
    parser.add_argument("--source", default="wildchat", help="data_source value (default: %(default)s)")
    parser.add_argument("--out", type=Path, required=True, help="output Parquet file")
    parser.add_argument("--split", default="test")
    args = parser.parse_args(argv)
    try:
        rows = load_chat_jsonl(args.input, args.source, args.split)
    except DatasetError as exc:
        raise SystemExit(f"error: {exc}") from None
    print(f"wrote {len(rows)} {args.source} rows from {args.input} to {write_parquet(rows, args.out)}")


if __name__ == "__main__":
    main()
