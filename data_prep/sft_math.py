"""SFT examples: the format, its loaders, and the self-made worked-solution set for the embedded math task.

An SFT example is a data_prep schema row whose ``prompt`` ends with an assistant message: that last
message is the response the model is trained on (loss on its tokens only), everything before it is the
prompt. ``ground_truth`` keeps the gold answer, so the same rows also measure greedy accuracy.

The embedded set (``builtin:sft_math``) takes the problems of data_prep/arithmetic.py (same seeds, same
train/test split, so its test prompts are exactly GRPO's ``builtin:arithmetic`` validation prompts) and
answers each with a short worked solution, one line per step, ending in "The answer is N.":

    Tom has 3 apples. He gets 4 more. ...  ->  "3 + 4 = 7.\\nThe answer is 7."

    python -m data_prep.sft_math --out data/sft_math --train-size 2000 --test-size 200
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from data_prep import arithmetic
from data_prep.jsonl import get_field, get_optional, iter_jsonl
from data_prep.schema import (
    DatasetError,
    extra_info_of,
    make_row,
    read_parquet,
    splits_parser,
    validate_row,
    write_splits,
)

BUILTIN = "builtin:sft_math"
DATA_SOURCE = "arithmetic"
_SYMBOL = {"+": "+", "-": "-", "*": "*"}


def worked_solution(operands: Sequence[int], operators: Sequence[str], final: str | None = None) -> str:
    """One line per step (left to right, as the problems are worded), then "The answer is N.".

    ``final`` replaces the last step's result (and the answer): a plausible wrong solution for DPO pairs.
    """
    lines, total = [], operands[0]
    for k, (op, n) in enumerate(zip(operators, operands[1:], strict=True)):
        new = arithmetic.evaluate([total, n], [op])
        if final is not None and k == len(operators) - 1:
            new = final
        lines.append(f"{total} {_SYMBOL[op]} {n} = {new}.")
        total = new
    lines.append(f"The answer is {total}.")
    return "\n".join(lines)


def sft_rows(
    n: int,
    seed: int,
    split: str = "train",
    difficulties: Sequence[int] | Mapping[int, float] = arithmetic.DEFAULT_DIFFICULTIES,
) -> list[dict]:
    """``n`` arithmetic problems of ``split`` with their worked solution as a final assistant message."""
    rows = []
    for row in arithmetic.generate(n, seed, difficulties, split=split):
        info = extra_info_of(row)
        answer = worked_solution(info["operands"], info["operators"])
        prompt = [*row["prompt"], {"role": "assistant", "content": answer}]
        rows.append(make_row(row["data_source"], prompt, row["ground_truth"], info))
    return rows


def split_response(row: Mapping, where: str = "row") -> tuple[list[dict], str]:
    """(prompt messages, response text) of an SFT example: the last message must be the assistant's."""
    messages = row["prompt"]
    if len(messages) < 2 or messages[-1]["role"] != "assistant":
        raise DatasetError(
            f"{where}: an SFT example's prompt must end with an assistant message (the response to train "
            f"on), got roles {[m['role'] for m in messages]}"
        )
    return list(messages[:-1]), messages[-1]["content"]


def load_sft_jsonl(path: str | os.PathLike, source: str = "sft") -> list[dict]:
    """JSONL examples as schema rows: ``{"messages": [...]}`` (ending with the assistant reply) or
    ``{"prompt": str | [...], "response": str}``; optional ``ground_truth`` and ``id``."""
    rows = []
    for where, line, record in iter_jsonl(path):
        if "messages" in record:
            messages = get_field(record, "messages", list, where)
        else:
            prompt = get_field(record, "prompt", (str, list), where)
            response = get_field(record, "response", str, where)
            prompt = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
            messages = [*prompt, {"role": "assistant", "content": response}]
        gold = get_optional(record, "ground_truth", str, where) or ""
        info = {"id": get_optional(record, "id", (str, int), where) or f"{source}-{line}", "line": line}
        try:
            row = make_row(source, messages, gold, info)
        except (KeyError, TypeError):
            raise DatasetError(f"{where}: messages must be dicts with role and content") from None
        validate_row(row, where)
        split_response(row, where)
        rows.append(row)
    return rows


def read_sft_file(path: str) -> list[dict]:
    """A ``.jsonl`` file or a schema Parquet file of SFT examples (``builtin:sft_math``: data_prep.datasets);
    every row checked to end with an assistant message (errors name the file and row)."""
    if path.endswith(".jsonl"):
        return load_sft_jsonl(path)
    rows = read_parquet(path, hint="python -m data_prep.sft_math --out DIR")
    for i, row in enumerate(rows):
        split_response(row, f"{path}: row {i}")
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = splits_parser(__doc__, train_size=2000, test_size=200)
    args = parser.parse_args(argv)
    write_splits(args, lambda size, split: sft_rows(size, args.seed, split=split), "SFT examples")


if __name__ == "__main__":
    main()
