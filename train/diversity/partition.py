"""Group responses into semantic-equivalence classes: the one partitioner for DARLING and NoveltyBench.

Two modes, both after the same short-answer shortcut (docs/algorithms.md section 2, docs/evals.md NoveltyBench):

- `union_find` (DARLING): every pair (i, j), i < j, is judged; equivalent pairs are merged, so classes
  are transitive (a~b and b~c put a, b, c together even when a !~ c).
- `greedy` (NoveltyBench): in order, a response joins the first class whose FIRST member it is
  equivalent to, else opens a new class (with a~b, b~c, a!~c: {a, b}, {c}).

Judges see only the two responses (never the prompt). Pairs are collected across all groups of a batch
and sent to the judge in one call (`union_find`) or one call per round of class openings (`greedy`),
with duplicate text pairs judged once.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol

MODES = ("union_find", "greedy")
SHORT_ANSWER_MAX_WORDS = 5


class PairJudge(Protocol):
    """What the partitioner needs from an equivalence judge (see train/diversity/judges.py)."""

    def equivalent(self, pairs: list[tuple[str, str]]) -> list[bool]: ...


def short_answer_equivalent(a: str, b: str) -> bool | None:
    """The <=5-word unigram shortcut, or None when either response is longer.

    Both texts are lower-cased and split on whitespace; when both have at most 5 words they are
    equivalent iff 2 * |set(u_a) & set(u_b)| >= max(len(u_a), len(u_b)) (word counts, not set sizes).
    """
    ua, ub = a.strip().lower().split(), b.strip().lower().split()
    longest = max(len(ua), len(ub))
    if longest > SHORT_ANSWER_MAX_WORDS:
        return None
    return 2 * len(set(ua) & set(ub)) >= longest


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(
            f"partition mode {mode!r} is unknown: use 'union_find' (DARLING, transitive classes) "
            "or 'greedy' (NoveltyBench, join the first class whose first member matches)"
        )


def _judge_pairs(
    groups: Sequence[Sequence[str]], pairs: list[tuple[int, int, int]], judge: PairJudge | None
) -> list[bool]:
    """Decide pairs given as (group, i, j): shortcut first, then one batched judge call.

    Identical (text_i, text_j) pairs, common when a policy collapses, are sent to the judge once.
    """
    decided: list[bool | None] = [short_answer_equivalent(groups[g][i], groups[g][j]) for g, i, j in pairs]
    slot: dict[tuple[str, str], int] = {}
    for k, (g, i, j) in enumerate(pairs):
        if decided[k] is None:
            slot.setdefault((groups[g][i], groups[g][j]), len(slot))
    if slot:
        if judge is None:
            raise ValueError(
                f"{len(slot)} response pairs are longer than {SHORT_ANSWER_MAX_WORDS} words and need an "
                "equivalence judge: pass one (e.g. train.diversity.judges.EmbeddingJudge())"
            )
        verdicts = judge.equivalent(list(slot))
        if len(verdicts) != len(slot):
            raise RuntimeError(
                f"judge {type(judge).__name__} returned {len(verdicts)} verdicts for {len(slot)} pairs"
            )
        for k, (g, i, j) in enumerate(pairs):
            if decided[k] is None:
                decided[k] = bool(verdicts[slot[(groups[g][i], groups[g][j])]])
    return [bool(d) for d in decided]


def _number_in_order_of_appearance(labels: Sequence[int]) -> list[int]:
    """Relabel arbitrary class labels to 0..K-1 in order of first appearance."""
    ids: dict[int, int] = {}
    return [ids.setdefault(label, len(ids)) for label in labels]


def _union_find_groups(groups: Sequence[Sequence[str]], judge: PairJudge | None) -> list[list[int]]:
    pairs = [
        (g, i, j)
        for g, texts in enumerate(groups)
        for i in range(len(texts))
        for j in range(i + 1, len(texts))
    ]
    verdicts = _judge_pairs(groups, pairs, judge)
    parents = [list(range(len(texts))) for texts in groups]

    def find(parent: list[int], x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for (g, i, j), same in zip(pairs, verdicts):
        if same:
            ri, rj = find(parents[g], i), find(parents[g], j)
            if ri != rj:
                parents[g][max(ri, rj)] = min(ri, rj)
    return [
        _number_in_order_of_appearance([find(parents[g], k) for k in range(len(texts))])
        for g, texts in enumerate(groups)
    ]


def _greedy_groups(groups: Sequence[Sequence[str]], judge: PairJudge | None) -> list[list[int]]:
    """NoveltyBench's order, run in lock-step rounds so each round is one batched judge call.

    Round r: in every group the first unassigned response opens a class and every later unassigned
    response is compared with it (the class's first member). This gives the same classes as
    comparing each response with the classes' first members one at a time.
    """
    labels: list[list[int]] = [[-1] * len(texts) for texts in groups]
    next_id = [0] * len(groups)
    while any(lab < 0 for group_labels in labels for lab in group_labels):
        pairs: list[tuple[int, int, int]] = []
        for g, texts in enumerate(groups):
            opener = next((k for k, lab in enumerate(labels[g]) if lab < 0), None)
            if opener is None:
                continue
            labels[g][opener] = next_id[g]
            next_id[g] += 1
            pairs += [(g, opener, j) for j in range(opener + 1, len(texts)) if labels[g][j] < 0]
        for (g, i, j), same in zip(pairs, _judge_pairs(groups, pairs, judge)):
            if same:
                labels[g][j] = labels[g][i]
    return labels


def partition_groups(
    groups: list[list[str]], judge: PairJudge | None, mode: str = "union_find"
) -> list[list[int]]:
    """Class ids for every response of every group, judging the pairs of all groups together.

    Args:
        groups: G groups (one per prompt) of n_g response texts each.
        judge: an equivalence judge with `equivalent(pairs) -> list[bool]`; may be None only when every
            pair is decided by the short-answer shortcut.
        mode: "union_find" (DARLING) or "greedy" (NoveltyBench).

    Returns:
        G lists, list g of length n_g: class ids 0..K_g-1 numbered in order of first appearance.
    """
    _check_mode(mode)
    if mode == "union_find":
        return _union_find_groups(groups, judge)
    return _greedy_groups(groups, judge)


def refine(labels: Sequence[int], keys: Sequence[Hashable]) -> list[int]:
    """Split classes by a key: i and j share a class iff they shared one and their keys are equal.

    DARLING over agent strategies partitions final answers, then splits each class by the tool path
    (train/diversity/strategy.py): same answer by two paths is two classes. Ids 0..K-1 in order of appearance.
    """
    if len(labels) != len(keys):
        raise ValueError(f"refine: {len(labels)} labels but {len(keys)} keys")
    ids: dict[tuple[int, Hashable], int] = {}
    return [ids.setdefault((label, key), len(ids)) for label, key in zip(labels, keys)]


def partition(texts: list[str], judge: PairJudge | None, mode: str = "union_find") -> list[int]:
    """Class id per text (0..K-1 in order of first appearance) for one group; see `partition_groups`."""
    return partition_groups([texts], judge, mode)[0]
