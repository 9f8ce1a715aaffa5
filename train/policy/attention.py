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
with. Its block mask is built by a compiled kernel (`_compile=True`), so it never materialises T x T.

On the CPU, `auto` is dense SDPA: torch has no FlexAttention backward on the CPU ("FlexAttention does
not support backward on CPU"), so a trainable CPU policy refuses `flex_attention` in one line; a frozen
one (the reference, log-prob passes) may run it, which is how the tests check its numbers against SDPA.
"""

from __future__ import annotations

import functools

import torch

ATTENTION = ("auto", "sdpa", "flex_attention", "flash_attention_2", "eager")


def pick_attention(requested: str, where: torch.device, trainable: bool = True) -> str:
    """The HF attention implementation for a policy on `where` (see the module docstring)."""
    if requested not in ATTENTION:
        raise ValueError(f"policy.attn_implementation={requested!r}: expected one of {ATTENTION}")
    if requested == "auto":
        return "flex_attention" if where.type == "cuda" else "sdpa"
    if requested == "flex_attention" and where.type != "cuda" and trainable:
        raise ValueError(
            "policy.attn_implementation=flex_attention: torch has no FlexAttention backward on the CPU; "
            "use sdpa (what auto picks on the CPU)"
        )
    return requested


def layout_warning(attn_implementation: str, share_prompts: bool, pack_sequences: bool) -> str | None:
    """A line for a layout that is unproven where it would run: shared-prompt units under FlexAttention (the
    GPU default) did not finish their first micro-batch of a paper-scale batch on an H200 (Qwen3-4B-shaped, 32K
    tokens, 130 s and 240 s tries, bench/memory_probe.py, 2026-11-26), while packed rows ran it (README, GPU)."""
    if attn_implementation == "flex_attention" and share_prompts and not pack_sequences:
        return (
            "policy.share_prompts=true under flex_attention is unproven on a GPU at long lengths (its first 32K-token "
            "micro-batch did not finish on an H200 in 130 s); policy.pack_sequences=true is the measured layout"
        )
    return None


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


def shared_prompt_block_mask(segments: torch.Tensor, compile_mask: bool = True):
    """The same pattern as `shared_prompt_dense_mask` as a FlexAttention `BlockMask` on `segments`'
    device: (U, 1, T/128, T/128) block indices instead of (U, 1, T, T) booleans. `compile_mask` builds it
    block by block with a compiled kernel (as transformers and torchtitan do); without it torch evaluates the
    mask densely first (fine for small tests)."""
    U, T = segments.shape

    def mask_mod(b, h, q_idx, kv_idx):
        q_seg, kv_seg = segments[b, q_idx], segments[b, kv_idx]
        sees = (kv_idx <= q_idx) & (q_seg >= 0) & (kv_seg >= 0) & ((kv_seg == 0) | (kv_seg == q_seg))
        return sees | (q_idx == kv_idx)

    from torch.nn.attention.flex_attention import create_block_mask

    build = _compiled_create_block_mask() if compile_mask else create_block_mask
    return build(mask_mod, U, None, T, T, device=segments.device)


@functools.cache
def _compiled_create_block_mask():
    """`torch.compile(create_block_mask)` once per process: torch's advice in place of `_compile=True`,
    and torchtitan's FlexAttention (`compiled_create_block_mask`)."""
    from torch.nn.attention.flex_attention import create_block_mask

    return torch.compile(create_block_mask)
