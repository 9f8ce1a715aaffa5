"""The pure parts of `bench.train_step`: FLOP counting, summaries, ratios and the table (no TRL, no vLLM)."""

from __future__ import annotations

import pytest

from bench.train_step import _parse, _response_lens, add_floor, format_table, ratio, summarize
from infra.allocator import DEFAULT
from train.flops import ModelDims, StepWork, _causal_attn_flops, generation_flops, step_flops, training_flops

DIMS = ModelDims(body_params=1000, hidden=4, vocab=10, layers=2, attn_dim=3)


def _steps(columns: str, *rows: tuple, **same) -> list[dict]:
    """Per-step records as a table: `columns` names the keys, each row one step's values; `same` are the
    values every step shares."""
    return [{**dict(zip(columns.split(), row, strict=True)), **same} for row in rows]


def test_causal_attention_flops_sum_positions():
    # positions 1..3 attend to 1, 2, 3 keys: 4 * layers * attn_dim * (1 + 2 + 3)
    assert _causal_attn_flops(DIMS, 0, 3) == 4 * 2 * 3 * 6
    assert _causal_attn_flops(DIMS, 2, 3) == 4 * 2 * 3 * 3
    assert _causal_attn_flops(DIMS, 0, 3) == _causal_attn_flops(DIMS, 0, 2) + _causal_attn_flops(DIMS, 2, 3)


def test_generation_and_training_flops_by_hand():
    work = StepWork(prompt_lens=[2], response_lens=[3, 1], n=2)
    assert work.prompt_tokens() == 4 and work.response_tokens() == 4
    attn_gen = (
        _causal_attn_flops(DIMS, 0, 2) + _causal_attn_flops(DIMS, 2, 5) + _causal_attn_flops(DIMS, 2, 3)
    )
    # prompt prefilled once (2 tokens) + 4 generated tokens; LM head on generated tokens only
    assert generation_flops(DIMS, work) == 2 * 1000 * 6 + 2 * 4 * 10 * 4 + attn_gen
    attn_train = 3 * (_causal_attn_flops(DIMS, 0, 5) + _causal_attn_flops(DIMS, 0, 3))
    # every sample's prompt + response through forward and backward; LM head on response positions
    assert training_flops(DIMS, work) == 6 * 1000 * 8 + 6 * 4 * 10 * 4 + attn_train
    assert step_flops(DIMS, work) == generation_flops(DIMS, work) + training_flops(DIMS, work)
    # shared prompts: the prompt (2 tokens) once for the group, each response attends to it
    attn_shared = 3 * (
        _causal_attn_flops(DIMS, 0, 2) + _causal_attn_flops(DIMS, 2, 5) + _causal_attn_flops(DIMS, 2, 3)
    )
    assert training_flops(DIMS, work, shared_prompts=True) == 6 * 1000 * 6 + 6 * 4 * 10 * 4 + attn_shared


def test_flops_of_smollm2_sized_step_are_plausible():
    dims = ModelDims(body_params=106_000_000, hidden=576, vocab=49152, layers=30, attn_dim=576)
    work = StepWork(prompt_lens=[60] * 8, response_lens=[64] * 32, n=4)
    flops = step_flops(dims, work)
    # dominated by 6 * N * tokens of training: 6 * 106e6 * 32 * 124 = 2.5e12
    assert 3.0e12 < flops < 4.5e12


def test_summarize_medians_after_warmup_and_rates():
    steps = _steps(
        "step_s rollout_s update_s weight_sync_s",
        (100.0, 50.0, 40.0, 9.0),
        (10.0, 4.0, 5.0, 0.0),
        (12.0, 4.0, 6.0, 1.0),
        (14.0, 5.0, 8.0, 0.0),
        reward_s=1.0, prompt_tokens=400, response_tokens=200,
    )  # fmt: skip
    s = summarize(steps, warmup=1)
    assert s["step_s"] == 12.0 and s["rollout_s"] == 4.0 and s["update_s"] == 6.0
    assert s["rollout_tokens_per_s"] == pytest.approx(50.0)  # median of 200/4, 200/4, 200/5
    assert s["train_tokens_per_s"] == pytest.approx(100.0)  # median of 600/5, 600/6, 600/8
    # a single step is summarised as itself rather than dropped as warm-up
    assert summarize(steps[:1], warmup=1)["step_s"] == 100.0


def test_ratio_and_floor():
    assert ratio(30.0, 10.0) == 3.0
    assert ratio(None, 1.0) is None and ratio(1.0, 0.0) is None
    s = {"step_s": 20.0}
    add_floor(s, flops=1e12, flops_per_s=1e11)
    assert s["floor_s"] == pytest.approx(10.0) and s["floor_share"] == pytest.approx(2.0)


