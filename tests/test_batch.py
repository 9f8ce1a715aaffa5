"""The batch type (train/batch.py): select, concat and chunk written once, on hand-made rows."""

from __future__ import annotations

import pytest
import torch

from train.batch import Batch
from train.rewards.base import RewardResult


def _batch(groups: list[int], first_token: int = 0) -> Batch:
    n = len(groups)
    b = Batch(
        prompt_ids=[[100 + g] for g in groups],
        response_ids=[[first_token + i] * (i + 1) for i in range(n)],
        response_logprobs=[[-0.5] * (i + 1) for i in range(n)],
        texts=[f"t{first_token + i}" for i in range(n)],
        finish_reasons=["stop"] * n,
        group_index=groups,
        rows=[{"g": g} for g in groups],
    )
    b.add_reward(RewardResult([float(i) for i in range(n)], [1.0] * n, {"m": 2.0}, {"spans": list(range(n))}))
    b["response_mask"] = b.padded([[1.0] * len(r) for r in b.response_ids])
    return b


def test_select_keeps_rows_in_order_and_renumbers_groups_by_first_appearance():
    b = _batch([0, 0, 1, 1, 2, 2])
    part = b.select([4, 5, 0])
    assert part.group_index == [0, 0, 1]  # group 2 first, then group 0
    assert part.texts == ["t4", "t5", "t0"] and part.scores == [4.0, 5.0, 0.0]
    assert part.rows == [{"g": 2}, {"g": 2}, {"g": 0}] and part.signals["spans"] == [4, 5, 0]
    assert part["response_mask"].tolist() == [[1.0] * 5 + [0.0], [1.0] * 6, [1.0] + [0.0] * 5]


def test_concat_offsets_groups_averages_reward_figures_and_pads_tensors():
    a, b = _batch([0, 0]), _batch([0, 0, 1, 1], first_token=10)
    b.reward_metrics["m"] = 4.0
    out = Batch.concat([a, b])
    assert out.group_index == [0, 0, 1, 1, 2, 2]  # the second batch's groups follow the first's
    assert out.texts == ["t0", "t1", "t10", "t11", "t12", "t13"] and out.correct == [1.0] * 6
    assert out.reward_metrics == {"m": 3.0} and out.signals["spans"] == [0, 1, 0, 1, 2, 3]
    assert out["response_mask"].shape == (6, 4) and out["response_mask"][1].tolist() == [1, 1, 0, 0]
    b.correct = None
    assert Batch.concat([a, b]).correct is None  # one part without correctness: none for the whole


def test_chunk_cuts_consecutive_mini_batches():
    b = _batch([0, 0, 1, 1, 2, 2])
    parts = b.chunk(4)
    assert [p.texts for p in parts] == [["t0", "t1", "t2", "t3"], ["t4", "t5"]]
    assert parts[1].group_index == [0, 0] and parts[1]["response_mask"].shape == (2, 6)


def test_named_tensors_check_their_rows_and_name_what_is_missing():
    b = _batch([0, 0])
    with pytest.raises(ValueError, match=r"batch\['x'\]: 3 rows, the batch has 2"):
        b["x"] = torch.zeros(3)
    with pytest.raises(KeyError, match="no tensor 'old_log_probs'"):
        b["old_log_probs"]
    with pytest.raises(KeyError, match="no signal 'cot_spans'"):
        b.signal("cot_spans")
