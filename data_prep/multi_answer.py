"""Number questions with many correct answers ("a two-digit multiple of 7"): the task where diversity matters.

DARLING's claim is that GRPO narrows what a model says while DARLING keeps several good answers alive.
That needs prompts with many correct answers, checked offline. Each prompt asks for one whole number
with a property; every family has at least ``MIN_ANSWERS`` correct answers per prompt:

| family        | example prompt                                           | correct answers |
|---------------|----------------------------------------------------------|-----------------|
| `between`     | Give a whole number between 1 and 100.                   | 1..100 (bounds included) |
| `parity`      | Give an even number between 10 and 40.                   | the evens in range |
| `multiple_of` | Give a two-digit multiple of 7.                          | 14, 21, ..., 98 |
| `greater_than`| Give a two-digit number greater than 60.                 | 61..99 |
| `prime`       | Give a prime number between 10 and 60.                   | 11, 13, ..., 59 |
| `digit_sum`   | Give a two-digit number whose digits add up to 9.        | 18, 27, ..., 90 |
| `divisor`     | Give a divisor of 36 other than 1 and 36.                | 2, 3, 4, 6, 9, 12, 18 |
| `square`      | Give a perfect square between 1 and 100.                 | 1, 4, ..., 100 |

The prompt is two fixed worked examples as earlier chat turns (FEW_SHOT: a question, then a bare number as
the assistant's reply), then the question: without them the default 135M model answers in prose (5% bare
numbers, measured on 112 samples), with them 65% are bare numbers. Ranges are wide so that the default
model, which picks numbers more or less at random, starts right often and with many different answers.

`ground_truth` holds EVERY correct answer, comma-separated in increasing order ("14,21,28,..."); the
checker (`check`) takes the response's final answer by the one math grader's extraction rules
(`math_grader.extract_answer`: last `\\boxed{}`, else the last number) and accepts it when it is a whole
number in that list. Sameness of two correct answers is decided by the same extraction: the
answer-aware partitioner (`train.diversity.judges.AnswerAwareJudge` without an inner judge) puts
responses with the same final number in one class, so "distinct correct answers per group" counts
different numbers.

Train/test: each prompt (family and parameters) is hashed to a fixed split (20% test), so held-out
prompts never appear in training, whatever the seed. ``python -m data_prep.multi_answer --out DIR``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from data_prep.schema import (
    draw_until,
    extra_info_of,
    family_order,
    hashed_split,
    make_row,
    splits_parser,
    write_splits,
)

DATA_SOURCE = "multi_answer"
INSTRUCTION = "Give only the number as your answer."
TEST_PERCENT = 20
MIN_ANSWERS = 4  # fewer correct answers would not leave room for diversity in a group of 8
# earlier chat turns showing the answer format (question -> bare number); their families' answers are valid
FEW_SHOT = (("Give an even number between 3 and 9.", "4"), ("Give a prime number between 20 and 40.", "31"))


def _is_prime(n: int) -> bool:
    return n > 1 and all(n % d for d in range(2, int(n**0.5) + 1))


def _between(rng: random.Random) -> tuple[str, list[int], dict]:
    lo = rng.choice([0, 1, 1, 5, 10, 20])
    hi = lo + rng.choice([40, 50, 90, 99, 100, 200])
    return f"Give a whole number between {lo} and {hi}.", list(range(lo, hi + 1)), {"lo": lo, "hi": hi}


def _parity(rng: random.Random) -> tuple[str, list[int], dict]:
    lo = rng.randint(1, 5)
    hi = lo + rng.randint(30, 100)
    even = rng.random() < 0.5
    answers = [k for k in range(lo, hi + 1) if (k % 2 == 0) == even]
    word = "an even" if even else "an odd"
    return f"Give {word} number between {lo} and {hi}.", answers, {"lo": lo, "hi": hi, "even": even}


def _multiple_of(rng: random.Random) -> tuple[str, list[int], dict]:
    m = rng.randint(2, 12)
    lo, hi = rng.choice([(10, 99), (1, 50), (1, 100), (1, 120), (1, 200)])
    answers = [k for k in range(lo, hi + 1) if k % m == 0]
    if (lo, hi) == (10, 99):
        return f"Give a two-digit multiple of {m}.", answers, {"m": m, "lo": lo, "hi": hi}
    return f"Give a multiple of {m} between {lo} and {hi}.", answers, {"m": m, "lo": lo, "hi": hi}


def _greater_than(rng: random.Random) -> tuple[str, list[int], dict]:
    x = rng.randint(10, 90)
    return f"Give a two-digit number greater than {x}.", list(range(x + 1, 100)), {"x": x}


def _prime(rng: random.Random) -> tuple[str, list[int], dict]:
    lo = rng.randint(2, 40)
    hi = lo + rng.randint(30, 80)
    answers = [k for k in range(lo, hi + 1) if _is_prime(k)]
    return f"Give a prime number between {lo} and {hi}.", answers, {"lo": lo, "hi": hi}


def _digit_sum(rng: random.Random) -> tuple[str, list[int], dict]:
    s = rng.randint(4, 14)
    answers = [k for k in range(10, 100) if k // 10 + k % 10 == s]
    return f"Give a two-digit number whose digits add up to {s}.", answers, {"s": s}


def _divisor(rng: random.Random) -> tuple[str, list[int], dict]:
    n = rng.choice([k for k in range(12, 201) if sum(1 for d in range(2, k) if k % d == 0) >= MIN_ANSWERS])
    answers = [d for d in range(2, n) if n % d == 0]
    return f"Give a divisor of {n} other than 1 and {n}.", answers, {"n": n}


def _square(rng: random.Random) -> tuple[str, list[int], dict]:
    lo = rng.choice([1, 1, 1, 10, 20])
    hi = rng.choice([100, 150, 200, 400])
    answers = [k * k for k in range(1, 21) if lo <= k * k <= hi]
    return f"Give a perfect square between {lo} and {hi}.", answers, {"lo": lo, "hi": hi}


FAMILIES: dict[str, Callable[[random.Random], tuple[str, list[int], dict]]] = {
    "between": _between,
    "parity": _parity,
    "multiple_of": _multiple_of,
    "greater_than": _greater_than,
    "prime": _prime,
    "digit_sum": _digit_sum,
    "divisor": _divisor,
    "square": _square,
}


# The default mix: families the default 135M model is right on sometimes (it answers mostly small numbers, so
# ranges that start near 1). Measured, 3 prompts x 8 samples each: between 0.62 (4-6 distinct correct of 8),
# parity 0.25, multiple_of 0.17, divisor 0.25, square 0.25; greater_than, prime, digit_sum 0.00.
DEFAULT_FAMILIES: tuple[str, ...] = ("between", "parity", "multiple_of", "divisor", "square")
# darling_math's mix (builtin:multi_answer_spread): 3/4 "between" (the default model starts at ~0.5 accuracy
# with ~3.5 distinct correct answers of 8, so there is diversity for GRPO to lose) and 1/4 "parity".
SPREAD_FAMILIES: tuple[str, ...] = ("between", "between", "between", "parity")


def split_of(family: str, params: dict) -> str:
    """The fixed split of a prompt, from a hash of its family and parameters (not of seed or order)."""
    return hashed_split(f"{family}|{sorted(params.items())}", TEST_PERCENT)


def parse_answers(ground_truth: str) -> frozenset[int]:
    """The correct answers stored in a row's ``ground_truth`` ("14,21,28")."""
    try:
        return frozenset(int(x) for x in ground_truth.split(",") if x.strip())
    except ValueError as exc:
        raise ValueError(
            f"{DATA_SOURCE} ground_truth {ground_truth[:60]!r} is not a comma-separated list of whole "
            "numbers (regenerate the rows with data_prep.multi_answer)"
        ) from exc


