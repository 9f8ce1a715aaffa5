"""`make bench-profile`: where one GRPO step's time goes, on CPU, under torch's profiler.

    python -m bench.profile_step [--precision bf16] [--steps 2] [--top 25] [--model default|tiny|DIR] [k=v ...]

Runs the bench's workload (`bench.train_step`: P prompts x n samples x exactly T new tokens, no KL) with
our trainer; the last step runs under `torch.profiler` (CPU activity, every thread), the earlier ones warm
up. Prints, for that step:

- each phase (rollout = the engine's generate, reward, update, weight sync): wall time, CPU time, system
  time and minor page faults of the process (`getrusage`), i.e. how much of the phase the kernel took;
- the top operators by self CPU time, each with its share of all operator time and its call count;
- the share of operator time in matrix products (mm/addmm/bmm/linear kernels, oneDNN/vLLM GEMMs,
  attention) against the rest (elementwise, copies and casts, softmax, optimizer, allocation);
- the floor budget: the profiled GEMMs against the step's own floor (bench-train's `own floor`) and what
  1.5x that floor (issue 27's goal) would leave for attention and all other work against what they took;
- the allocator in use (`RLPOST_ALLOCATOR`, infra/allocator.py) and the load average: timings on a
  shared machine are not idle figures, faults and system time are the load-robust ones.

`--trace FILE` also writes a Chrome trace of the profiled step. `key=value` are train.config overrides.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from infra.process_exit import exit_now

# Operators whose self time is attention (SDPA's kernels, vLLM's paged attention) and, with those, all
# matrix-product work (names as torch's profiler reports them).
ATTENTION_MARKERS = ("aten::_scaled_dot_product", "attention")
MATMUL_MARKERS = (
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::_addmm_activation",
    "mkldnn",
    "onednn",
    "gemm",
    "matmul",
    "linear",
    *ATTENTION_MARKERS,
)


# ---- pure parts (tested in tests/test_profile_step.py) -----------------------------------------
@dataclass(frozen=True)
class OpRow:
    name: str
    self_cpu_us: float
    calls: int


def is_matmul(name: str) -> bool:
    """Whether an operator's self time is matrix-product work (GEMMs and attention kernels)."""
    low = name.lower()
    return any(m in low for m in MATMUL_MARKERS)


def rows_from_key_averages(averages) -> list[OpRow]:
    """`profiler.key_averages()` -> one row per operator name, largest self CPU time first."""
    rows = [OpRow(e.key, float(e.self_cpu_time_total), int(e.count)) for e in averages]
    return sorted(rows, key=lambda r: r.self_cpu_us, reverse=True)


def matmul_share(rows: list[OpRow]) -> float:
    """The share of all operators' self CPU time spent in matrix products (0 when nothing was recorded)."""
    total = sum(r.self_cpu_us for r in rows)
    return sum(r.self_cpu_us for r in rows if is_matmul(r.name)) / total if total else 0.0


def decode_gemm_seconds(rows: list[OpRow]) -> float:
    """Self time of the engine's GEMMs (vLLM's CPU backend multiplies through `_C::onednn_mm`)."""
    return sum(r.self_cpu_us for r in rows if "onednn_mm" in r.name and "handler" not in r.name) / 1e6


def shape_rates_report(
    precision: str,
    threads: int,
    rates: dict[str, float],
    shapes: dict[str, str],
    decode_flops: float,
    decode_gemm_s: float,
) -> str:
    """What the step's own matrix shapes allow: the square-product rate the floor uses (bench-train's
    `floor_s`), a decode step's product (one row per sequence decoded together) and a training
    micro-batch's, in GFLOP/s; and the decode products' time at their shape's rate against what the
    profiled engine spent in its GEMMs. A decode at a few dozen rows runs far below the square rate,
    which is the part of the floor gap no implementation of the same rollout closes."""
    names = ", ".join(f"{k} ({shapes.get(k, '?')}) {v / 1e9:.0f}" for k, v in rates.items())
    at_shape = decode_flops / rates["decode"] if rates.get("decode") else float("nan")
    at_square = decode_flops / rates["square"] if rates.get("square") else float("nan")
    return (
        f"{precision} products at the step's shapes ({threads} threads), GFLOP/s: {names}\n"
        f"decode products: {decode_flops / 1e12:.3f} TFLOP = {at_square:.2f} s at the square rate, "
        f"{at_shape:.2f} s at the decode shape's; the profiled engine's GEMMs took {decode_gemm_s:.2f} s"
    )


