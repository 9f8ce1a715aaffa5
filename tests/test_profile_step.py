"""bench/profile_step.py's tables from a real torch profiler run, and infra/allocator.py's settings.

No timing assertions: the shares and rows come from what the profiler recorded, whatever the speed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from bench.profile_step import (
    OpRow,
    PhaseLog,
    PhaseUsage,
    decode_gemm_seconds,
    floor_budget_report,
    is_attention,
    is_matmul,
    matmul_share,
    operator_table,
    rows_from_key_averages,
    shape_rates_report,
)
from infra import allocator


def _profiled_rows() -> list[OpRow]:
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            c = torch.mm(a, b)
            torch.relu(c)
            torch.log_softmax(c, -1)
    return rows_from_key_averages(prof.key_averages())


def test_rows_from_a_real_profile_are_sorted_and_classified():
    rows = _profiled_rows()
    names = {r.name: r for r in rows}
    assert names["aten::mm"].calls == 3 and names["aten::relu"].calls == 3
    assert [r.self_cpu_us for r in rows] == sorted((r.self_cpu_us for r in rows), reverse=True)
    assert is_matmul("aten::mm") and is_matmul("aten::addmm") and is_matmul("aten::linear")
    assert (
        not is_matmul("aten::relu") and not is_matmul("aten::_log_softmax") and not is_matmul("aten::copy_")
    )
    share = matmul_share(rows)
    mm = sum(r.self_cpu_us for r in rows if is_matmul(r.name))
    assert share == pytest.approx(mm / sum(r.self_cpu_us for r in rows))
    assert 0.0 < share < 1.0


def test_matmul_share_and_table_on_hand_rows():
    rows = [OpRow("aten::mm", 600.0, 2), OpRow("aten::copy_", 300.0, 10), OpRow("aten::add_", 100.0, 5)]
    assert matmul_share(rows) == pytest.approx(0.6)
    assert matmul_share([]) == 0.0
    table = operator_table(rows, top=2).splitlines()
    assert table[1].split()[:5] == ["aten::mm", "0.001", "60.0%", "2", "matmul"]
    assert table[2].split()[:5] == ["aten::copy_", "0.000", "30.0%", "10", "other"]
    assert table[3].startswith("(1 more operators)") and table[3].split()[-1] == "10.0%"


def test_shape_rates_report_prices_the_decode_products_at_their_own_shape():
    rows = [OpRow("_C::onednn_mm", 1_100_000.0, 7744), OpRow("_C::create_onednn_mm_handler", 40_000.0, 122),
            OpRow("aten::mm", 2_000_000.0, 1266)]  # fmt: skip
    assert decode_gemm_seconds(rows) == pytest.approx(1.1)  # the engine's GEMMs only, not their set-up
    rates = {"square": 1000e9, "decode": 500e9, "training": 800e9}
    shapes = {"square": "floor rate", "decode": "32 x 576 x 1536", "training": "2048 x 576 x 1536"}
    lines = shape_rates_report("bf16", 2, rates, shapes, 0.55e12, 1.1).splitlines()
    assert lines[0] == (
        "bf16 products at the step's shapes (2 threads), GFLOP/s: square (floor rate) 1000, "
        "decode (32 x 576 x 1536) 500, training (2048 x 576 x 1536) 800"
    )
    assert "0.550 TFLOP = 0.55 s at the square rate, 1.10 s at the decode shape's" in lines[1]
    assert lines[1].endswith("the profiled engine's GEMMs took 1.10 s")


def test_floor_budget_report_states_what_the_goal_leaves_beside_the_gemms():
    # floor 2.9 s, GEMMs 3.4 s, step 7.0 s: 1.5x = 4.35 s leaves 0.95 s for work that took 3.6 s
    line = floor_budget_report(step_s=7.0, gemm_s=3.4, attention_s=0.8, own_floor_s=2.9)
    assert "own floor 2.90 s" in line and "GEMMs took 3.40 s = 1.17x it" in line
    assert (
        "1.5x the floor (4.35 s) would leave 0.95 s for attention and all other work, which took 3.60 s"
        in line
    )
    assert line.endswith("(attention kernels 0.80 s; profiled step 7.00 s)")
    assert "would leave -1.60 s" in floor_budget_report(7.0, 5.0, 0.1, own_floor_s=2.0, goal=1.7)
    assert "own floor 0.0012 s" in floor_budget_report(0.5, 0.001, 0.0, own_floor_s=0.00123)
    assert is_attention("aten::_scaled_dot_product_flash_attention_for_cpu_backward")
    assert is_attention("_C::cpu_attention_with_kv_cache") and not is_attention("_C::onednn_mm")


@pytest.mark.slow
@pytest.mark.heavy  # make test-all: a long integration run (docs/commands.md, Tests)
def test_make_bench_profile_runs_a_tiny_step_end_to_end(tmp_path):
    """`python -m bench.profile_step` on the tiny model: one profiled step (vLLM rollout, FSDP2 update) and every
    section of its report, the products at the step's own shapes included."""
    from infra.models import PROJECT_ROOT

    trace = tmp_path / "trace.json"
    cmd = [sys.executable, "-m", "bench.profile_step", "--model", "tiny", "--steps", "1", "--prompts", "2",
           "--samples", "2", "--new-tokens", "4", "--precision", "fp32", "--trace", str(trace)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "OMP_NUM_THREADS": "2"}
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = proc.stdout.split("=" * 100)[-1]
    assert "GRPO step 1 under torch.profiler, fp32" in report
    for phase in ("rollout", "reward", "update", "weight_sync", "step"):
        assert any(line.split()[:1] == [phase] for line in report.splitlines()), phase
    assert "matrix products" in report
    assert any(
        line.split()[-1:] == ["matmul"] for line in report.splitlines()
    )  # the policy's or vLLM's GEMMs
    shapes = next(line for line in report.splitlines() if "products at the step's shapes" in line)
    assert "decode (4 x 128 x " in shapes and "training (2048 x 128 x " in shapes
    assert "decode products:" in report and trace.stat().st_size > 0
    budget = next(line for line in report.splitlines() if line.startswith("own floor "))
    floor_s = float(budget.split()[2])
    assert floor_s > 0 and "x the floor (" in budget