def test_format_table_has_both_sides_and_ratio():
    results = {
        "ours": {"step_s": 10.0, "rollout_tokens_per_s": 200.0, "peak_rss_gb": 2.0, "floor_s": 5.0},
        "trl": {"step_s": 25.0, "rollout_tokens_per_s": 50.0, "peak_rss_gb": 3.0, "floor_s": 5.0},
    }
    table = format_table(results)
    lines = table.splitlines()
    assert "ours" in lines[0] and "TRL" in lines[0] and "TRL/ours" in lines[0]
    step = next(line for line in lines if line.startswith("step_s (median)"))
    assert step.split()[-3:] == ["10.00", "25.00", "2.50"]
    tps = next(line for line in lines if line.startswith("rollout tokens/s"))
    assert tps.split()[-3:] == ["200", "50", "0.25"]
    missing = next(line for line in lines if line.startswith("  weight_sync_s"))
    assert missing.split()[-3:] == ["-", "-", "-"]
    assert all(len(line) == len(lines[1]) for line in lines)  # fixed-width columns


def test_format_table_with_one_side_missing():
    table = format_table({"ours": {"step_s": 10.0}})
    step = next(line for line in table.splitlines() if line.startswith("step_s"))
    assert step.split()[-3:] == ["10.00", "-", "-"]


def test_cli_flags():
    args = _parse(["--steps", "2", "--precision", "fp32,bf16", "rollout.engine.kv_cache_gb=2"])
    assert args.steps == 2 and args.precisions == ["fp32", "bf16"]
    assert args.overrides == ["rollout.engine.kv_cache_gb=2"] and args.side_list == ["ours", "trl"]
    assert _parse([]).precisions == ["fp32"]
    with pytest.raises(SystemExit):
        _parse(["--precision", "fp16"])


def test_response_lens_spread_totals():
    class A:
        samples = 2

    assert _response_lens({"response_tokens": 7, "prompt_lens": [3, 4]}, A) == [2, 2, 2, 1]


def test_kernel_usage_rows_per_side():
    """System time and minor faults per step (medians after warm-up) are rows of the table for both sides."""
    steps = _steps(
        "step_s rollout_s update_s sys_s minor_faults",
        (9.0, 4.0, 5.0, 9.0, 900_000),
        (5.0, 2.0, 3.0, 1.5, 200_000),
        (6.0, 2.0, 4.0, 2.5, 300_000),
        prompt_tokens=4, response_tokens=2,
    )  # fmt: skip
    s = summarize(steps, warmup=1)
    assert s["sys_s"] == 2.0 and s["minor_faults"] == 250_000
    lines = format_table({"ours": s, "trl": {**s, "sys_s": 8.0, "minor_faults": 1_000_000}}).splitlines()
    sys_row = next(line for line in lines if line.startswith("system s/step"))
    assert sys_row.split()[-3:] == ["2.00", "8.00", "4.00"]
    faults = next(line for line in lines if line.startswith("minor faults/step"))
    assert faults.split()[-3:] == ["250000", "1000000", "4.00"]


def test_allocator_flag(monkeypatch):
    monkeypatch.delenv("RLPOST_ALLOCATOR", raising=False)
    assert _parse([]).allocator_list == [DEFAULT]
    assert _parse(["--allocators", "jemalloc,off"]).allocator_list == ["jemalloc", "off"]
    monkeypatch.setenv("RLPOST_ALLOCATOR", "glibc")
    assert _parse([]).allocator_list == ["glibc"]
    with pytest.raises(SystemExit):
        _parse(["--allocators", "mimalloc"])


def test_lora_side_flags_and_table():
    args = _parse(["--lora-rank", "16"])
    assert args.side_list == ["ours", "lora"] and args.lora_rank == 16
    assert _parse(["--sides", "ours,lora"]).lora_rank == 16  # the lora side's default rank
    results = {
        "ours": {"step_s": 10.0, "weight_sync_mb": 538.0},
        "lora": {"step_s": 8.0, "weight_sync_mb": 7.4},
    }
    lines = format_table(results, ("ours", "lora")).splitlines()
    assert "LoRA/ours" in lines[0]
    sync = next(line for line in lines if line.startswith("weight sync MB/step"))
    assert sync.split()[-3:] == ["538.00", "7.40", "0.01"]
    steps = [{"step_s": 1.0, "prompt_tokens": 1, "response_tokens": 1, "rollout_s": 1, "update_s": 1,
              "weight_sync_bytes": b} for b in (9e6, 2e6, 4e6)]  # fmt: skip
    assert summarize(steps, 1)["weight_sync_mb"] == pytest.approx(3.0)
