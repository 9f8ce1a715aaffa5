"""Token-budget micro-batches: rows sorted by length, packed until the padded size hits the budget.

Layout of one micro-batch (b rows): prompts left-padded to a common width P, responses right-padded
to a common width R, so every response starts at column P and the logits the loss needs are the
contiguous columns P-1 .. P+R-2 (the LM head runs on those only, not on the prompt).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class MicroBatch:
    rows: torch.Tensor  # (b,) indices into the full batch
    input_ids: torch.Tensor  # (b, P + R)
    attention_mask: torch.Tensor  # (b, P + R)
    position_ids: torch.Tensor  # (b, P + R)
    response_ids: torch.Tensor  # (b, R)
    response_mask: torch.Tensor  # (b, R) float
    prompt_width: int  # P

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())


def plan_micro_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Group row indices so each group's padded size (rows x longest) stays within the budget.

    Sorting by length first keeps padding small; a single row longer than the budget gets its own group.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        new_longest = max(longest, lengths[i])
        if current and new_longest * (len(current) + 1) > token_budget:
            groups.append(current)
            current, new_longest = [], lengths[i]
        current.append(i)
        longest = new_longest
    if current:
        groups.append(current)
    return groups


def collate(
    prompt_ids: list[list[int]], response_ids: list[list[int]], rows: list[int], pad_id: int
) -> MicroBatch:
    """Build one micro-batch from the given rows (see the module docstring for the layout)."""
    P = max(len(prompt_ids[i]) for i in rows)
    R = max(max(len(response_ids[i]) for i in rows), 1)
    b = len(rows)
    input_ids = torch.full((b, P + R), pad_id, dtype=torch.long)
    attention = torch.zeros((b, P + R), dtype=torch.long)
    response = torch.full((b, R), pad_id, dtype=torch.long)
    response_mask = torch.zeros((b, R), dtype=torch.float32)
    for k, i in enumerate(rows):
        p, r = prompt_ids[i], response_ids[i]
        input_ids[k, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
        attention[k, P - len(p) : P] = 1
        if r:
            input_ids[k, P : P + len(r)] = torch.tensor(r, dtype=torch.long)
            attention[k, P : P + len(r)] = 1
            response[k, : len(r)] = torch.tensor(r, dtype=torch.long)
            response_mask[k, : len(r)] = 1.0
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    return MicroBatch(
        rows=torch.tensor(rows, dtype=torch.long),
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=position_ids,
        response_ids=response,
        response_mask=response_mask,
        prompt_width=P,
    )


def make_micro_batches(
    prompt_ids: list[list[int]], response_ids: list[list[int]], token_budget: int, pad_id: int
) -> list[MicroBatch]:
    lengths = [len(p) + len(r) for p, r in zip(prompt_ids, response_ids)]
    return [collate(prompt_ids, response_ids, g, pad_id) for g in plan_micro_batches(lengths, token_budget)]


def empty_micro_batch(pad_id: int) -> MicroBatch:
    """One pad token with an all-zero response mask: contributes nothing, but runs FSDP's collectives."""
    mb = collate([[pad_id]], [[pad_id]], [0], pad_id)
    mb.rows = torch.zeros(0, dtype=torch.long)
    mb.response_mask.zero_()
    return mb
