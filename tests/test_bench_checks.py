"""bench/gpu_check.py and bench/dcp_check.py run on the CPU with the tiny model, so they cannot rot unseen
(issue 24 item 8: the GPU check's trainer subclass broke when the update's signature changed)."""

from __future__ import annotations

import json

import pytest

from bench import dcp_check, gpu_check, logprob_kernels

pytestmark = pytest.mark.slow


def test_gpu_check_measures_every_optimizer_step_of_a_grpo_step(tiny_model, tmp_path, dist_group):
    out = tmp_path / "gpu-check.json"
    steps = gpu_check.main([
        "--model", str(tiny_model), "--steps", "1", "--out", str(out),
        "data.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=8",
        "algorithm.ppo_mini_batch_size=1",  # two optimizer steps in the update: both measured
    ])  # fmt: skip
    assert len(steps) == 1 and json.loads(out.read_text())["steps"][0]["step"] == 1
    row = steps[0]
    assert row["optimizer_steps"] == 2
    assert row["update_s"] > 0 and row["update_flops"] > 0 and row["mfu"] > 0
    assert row["trained_tokens"] > 0 and row["grad_norm"] is not None
    # the compiled log-prob kernels compiled at the policy's start-up (policy.torch_compile, on by default),
    # under the grad mode they run in: the step itself compiles nothing (on an H100 it recompiled each kernel)
    assert row["compiled_frames"] == 0, row


def test_rows_work_groups_equal_consecutive_prompts():
    work = gpu_check.rows_work([[1, 2], [1, 2], [3], [3]], [[5], [5, 6], [7], []])
    assert (work.prompt_lens, work.response_lens, work.n) == ([2, 1], [1, 2, 1, 0], 2)
    uneven = gpu_check.rows_work([[1, 2], [1, 2], [3]], [[5], [6], [7]])
    assert (uneven.prompt_lens, uneven.n) == ([2, 2, 1], 1)


def test_dcp_check_round_trip_is_exact(tiny_model, dist_group):
    r = dcp_check.check(str(tiny_model))
    assert r["resumed_identical"] and r["adamw_identical"] and r["export_equals_bf16"], r
    assert dcp_check.main(str(tiny_model)) == 0


def test_logprob_kernels_bench_checks_both_kernel_sets_against_fp64(tmp_path):
    """bench/logprob_kernels.py (run on lent GPUs) on the CPU at small sizes: every kernel of both sets has an
    error against fp64 at its dtype's rounding and a time, and the micro-batch compares compiled with eager."""
    out = tmp_path / "k.json"
    result = logprob_kernels.main(
        ["--vocab", "1000", "--positions", "64", "--reps", "1", "--dtypes", "bf16,fp32", "--out", str(out),
         "--chunk-scales", "1,4"]
    )  # fmt: skip
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert [(r["kernels"], r["dtype"]) for r in result["kernels"]] == [
        ("eager", "bfloat16"), ("compiled", "bfloat16"), ("eager", "float32"), ("compiled", "float32"),
    ]  # fmt: skip
    for row in result["kernels"]:
        bound = 1e-2 if row["dtype"] == "bfloat16" else 1e-5  # bf16 outputs carry one bf16 rounding (2^-9)
        assert all(0 <= err < bound for err in row["rel_err"].values()), row
        assert all(ms > 0 for ms in row["ms"].values())
    compiled = [r for r in result["micro_batch"] if r["kernels"].startswith("compiled")]
    assert [r["kernels"] for r in compiled] == ["compiled", "compiled x4"] * 2
    assert compiled[1]["chunk_rows"] == 4 * compiled[0]["chunk_rows"]
    assert all(r["vs_eager"]["grad_rel"] < 1e-2 for r in compiled)
