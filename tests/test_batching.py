import torch

from tests.applied_grads import applied_grads
from train.policy.batching import build_micro_batches, collate, plan_micro_batches


def test_plan_respects_budget_and_covers_every_row():
    lengths = [5, 30, 12, 7, 30, 3, 18]
    groups = plan_micro_batches(lengths, token_budget=40)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        assert max(lengths[i] for i in g) * len(g) <= 40 or len(g) == 1
    # sorted by length: the two 30s share a group only if the budget allows (60 > 40: it does not)
    assert [1, 4] not in groups


def test_oversized_row_gets_its_own_group():
    assert plan_micro_batches([100, 2, 2], token_budget=10) == [[1, 2], [0]]


def test_collate_layout_left_pads_prompts_right_pads_responses():
    prompts = [[1, 2, 3], [4]]
    responses = [[7], [8, 9]]
    mb = collate(prompts, responses, [0, 1], pad_id=0)
    assert mb.prompt_width == 3
    assert mb.input_ids.tolist() == [[1, 2, 3, 7, 0], [0, 0, 4, 8, 9]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1, 0], [0, 0, 1, 1, 1]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 3], [0, 0, 0, 1, 2]]
    assert mb.response_ids.tolist() == [[7, 0], [8, 9]]
    assert mb.response_mask.tolist() == [[1.0, 0.0], [1.0, 1.0]]


def test_make_micro_batches_rows_point_back_to_the_batch():
    prompts = [[1] * n for n in (3, 9, 4, 8)]
    responses = [[2] * n for n in (2, 6, 1, 5)]
    mbs = build_micro_batches("plain", prompts, responses, token_budget=30, pad_id=0)
    seen = torch.cat([mb.rows for mb in mbs]).tolist()
    assert sorted(seen) == [0, 1, 2, 3]
    for mb in mbs:
        for k, row in enumerate(mb.rows.tolist()):
            assert int(mb.response_mask[k].sum()) == len(responses[row])


def test_prompt_units_group_rows_by_prompt_and_split_to_the_budget():
    from train.policy.batching import prompt_units

    prompts = [[1, 2], [1, 2], [3], [1, 2]]
    responses = [[5, 5, 5], [6], [7], [8, 8]]
    assert prompt_units(prompts, responses, token_budget=100) == [[0, 1, 3], [2]]
    # prompt 2 + 3 + 1 = 6 fits 6; adding the third response (2 more) would not
    assert prompt_units(prompts, responses, token_budget=6) == [[0, 1], [3], [2]]


def test_collate_shared_layout_hand_checked():
    from train.policy.batching import collate_shared

    mb = collate_shared([[1, 2], [1, 2], [4]], [[7], [8, 9], [5]], [[0, 1], [2]], pad_id=0)
    # unit 0: prompt [1, 2] then responses [7] and [8, 9] back to back; unit 1: [4] left-padded, [5]
    assert mb.input_ids.tolist() == [[1, 2, 7, 8, 9], [0, 4, 5, 0, 0]]
    assert mb.position_ids.tolist() == [
        [0, 1, 2, 2, 3],
        [0, 0, 1, 0, 0],
    ]  # responses restart after the prompt
    assert mb.keep.tolist() == [1, 2, 3]  # columns P-1 .. T-2 as in the plain layout
    # response [8, 9]: token 0 predicted at P-1 (column 0), token 1 at position 3 (column 2)
    assert mb.gather_unit.tolist() == [[0, 0], [0, 0], [1, 1]]
    assert mb.gather_col[1].tolist() == [0, 2] and mb.gather_col[0, 0] == 0 and mb.gather_col[2, 0] == 0
    assert mb.response_ids.tolist() == [[7, 0], [8, 9], [5, 0]]
    assert mb.response_mask.tolist() == [[1, 0], [1, 1], [1, 0]]
    assert mb.attention_mask.int()[0, 0].tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],  # response 0 sees the prompt and itself
        [1, 1, 0, 1, 0],  # response 1 does not see response 0
        [1, 1, 0, 1, 1],
    ]
    assert mb.attention_mask.int()[1, 0].tolist()[3] == [0, 0, 0, 1, 0]  # padding sees itself only
    assert mb.num_tokens == 7 and mb.rows.tolist() == [0, 1, 2]