def test_phase_table_sums_usage_and_shares():
    log = PhaseLog()
    log.phases["rollout"] = PhaseUsage()
    log.phases["rollout"].add((0.0, 1.0, 0.5, 100), (3.0, 4.0, 1.0, 1100))
    step = PhaseUsage()
    step.add((0.0, 0.0, 0.0, 0), (4.0, 5.0, 1.0, 2000))
    lines = log.table(step).splitlines()
    assert lines[1].split() == ["rollout", "3.00", "3.00", "0.50", "1,000", "75.0%"]
    assert lines[2].split() == ["step", "4.00", "5.00", "1.00", "2,000", "100.0%"]


def test_allocator_modes_and_child_env():
    assert allocator.requested({}) == allocator.DEFAULT
    assert allocator.requested({"RLPOST_ALLOCATOR": "GLIBC"}) == "glibc"
    with pytest.raises(allocator.AllocatorError, match="RLPOST_ALLOCATOR='mimalloc'"):
        allocator.requested({"RLPOST_ALLOCATOR": "mimalloc"})
    tc = "/lib/libtcmalloc_minimal.so.4"
    env = allocator.child_env("tcmalloc", {"LD_PRELOAD": "/x/libgomp.so", "MALLOC_MMAP_MAX_": "0"}, tc)
    assert env["LD_PRELOAD"] == f"{tc}:/x/libgomp.so" and "MALLOC_MMAP_MAX_" not in env
    je = allocator.child_env("jemalloc", env, "/lib/libjemalloc.so.2")  # one preloaded allocator at a time
    assert (
        je["LD_PRELOAD"] == "/lib/libjemalloc.so.2:/x/libgomp.so"
        and je["MALLOC_CONF"] == allocator.JEMALLOC_CONF
    )
    fallback = allocator.child_env("tcmalloc", {}, None)  # library missing: glibc tuned instead
    assert "LD_PRELOAD" not in fallback and fallback["MALLOC_MMAP_MAX_"] == "0"
    off = allocator.child_env(
        "off", {**je, **allocator.GLIBC_ENV, "A": "1"}, None
    )  # what the project set goes
    assert off == {"A": "1", "LD_PRELOAD": "/x/libgomp.so", "RLPOST_ALLOCATOR": "off"}


def _child_allocator(mode: str) -> str:
    """What a `python -m infra.allocator` child reports as its allocator."""
    code = "from infra import allocator; print(allocator.describe())"
    drop = {"LD_PRELOAD", "MALLOC_CONF", *allocator.GLIBC_ENV}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["RLPOST_ALLOCATOR"] = mode
    cmd = [sys.executable, "-m", "infra.allocator", sys.executable, "-c", code]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout.strip()


def test_launcher_puts_children_under_the_allocator():
    assert _child_allocator("glibc") == "glibc (no mmap, no trim)"
    assert _child_allocator("off") == "glibc (defaults)"
    if allocator.find_library("tcmalloc") is None:
        pytest.skip("libtcmalloc-minimal4 not installed (make setup installs it with apt)")
    assert _child_allocator("tcmalloc") == "tcmalloc (preloaded)"
