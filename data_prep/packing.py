"""Packed SFT data (CS336): documents concatenated, each ended by EOS, and cut into fixed-length blocks.

A block of `block_size` inputs predicts the `block_size` tokens one place to its right (the language-model
shift), and the next block starts where this one's inputs end: block i is stream[i L : (i+1) L + 1], so
every token after the first is a target exactly once and no padding is ever computed. Blocks cross
document boundaries (attention sees the previous document, as in the course). The stream's tail shorter
than a block is dropped. Each target token keeps its document's loss mask (response tokens only, or all).

Pure functions on token ids: the SFT stage (train/stages/sft.py, `data.pack=true`) turns each block into
(prompt = its first token, response = the other `block_size` tokens) for the policy, and iterates the
blocks in shuffled batches (train/data.py PromptSampler: epoch-wise shuffled, deterministic by step).
"""

from __future__ import annotations

PACK_LOSS = ("response", "all")


def pack_documents(
    prompts: list[list[int]],
    responses: list[list[int]],
    eos_id: int,
    block_size: int,
    loss_on: str = "response",
) -> tuple[list[list[int]], list[list[float]]]:
    """(blocks of block_size + 1 token ids, per-block loss masks of block_size targets).

    Each document is prompt + response (+ EOS unless the response already ends with it); `loss_on`:
    `response` trains on the response tokens and the EOS, `all` on every token (the course's packed set).
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if loss_on not in PACK_LOSS:
        raise ValueError(f"pack loss must be one of {PACK_LOSS}, got {loss_on!r}")
    stream: list[int] = []
    weight: list[float] = []
    for prompt, response in zip(prompts, responses, strict=True):
        doc = [*prompt, *response]
        mask = [1.0 if loss_on == "all" else 0.0] * len(prompt) + [1.0] * len(response)
        if not doc or doc[-1] != eos_id:
            doc.append(eos_id)
            mask.append(1.0)
        stream += doc
        weight += mask
    blocks, masks = [], []
    for start in range(0, len(stream) - block_size, block_size):
        blocks.append(stream[start : start + block_size + 1])
        masks.append(weight[start + 1 : start + block_size + 1])  # the mask of each predicted token
    return blocks, masks
