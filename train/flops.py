"""The FLOPs of a GRPO step of a decoder-only LM: what the planner (train/plan.py) times at a stated MFU and
what the benchmarks (bench/train_step.py, bench/gpu_check.py) divide measured time into.

Matmul FLOPs only: generation ~2*N*tokens with each prompt prefilled once, training ~6*N*tokens over
prompt+response (forward + backward), the LM head on the positions whose logits are computed, and causal
attention (QK^T and AV) counted position by position.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelDims:
    """What the FLOP count needs from a decoder-only LM."""

    body_params: int  # parameters outside the token embedding and the LM head
    hidden: int
    vocab: int
    layers: int
    attn_dim: int  # query heads x head dim


@dataclass
class StepWork:
    """The tokens of one GRPO step."""

    prompt_lens: list[int]  # one per unique prompt
    response_lens: list[int]  # one per sample, prompt-major (sample j of prompt p at p * n + j)
    n: int  # samples per prompt

    def prompt_tokens(self) -> int:  # prompt tokens over all samples (what training processes)
        return self.n * sum(self.prompt_lens)

    def response_tokens(self) -> int:
        return sum(self.response_lens)


def _causal_attn_flops(dims: ModelDims, start: int, end: int) -> float:
    """Forward QK^T and AV FLOPs of positions start+1..end attending to all earlier positions."""
    positions = (end * (end + 1) - start * (start + 1)) // 2  # sum of t for t in (start, end]
    return 4.0 * dims.layers * dims.attn_dim * positions


def generation_flops(dims: ModelDims, work: StepWork) -> float:
    """Each prompt prefilled once (prefix cache), then one forward per generated token, LM head per token."""
    flops = 2.0 * dims.body_params * (sum(work.prompt_lens) + work.response_tokens())
    flops += 2.0 * dims.hidden * dims.vocab * work.response_tokens()
    for p, plen in enumerate(work.prompt_lens):
        flops += _causal_attn_flops(dims, 0, plen)
        for r in work.response_lens[p * work.n : (p + 1) * work.n]:
            flops += _causal_attn_flops(dims, plen, plen + r)
    return flops


def training_flops(dims: ModelDims, work: StepWork, shared_prompts: bool = False) -> float:
    """Forward + backward (3x forward) over prompt+response of every sample, LM head on response positions.

    `shared_prompts`: each group's prompt goes through the model once (policy.share_prompts), not n times.
    """
    prompt_tokens = sum(work.prompt_lens) if shared_prompts else work.prompt_tokens()
    flops = 6.0 * dims.body_params * (prompt_tokens + work.response_tokens())
    flops += 6.0 * dims.hidden * dims.vocab * work.response_tokens()
    for p, plen in enumerate(work.prompt_lens):
        if shared_prompts:
            flops += 3.0 * _causal_attn_flops(dims, 0, plen)
        for r in work.response_lens[p * work.n : (p + 1) * work.n]:
            flops += 3.0 * _causal_attn_flops(dims, plen if shared_prompts else 0, plen + r)
    return flops


def step_flops(dims: ModelDims, work: StepWork, shared_prompts: bool = False) -> float:
    return generation_flops(dims, work) + training_flops(dims, work, shared_prompts)