def answer_number(response: str) -> int | None:
    """The response's final answer as a whole number (math grader's extraction), or None."""
    from math_grader import extract_answer, normalize_answer

    answer = extract_answer(response or "")
    if answer is None:
        return None
    text = normalize_answer(answer)
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if value.is_integer() and abs(value) < 1e12 else None


def check(response: str, ground_truth: str) -> bool:
    """Whether the response's final answer is one of the correct answers in ``ground_truth``."""
    number = answer_number(response)
    return number is not None and number in parse_answers(ground_truth)


def generate(
    n: int,
    seed: int,
    split: str = "train",
    families: Sequence[str] | None = None,
    instruction: str = INSTRUCTION,
) -> list[dict]:
    """``n`` schema rows of ``split``, ``families`` (default DEFAULT_FAMILIES) in equal shares."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng, order = family_order(DATA_SOURCE, families or DEFAULT_FAMILIES, FAMILIES, n, seed, split)
    rows = []
    for i, family in enumerate(order):
        text, answers, params = draw_until(
            lambda: FAMILIES[family](rng),  # noqa: B023 -- called at once, in this iteration
            lambda d: len(d[1]) >= MIN_ANSWERS and split_of(family, d[2]) == split,  # noqa: B023
            f"{split} prompt of family {family}",
        )
        info = {
            "id": f"{DATA_SOURCE}-{split}-{seed}-{i:06d}",
            "split": split,
            "family": family,
            "params": params,
            "num_answers": len(answers),
            "seed": seed,
        }
        shots = [
            {"role": role, "content": c} for q, a in FEW_SHOT for role, c in (("user", q), ("assistant", a))
        ]
        prompt = shots + [{"role": "user", "content": f"{text}\n{instruction}" if instruction else text}]
        rows.append(make_row(DATA_SOURCE, prompt, ",".join(map(str, sorted(answers))), info))
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = splits_parser(__doc__, train_size=2000, test_size=200)
    parser.add_argument(
        "--families",
        default=None,
        help=f"comma list of {', '.join(FAMILIES)} (default {','.join(DEFAULT_FAMILIES)})",
    )
    args = parser.parse_args(argv)
    families = args.families.split(",") if args.families else None
    write_splits(
        args,
        lambda size, split: generate(size, args.seed, split=split, families=families),
        tally=lambda row: extra_info_of(row)["family"],
    )


if __name__ == "__main__":
    main()