def test_shared_prompt_layout_gives_the_plain_layouts_log_probs_and_gradients(tiny_model, dist_group):
    from train.policy.fsdp import Policy

    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 4000, (int(k),), generator=g).tolist() for k in (3, 9, 6)]
    rows = [p for p in prompts for _ in range(4)]
    responses = [torch.randint(10, 4000, (int(k),), generator=g).tolist() for k in [1, 8, 0, 5] * 3]
    kw = {"lr": 1e-2, "grad_clip": 1e9, "micro_batch_tokens": 40, "pad_id": 0}
    plain = Policy(tiny_model, share_prompts=False, **kw)
    split = Policy(tiny_model, share_prompts=True, **kw)  # auto on the CPU: the split attention
    dense = Policy(tiny_model, share_prompts=True, attn_implementation="sdpa", **kw)  # the (T x T) mask
    assert split.attn_implementation == "sdpa_shared_prompt" and plain.attn_implementation == "sdpa"
    mbs = list(split.micro_batches(rows, responses))
    assert all(mb.keep is not None for mb in mbs)
    assert all("shared_prompt_split" in mb.attention_kwargs and mb.attention_mask is None for mb in mbs)
    assert len(mbs) > 1  # groups split over micro-batches too
    lp_plain, ent_plain = plain.compute_log_probs(rows, responses, with_entropy=True)
    for shared in (split, dense):
        lp_shared, ent_shared = shared.compute_log_probs(rows, responses, with_entropy=True)
        torch.testing.assert_close(lp_shared, lp_plain, rtol=0, atol=1e-5)
        torch.testing.assert_close(ent_shared, ent_plain, rtol=0, atol=1e-5)
    weights = torch.rand(len(rows), lp_plain.shape[1], generator=g)

    def loss_fn(mb, log_probs, entropy):
        return -(log_probs * weights[mb.rows, : log_probs.shape[1]] * mb.response_mask).sum(), {}

    grads = []
    for policy in (plain, split, dense):
        with applied_grads(policy) as applied:
            policy.train_step(rows, responses, loss_fn, with_entropy=False)
        grads.append(applied)
    for name, grad in grads[0].items():
        scale = float(grad.abs().max())  # fp32 sums in another order: equal to ~1e-6 of the largest entry
        for other in grads[1:]:
            torch.testing.assert_close(other[name], grad, rtol=1e-4, atol=1e-5 * scale, msg=name)


def test_packed_layout_is_one_padding_free_row():
    from train.policy.batching import build_micro_batches, plan_packed

    assert plan_packed([5, 4, 3, 9, 1], token_budget=10) == [[0, 1], [2], [3, 4]]  # 9, 3, 10 tokens
    (mb,) = build_micro_batches("packed", [[1, 2], [3]], [[7, 8, 9], [5]], token_budget=64, pad_id=0)
    assert mb.attention_mask is None and mb.input_ids.tolist() == [[1, 2, 7, 8, 9, 3, 5]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1]]  # restart per sample: no cross attention
    # row 0's tokens 7, 8, 9 are predicted at positions 1, 2, 3; row 1's token 5 at position 5
    assert mb.keep.tolist() == [1, 2, 3, 5]
    assert mb.gather_col.tolist() == [[0, 1, 2], [3, 0, 0]] and mb.gather_unit.abs().sum() == 0
    assert mb.response_mask.tolist() == [[1, 1, 1], [1, 0, 0]] and mb.num_tokens == 7


def test_packed_layout_gives_the_plain_layouts_log_probs_and_gradients(tiny_model, dist_group):
    from train.policy.fsdp import Policy

    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(10, 4000, (int(k),), generator=g).tolist() for k in (3, 9, 6)]
    rows = [p for p in prompts for _ in range(3)]
    responses = [torch.randint(10, 4000, (int(k),), generator=g).tolist() for k in [1, 8, 0] * 3]
    plain = Policy(tiny_model, lr=1e-2, grad_clip=1e9, share_prompts=False, micro_batch_tokens=40, pad_id=0)
    packed = Policy(tiny_model, lr=1e-2, grad_clip=1e9, pack_sequences=True, micro_batch_tokens=40, pad_id=0)
    assert packed.attn_implementation == "sdpa"  # on CPU: SDPA with the mask built from position ids
    mbs = list(packed.micro_batches(rows, responses))
    assert len(mbs) > 1 and all(mb.input_ids.shape[0] == 1 and mb.num_tokens <= 40 for mb in mbs)
    lp_plain, _ = plain.compute_log_probs(rows, responses)
    lp_packed, _ = packed.compute_log_probs(rows, responses)
    torch.testing.assert_close(lp_packed, lp_plain, rtol=0, atol=1e-5)
    weights = torch.rand(len(rows), lp_plain.shape[1], generator=g)

    def loss_fn(mb, log_probs, entropy):
        return -(log_probs * weights[mb.rows, : log_probs.shape[1]] * mb.response_mask).sum(), {}

    grads = []
    for policy in (plain, packed):
        with applied_grads(policy) as applied:
            policy.train_step(rows, responses, loss_fn, with_entropy=False)
        grads.append(applied)
    for name, grad in grads[0].items():
        scale = float(grad.abs().max())
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-4, atol=1e-5 * scale, msg=name)
