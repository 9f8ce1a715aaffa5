"""Attention selection (FlexAttention on GPU, SDPA on CPU: split for shared-prompt units), the shared-prompt
block mask and the split attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from train.policy.attention import (
    SPLIT_SDPA,
    pick_attention,
    shared_prompt_block_mask,
    shared_prompt_dense_mask,
    shared_prompt_split,
    split_attention,
)
from train.policy.batching import build_micro_batches, collate_shared


def test_auto_is_flex_on_gpu_and_sdpa_on_cpu():
    assert pick_attention("auto", torch.device("cuda")) == "flex_attention"
    assert pick_attention("auto", torch.device("cpu")) == "sdpa"
    assert pick_attention("auto", torch.device("cpu"), shared=True) == SPLIT_SDPA  # shared-prompt units
    assert pick_attention("auto", torch.device("cuda"), shared=True) == "flex_attention"
    assert pick_attention("sdpa", torch.device("cpu"), shared=True) == "sdpa"  # the dense mask, on request
    assert pick_attention("sdpa", torch.device("cuda")) == "sdpa"  # an explicit choice is kept
    assert pick_attention("flex_attention", torch.device("cpu"), trainable=False) == "flex_attention"
    with pytest.raises(ValueError, match="no FlexAttention backward on the CPU; use sdpa"):
        pick_attention("flex_attention", torch.device("cpu"), trainable=True)
    with pytest.raises(ValueError, match="policy.attn_implementation='flash'"):
        pick_attention("flash", torch.device("cuda"))


def test_shared_prompt_block_mask_attends_like_the_dense_mask():
    from torch.nn.attention.flex_attention import flex_attention

    # two units: prompt [1, 2] + responses [7], [8, 9, 6]; prompt [4] + response [5], then padding
    mb = collate_shared([[1, 2], [1, 2], [4]], [[7], [8, 9, 6], [5]], [[0, 1], [2]], pad_id=0)
    assert mb.segments.tolist() == [[0, 0, 1, 2, 2, 2], [-1, 0, 1, -1, -1, -1]]
    dense = shared_prompt_dense_mask(mb.segments)
    assert torch.equal(dense, mb.attention_mask)
    block = shared_prompt_block_mask(mb.segments)
    assert block.shape == (2, 1, 6, 6)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 6, 8, generator=g) for _ in range(3))
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
    got = flex_attention(q, k, v, block_mask=block)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def _blocks(mask) -> tuple[torch.Tensor, torch.Tensor]:
    """(partial, full) (B, n, n) booleans of a BlockMask's key-block lists."""

    def dense(num, index):
        B, _, n = num.shape
        out = torch.zeros(B, n, index.shape[-1], dtype=torch.bool)
        for b in range(B):
            for i in range(n):
                out[b, i, index[b, 0, i, : num[b, 0, i]].long()] = True
        return out

    return dense(mask.kv_num_blocks, mask.kv_indices), dense(mask.full_kv_num_blocks, mask.full_kv_indices)


