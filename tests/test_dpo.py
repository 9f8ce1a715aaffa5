"""DPO: preference-pair data, the per-answer gradient weights by hand, the two-pass micro-batched gradient
against autograd through dpo_loss on a plain HF model, and a run with its cached reference log-probs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from data_prep.datasets import load_pairs
from data_prep.preference import arithmetic_pairs, make_pair, read_pairs, write_pairs
from data_prep.schema import DatasetError, extra_info_of
from tests.applied_grads import applied_grads
from tests.configs import stage_config
from train.algorithms.dpo import dpo_loss
from train.config import ConfigError, merge_layers, override_layers
from train.stages.dpo import (
    REF_CACHE,
    DPOStage,
    dpo_sequence_weights,
    encode_pairs,
    make_weighted_logp_loss_fn,
)


def test_dpo_sequence_weights_by_hand():
    pi_c, pi_r = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    ref_c, ref_r = torch.tensor([-1.2, -2.0]), torch.tensor([-1.2, -1.5])
    # h = (pi_c - ref_c) - (pi_r - ref_r) = [0.2 + 0.3, 0 - 0.5] = [0.5, -0.5]; beta h = [0.25, -0.25]
    w_c, w_r, loss, metrics = dpo_sequence_weights(pi_c, pi_r, ref_c, ref_r, beta=0.5, global_pair_count=4)
    s_neg, s_pos = 0.43782349911420193, 0.5621765008857981  # sigmoid(-0.25), sigmoid(0.25)
    torch.testing.assert_close(w_c, torch.tensor([-0.5 * s_neg / 4, -0.5 * s_pos / 4]))
    torch.testing.assert_close(w_r, -w_c)
    assert loss.item() == pytest.approx((-math.log(s_pos) - math.log(s_neg)) / 4)
    assert metrics["rewards/accuracy"] == 0.5
    assert metrics["rewards/margin"] == pytest.approx(0.0, abs=1e-7)
    assert metrics["rewards/chosen"] == pytest.approx(0.5 * (0.2 + 0.0) / 2)


def test_weighted_logp_surrogate_by_hand():
    from types import SimpleNamespace

    loss_fn = make_weighted_logp_loss_fn(torch.tensor([0.5, -2.0, 1.0]), world=2)
    mb = SimpleNamespace(rows=torch.tensor([2, 0]), response_mask=torch.tensor([[1.0, 1.0], [1.0, 0.0]]))
    loss, _ = loss_fn(mb, torch.tensor([[-1.0, -2.0], [-4.0, float("-inf")]]), None)
    assert loss.item() == pytest.approx(((-3.0) * 1.0 + (-4.0) * 0.5) * 2)


def test_preference_files_formats_and_one_line_errors(tmp_path):
    path = tmp_path / "pairs.jsonl"
    hh = {
        "chosen": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
        "rejected": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Go away."}],
    }
    path.write_text(
        json.dumps({"prompt": "2+2?", "chosen": "4", "rejected": "5", "id": 7}) + "\n" + json.dumps(hh) + "\n"
    )
    pairs = read_pairs(path)
    assert [p["prompt"] for p in pairs] == [
        [{"role": "user", "content": "2+2?"}],
        [{"role": "user", "content": "Hi"}],
    ]
    assert [(p["chosen"], p["rejected"]) for p in pairs] == [("4", "5"), ("Hello!", "Go away.")]
    assert extra_info_of(pairs[0])["id"] == 7
    assert read_pairs(write_pairs(pairs, tmp_path / "pairs.parquet")) == pairs
    assert read_pairs(write_pairs(pairs, tmp_path / "copy.jsonl")) == pairs

    bad = tmp_path / "bad.jsonl"
    for record, message in [
        ({"prompt": "q", "chosen": "a"}, r"bad.jsonl:1: field 'rejected' missing"),
        ({"prompt": "q", "chosen": "a", "rejected": "a"}, r"bad.jsonl:1: chosen and rejected are the same"),
        ({"chosen": "a", "rejected": "b"}, r"bad.jsonl:1: field 'prompt' missing"),
        (
            {"prompt": "q", "chosen": [{"role": "user", "content": "x"}], "rejected": "b"},
            "must end with an assistant",
        ),
    ]:
        bad.write_text(json.dumps(record) + "\n")
        with pytest.raises(DatasetError, match=message):
            read_pairs(bad)
    with pytest.raises(DatasetError, match="preference data not found"):
        read_pairs(tmp_path / "missing.parquet")
    with pytest.raises(DatasetError, match="unknown builtin preference dataset"):
        load_pairs("builtin:nope", 1, 0)
    with pytest.raises(DatasetError, match="field 'chosen' must be a non-empty str"):
        write_pairs([make_pair([{"role": "user", "content": "q"}], "", "b", {})], tmp_path / "x.parquet")


def test_arithmetic_pairs_chosen_right_rejected_wrong():
    from math_grader import grade_batch

    pairs = arithmetic_pairs(30, seed=2, split="test")
    golds = [extra_info_of(p)["ground_truth"] for p in pairs]
    assert grade_batch([p["chosen"] for p in pairs], golds) == [1.0] * 30
    assert grade_batch([p["rejected"] for p in pairs], golds) == [0.0] * 30
    # same steps except the last result: a minimal pair
    for p in pairs:
        assert p["chosen"].split("\n")[:-2] == p["rejected"].split("\n")[:-2]


def test_dpo_config_errors_name_the_key():
    stage = DPOStage()
    with pytest.raises(ConfigError, match="beta must be > 0"):
        stage.validate(merge_layers(OmegaConf.structured(stage.schema), override_layers(["beta=0"])))


@pytest.mark.slow
def test_two_pass_gradient_equals_autograd_through_dpo_loss(tiny_model, dist_group):
    """Token-budget micro-batches split every pair; the two passes must still give dL/dtheta exactly."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from train.policy.fsdp import Policy

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    prompts, chosen, rejected, _, _ = encode_pairs(tokenizer, arithmetic_pairs(4, seed=0), max_tokens=512)
    ref_c = torch.tensor([-900.0, -950.0, -1000.0, -980.0])  # any fixed reference values
    ref_r = torch.tensor([-990.0, -940.0, -1010.0, -960.0])
    beta = 0.01

    plain = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)

    def summed(p, r):
        logits = plain(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1 : len(p) + len(r) - 1]
        return logits.log_softmax(-1).gather(-1, torch.tensor(r)[:, None]).sum()

    pi_c = torch.stack([summed(p, c) for p, c in zip(prompts, chosen)])
    pi_r = torch.stack([summed(p, r) for p, r in zip(prompts, rejected)])
    loss, _ = dpo_loss(pi_c, pi_r, ref_c, ref_r, beta)
    loss.backward()
    expected = dict(plain.named_parameters())

    policy = Policy(tiny_model, lr=1e-3, grad_clip=1e9, micro_batch_tokens=150)
    seq = policy.compute_log_probs(prompts * 2, chosen + rejected)[0].sum(-1)
    torch.testing.assert_close(seq, torch.cat([pi_c, pi_r]).detach(), rtol=1e-5, atol=1e-3)
    w_c, w_r, two_pass_loss, _ = dpo_sequence_weights(seq[:4], seq[4:], ref_c, ref_r, beta, 4)
    assert two_pass_loss.item() == pytest.approx(loss.item(), rel=1e-5)
    with applied_grads(policy) as grads:
        metrics = policy.train_step(
            prompts * 2,
            chosen + rejected,
            make_weighted_logp_loss_fn(torch.cat([w_c, w_r]), 1),
            with_entropy=False,
        )
    assert metrics["actor/micro_batches"] >= 3
    for name in ("model.embed_tokens.weight", "model.layers.1.self_attn.q_proj.weight", "model.norm.weight"):
        torch.testing.assert_close(grads[name], expected[name].grad, rtol=1e-4, atol=1e-7)