def is_attention(name: str) -> bool:
    """Whether an operator is an attention kernel (SDPA's, vLLM's paged attention), not a GEMM."""
    low = name.lower()
    return any(m in low for m in ATTENTION_MARKERS)


def floor_budget_report(
    step_s: float, gemm_s: float, attention_s: float, own_floor_s: float, goal: float = 1.5
) -> str:
    """The arithmetic of issue 27's goal (a step within `goal` x its own floor, bench-train's `own floor`):
    what the profiled GEMMs took against the floor, and what the goal would leave for attention and all other
    work (sampling, norms, casts and copies, optimizer, Python) against what they took. When the GEMMs alone
    pass `goal` x the floor, or leave less than attention takes, no change outside the kernels reaches it."""
    budget = goal * own_floor_s

    def sec(x: float) -> str:  # two decimals, or two significant digits for a tiny model's floor
        return f"{x:.2f}" if abs(x) >= 0.1 else f"{x:.2g}"

    return (
        f"own floor {sec(own_floor_s)} s (the step's FLOPs, each group's prompt once, at the square rate); GEMMs"
        f" took {sec(gemm_s)} s = {gemm_s / own_floor_s:.2f}x it; {goal:g}x the floor ({sec(budget)} s) would"
        f" leave {sec(budget - gemm_s)} s for attention and all other work, which took {sec(step_s - gemm_s)} s"
        f" (attention kernels {sec(attention_s)} s; profiled step {sec(step_s)} s)"
    )


def linear_flops_per_s(rows: int, inner: int, outer: int, dtype, min_time_s: float = 0.3) -> float:
    """Sustained rate of one (rows x inner) x (inner x outer) linear layer product at `dtype`: F.linear, and
    for fp32 also oneDNN's (the kernel a CPU policy and vLLM may use instead), the faster one."""
    import torch

    from train.policy.cpu_matmul import mm_t, onednn_available
    from train.policy.precision import product_flops_per_s

    x = torch.randn(rows, inner).to(dtype)
    w = torch.randn(outer, inner).to(dtype)
    products = [torch.nn.functional.linear]
    if dtype == torch.float32 and onednn_available():
        products.append(mm_t)
    flops = 2.0 * rows * inner * outer
    return max(product_flops_per_s(product, x, w, flops, min_time_s) for product in products)


def operator_table(rows: list[OpRow], top: int) -> str:
    """The `top` operators by self CPU time: seconds, share of all operator time, calls, matmul or not."""
    total = sum(r.self_cpu_us for r in rows) or 1.0
    lines = [f"{'operator':<56} {'self_cpu_s':>10} {'share':>7} {'calls':>8}  kind"]
    for r in rows[:top]:
        kind = "matmul" if is_matmul(r.name) else "other"
        name = r.name if len(r.name) <= 56 else r.name[:53] + "..."
        lines.append(
            f"{name:<56} {r.self_cpu_us / 1e6:>10.3f} {r.self_cpu_us / total:>7.1%} {r.calls:>8}  {kind}"
        )
    rest = rows[top:]
    if rest:
        lines.append(
            f"{f'({len(rest)} more operators)':<56} {sum(r.self_cpu_us for r in rest) / 1e6:>10.3f}"
            f" {sum(r.self_cpu_us for r in rest) / total:>7.1%}"
        )
    return "\n".join(lines)


