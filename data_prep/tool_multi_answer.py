"""Number puzzles with many correct answers AND many ways to check one with a calculator: DARLING over agent
strategies (experiments/darling_tool.yaml).

"Give a 4-digit multiple of 37 whose digits add up to 19" has 11 answers (1369, 2368, ..., 9028), and a model
with a calculator can reach one by several tool paths: build candidates (`37 * 27`), test them by division
(`1998 / 37`) or by remainder (`1998 % 37`), add up digits (`1 + 9 + 9 + 8`). So two groups can be equally
correct and differ in what they answered, in how they got there, or both; the strategy of a trajectory
(train/diversity/strategy.py) and DARLING's `partition_by: strategy_and_answer` see both.

| family        | example prompt                                                       | answers |
|---------------|----------------------------------------------------------------------|---------|
| `digit_sum`   | Give a 4-digit multiple of 37 whose digits add up to 19.             | 4-digit multiples of k, digit sum s |
| `range`       | Give a number between 2300 and 2800 that is divisible by 43.         | the multiples of k in [a, b] |
| `remainder`   | Give a number between 4100 and 4600 that leaves remainder 5 when divided by 29. | n in [a, b], n % k == r |
| `two_divisors`| Give a 4-digit number divisible by both 12 and 35.                   | 4-digit multiples of lcm(k, m) |

Every prompt has MIN_ANSWERS to MAX_ANSWERS correct answers (tests/test_tool_multi_answer.py enumerates them).
`ground_truth` lists every correct answer, comma-separated in increasing order, as data_prep/multi_answer.py
does, and is graded by the same checker (`multi_answer.check`, registered for this data_source in
train/rewards/math_reward.py): the response's final answer by the math grader's extraction, in the list.
Each prompt (family and parameters) is hashed to a fixed split (20% test) whatever the seed.

    python -m data_prep.tool_multi_answer --out data/tool_multi_answer
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from data_prep.schema import (
    draw_until,
    extra_info_of,
    family_order,
    hashed_split,
    make_row,
    splits_parser,
    write_splits,
)
from data_prep.tool_math import INSTRUCTION

DATA_SOURCE = "tool_multi_answer"
TEST_PERCENT = 20
MIN_ANSWERS = 6  # a group of 8 can hold several different correct answers
MAX_ANSWERS = 150  # the ground truth lists them all, and is logged with every sample
HINT = "You can check a candidate with the calculator."
TOOLS = ["calculator"]
FOUR_DIGITS = range(1000, 10000)


def _digit_sum(n: int) -> int:
    return sum(map(int, str(n)))


def _two_divisors(rng: random.Random) -> dict:
    k, m = sorted(rng.sample(range(6, 40), 2))
    while m % k == 0:  # "both 6 and 12" is one condition
        k, m = sorted(rng.sample(range(6, 40), 2))
    return {"k": k, "m": m}


def _window(rng: random.Random, divisors: tuple[int, int]) -> dict:
    """A range [a, b] of 4-digit numbers 300 to 800 wide and a divisor k (a remainder r when asked)."""
    a = 100 * rng.randint(10, 95)
    b, k = a + rng.choice((300, 500, 800)), rng.randint(*divisors)
    return {"a": a, "b": b, "k": k}


def _remainder(rng: random.Random) -> dict:
    p = _window(rng, (11, 59))
    return {**p, "r": rng.randint(1, p["k"] - 1)}


@dataclass(frozen=True)
class Family:
    """How a family draws its parameters, asks its question and lists every correct answer."""

    sample: Callable[[random.Random], dict]
    question: str  # formatted with the parameters
    answers: Callable[[dict], list[int]]  # in increasing order


FAMILIES: dict[str, Family] = {
    "digit_sum": Family(
        lambda rng: {"k": rng.randint(13, 49), "s": rng.randint(10, 26)},
        "Give a 4-digit multiple of {k} whose digits add up to {s}.",
        lambda p: [n for n in FOUR_DIGITS if n % p["k"] == 0 and _digit_sum(n) == p["s"]],
    ),
    "range": Family(
        lambda rng: _window(rng, (13, 97)),
        "Give a number between {a} and {b} that is divisible by {k}.",
        lambda p: [n for n in range(p["a"], p["b"] + 1) if n % p["k"] == 0],
    ),
    "remainder": Family(
        _remainder,
        "Give a number between {a} and {b} that leaves remainder {r} when divided by {k}.",
        lambda p: [n for n in range(p["a"], p["b"] + 1) if n % p["k"] == p["r"]],
    ),
    "two_divisors": Family(
        _two_divisors,
        "Give a 4-digit number divisible by both {k} and {m}.",
        lambda p: [n for n in FOUR_DIGITS if n % p["k"] == 0 and n % p["m"] == 0],
    ),
}


def split_of(family: str, params: dict) -> str:
    """The fixed split of a prompt, from a hash of what it asks (never of the seed or its position)."""
    return hashed_split(f"{DATA_SOURCE}|{family}|{sorted(params.items())}", TEST_PERCENT)


def generate(n: int, seed: int, split: str = "train", families: Sequence[str] | None = None) -> list[dict]:
    """`n` schema rows of `split`, `families` (default: all) in equal shares; MIN_ANSWERS..MAX_ANSWERS answers each."""
    rng, order = family_order(DATA_SOURCE, families or FAMILIES, FAMILIES, n, seed, split)
    rows = []
    for i, family in enumerate(order):
        params, answers = draw_until(
            lambda: (p := FAMILIES[family].sample(rng), FAMILIES[family].answers(p)),  # noqa: B023
            lambda d: MIN_ANSWERS <= len(d[1]) <= MAX_ANSWERS and split_of(family, d[0]) == split,  # noqa: B023
            f"{split} prompt of family {family}",
        )
        info = {
            "id": f"{DATA_SOURCE}-{split}-{seed}-{i:06d}",
            "split": split,
            "family": family,
            "params": params,
            "num_answers": len(answers),
            "tools": TOOLS,
        }
        question = f"{FAMILIES[family].question.format(**params)} {HINT} {INSTRUCTION}"
        rows.append(
            make_row(DATA_SOURCE, [{"role": "user", "content": question}], ",".join(map(str, answers)), info)
        )
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = splits_parser(__doc__, train_size=2000, test_size=200)
    args = parser.parse_args(argv)
    write_splits(
        args, lambda size, split: generate(size, args.seed, split), tally=lambda r: extra_info_of(r)["family"]
    )


if __name__ == "__main__":
    main()
