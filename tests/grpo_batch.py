"""A fixed GRPO batch for the multi-rank workers (tests/fsdp_worker.py, tests/paper_ranks_worker.py): groups of
`n` rows sharing a random prompt, random responses and scores, group-normalised advantages."""

from __future__ import annotations

import torch

from train.algorithms.advantages import compute_grpo_outcome_advantage
from train.batch import Batch


def grpo_batch(
    n_groups: int, n: int, vocab: int, prompt_len: tuple[int, int], response_len: tuple[int, int]
) -> Batch:
    """Token ids in [10, vocab); lengths drawn in [lo, hi) from one seeded generator (the same batch on every
    rank and every run)."""
    g = torch.Generator().manual_seed(0)

    def row(lo: int, hi: int) -> list[int]:
        return torch.randint(
            10, vocab, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g
        ).tolist()

    group_prompts = [row(*prompt_len) for _ in range(n_groups)]
    prompts = [p for p in group_prompts for _ in range(n)]  # a GRPO batch: the shared-prompt layout
    responses = [row(*response_len) for _ in range(n_groups * n)]
    scores = torch.rand(n_groups * n, generator=g)
    groups = torch.arange(n_groups).repeat_interleave(n)
    mask = torch.zeros(len(responses), max(len(r) for r in responses))
    for i, r in enumerate(responses):
        mask[i, : len(r)] = 1
    adv = compute_grpo_outcome_advantage(scores, groups, mask)
    return Batch(
        prompts, responses, [], [], [], groups.tolist(), tensors={"advantages": adv, "response_mask": mask}
    )