@dataclass
class PhaseUsage:
    """What one phase cost the process: wall, user and system CPU seconds, minor page faults."""

    wall_s: float = 0.0
    user_s: float = 0.0
    sys_s: float = 0.0
    minor_faults: int = 0
    calls: int = 0

    def add(self, before: tuple[float, float, float, int], after: tuple[float, float, float, int]) -> None:
        self.wall_s += after[0] - before[0]
        self.user_s += after[1] - before[1]
        self.sys_s += after[2] - before[2]
        self.minor_faults += after[3] - before[3]
        self.calls += 1


@dataclass
class PhaseLog:
    phases: dict[str, PhaseUsage] = field(default_factory=dict)

    def table(self, step: PhaseUsage) -> str:
        lines = [f"{'phase':<14} {'wall_s':>8} {'user_s':>8} {'sys_s':>8} {'minor_faults':>13} {'share':>7}"]
        for name, u in [*self.phases.items(), ("step", step)]:
            share = u.wall_s / step.wall_s if step.wall_s else 0.0
            lines.append(
                f"{name:<14} {u.wall_s:>8.2f} {u.user_s:>8.2f} {u.sys_s:>8.2f} {u.minor_faults:>13,}"
                f" {share:>7.1%}"
            )
        return "\n".join(lines)


# ---- measurement -------------------------------------------------------------------------------
def usage_now() -> tuple[float, float, float, int]:
    """(wall, user, system, minor faults) of this process, all threads."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), r.ru_utime, r.ru_stime, r.ru_minflt


def _wrap(log: PhaseLog, phase: str, fn):
    """`fn` timed into `log.phases[phase]` and marked as a profiler range of that name."""
    import torch

    def timed(*a, **kw):
        usage = log.phases.setdefault(phase, PhaseUsage())
        before = usage_now()
        with torch.profiler.record_function(f"phase::{phase}"):
            out = fn(*a, **kw)
        usage.add(before, usage_now())
        return out

    return timed


def instrument(trainer, log: PhaseLog) -> None:
    """Time the trainer's phases through the objects it calls (its engine, reward and policy update)."""
    engine = trainer.engine
    engine.generate = _wrap(log, "rollout", engine.generate)
    engine.update_weights = _wrap(log, "weight_sync", engine.update_weights)
    trainer.reward_fn = _wrap(log, "reward", trainer.reward_fn)
    trainer._update = _wrap(log, "update", trainer._update)


