"""bench/memory_probe.py on the CPU with a tiny Qwen3-shaped model (Qwen3's vocabulary): every layout runs,
its peak (the live-tensor tracker) stays under the planner's prediction for the same workload, and the
figures the GPU run reports are all there. The paper-shape run itself is a GPU job (bench/device_check.sh)."""

from __future__ import annotations

import json

import pytest

from bench import memory_probe

pytestmark = pytest.mark.slow

TINY = ["--shape", "tiny", "--layers", "2", "--prompts", "2", "--group", "3", "--prompt-len", "16",
        "--max-response", "96", "--micro-batch-tokens", "256"]  # fmt: skip


def test_lengths_are_long_tailed_and_one_row_reaches_the_maximum():
    lengths = memory_probe.response_lengths(64, 8192)
    assert lengths[0] == 8192 and all(8 <= n <= 8192 for n in lengths)
    ordered = sorted(lengths)
    assert ordered[32] < 8192 / 4 < ordered[-2]  # median far below the tail
    assert memory_probe.response_lengths(64, 8192) == lengths  # the same batch every run


@pytest.mark.heavy  # make test-all: a long integration run (docs/commands.md, Tests)
def test_every_layout_runs_under_the_planners_peak(tmp_path, dist_group):
    out = tmp_path / "probe.json"
    rows = memory_probe.main([*TINY, "--out", str(out)])
    assert [r["layout"] for r in rows] == ["shared", "packed", "unshared"]
    for r in rows:
        assert "error" not in r, r
        assert r["grad_norm_finite"] and r["micro_batches"] >= 1
        assert 0 < r["update_peak_gib"] <= r["planned_update_gib"], r
        assert 0 < r["logprobs_peak_gib"] <= r["planned_logprobs_gib"], r
        assert r["attention_per_layer_s"] > 0 and r["attention_vs_causal"] > 0
    saved = json.loads(out.read_text())
    assert saved["header"]["rows"] == 6 and saved["header"]["max_response"] == 96
    assert saved["header"]["causal_baseline_attention_per_layer_s"] > 0


def test_an_unknown_layout_is_named():
    with pytest.raises(SystemExit, match="--layouts: unknown \\['padded'\\]"):
        memory_probe.main([*TINY, "--layouts", "shared,padded"])
