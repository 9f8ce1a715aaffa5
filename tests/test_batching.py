import torch

from train.policy.batching import collate, make_micro_batches, plan_micro_batches


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
    mbs = make_micro_batches(prompts, responses, token_budget=30, pad_id=0)
    seen = torch.cat([mb.rows for mb in mbs]).tolist()
    assert sorted(seen) == [0, 1, 2, 3]
    for mb in mbs:
        for k, row in enumerate(mb.rows.tolist()):
            assert int(mb.response_mask[k].sum()) == len(responses[row])
