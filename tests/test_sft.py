"""SFT: the worked-solution set, the response-only token-mean loss (by hand and against a plain HF model's
gradient), and a tracked, checkpointed, resumable SFT run on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from data_prep import arithmetic
from data_prep.datasets import load_sft_rows
from data_prep.schema import DatasetError, make_row, write_parquet
from data_prep.sft_math import sft_rows, worked_solution
from tests.applied_grads import applied_grads
from tests.configs import stage_config
from train.config import ConfigError, merge_layers, override_layers
from train.stages.sft import SFTStage, encode_examples, make_sft_loss_fn


def test_worked_solution_by_hand():
    assert worked_solution([3, 4], ["+"]) == "3 + 4 = 7.\nThe answer is 7."
    assert worked_solution([12, 5, 3], ["-", "+"]) == "12 - 5 = 7.\n7 + 3 = 10.\nThe answer is 10."
    assert worked_solution([6, 7], ["*"]) == "6 * 7 = 42.\nThe answer is 42."
    assert (
        worked_solution([12, 5, 3], ["-", "+"], final="11") == "12 - 5 = 7.\n7 + 3 = 11.\nThe answer is 11."
    )


def test_sft_rows_are_graded_correct_and_share_the_arithmetic_prompts():
    from math_grader import grade_batch

    rows = sft_rows(40, seed=3, split="test")
    plain = arithmetic.generate(40, 3, split="test")
    assert [r["prompt"][:-1] for r in rows] == [r["prompt"] for r in plain]
    assert [r["ground_truth"] for r in rows] == [r["ground_truth"] for r in plain]
    assert all(r["prompt"][-1]["role"] == "assistant" for r in rows)
    assert (
        grade_batch([r["prompt"][-1]["content"] for r in rows], [r["ground_truth"] for r in rows])
        == [1.0] * 40
    )


def test_load_sft_rows_formats_and_one_line_errors(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text(
        json.dumps({"prompt": "What is 2 + 2?", "response": "4", "ground_truth": "4"})
        + "\n"
        + json.dumps(
            {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
        )
        + "\n"
    )
    rows = load_sft_rows(str(good), 0, 0)
    assert [r["prompt"][-1]["content"] for r in rows] == ["4", "Hello"]
    assert rows[0]["ground_truth"] == "4"

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "What is 2 + 2?"}) + "\n")
    with pytest.raises(DatasetError, match=r"bad.jsonl:1: field 'response' missing"):
        load_sft_rows(str(bad), 0, 0)
    no_reply = tmp_path / "no_reply.parquet"
    write_parquet([make_row("x", [{"role": "user", "content": "Hi"}], "", {})], no_reply)
    with pytest.raises(DatasetError, match=r"no_reply.parquet: row 0: .*must end with an assistant message"):
        load_sft_rows(str(no_reply), 0, 0)
    with pytest.raises(DatasetError, match="unknown builtin SFT dataset"):
        load_sft_rows("builtin:nope", 10, 0)
    with pytest.raises(DatasetError, match="dataset not found"):
        load_sft_rows(str(tmp_path / "missing.parquet"), 0, 0)


def test_sft_loss_fn_token_mean_over_the_whole_batch_by_hand():
    """Two micro-batches of one step: 5 response tokens in all, world size 2."""
    loss_fn = make_sft_loss_fn(global_token_count=5, world=2)
    lp1 = torch.tensor([[-1.0, -2.0, -7.0], [-3.0, -9.0, -9.0]])  # -7, -9: padding, masked out
    mask1 = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    lp2 = torch.tensor([[-0.5, -1.5]])
    mask2 = torch.tensor([[1.0, 1.0]])
    loss1, m1 = loss_fn(SimpleNamespace(response_mask=mask1), lp1, None)
    loss2, m2 = loss_fn(SimpleNamespace(response_mask=mask2), lp2, None)
    assert loss1.item() == pytest.approx((1 + 2 + 3) / 5 * 2)
    assert loss2.item() == pytest.approx((0.5 + 1.5) / 5 * 2)
    assert m1["sft/loss"] + m2["sft/loss"] == pytest.approx(8 / 5)  # the step's token mean (this rank)


def test_sft_config_errors_name_the_key():
    stage = SFTStage()
    with pytest.raises(ConfigError, match="data.batch_size must be divisible by world_size"):
        stage.validate(
            merge_layers(
                OmegaConf.structured(stage.schema), override_layers(["data.batch_size=3", "world_size=2"])
            )
        )
    with pytest.raises(ConfigError, match="optim.lrr"):
        merge_layers(OmegaConf.structured(stage.schema), override_layers(["optim.lrr=1"]))


@pytest.fixture(scope="module")
def examples(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    prompts, responses, golds, dropped, _ = encode_examples(tokenizer, sft_rows(6, seed=0), max_tokens=512)
    return tokenizer, prompts, responses, golds


def test_response_ids_are_the_assistant_turn_up_to_end_of_turn(examples):
    from train.data import encode_prompts

    tokenizer, prompts, responses, _ = examples
    rows = sft_rows(6, seed=0)
    assert prompts == encode_prompts(tokenizer, [{"prompt": r["prompt"][:-1]} for r in rows])
    for r, row in zip(responses, rows):
        assert tokenizer.decode(r) == row["prompt"][-1]["content"] + tokenizer.eos_token
    _, _, _, dropped, _ = encode_examples(tokenizer, rows, max_tokens=20)
    assert dropped == 6


@pytest.mark.slow
def test_micro_batched_sft_gradient_equals_plain_response_only_loss(tiny_model, dist_group, examples):
    """FSDP policy, several token-budget micro-batches vs one plain HF model on unpadded sequences:
    gradient of -sum(log p(response tokens)) / (response tokens), prompt tokens excluded."""
    from transformers import AutoModelForCausalLM

    from train.policy.fsdp import Policy

    _, prompts, responses, _ = examples
    total = sum(len(r) for r in responses)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    nll = 0.0
    for p, r in zip(prompts, responses):
        logits = plain(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1 : len(p) + len(r) - 1]
        nll = nll - logits.log_softmax(-1).gather(-1, torch.tensor(r)[:, None]).sum()
    (nll / total).backward()
    expected = dict(plain.named_parameters())

    policy = Policy(tiny_model, lr=1e-3, grad_clip=1e9, micro_batch_tokens=120)
    with applied_grads(policy) as grads:
        metrics = policy.train_step(prompts, responses, make_sft_loss_fn(total, 1), with_entropy=False)
    assert metrics["actor/micro_batches"] >= 3
    assert metrics["sft/loss"] == pytest.approx((nll / total).item(), rel=1e-5)
    for name in ("model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight", "model.norm.weight"):
        torch.testing.assert_close(grads[name], expected[name].grad, rtol=1e-4, atol=1e-6)


def _sft_cfg(model: Path, run_dir: Path, steps: int, *extra: str):
    stage = SFTStage()
    return stage, stage_config(
        stage, model, run_dir, f"total_steps={steps}", "save_every=1", "keep_last=2", "data.builtin_size=24",
        "data.batch_size=4", "data.val_size=4", "optim.lr=3e-3", "seed=5", "rollout.max_new_tokens=8", *extra,
    )  # fmt: skip


@pytest.mark.slow
def test_sft_run_tracks_checkpoints_and_resumes_like_uninterrupted(
    tiny_model, dist_group, mlflow_uri, tmp_path
):
    import mlflow

    from infra.checkpoint import layout as ckpt

    hf = "rollout.engine._target_=train.rollout.hf_engine.HFEngine"
    stage, cfg = _sft_cfg(tiny_model, tmp_path / "a", 3, "val_every=2", "val_accuracy=true", hf)
    last = stage.run(cfg)
    client = mlflow.MlflowClient()
    run_id = (tmp_path / "a" / "mlflow_run_id").read_text()
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["rlpost.stage_kind"] == "sft"
    hist = {k: {m.step: m.value for m in client.get_metric_history(run_id, k)} for k in
            ("sft/loss", "sft/val_loss", "val/accuracy", "perf/train_tokens_per_s", "perf/peak_memory_gb")}  # fmt: skip
    assert sorted(hist["sft/loss"]) == [1, 2, 3]
    assert sorted(hist["sft/val_loss"]) == [0, 2, 3] == sorted(hist["val/accuracy"])
    assert hist["sft/val_loss"][3] < hist["sft/val_loss"][0] - 0.5  # it learns the held-out solutions' tokens
    assert all(0.0 <= v <= 1.0 for v in hist["val/accuracy"].values())
    assert hist["perf/train_tokens_per_s"][3] > 0 and hist["perf/peak_memory_gb"][3] > 0.1
    assert run.data.tags["rlpost.checkpoint_latest"].endswith("step_000003")
    assert last["sft/loss"] == pytest.approx(hist["sft/loss"][3])
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path / "a")] == [2, 3]

    # the same run stopped after step 2, then resumed: same metrics, same MLflow run, nothing twice
    stage, cfg_b = _sft_cfg(tiny_model, tmp_path / "b", 2)
    stage.run(cfg_b)
    _, cfg_b = _sft_cfg(tiny_model, tmp_path / "b", 3, "resume=true")
    stage.run(cfg_b)
    run_b = (tmp_path / "b" / "mlflow_run_id").read_text()
    hist_b = {m.step: m.value for m in client.get_metric_history(run_b, "sft/loss")}
    assert sorted(hist_b) == [1, 2, 3]
    for step in (1, 2, 3):
        assert hist_b[step] == pytest.approx(hist["sft/loss"][step], rel=1e-4), step
    from transformers import AutoModelForCausalLM

    a = AutoModelForCausalLM.from_pretrained(ckpt.latest_checkpoint(tmp_path / "a") / "hf").state_dict()
    b = AutoModelForCausalLM.from_pretrained(ckpt.latest_checkpoint(tmp_path / "b") / "hf").state_dict()
    torch.testing.assert_close(a["model.layers.1.mlp.up_proj.weight"], b["model.layers.1.mlp.up_proj.weight"])


# ---- packed SFT and the length filter (CS336) ----------------------------------------------------------
def test_pack_documents_by_hand():
    from data_prep.packing import pack_documents

    # documents [1 2 | 3] and [4 | 5 6 EOS=9] (the second already ends with EOS): stream 1 2 3 9 4 5 6 9
    blocks, masks = pack_documents([[1, 2], [4]], [[3], [5, 6, 9]], eos_id=9, block_size=3)
    assert blocks == [[1, 2, 3, 9], [9, 4, 5, 6]]  # the tail [6, 9] fills no block: dropped
    assert masks == [[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]]  # targets 2 3 9 | 4 5 6: prompt tokens 2 and 4 masked
    _, every = pack_documents([[1, 2], [4]], [[3], [5, 6, 9]], eos_id=9, block_size=3, loss_on="all")
    assert every == [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        pack_documents([[1]], [[2]], 9, 0)


def test_length_filter_and_pack_config_errors(tiny_model):
    from transformers import AutoTokenizer

    from train.stages.sft import encode_examples

    tok = AutoTokenizer.from_pretrained(tiny_model)
    rows = sft_rows(20, seed=1)
    p, r, _, dropped, _ = encode_examples(tok, rows, 512)
    assert dropped == 0
    shortest, longest = min(map(len, r)), max(map(len, r))
    assert shortest < longest
    _, kept, _, dropped, _ = encode_examples(tok, rows, 512, max_response_tokens=shortest)
    assert dropped > 0 and all(len(x) <= shortest for x in kept)
    total = sorted(len(a) + len(b) for a, b in zip(p, r))
    _, _, _, dropped, _ = encode_examples(tok, rows, 512, min_tokens=total[5])
    assert dropped == sum(t < total[5] for t in total)
    stage = SFTStage()
    for override, message in [
        ("data.pack_loss=prompt", "data.pack_loss must be one of"),
        ("data.loss_normalization=sum", "data.loss_normalization must be one of"),
        ("data.min_tokens=600", r"data.min_tokens must be in \[0, data.max_tokens\]"),
    ]:
        with pytest.raises(ConfigError, match=message):
            stage.validate(merge_layers(OmegaConf.structured(stage.schema), override_layers([override])))


@pytest.mark.slow
def test_packed_sft_trains_on_full_blocks(tiny_model, dist_group, mlflow_uri, tmp_path):
    """A real packed run: every step trains batch_size blocks of exactly block_size targets (no padding),
    with the sequence_constant normalisation, and the loss falls."""
    import mlflow

    stage, cfg = _sft_cfg(tiny_model, tmp_path / "p", 4, "data.pack=true", "data.block_size=64",
                          "data.loss_normalization=sequence_constant", "data.normalize_constant=64",
                          "data.val_path=null")  # fmt: skip
    stage.run(cfg)
    run_id = (tmp_path / "p" / "mlflow_run_id").read_text()
    client = mlflow.MlflowClient()
    hist = {k: {m.step: m.value for m in client.get_metric_history(run_id, k)}
            for k in ("sft/loss", "sft/response_tokens")}  # fmt: skip
    assert sorted(hist["sft/loss"]) == [1, 2, 3, 4]
    assert hist["sft/loss"][4] < hist["sft/loss"][1]
    # response mode: a block's prompt tokens are not trained, so fewer than 4 x 64 targets count
    assert all(0 < t < 4 * 64 for t in hist["sft/response_tokens"].values())