def _random_units(g: torch.Generator, units: int, empty: bool) -> list[tuple[list[int], list[list[int]]]]:
    out = []
    for _ in range(units):
        prompt = torch.randint(5, 100, (int(torch.randint(1, 300, (1,), generator=g)),), generator=g).tolist()
        answers = []
        for _ in range(int(torch.randint(1, 6, (1,), generator=g))):
            n = int(torch.randint(0 if empty else 1, 400, (1,), generator=g))
            answers.append(torch.randint(5, 100, (n,), generator=g).tolist())
        out.append((prompt, answers))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_shared_prompt_block_mask_classifies_blocks_as_the_mask_evaluated_densely(seed):
    """The layout-derived block lists against torch's `create_block_mask`, which evaluates the mask on every
    (query, key) pair: identical where no response is empty; with empty responses (a gap in the ids) only
    extra partial blocks, never a missing or a wrongly full one. Shapes long enough for many 128-blocks,
    ragged prompts (left padding) and ragged units (right padding)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    g = torch.Generator().manual_seed(seed)
    empty = seed >= 3
    prompts, responses, units = [], [], []
    for prompt, answers in _random_units(g, int(torch.randint(1, 4, (1,), generator=g)), empty):
        units.append(list(range(len(prompts), len(prompts) + len(answers))))
        prompts += [prompt] * len(answers)
        responses += answers
    mb = collate_shared(prompts, responses, units, pad_id=0, dense_mask=False)
    U, T = mb.segments.shape
    ours = shared_prompt_block_mask(mb.segments)
    dense = shared_prompt_dense_mask(mb.segments)[:, 0]
    theirs = create_block_mask(lambda b, h, q, kv: dense[b, q, kv], U, None, T, T, device="cpu")
    (p_ours, f_ours), (p_theirs, f_theirs) = _blocks(ours), _blocks(theirs)
    assert ours.shape == (U, 1, T, T)
    if not empty:
        assert torch.equal(p_ours, p_theirs) and torch.equal(f_ours, f_theirs)
    assert not (f_ours & ~f_theirs).any()  # nothing called full that is not
    assert not ((p_theirs | f_theirs) & ~(p_ours | f_ours)).any()  # nothing dropped that is needed
    g2 = torch.Generator().manual_seed(100 + seed)
    q, k, v = (torch.randn(U, 2, T, 16, generator=g2, dtype=torch.float64) for _ in range(3))
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=dense.unsqueeze(1))
    torch.testing.assert_close(flex_attention(q, k, v, block_mask=ours), want, rtol=0, atol=1e-12)


def test_split_attention_hand_checked_maps():
    """Unit 0: prompt [1, 2] + responses [7], [8, 9, 6]; unit 1: prompt [4] + response [5], padding."""
    mb = collate_shared([[1, 2], [1, 2], [4]], [[7], [8, 9, 6], [5]], [[0, 1], [2]], pad_id=0)
    split = shared_prompt_split(mb.segments)
    assert split.P == 2 and split.unit.tolist() == [0, 0, 1]
    assert split.cols.tolist() == [[2, 3, 4], [3, 4, 5], [2, 3, 4]]  # response starts, clipped at T - 1
    assert split.prompt_mask[1, 0].tolist() == [[True, False], [False, True]]  # left pad sees itself only
    # response 1 of unit 0 (tokens 8, 9, 6): the prompt's 2 columns, then causal over its own 3
    assert split.response_mask[1, 0].int().tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    # response 0 of unit 1 (one token): unit 1's real prompt column only, then itself; its padding rows
    # (offsets 1, 2) see only themselves
    assert split.response_mask[2, 0].int().tolist() == [[0, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 0, 1]]
    assert list(zip(split.flat_unit.tolist(), split.flat_col.tolist())) == [
        (0, 2),
        (0, 3),
        (0, 4),
        (0, 5),
        (1, 2),
    ]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_split_attention_equals_the_dense_mask(dtype):
    """Ragged prompts (left-padded), empty responses, several micro-batches: outputs and input gradients on
    real tokens equal SDPA's under the dense mask (padding columns, which nothing reads, stay finite)."""
    g = torch.Generator().manual_seed(4)
    prompts, responses = [], []
    for n_prompt, answers in ((3, (5, 0, 2)), (7, (1, 6)), (1, (4, 4, 0, 3)), (5, (2,))):
        p = torch.randint(5, 100, (n_prompt,), generator=g).tolist()
        for n in answers:
            prompts.append(p)
            responses.append(torch.randint(5, 100, (n,), generator=g).tolist())
    mbs = build_micro_batches("shared", prompts, responses, 16, 0)
    assert len(mbs) > 1
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    for mb in mbs:
        U, T = mb.segments.shape
        q, k, v = (torch.randn(U, 3, T, 8, generator=g).to(dtype).requires_grad_() for _ in range(3))
        real = mb.segments >= 0
        dense = F.scaled_dot_product_attention(q, k, v, attn_mask=shared_prompt_dense_mask(mb.segments))
        dense = dense.transpose(1, 2)
        split = split_attention(q, k, v, shared_prompt_split(mb.segments))
        torch.testing.assert_close(split[real], dense[real], rtol=0, atol=tol)
        assert split.isfinite().all()
        up = torch.randn(dense.shape, generator=g).to(dtype) * real[:, :, None, None]
        want = torch.autograd.grad((dense * up).sum(), (q, k, v))
        got = torch.autograd.grad((split * up).sum(), (q, k, v))
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=0, atol=4 * tol)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["shared", "packed"])
def test_flex_attention_log_probs_equal_sdpa(tiny_model, dist_group, layout):
    """transformers' FlexAttention path (compiled, as on a GPU) on this project's layouts: the block mask from
    the position ids (packed) or from the units' segments (shared) gives SDPA's log-probs. Forward only:
    torch has no FlexAttention backward on the CPU."""
    from train.policy.fsdp import Policy

    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(10, 4000, (int(n),), generator=g).tolist() for n in (5, 9, 3)]
    rows = [p for p in prompts for _ in range(3)]
    responses = [torch.randint(10, 4000, (int(n),), generator=g).tolist() for n in [6, 1, 11] * 3]
    kw = {"share_prompts": layout == "shared", "pack_sequences": layout == "packed", "trainable": False}
    sdpa = Policy(tiny_model, micro_batch_tokens=48, pad_id=0, attn_implementation="sdpa", **kw)
    flex = Policy(tiny_model, micro_batch_tokens=48, pad_id=0, attn_implementation="flex_attention", **kw)
    mbs = list(flex.micro_batches(rows, responses))
    assert len(mbs) > 1
    if layout == "shared":
        assert all(type(mb.attention_mask).__name__ == "BlockMask" for mb in mbs if mb.segments is not None)
    lp_sdpa, ent_sdpa = sdpa.compute_log_probs(rows, responses, with_entropy=True)
    lp_flex, ent_flex = flex.compute_log_probs(rows, responses, with_entropy=True)
    torch.testing.assert_close(lp_flex, lp_sdpa, rtol=0, atol=2e-5)
    torch.testing.assert_close(ent_flex, ent_sdpa, rtol=0, atol=2e-5)


