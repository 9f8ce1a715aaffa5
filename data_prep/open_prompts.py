"""Seeded open-ended chat prompts (poems, names, stories, ideas): the embedded default for chat training.

They stand in for WildChat-style prompts when no dataset is given (`data.train_path=builtin:open_prompts`),
so DARLING's chat experiment runs on a fresh clone. Every prompt has many good answers, which is what a
diversity reward needs. Rows have an empty ground truth: quality comes from a scorer, not a grader.
Real WildChat prompts: `python -m data_prep.chat_jsonl --input wildchat.jsonl --out data/wildchat/train.parquet`.
"""

from __future__ import annotations

import random

from data_prep.schema import hashed_split, make_row

DATA_SOURCE = "open_prompts"
TEST_PERCENT = 20
SPLITS = ("train", "test")

_TEMPLATES = [
    "Write a four-line poem about {subject}.",
    "Write a haiku about {subject}.",
    "Tell me a very short story about {subject}.",
    "Tell me a joke about {subject}.",
    "Describe {subject} in one sentence.",
    "Give me a creative name for a shop that sells things related to {subject}.",
    "Suggest a fun weekend activity involving {subject}.",
    "Write a one-sentence slogan for {subject}.",
    "Give me an unusual fact-style riddle whose answer is {subject}.",
    "Invent a short title for a song about {subject}.",
]
_SUBJECTS = [
    "the ocean", "a lost umbrella", "autumn leaves", "a sleepy cat", "the moon", "coffee", "a rainy Monday",
    "a lighthouse", "old friends", "a robot learning to dance", "the first snow", "a library at night",
    "a broken clock", "mountains", "a garden", "a paper boat", "city lights", "a dragon who is afraid of fire",
    "bicycles", "the smell of bread", "a message in a bottle", "trains", "a stubborn goat", "thunderstorms",
    "a tiny island", "music", "a forgotten key", "sunrise", "a penguin in the desert", "homework",
]  # fmt: skip


def split_of(text: str) -> str:
    """A fixed split per prompt text (independent of the seed), so train and test never share a prompt."""
    return hashed_split(text, TEST_PERCENT)


def generate(n: int, seed: int, split: str = "train") -> list[dict]:
    """``n`` schema rows of ``split`` in a seeded order, cycling when n exceeds the distinct prompts."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    texts = [t.format(subject=s) for t in _TEMPLATES for s in _SUBJECTS]
    texts = [t for t in texts if split_of(t) == split]
    random.Random(f"{DATA_SOURCE}:{seed}:{split}").shuffle(texts)
    rows = []
    for i in range(n):
        text = texts[i % len(texts)]
        info = {"id": f"{DATA_SOURCE}-{split}-{seed}-{i:06d}", "split": split}
        rows.append(make_row(DATA_SOURCE, [{"role": "user", "content": text}], "", info))
    return rows
