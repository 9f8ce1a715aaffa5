"""Token-budget micro-batches: rows sorted by length, packed until the padded size hits the budget.

Plain layout (b rows): prompts left-padded to a common width P, responses right-padded to a common
width R, so every response starts at column P and the logits the loss needs are the contiguous columns
P-1 .. P+R-2 (the LM head runs on those only, not on the prompt).

Shared-prompt layout (`share_prompts=True`, what GRPO groups want): the rows that share a prompt become
ONE sequence, the prompt once followed by its m responses back to back. A 4-D attention mask lets each
response see the prompt and itself (causally) and nothing of the other responses, and its position ids
restart after the prompt, so every response token gets exactly the log-prob it gets in the plain layout,
while the prompt's forward and backward run once per group instead of n times (for 8 prompts x 4 samples
x 64 tokens: 40% fewer tokens through the model).

Packed layout (`pack_sequences=True`, padding-free, for GPUs): the micro-batch is ONE row, each sample's
prompt and response back to back, position ids restarting at 0 for each sample and no attention mask:
transformers finds the sample boundaries from the position ids (a block-sparse FlexAttention mask on GPUs,
a block-diagonal causal mask under SDPA on CPUs), so no padded token is computed and the budget counts
real tokens only.

Every layout names, for each response token, the kept position whose logits predict it (`kept_index`):
log-probs and entropy are computed there and only the per-token results are padded to (rows x longest
response) (packed_logprobs.py). Planning (`plan_layout`) groups row indices only; a micro-batch's tensors
are built when it is reached.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from train.policy.attention import shared_prompt_dense_mask


@dataclass
class MicroBatch:
    rows: torch.Tensor  # (b,) indices into the full batch
    input_ids: torch.Tensor  # (b, P + R)
    attention_mask: torch.Tensor | None  # (b, P + R); None in the packed layout
    position_ids: torch.Tensor  # (b, P + R)
    response_ids: torch.Tensor  # (b, R)
    response_mask: torch.Tensor  # (b, R) float
    prompt_width: int  # P
    keep: torch.Tensor | None = None  # (K,) the columns whose logits the loss needs (LM head runs there)
    # shared-prompt layout only: input_ids etc. are (U units, T); for response row k, token t the unit
    # and the column (into `keep`) whose logits predict it
    gather_unit: torch.Tensor | None = None  # (b, R)
    gather_col: torch.Tensor | None = None  # (b, R)
    input_valid: torch.Tensor | None = None  # (U, T) real tokens
    segments: torch.Tensor | None = None  # (U, T) 0 prompt, j+1 response j, -1 padding (attention.py)
    attention_kwargs: dict = dataclasses.field(default_factory=dict)  # extra model kwargs (the split)

    @property
    def num_tokens(self) -> int:
        """Real (unpadded) tokens through the model."""
        if self.input_valid is not None:
            return int(self.input_valid.sum())
        if self.attention_mask is None:
            return self.input_ids.numel()
        return int(self.attention_mask.sum())

    def kept_index(self, kept: int) -> torch.Tensor:
        """(b, R) index of the position predicting each response token in the flattened (units x `kept`)
        kept positions: unit x kept + column (plain layout: row k's column t)."""
        if self.gather_unit is None:
            b, R = self.response_ids.shape
            return torch.arange(b * R, device=self.response_ids.device).view(b, R)
        return self.gather_unit * kept + self.gather_col

    def to(self, device: torch.device) -> MicroBatch:
        """The model inputs and the loss's tensors on `device`; `rows` stays on the CPU, where it indexes
        the batch's own (N, R) tensors."""
        if device.type == "cpu":
            return self
        moved = {
            f.name: getattr(self, f.name).to(device, non_blocking=True)
            for f in dataclasses.fields(self)
            if f.name != "rows" and isinstance(getattr(self, f.name), torch.Tensor)
        }
        return dataclasses.replace(self, **moved)


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


def _responses(
    response_ids: list[list[int]], rows: list[int], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' responses left-aligned in (b, R) (R the longest, at least 1; pad_id after) and their mask,
    as every layout hands them to the loss."""
    R = max(max(len(response_ids[i]) for i in rows), 1)
    response = torch.full((len(rows), R), pad_id, dtype=torch.long)
    response_mask = torch.zeros((len(rows), R), dtype=torch.float32)
    for k, i in enumerate(rows):
        r = response_ids[i]
        if r:
            response[k, : len(r)] = torch.tensor(r, dtype=torch.long)
            response_mask[k, : len(r)] = 1.0
    return response, response_mask


def collate(
    prompt_ids: list[list[int]], response_ids: list[list[int]], rows: list[int], pad_id: int
) -> MicroBatch:
    """Build one micro-batch from the given rows (see the module docstring for the layout)."""
    P = max(len(prompt_ids[i]) for i in rows)
    response, response_mask = _responses(response_ids, rows, pad_id)
    b, R = response.shape
    input_ids = torch.full((b, P + R), pad_id, dtype=torch.long)
    attention = torch.zeros((b, P + R), dtype=torch.long)
    for k, i in enumerate(rows):
        p, r = prompt_ids[i], response_ids[i]
        input_ids[k, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
        attention[k, P - len(p) : P] = 1
        if r:
            input_ids[k, P : P + len(r)] = torch.tensor(r, dtype=torch.long)
            attention[k, P : P + len(r)] = 1
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    return MicroBatch(
        rows=torch.tensor(rows, dtype=torch.long),
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=position_ids,
        response_ids=response,
        response_mask=response_mask,
        prompt_width=P,
        keep=torch.arange(P - 1, P + R - 1),
    )


def plan_plain(
    prompt_ids: list[list[int]], response_ids: list[list[int]], token_budget: int, pad_id: int
) -> list[Callable[[], MicroBatch]]:
    """The plain layout's micro-batches, each still to be built (call it): see `plan_layout`."""
    return _planned(collate, plan_micro_batches, prompt_ids, response_ids, token_budget, pad_id)


def _planned(
    collate_fn, grouping, prompt_ids, response_ids, token_budget: int, pad_id: int
) -> list[Callable[[], MicroBatch]]:
    """Rows grouped by `grouping(lengths, token_budget)` on their prompt + response lengths, each group a
    micro-batch `collate_fn` builds when called (the plain and the packed layout)."""
    lengths = [len(p) + len(r) for p, r in zip(prompt_ids, response_ids)]
    return [partial(collate_fn, prompt_ids, response_ids, g, pad_id) for g in grouping(lengths, token_budget)]


def prompt_units(
    prompt_ids: list[list[int]], response_ids: list[list[int]], token_budget: int
) -> list[list[int]]:
    """Rows grouped by identical prompt (first-seen order), a group split so that the prompt plus its
    responses fit the budget. E.g. prompts [a, a, b, a] -> [[0, 1, 3], [2]]."""
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prompt_ids):
        by_prompt.setdefault(tuple(p), []).append(i)
    units = []
    for prompt, rows in by_prompt.items():
        current: list[int] = []
        size = len(prompt)
        for i in rows:
            length = max(len(response_ids[i]), 1)
            if current and size + length > token_budget:
                units.append(current)
                current, size = [], len(prompt)
            current.append(i)
            size += length
        units.append(current)
    return units


def _unit_length(prompt_ids, response_ids, unit: list[int]) -> int:
    return len(prompt_ids[unit[0]]) + sum(max(len(response_ids[i]), 1) for i in unit)


def collate_shared(
    prompt_ids: list[list[int]],
    response_ids: list[list[int]],
    units: list[list[int]],
    pad_id: int,
    dense_mask: bool = True,
) -> MicroBatch:
    """One shared-prompt micro-batch: each unit (rows with one prompt) is one sequence, the prompt
    left-padded to P, then its responses back to back (no padding between them), then right padding.
    The LM head runs on columns P-1 .. T-2 (as in the plain layout); response j's first token is
    predicted at P-1, its token t at its own start + t - 1. `dense_mask=False` leaves `attention_mask`
    to be built on the device from `segments` (a FlexAttention block mask: attention.py)."""
    P = max(len(prompt_ids[u[0]]) for u in units)
    T = P + max(_unit_length(prompt_ids, response_ids, u) - len(prompt_ids[u[0]]) for u in units)
    U = len(units)
    input_ids = torch.full((U, T), pad_id, dtype=torch.long)
    segment = torch.full((U, T), -1, dtype=torch.long)  # 0 prompt, j+1 response j, -1 padding
    position_ids = torch.zeros((U, T), dtype=torch.long)
    rows = [i for u in units for i in u]
    response, response_mask = _responses(response_ids, rows, pad_id)
    b, R = response.shape
    gather_unit = torch.zeros((b, R), dtype=torch.long)
    gather_col = torch.zeros((b, R), dtype=torch.long)  # columns of keep = positions P-1 .. T-2
    k = 0
    for u, unit in enumerate(units):
        p = prompt_ids[unit[0]]
        L = len(p)
        input_ids[u, P - L : P] = torch.tensor(p, dtype=torch.long)
        segment[u, P - L : P] = 0
        position_ids[u, P - L : P] = torch.arange(L)
        start = P
        for j, i in enumerate(unit):
            r = response_ids[i]
            n = len(r)
            if n:
                input_ids[u, start : start + n] = torch.tensor(r, dtype=torch.long)
                segment[u, start : start + n] = j + 1
                position_ids[u, start : start + n] = L + torch.arange(n)
                # token t >= 1 is predicted at position start + t - 1, i.e. column start + t - P
                gather_col[k, 1:n] = start - P + 1 + torch.arange(n - 1)
            gather_unit[k] = u
            start += max(n, 1)
            k += 1
    return MicroBatch(
        rows=torch.tensor(rows, dtype=torch.long),
        input_ids=input_ids,
        attention_mask=shared_prompt_dense_mask(segment) if dense_mask else None,
        position_ids=position_ids,
        response_ids=response,
        response_mask=response_mask,
        prompt_width=P,
        keep=torch.arange(P - 1, T - 1),
        gather_unit=gather_unit,
        gather_col=gather_col,
        input_valid=segment >= 0,
        segments=segment,
    )


def plan_shared(
    prompt_ids: list[list[int]],
    response_ids: list[list[int]],
    token_budget: int,
    pad_id: int,
    dense_mask: bool = True,
) -> list[Callable[[], MicroBatch]]:
    """Shared-prompt micro-batches (still to be built); the plain layout when no two rows share a prompt."""
    units = prompt_units(prompt_ids, response_ids, token_budget)
    if len(units) == len(prompt_ids):
        return plan_plain(prompt_ids, response_ids, token_budget, pad_id)
    lengths = [_unit_length(prompt_ids, response_ids, u) for u in units]
    return [
        partial(collate_shared, prompt_ids, response_ids, [units[k] for k in group], pad_id, dense_mask)
        for group in plan_micro_batches(lengths, token_budget)
    ]


def plan_packed(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Consecutive rows grouped so each group's total length (no padding) stays within the budget;
    a row longer than the budget gets its own group."""
    groups: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i, length in enumerate(lengths):
        if current and total + length > token_budget:
            groups.append(current)
            current, total = [], 0
        current.append(i)
        total += length
    if current:
        groups.append(current)
    return groups


def collate_packed(
    prompt_ids: list[list[int]], response_ids: list[list[int]], rows: list[int], pad_id: int
) -> MicroBatch:
    """One padding-free micro-batch: the rows' prompt+response sequences concatenated into one row.

    Response k's token t is predicted at its sequence's offset + len(prompt) + t - 1; `keep` lists those
    positions for all rows and `gather_col[k, t]` is the index of token t's position in `keep`.
    """
    response, response_mask = _responses(response_ids, rows, pad_id)
    b, R = response.shape
    ids: list[int] = []
    positions: list[int] = []
    keep: list[int] = []
    gather_col = torch.zeros((b, R), dtype=torch.long)
    for k, i in enumerate(rows):
        p, r = prompt_ids[i], response_ids[i]
        start = len(ids)
        ids += p + r
        positions += list(range(len(p) + len(r)))
        if r:
            gather_col[k, : len(r)] = len(keep) + torch.arange(len(r))
            keep += list(range(start + len(p) - 1, start + len(p) + len(r) - 1))
    if not keep:  # no response token at all: keep one column so the LM head output is not empty
        keep = [len(ids) - 1]
    return MicroBatch(
        rows=torch.tensor(rows, dtype=torch.long),
        input_ids=torch.tensor([ids], dtype=torch.long),
        attention_mask=None,
        position_ids=torch.tensor([positions], dtype=torch.long),
        response_ids=response,
        response_mask=response_mask,
        prompt_width=0,
        keep=torch.tensor(keep, dtype=torch.long),
        gather_unit=torch.zeros((b, R), dtype=torch.long),
        gather_col=gather_col,
    )


def plan_packed_layout(
    prompt_ids: list[list[int]], response_ids: list[list[int]], token_budget: int, pad_id: int
) -> list[Callable[[], MicroBatch]]:
    return _planned(collate_packed, plan_packed, prompt_ids, response_ids, token_budget, pad_id)


LAYOUTS = {"plain": plan_plain, "shared": plan_shared, "packed": plan_packed_layout}


def plan_layout(
    layout: str,
    prompt_ids: list[list[int]],
    response_ids: list[list[int]],
    token_budget: int,
    pad_id: int,
    dense_mask: bool = True,
) -> list[Callable[[], MicroBatch]]:
    """One builder per micro-batch of `layout` (plain | shared | packed), in order.

    Planning only groups row indices; the tensors (ids, masks, index maps) are made when a builder is
    called, so a caller that builds, moves and runs one micro-batch at a time holds one micro-batch's
    tensors, never the whole batch's. `dense_mask=False`: the shared-prompt layout leaves its mask to the
    device (a FlexAttention block mask built from `segments`, attention.py), no (U, 1, T, T) tensor.
    """
    if layout == "shared":
        return plan_shared(prompt_ids, response_ids, token_budget, pad_id, dense_mask)
    return LAYOUTS[layout](prompt_ids, response_ids, token_budget, pad_id)


def empty_micro_batch(pad_id: int, layout: str = "plain", dense_mask: bool = True) -> MicroBatch:
    """One pad token with an all-zero response mask: contributes nothing, but runs FSDP's collectives.

    Built in `layout`, as the real micro-batches are (a shared-prompt unit with its segments, a packed row
    with no mask): a padding rank then takes the same attention path as its peers (FlexAttention's block
    mask, the split SDPA, the packed mask from position ids), not a plain row with a 2-D mask."""
    if layout == "shared":  # one unit (plan_shared would fall back to the plain layout for one row)
        mb = collate_shared([[pad_id]], [[pad_id]], [[0]], pad_id, dense_mask)
    else:
        mb = plan_layout(layout, [[pad_id]], [[pad_id]], 2, pad_id)[0]()
    mb.rows = torch.zeros(0, dtype=torch.long)
    mb.response_mask.zero_()
    return mb


def build_micro_batches(
    layout: str, prompt_ids: list[list[int]], response_ids: list[list[int]], token_budget: int, pad_id: int
) -> list[MicroBatch]:
    """Every micro-batch of `layout` built at once (tests and tools; training builds them one at a time)."""
    return [build() for build in plan_layout(layout, prompt_ids, response_ids, token_budget, pad_id)]