def test_every_paper_preset_trains_packed_rows():
    """The GPU presets use the layout measured at their shapes on an H200 (docs/gpu.md), not the
    shared-prompt units that stalled there."""
    from infra.models import PROJECT_ROOT
    from train.config import build_config, load_experiment

    with_paper = [
        p.stem
        for p in sorted((PROJECT_ROOT / "experiments").glob("*.yaml"))
        if "paper" in (load_experiment(p.stem).get("presets") or {})
    ]
    assert len(with_paper) >= 5, with_paper
    for name in with_paper:
        cfg = build_config(name, [], preset="paper")
        assert cfg.policy.pack_sequences, f"{name} preset=paper: policy.pack_sequences is not true"


def test_a_reference_model_takes_the_policys_layout_attention_and_kernels(tiny_model, dist_group):
    """The KL/DPO reference and the critic are built from `companion_kwargs`: a packed-rows policy gets a
    packed-rows reference (not the shared-prompt units that stalled under FlexAttention on a GPU), and the
    same attention, precision and fp32 kernel, so step 1's policy and reference log-probs agree exactly."""
    from train.policy.fsdp import Policy

    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(10, 4000, (n,), generator=g).tolist() for n in (4, 7)]
    rows = [p for p in prompts for _ in range(2)]
    responses = [torch.randint(10, 4000, (n,), generator=g).tolist() for n in (3, 5, 2, 6)]
    for layout in ({"pack_sequences": True}, {"share_prompts": True}, {"share_prompts": False}):
        policy = Policy(tiny_model, lr=1e-3, micro_batch_tokens=24, pad_id=0, **layout)
        ref = Policy(tiny_model, trainable=False, **policy.companion_kwargs())
        assert (ref.layout, ref.attn_implementation, ref.precision) == (
            policy.layout,
            policy.attn_implementation,
            policy.precision,
        )
        assert ref.precision_choice.fp32_kernel == policy.precision_choice.fp32_kernel
        assert torch.equal(
            ref.compute_log_probs(rows, responses)[0], policy.compute_log_probs(rows, responses)[0]
        )
