"""Which attention kernel the policy runs, and the shared-prompt layout's mask for it.

On a GPU, `auto` is torch's own FlexAttention (`attn_implementation="flex_attention"` in transformers):
block-sparse, so the causal upper triangle and the blocks between different sequences of a micro-batch
are skipped, never computed or masked, and no (T x T) mask exists. Each layout gives it its structure:
- packed rows: transformers builds the block mask from the restarting position ids (document ids);
- plain rows: transformers builds it from the 2-D padding mask (causal + padding);
- shared-prompt units: `shared_prompt_block_mask` below, from the units' segment ids (a response sees
  the prompt and itself, causally; padding sees itself).
FlexAttention needs no extra package (the `gpu` extra's torch has it; flash-attn has no wheel there),
handles the shared-prompt pattern that variable-length kernels cannot, and is what torchtitan trains
with. Its block mask is classified block by block from the layout (`shared_prompt_block_mask`), so it never
materialises T x T and compiles nothing.

On the CPU, `auto` is SDPA: torch has no FlexAttention backward on the CPU ("FlexAttention does not
support backward on CPU"), so a trainable CPU policy refuses `flex_attention` in one line; a frozen one
(the reference, log-prob passes) may run it, which is how the tests check its numbers against SDPA. For
shared-prompt units it is `sdpa_shared_prompt` (`split_attention`): instead of one dense (T x T) masked
product per unit, the prompts attend over themselves and each response over its prompt and itself, two
SDPA calls over index maps made once per micro-batch (same outputs; 3.2x fewer scores at 4 answers of 64
tokens to a 40-token prompt). `sdpa` keeps the dense mask.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

SPLIT_SDPA = "sdpa_shared_prompt"  # the transformers attention name of `split_attention` (registered below)
ATTENTION = ("auto", "sdpa", SPLIT_SDPA, "flex_attention", "flash_attention_2", "eager")


def pick_attention(requested: str, where: torch.device, trainable: bool = True, shared: bool = False) -> str:
    """The HF attention implementation for a policy on `where` whose micro-batches are shared-prompt units
    when `shared` (see the module docstring)."""
    if requested not in ATTENTION:
        raise ValueError(f"policy.attn_implementation={requested!r}: expected one of {ATTENTION}")
    if requested == "auto":
        if where.type == "cuda":
            return "flex_attention"
        requested = SPLIT_SDPA if shared else "sdpa"
    if requested == SPLIT_SDPA:
        register_split_attention()
    if requested == "flex_attention" and where.type != "cuda" and trainable:
        raise ValueError(
            "policy.attn_implementation=flex_attention: torch has no FlexAttention backward on the CPU; "
            "use sdpa (what auto picks on the CPU)"
        )
    return requested


def shared_prompt_dense_mask(segments: torch.Tensor) -> torch.Tensor:
    """(U, 1, T, T) boolean mask of the shared-prompt layout for SDPA/eager (CPU): query i sees key j when
    j <= i, both are real tokens, and j is in the prompt (segment 0) or in i's own response; padding
    queries see themselves (no all-masked row, which would give NaN)."""
    T = segments.shape[1]
    valid = segments >= 0
    q, kv = segments.unsqueeze(2), segments.unsqueeze(1)  # (U, T, 1), (U, 1, T)
    causal = torch.ones((T, T), dtype=torch.bool, device=segments.device).tril()
    mask = causal & valid.unsqueeze(1) & valid.unsqueeze(2) & ((kv == 0) | (kv == q))
    mask |= torch.eye(T, dtype=torch.bool, device=segments.device)
    return mask.unsqueeze(1)


def shared_prompt_block_mask(segments: torch.Tensor, block: int = 128):
    """The same pattern as `shared_prompt_dense_mask` as a FlexAttention `BlockMask` on `segments`' device:
    (U, 1, T/128, T/128) block indices instead of (U, 1, T, T) booleans.

    The blocks are classified from the layout, not by evaluating the mask: every unit's columns are left
    padding, the prompt, responses 1, 2, ... in order, then right padding, so per-block summaries (is every
    token real, is any a prompt token, the least and greatest response id) decide each (query, key) block
    pair: empty (nothing to compute), full (no mask to apply) or partial (the kernel applies `mask_mod`).
    A few small tensor ops and no compilation: `torch.compile(create_block_mask)` took 60 s for its first
    (6, 4361) micro-batch inside the policy on an H100 and did not finish a (2, 11608) one in 100 s
    (bench/flex_probe.py and bench/memory_probe.py, README GPU), the shared-prompt stall at paper lengths.
    Where an id range over-approximates (an empty response leaves a gap) a block is kept as partial, never
    dropped, so the kernel's per-token mask keeps the result exact."""
    from torch.nn.attention.flex_attention import BlockMask

    U, T = segments.shape

    def mask_mod(b, h, q_idx, kv_idx):
        q_seg, kv_seg = segments[b, q_idx], segments[b, kv_idx]
        sees = (kv_idx <= q_idx) & (q_seg >= 0) & (kv_seg >= 0) & ((kv_seg == 0) | (kv_seg == q_seg))
        return sees | (q_idx == kv_idx)

    n = -(-T // block)
    seg = torch.nn.functional.pad(segments, (0, n * block - T), value=-1).view(U, n, block)
    response = seg > 0
    has_response = response.any(-1)
    low = torch.where(response, seg, torch.iinfo(seg.dtype).max).amin(-1)  # (U, n) least response id
    high = torch.where(response, seg, -1).amax(-1)  # greatest (-1: none)
    has_prompt, all_prompt = (seg == 0).any(-1), (seg == 0).all(-1)
    any_real, all_real = (seg >= 0).any(-1), (seg >= 0).all(-1)
    q, kv = (lambda x: x.unsqueeze(2)), (lambda x: x.unsqueeze(1))  # (U, n, 1) query, (U, 1, n) key blocks
    below = torch.ones(n, n, dtype=torch.bool, device=seg.device).tril(-1)  # every key before every query
    shared_ids = q(has_response) & kv(has_response) & (q(low) <= kv(high)) & (kv(low) <= q(high))
    sees_some = below & q(any_real) & (kv(has_prompt) | shared_ids)
    one_response = q(all_real) & q(has_response) & ~q(has_prompt) & (q(low) == q(high))
    keys_in_it = kv(all_real) & (~kv(has_response) | ((kv(low) == q(low)) & (kv(high) == q(low))))
    full = below & q(all_real) & (kv(all_prompt) | (one_response & keys_in_it))
    diagonal = torch.eye(n, dtype=torch.bool, device=seg.device)  # each query sees itself: never empty
    partial = (sees_some & ~full) | diagonal

    def ordered(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(U, 1, n) counts and (U, 1, n, n) indices, the kept key blocks first in ascending order."""
        index = torch.argsort(blocks.to(torch.int8), dim=-1, descending=True, stable=True)
        return blocks.sum(-1).to(torch.int32).unsqueeze(1), index.to(torch.int32).unsqueeze(1)

    return BlockMask.from_kv_blocks(
        *ordered(partial), *ordered(full), BLOCK_SIZE=block, mask_mod=mask_mod, seq_lengths=(T, T)
    )


@dataclass
class SharedPromptSplit:
    """Index maps of one shared-prompt micro-batch for `split_attention`, built once and used by every layer.

    The prompt occupies columns 0..P-1 of every unit (left-padded); each response is a run of columns after
    it. `cols[k]` are response k's columns (clipped past its end), `unit[k]` its unit; (`flat_unit`,
    `flat_col`) are the real response tokens in order. The `*_rows` index the (U x T) positions flattened
    (unit * T + column), the layout `split_attention` gathers from and writes to."""

    P: int
    prompt_mask: torch.Tensor  # (U, 1, P, P): causal over real prompt tokens (+ the diagonal for padding)
    unit: torch.Tensor  # (Nr,)
    cols: torch.Tensor  # (Nr, Rm)
    response_mask: torch.Tensor  # (Nr, 1, Rm, P + Rm): the unit's real prompt, then causal over the response
    flat_unit: torch.Tensor  # (M,) the real response tokens' units ...
    flat_col: torch.Tensor  # (M,) ... and columns
    own_rows: torch.Tensor  # (Nr * Rm,) each response's columns
    prompt_rows: torch.Tensor  # (Nr * P,) its unit's prompt columns
    answer_rows: torch.Tensor  # (M,) the real tokens among the (Nr * Rm) response outputs
    write_rows: torch.Tensor  # (U * P + M,) where the prompt outputs, then the real response outputs, go


def shared_prompt_split(segments: torch.Tensor) -> SharedPromptSplit:
    """The split of `segments` ((U, T): 0 prompt, j+1 response j, -1 padding; prompts left-padded)."""
    U, T = segments.shape
    dev = segments.device
    in_prompt = segments == 0
    P = int(in_prompt.any(0).nonzero().max()) + 1 if bool(in_prompt.any()) else 0
    prompt_valid = in_prompt[:, :P]  # (U, P)
    causal = torch.ones((P, P), dtype=torch.bool, device=dev).tril()
    eye = torch.eye(P, dtype=torch.bool, device=dev)
    prompt_mask = ((causal & prompt_valid[:, None, :]) | eye).unsqueeze(1)
    units, starts, lengths = [], [], []  # each response's unit, first column and length, in column order
    for u in range(U):
        ids, counts = torch.unique_consecutive(segments[u, P:], return_counts=True)
        col = P
        for seg, n in zip(ids.tolist(), counts.tolist()):
            if seg > 0:
                units.append(u)
                starts.append(col)
                lengths.append(n)
            col += n
    Nr, Rm = len(units), max(lengths, default=1)
    unit = torch.tensor(units, dtype=torch.long, device=dev)
    start = torch.tensor(starts, dtype=torch.long, device=dev)
    length = torch.tensor(lengths, dtype=torch.long, device=dev)
    offset = torch.arange(Rm, device=dev)
    real = offset[None, :] < length[:, None]  # (Nr, Rm)
    cols = (start[:, None] + offset[None, :]).clamp(max=T - 1)
    own = (
        torch.ones((Rm, Rm), dtype=torch.bool, device=dev).tril()[None] & real[:, None, :] & real[:, :, None]
    )
    own |= torch.eye(Rm, dtype=torch.bool, device=dev)[None] & ~real[:, :, None]  # padding sees itself only
    seen_prompt = prompt_valid[unit][:, None, :].expand(Nr, Rm, P) & real[:, :, None]
    flat_response, flat_offset = real.nonzero(as_tuple=True)
    flat_unit, flat_col = unit[flat_response], cols[flat_response, flat_offset]
    prompt_cols = torch.arange(P, device=dev)
    all_prompts = (torch.arange(U, device=dev)[:, None] * T + prompt_cols).flatten()
    return SharedPromptSplit(
        P=P,
        prompt_mask=prompt_mask,
        unit=unit,
        cols=cols,
        response_mask=torch.cat([seen_prompt, own], dim=2).unsqueeze(1),
        flat_unit=flat_unit,
        flat_col=flat_col,
        own_rows=(unit[:, None] * T + cols).flatten(),
        prompt_rows=(unit[:, None] * T + prompt_cols).flatten(),
        answer_rows=flat_response * Rm + flat_offset,
        write_rows=torch.cat([all_prompts, flat_unit * T + flat_col]),
    )


def split_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    split: SharedPromptSplit,
    scaling: float | None = None,
) -> torch.Tensor:
    """Shared-prompt attention as two dense SDPA calls: the prompts over themselves, and each response over
    its unit's prompt and itself. (U, H, T, d) queries, (U, H_kv, T, d) keys and values -> (U, T, H, d)
    (padding columns: finite values nothing reads). The dense (U, T, T) mask scores every pair of a unit's
    columns; this scores P^2 + sum_k R_k (P + R_k) of them (3.2x fewer for 4 answers of 64 tokens to a
    40-token prompt).

    Gathers and the write-back are `index_select` / `index_copy` over the flattened (unit, column) rows of
    `split` (their backward passes are one `index_add` / `index_select`). The two products run in fp32 (at
    least) whatever the inputs: torch's CPU flash-attention backward was slower in bf16 than in fp32 at
    these shapes (64 x 104 per response: 12.0 vs 7.8 ms for 16 responses x 9 heads), and fp32 only adds
    accuracy."""
    U, H, T, d = query.shape
    P = split.P
    Nr, Rm = split.cols.shape
    wide = torch.promote_types(query.dtype, torch.float32)

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(
            q.to(wide), k.to(wide), v.to(wide), attn_mask=mask, scale=scaling, enable_gqa=True
        )

    def rows(x: torch.Tensor, index: torch.Tensor, length: int) -> torch.Tensor:  # (Nr, length, heads, d)
        flat = x.transpose(1, 2).reshape(U * T, x.shape[1], d)
        return flat.index_select(0, index).view(Nr, length, x.shape[1], d)

    def keys(x: torch.Tensor) -> torch.Tensor:  # (Nr, H_kv, P + Rm, d): the unit's prompt, then its own
        return torch.cat([rows(x, split.prompt_rows, P), rows(x, split.own_rows, Rm)], dim=1).transpose(1, 2)

    outputs = []
    if P:
        prompt = sdpa(query[:, :, :P], key[:, :, :P], value[:, :, :P], split.prompt_mask)
        outputs.append(prompt.transpose(1, 2).reshape(U * P, H, d))
    if Nr:
        q = rows(query, split.own_rows, Rm).transpose(1, 2)
        answers = sdpa(q, keys(key), keys(value), split.response_mask).transpose(1, 2).reshape(Nr * Rm, H, d)
        outputs.append(answers.index_select(0, split.answer_rows))
    out = query.new_zeros(U * T, H, d)
    if outputs:
        out = out.index_copy(0, split.write_rows, torch.cat(outputs).to(query.dtype))
    return out.view(U, T, H, d)


def _split_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' attention-function signature: `split_attention` for a micro-batch that carries a
    `shared_prompt_split`, plain SDPA (with its mask) for any other."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    split = kwargs.pop("shared_prompt_split", None)
    if split is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    return split_attention(query, key, value, split, scaling), None


@functools.cache
def register_split_attention() -> str:
    """Make `SPLIT_SDPA` a transformers attention implementation (its masks are SDPA's); once per process."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(SPLIT_SDPA, _split_attention_forward)
    AttentionMaskInterface.register(SPLIT_SDPA, sdpa_mask)
    return SPLIT_SDPA
