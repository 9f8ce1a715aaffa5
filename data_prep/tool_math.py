"""Exact arithmetic the embedded model cannot do in its head, and multi-turn traces that use tools for it.

Four families (`FAMILIES`), each asking for one exact integer:

- `product`: a 3-digit times a 4-digit number ("What is 347 * 5821?");
- `sum`: four or five numbers of 3-4 digits added up;
- `small`: a sum of two numbers up to 20 or a product of two digits, which the warmed-up model answers in its
  head: where a tool cannot help, so a broken one can only hurt (the `broken_calculator` control learns to
  stop calling on these);
- `chain`: a price the model must look up first (the `catalog` tool), then multiply: two tool calls in
  sequence, so a trajectory that solves it has at least three model turns.

Train/test disjointness does not depend on the seed: each problem's numbers are hashed to a fixed split.
`prompt_rows` are GRPO prompts (`builtin:tool_math`: product, sum and small; `builtin:tool_math_chain`);
`sft_rows` are the SFT warm-up. Half its problems are asked with the tools described (`extra_info.tools`
names them, so the SFT stage describes them in the prompt exactly as a rollout with `env.tools` does), the
other half without, answered directly (the no-tools arm's start). Of the problems asked with tools, a share
`call_share` is a trace that calls them and the rest a direct answer: `builtin:sft_tool_math` calls in
every one (the model learns to always call: nothing left for RL), `builtin:sft_tool_math_mixed` in
`MIXED_CALL_SHARE` of them, whichever the problem, so the warmed-up model calls sometimes and RL finds out
when calling pays (experiments/tool_math.yaml). The tool results in a trace are the tools' own outputs.

    python -m data_prep.tool_math --out data/tool_math --train-size 2000 --test-size 200
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from pathlib import Path

from data_prep.schema import extra_info_of, hashed_split, make_row, write_parquet

# the price catalog of the chained task: a price is a function of the item's name, the same in every process,
# so the gold answer here and the `catalog` tool's answer (train/env/tools/catalog.py) agree
ITEMS = (
    "blue widget", "red gear", "steel bolt", "brass hinge", "glass bead", "oak plank", "copper coil",
    "paper fan", "clay pot", "wool scarf", "silk ribbon", "tin cup",
)  # fmt: skip


def price_of(item: str) -> int:
    """The catalog's price of `item` in cents (101..999)."""
    digest = hashlib.sha256(item.strip().lower().encode()).digest()
    return 101 + int.from_bytes(digest[:4], "big") % 899


DATA_SOURCE = "tool_math"
FAMILIES = ("product", "sum", "small", "chain")
PROMPT_FAMILIES = ("product", "sum", "small")  # builtin:tool_math
MIXED_CALL_SHARE = 0.4
TEST_PERCENT = 20
INSTRUCTION = "Give only the final number as your answer."
TOOLS_OF = {
    "product": ["calculator"],
    "sum": ["calculator"],
    "small": ["calculator"],
    "chain": ["catalog", "calculator"],
}


def _split_of(family: str, numbers: list, item: str = "", expression: str = "") -> str:
    key = [family, numbers, item] + ([expression] if family == "small" else [])  # 3 + 4 vs 3 * 4
    return hashed_split(json.dumps(key), TEST_PERCENT)


def _problem(rng: random.Random, family: str) -> tuple[str, str, dict]:
    """(question, gold, extra_info) of one problem of `family`."""
    if family == "product":
        a, b = rng.randint(100, 999), rng.randint(1000, 9999)
        return (
            f"What is {a} * {b}? {INSTRUCTION}",
            str(a * b),
            {"numbers": [a, b], "expression": f"{a} * {b}"},
        )
    if family == "sum":
        nums = [rng.randint(100, 9999) for _ in range(rng.choice((4, 5)))]
        expr = " + ".join(map(str, nums))
        return f"What is {expr}? {INSTRUCTION}", str(sum(nums)), {"numbers": nums, "expression": expr}
    if family == "small":
        if rng.random() < 0.5:
            a, b, op = rng.randint(1, 20), rng.randint(1, 20), "+"
            value = a + b
        else:
            a, b, op = rng.randint(2, 9), rng.randint(2, 9), "*"
            value = a * b
        expr = f"{a} {op} {b}"
        return f"What is {expr}? {INSTRUCTION}", str(value), {"numbers": [a, b], "expression": expr}
    item, count = rng.choice(ITEMS), rng.randint(100, 9999)
    question = (
        f"A {item} costs some number of cents: look it up in the catalog. "
        f"How many cents do {count} of them cost? {INSTRUCTION}"
    )
    return question, str(price_of(item) * count), {"numbers": [count], "item": item}


def prompt_rows(
    n: int, seed: int, split: str = "train", families: tuple[str, ...] = PROMPT_FAMILIES
) -> list[dict]:
    """`n` problems of `split` drawn round-robin from `families`."""
    rng, rows, k = random.Random(seed * 7919 + len(families)), [], 0
    while len(rows) < n:
        family = families[k % len(families)]
        k += 1
        question, gold, info = _problem(rng, family)
        if _split_of(family, info["numbers"], info.get("item", ""), info.get("expression", "")) != split:
            continue
        info.update(family=family, split=split, tools=TOOLS_OF[family])
        rows.append(make_row(DATA_SOURCE, [{"role": "user", "content": question}], gold, info))
    return rows


def _call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def trace(row: dict) -> list[dict]:
    """The messages of a correct tool-using solution of a `prompt_rows` row. The tool results are what the
    tools answer (an integer result is its digits: tests/test_tool_math.py checks them against the tools)."""
    info = extra_info_of(row)
    messages = list(row["prompt"])
    if info["family"] == "chain":
        price = price_of(info["item"])
        messages += [
            {"role": "assistant", "content": _call("catalog", item=info["item"])},
            {"role": "tool", "content": str(price)},
        ]
        expression = f"{price} * {info['numbers'][0]}"
    else:
        expression = info["expression"]
    return messages + [
        {"role": "assistant", "content": _call("calculator", expression=expression)},
        {"role": "tool", "content": row["ground_truth"]},
        {"role": "assistant", "content": f"The answer is {row['ground_truth']}."},
    ]


def sft_rows(n: int, seed: int, split: str = "train", call_share: float = 1.0) -> list[dict]:
    """The warm-up: every other problem asked with its tools described (in extra_info), of which a share
    `call_share` (drawn per problem, whatever its family) is a trace calling them and the rest a direct
    answer; the other problems asked without tools and answered directly."""
    rows, rng = [], random.Random(seed * 104729 + 1)
    for k, row in enumerate(prompt_rows(n, seed, split, FAMILIES)):
        info = extra_info_of(row)
        direct = [*row["prompt"], {"role": "assistant", "content": f"The answer is {row['ground_truth']}."}]
        if k % 2 == 0:
            messages = trace(row) if rng.random() < call_share else direct
        else:
            info["tools"], messages = [], direct
        rows.append(make_row(DATA_SOURCE, messages, row["ground_truth"], info))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--train-size", type=int, default=2000)
    p.add_argument("--test-size", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    for split, size in (("train", a.train_size), ("test", a.test_size)):
        write_parquet(prompt_rows(size, a.seed, split, FAMILIES), a.out / f"{split}.parquet")
        write_parquet(sft_rows(size, a.seed, split), a.out / f"sft_{split}.parquet")
    print(f"wrote {a.out}/{{train,test}}.parquet and sft_{{train,test}}.parquet")


if __name__ == "__main__":
    main()
