"""Seeded arithmetic word problems with graded difficulty: the embedded default math task.

Levels (every intermediate result is a non-negative integer). Levels 1-2 are one short story sentence
that ends by asking the sum explicitly ("... What is 3 + 4?"); levels 3-5 are plain word problems, where
the model must find the operation itself:

1. addition within 10 or subtraction of one-digit numbers (non-zero result);
2. one-digit multiplication, or two steps of one-digit addition/subtraction;
3. two-digit addition or subtraction;
4. two-digit times one-digit, or two steps of two-digit addition/subtraction;
5. two-digit times two-digit.

Train/test disjointness does not depend on the seed: each arithmetic problem (level, operands,
operators) is hashed to a fixed split, and ``generate`` only emits problems of the requested split.
The same numbers with different wording therefore never appear on both sides.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from data_prep.schema import extra_info_of, hashed_split, make_row, splits_parser, write_splits

DATA_SOURCE = "arithmetic"
LEVELS: tuple[int, ...] = (1, 2, 3, 4, 5)
# Calibrated so SmolLM2-135M-Instruct starts at 15-30% (see data_prep/README.md, "Calibration").
DEFAULT_DIFFICULTIES: Mapping[int, float] = {1: 0.6, 2: 0.3, 3: 0.1}
INSTRUCTION = "Give only the final number as your answer."
TEST_PERCENT = 20
SPLITS = ("train", "test")
OP_NAMES = {"+": "add", "-": "sub", "*": "mul"}

_NAMES = [
    ("Tom", "he"), ("Anna", "she"), ("Sam", "he"), ("Lily", "she"), ("Ben", "he"), ("Mia", "she"),
    ("Max", "he"), ("Emma", "she"), ("Leo", "he"), ("Zoe", "she"), ("Jack", "he"), ("Sara", "she"),
]  # fmt: skip
_ITEMS = ["apples", "pencils", "cookies", "marbles", "stickers", "books", "cards", "shells", "eggs", "toys"]
_GROUPS = ["bags", "boxes", "baskets", "jars", "packs", "rows"]

_ADD = [
    "{name} has {a} {item}. {He} gets {b} more. How many {item} does {name} have now?",
    "There are {a} {item} in a box. {name} puts in {b} more. How many {item} are in the box now?",
    "{name} found {a} {item} in the morning and {b} in the afternoon. How many {item} did {name} find?",
]
_SUB = [
    "{name} has {a} {item}. {He} gives {b} to a friend. How many {item} does {name} have left?",
    "There are {a} {item} on the table. {name} takes {b} of them. How many {item} are left on the table?",
    "{name} had {a} {item} and lost {b}. How many {item} does {name} have now?",
]
_MUL = [
    "{name} has {a} {group} with {b} {item} in each. How many {item} does {name} have in total?",
    "There are {a} {group} and each holds {b} {item}. How many {item} are there altogether?",
    "{name} buys {a} {group} of {item}. Each has {b} {item}. How many {item} does {name} buy?",
]
# Levels 1-2: one sentence, then the sum asked explicitly (SmolLM2-135M is near 0% on bare stories).
_SHORT = {
    "+": "{name} has {a} {item} and gets {b} more.",
    "-": "{name} has {a} {item} and gives away {b}.",
    "*": "{name} has {a} {group} with {b} {item} in each.",
}
_SHORT_TWO_STEP = "{name} has {a} {item}, {step1}, then {step2}."
_SYMBOL = {"+": "+", "-": "-", "*": "times"}
_STEP = {"+": "{he} gets {n} more", "-": "{he} gives away {n}"}
_TWO_STEP = "{name} has {a} {item}. First {step1}. Then {step2}. How many {item} does {name} have now?"


def _digits(rng: random.Random, two: bool) -> int:
    return rng.randint(10, 99) if two else rng.randint(1, 9)


def _sample_problem(rng: random.Random, level: int) -> tuple[list[int], list[str]]:
    """Operands and operators (applied left to right) for one problem of ``level``."""
    if level == 1:
        if rng.random() < 0.5:
            a = rng.randint(1, 9)
            return [a, rng.randint(1, 10 - a)], ["+"]
        a = rng.randint(2, 9)
        return [a, rng.randint(1, a - 1)], ["-"]
    if level == 3:
        a, b = _digits(rng, True), _digits(rng, True)
        if rng.random() < 0.5:
            return [a, b], ["+"]
        return [max(a, b), min(a, b)], ["-"]
    if level == 2 and rng.random() < 0.5:
        return [rng.randint(2, 9), rng.randint(2, 9)], ["*"]
    if level == 4 and rng.random() < 0.5:
        return [rng.randint(10, 99), rng.randint(2, 9)], ["*"]
    if level == 5:
        return [rng.randint(11, 99), rng.randint(11, 99)], ["*"]
    # Two steps of addition/subtraction (levels 2 and 4); subtract only what is there.
    two = level == 4
    operands, operators = [_digits(rng, two)], []
    total = operands[0]
    for _ in range(2):
        n = _digits(rng, two)
        op = "-" if n <= total and rng.random() < 0.5 else "+"
        total = total + n if op == "+" else total - n
        operands.append(n)
        operators.append(op)
    return operands, operators


def evaluate(operands: Sequence[int], operators: Sequence[str]) -> int:
    """Apply ``operators`` left to right (the problems are worded as sequential steps)."""
    total = operands[0]
    for op, n in zip(operators, operands[1:], strict=True):
        total = {"+": total + n, "-": total - n, "*": total * n}[op]
    return total


def split_of(level: int, operands: Sequence[int], operators: Sequence[str]) -> str:
    """The fixed split of an arithmetic problem, from a hash of its numbers (independent of seed and wording)."""
    return hashed_split(f"{level}|{' '.join(map(str, operands))}|{' '.join(operators)}", TEST_PERCENT)


def _word_problem(
    rng: random.Random, level: int, operands: list[int], operators: list[str]
) -> tuple[str, int]:
    """Phrase the problem as a short story; returns (text, template index; -1 = short explicit form)."""
    name, he = rng.choice(_NAMES)
    fields = {"name": name, "he": he, "He": he.capitalize(), "item": rng.choice(_ITEMS)}
    fields["group"] = rng.choice(_GROUPS)
    if level <= 2:
        expression = " ".join(
            [str(operands[0])] + [f"{_SYMBOL[o]} {n}" for o, n in zip(operators, operands[1:])]
        )
        if len(operators) == 2:
            steps = [_STEP[op].format(he="", n=n).strip() for op, n in zip(operators, operands[1:])]
            story = _SHORT_TWO_STEP.format(a=operands[0], step1=steps[0], step2=steps[1], **fields)
        else:
            story = _SHORT[operators[0]].format(a=operands[0], b=operands[1], **fields)
        return f"{story} What is {expression}?", -1
    if len(operators) == 2:
        steps = [_STEP[op].format(he=he, n=n) for op, n in zip(operators, operands[1:])]
        return _TWO_STEP.format(a=operands[0], step1=steps[0], step2=steps[1], **fields), 0
    templates = {"+": _ADD, "-": _SUB, "*": _MUL}[operators[0]]
    index = rng.randrange(len(templates))
    return templates[index].format(a=operands[0], b=operands[1], **fields), index


def _level_counts(n: int, difficulties: Sequence[int] | Mapping[int, float]) -> dict[int, int]:
    """Split ``n`` over levels in proportion to the weights (largest remainder), so the mix is exact."""
    weights = dict(difficulties) if isinstance(difficulties, Mapping) else dict.fromkeys(difficulties, 1.0)
    bad = [lvl for lvl in weights if lvl not in LEVELS]
    if bad or not weights or any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise ValueError(f"difficulties must map levels from {LEVELS} to non-negative weights, got {weights}")
    total = sum(weights.values())
    exact = {lvl: n * w / total for lvl, w in weights.items()}
    counts = {lvl: int(x) for lvl, x in exact.items()}
    for lvl in sorted(exact, key=lambda k: counts[k] - exact[k])[: n - sum(counts.values())]:
        counts[lvl] += 1
    return counts


def generate(
    n: int,
    seed: int,
    difficulties: Sequence[int] | Mapping[int, float] = DEFAULT_DIFFICULTIES,
    split: str = "train",
    instruction: str = INSTRUCTION,
) -> list[dict]:
    """``n`` schema rows of ``split``; ``difficulties`` is a list of levels (equal shares) or level -> weight."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(f"{DATA_SOURCE}:{seed}:{split}")
    levels = [lvl for lvl, count in sorted(_level_counts(n, difficulties).items()) for _ in range(count)]
    rng.shuffle(levels)
    rows = []
    for i, level in enumerate(levels):
        for _ in range(10_000):
            operands, operators = _sample_problem(rng, level)
            if split_of(level, operands, operators) == split:
                break
        else:  # pragma: no cover - every level has thousands of problems per split
            raise RuntimeError(f"no {split} problem found for level {level}")
        text, template = _word_problem(rng, level, operands, operators)
        info = {
            "id": f"{DATA_SOURCE}-{split}-{seed}-{i:06d}",
            "split": split,
            "difficulty": level,
            "operation": "_".join(OP_NAMES[op] for op in operators),
            "operands": operands,
            "operators": operators,
            "template": template,
            "seed": seed,
        }
        prompt = [{"role": "user", "content": f"{text}\n{instruction}" if instruction else text}]
        rows.append(make_row(DATA_SOURCE, prompt, str(evaluate(operands, operators)), info))
    return rows


def parse_difficulties(text: str) -> dict[int, float]:
    """CLI form: "1,2,3" (equal weights) or "1=0.5,2=0.3,3=0.2"."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        level, _, weight = part.partition("=")
        out[int(level)] = float(weight) if weight else 1.0
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = splits_parser(__doc__, train_size=5000, test_size=500)
    parser.add_argument(
        "--difficulties",
        type=parse_difficulties,
        default=dict(DEFAULT_DIFFICULTIES),
        help='levels "1,2,3" or weights "1=0.5,2=0.3,3=0.2" (default: %(default)s)',
    )
    args = parser.parse_args(argv)
    write_splits(
        args,
        lambda size, split: generate(size, args.seed, args.difficulties, split=split),
        tally=lambda row: f"L{extra_info_of(row)['difficulty']}",
    )


if __name__ == "__main__":
    main()