@contextmanager
def _quiet_profiler_warnings():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def profile(args) -> str:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from bench.train_step import _our_overrides, _response_lens, model_dims
    from infra import allocator
    from train.config import build_config
    from train.flops import StepWork, step_flops
    from train.stages.grpo import GRPOTrainer

    torch.set_num_threads(args.threads)
    out: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as run_dir:
        trainer = GRPOTrainer(build_config(overrides=_our_overrides(args, run_dir)))
        for step in range(1, args.steps):
            m = trainer.step(step)
            print(f"[profile] warm-up step {step}: {m['timing/step_s']:.2f}s", flush=True)
        log = PhaseLog()
        instrument(trainer, log)
        step_usage = PhaseUsage()
        prompt_lens = [len(trainer.prompt_ids[i]) for i in trainer.sampler.batch(args.steps)]
        shared = trainer.cfg.policy.share_prompts
        with _quiet_profiler_warnings(), torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            before = usage_now()
            m = trainer.step(args.steps)
            step_usage.add(before, usage_now())
        trainer.close()
    rows = rows_from_key_averages(prof.key_averages())
    rows = [r for r in rows if not r.name.startswith("phase::")]
    if args.trace:
        prof.export_chrome_trace(args.trace)
    share = matmul_share(rows)
    total_s = sum(r.self_cpu_us for r in rows) / 1e6
    out.append(
        f"GRPO step {args.steps} under torch.profiler, {args.precision}: {Path(args.model).name}, "
        f"{args.prompts} prompts x {args.samples} samples x {args.new_tokens} new tokens, "
        f"{args.threads} threads; allocator {allocator.describe()}; "
        f"1-min load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    )
    out.append(
        f"trainer's own timings: step {m['timing/step_s']:.2f}s = rollout {m['timing/rollout_s']:.2f} + reward "
        f"{m['timing/reward_s']:.2f} + update {m['timing/update_s']:.2f} + sync {m['timing/weight_sync_s']:.2f}"
        " (profiled: the profiler's own overhead is in them)"
    )
    out += ["", log.table(step_usage), ""]
    out.append(
        f"operators: {total_s:.2f} s self CPU time recorded (all threads); matrix products {share:.1%},"
        f" the rest {1 - share:.1%}"
    )
    out.append(operator_table(rows, args.top))
    report, square_rate = shape_rates(args, decode_gemm_seconds(rows))
    out += ["", report]
    responses = round(m["train/response_length_mean"] * len(prompt_lens) * args.samples)
    step = {"response_tokens": responses, "prompt_lens": prompt_lens}  # as bench-train's workers report it
    work = StepWork(prompt_lens, _response_lens(step, args), args.samples)
    own_floor_s = step_flops(model_dims(args.model), work, shared) / square_rate
    attention_s = sum(r.self_cpu_us for r in rows if is_attention(r.name)) / 1e6
    products = [r for r in rows if is_matmul(r.name) and "handler" not in r.name]  # not oneDNN's set-up
    gemm_s = sum(r.self_cpu_us for r in products) / 1e6 - attention_s
    out.append(floor_budget_report(m["timing/step_s"], gemm_s, attention_s, own_floor_s))
    return "\n".join(out)


def shape_rates(args, decode_gemm_s: float) -> tuple[str, float]:
    """`shape_rates_report` for this run's model, workload and precision (measured after the profiled step;
    the square rate is bench-train's, the one its `floor_s` divides by), and that square rate."""
    import torch
    from transformers import AutoConfig

    from bench.train_step import matmul_rates, model_dims

    config = AutoConfig.from_pretrained(args.model)
    hidden, inner = config.hidden_size, config.intermediate_size
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    dims = model_dims(args.model)
    sequences = args.prompts * args.samples
    fp32_torch, bf16, fp32_onednn = matmul_rates(trials=3)
    rates = {
        "square": bf16 if args.precision == "bf16" else max(fp32_torch, fp32_onednn),
        "decode": 0.0,
        "training": 0.0,
    }
    for _ in range(3):  # best of alternating trials, as matmul_rates
        rates["decode"] = max(rates["decode"], linear_flops_per_s(sequences, hidden, inner, dtype))
        rates["training"] = max(rates["training"], linear_flops_per_s(2048, hidden, inner, dtype))
    shapes = {
        "square": "bench-train's floor rate",
        "decode": f"{sequences} x {hidden} x {inner}",
        "training": f"2048 x {hidden} x {inner}",
    }
    decode_flops = 2.0 * (dims.body_params + dims.hidden * dims.vocab) * sequences * args.new_tokens
    report = shape_rates_report(args.precision, args.threads, rates, shapes, decode_flops, decode_gemm_s)
    return report, rates["square"]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    from bench.train_step import add_workload_args

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--precision", default="bf16", choices=("fp32", "bf16"))
    p.add_argument("--steps", type=int, default=2, help="the last one is profiled (default 2: 1 warm-up)")
    p.add_argument("--top", type=int, default=25)
    add_workload_args(p)
    p.add_argument("--trace", help="also write a Chrome trace (JSON) of the profiled step here")
    p.add_argument("overrides", nargs="*", help="key=value overrides (train.config keys)")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    from infra.models import bench_model

    args.model, tmp_model = bench_model(args.model)
    report = profile(args)
    print("=" * 100)
    print(report, flush=True)
    if tmp_model is not None:
        tmp_model.cleanup()


if __name__ == "__main__":
    from infra import allocator

    allocator.ensure()
    main()
    exit_now(0)  # no interpreter teardown: vLLM's and gloo's threads outlive it (infra/process_exit.py)