def _dpo_cfg(model: Path, run_dir: Path, steps: int, *extra: str):
    stage = DPOStage()
    return stage, stage_config(
        stage, model, run_dir, f"total_steps={steps}", "save_every=1", "data.builtin_size=16",
        "data.batch_size=4", "data.val_size=4", "val_every=2", "optim.lr=3e-3", "beta=0.5", "seed=4", *extra,
    )  # fmt: skip


@pytest.mark.slow
def test_dpo_run_logs_rewards_and_reuses_cached_reference(
    tiny_model, dist_group, mlflow_uri, tmp_path, capsys
):
    import mlflow

    stage, cfg = _dpo_cfg(tiny_model, tmp_path / "run", 2)
    stage.run(cfg)
    client = mlflow.MlflowClient()
    run_id = (tmp_path / "run" / "mlflow_run_id").read_text()
    hist = {
        k: {m.step: m.value for m in client.get_metric_history(run_id, k)}
        for k in (
            "dpo/loss",
            "dpo/rewards_accuracy",
            "dpo/rewards_margin",
            "dpo/val_loss",
            "dpo/val_rewards_margin",
        )
    }
    # step 1: the policy is the reference, so every margin is 0 and the loss is log 2 exactly
    assert hist["dpo/loss"][1] == pytest.approx(math.log(2), abs=1e-5)
    assert hist["dpo/rewards_margin"][1] == pytest.approx(0.0, abs=1e-5)
    assert hist["dpo/rewards_accuracy"][1] == 0.0
    assert hist["dpo/val_loss"][0] == pytest.approx(math.log(2), abs=1e-5)
    assert sorted(hist["dpo/val_loss"]) == [0, 2]
    assert hist["dpo/loss"][2] != pytest.approx(math.log(2), abs=1e-4)  # it moved away from the reference
    cache = torch.load(tmp_path / "run" / REF_CACHE)
    assert cache["val"].shape == (4, 2) and not cache["val"].isnan().any()
    assert (
        ~cache["train"][:, 0].isnan()
    ).sum() == 8  # the pairs of steps 1-2 (4 each, no repeats in epoch 1)

    # resumed without its cache: recomputed from the starting model, not from the trained checkpoint
    (tmp_path / "run" / REF_CACHE).unlink()
    capsys.readouterr()
    _, cfg = _dpo_cfg(tiny_model, tmp_path / "run", 3, "resume=true")
    stage.run(cfg)
    assert "resuming from" in capsys.readouterr().out
    cache2 = torch.load(tmp_path / "run" / REF_CACHE)
    used = ~cache["train"][:, 0].isnan()
    torch.testing.assert_close(cache2["train"][used], cache["train"][used])
    torch.testing.assert_close(cache2["val"], cache["val"])
    # the same again: everything comes from the cache
    stage.run(cfg)
    assert "reference log-probs from" in capsys.readouterr().out
    hist_loss = {m.step: m.value for m in client.get_metric_history(run_id, "dpo/loss")}
    assert sorted(hist_loss) == [1, 2, 3]
