"""`make bench`: one GRPO step of this project timed against TRL's `GRPOTrainer`, same model and data.

    python -m bench.train_step [--steps 4] [--precision fp32,bf16] [--model default|tiny|DIR] [key=value ...]
    python -m bench.train_step --lora-rank 16 ...   # ours with LoRA adapters (policy.lora) vs ours full weights

Both sides run the same workload: the prompts our trainer samples for steps 1..S (builtin arithmetic,
`data_prep.arithmetic.generate`), P prompts x n samples x exactly T new tokens (EOS suppressed until T:
vLLM `min_tokens`, HF `min_new_tokens`), the project's math reward, no KL, one optimizer step per
rollout batch. Each side runs in its own subprocess (separate peak RSS; vLLM and TRL never share a
process) with the same OMP thread count. The first step of each side is a warm-up; the table shows
medians over the remaining steps. `key=value` arguments are extra overrides for our side only.

`--lora-rank R` (sides `ours,lora` unless --sides says otherwise): the same step of ours with `policy.lora.rank=R`
(PEFT adapters on every attention/MLP projection, base frozen) against ours training every weight: step time
split rollout / update / weight sync, peak RSS, and the bytes each step's weight sync hands the engine.

The compute floor of a step is its matmul FLOPs (generation ~2*N*tokens with each prompt prefilled once,
training ~6*N*tokens over prompt+response, plus the LM head on the positions whose logits are computed,
plus causal attention) divided by the matmul rate of the run's precision (fp32 or bf16), measured at the start;
for fp32 the faster of torch.mm (MKL on x86) and oneDNN, which ours trains with where faster
(`policy.fp32_matmul=auto`, train/policy/cpu_matmul.py) and TRL does not.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from infra.process_exit import exit_now
from train.flops import ModelDims, StepWork, step_flops
from train.rollout.vllm_engine import VLLMEngine  # imports vLLM itself only when an engine starts

SIDES = ("ours", "trl", "lora")
SIDE_LABELS = {"ours": "ours (vLLM+FSDP2)", "trl": "TRL 1.16 (HF generate)", "lora": "ours + LoRA"}
SHORT = {"ours": "ours", "trl": "TRL", "lora": "LoRA"}
TIMING_KEYS = ("step_s", "rollout_s", "reward_s", "update_s", "weight_sync_s")
# what the kernel did for the step (getrusage of the worker): a lead that comes from the machine shows here
MACHINE_KEYS = ("sys_s", "minor_faults")


# ---- pure parts (tested in tests/test_bench.py) ------------------------------------------------
def summarize(steps: list[dict], warmup: int) -> dict[str, float]:
    """Medians over the timed steps (after `warmup`) of the timings, token counts and derived rates."""
    timed = steps[warmup:] or steps[-1:]
    out = {k: statistics.median(s[k] for s in timed) for k in TIMING_KEYS if all(k in s for s in timed)}
    if all("weight_sync_bytes" in s for s in timed):
        out["weight_sync_mb"] = statistics.median(s["weight_sync_bytes"] for s in timed) / 1e6
    for k in ("prompt_tokens", "response_tokens", *MACHINE_KEYS):
        if all(k in s for s in timed):
            out[k] = statistics.median(s[k] for s in timed)
    out["rollout_tokens_per_s"] = statistics.median(
        s["response_tokens"] / max(s["rollout_s"], 1e-9) for s in timed
    )
    out["train_tokens_per_s"] = statistics.median(
        (s["prompt_tokens"] + s["response_tokens"]) / max(s["update_s"], 1e-9) for s in timed
    )
    return out


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den == 0:
        return None
    return num / den


def _fmt(value: float | None, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "s":
        return f"{value:.2f}"
    if kind == "x":
        return f"{value:.2f}x"
    if kind == "gb":
        return f"{value:.2f}"
    return f"{value:.0f}"


# (label, key, format); the ratio column is the second side / the first for every row.
TABLE_ROWS = [
    ("step_s (median)", "step_s", "s"),
    ("  rollout_s", "rollout_s", "s"),
    ("  reward_s", "reward_s", "s"),
    ("  update_s", "update_s", "s"),
    ("  weight_sync_s", "weight_sync_s", "s"),
    ("weight sync MB/step", "weight_sync_mb", "s"),
    ("rollout tokens/s", "rollout_tokens_per_s", "n"),
    ("train tokens/s", "train_tokens_per_s", "n"),
    ("response tokens/step", "response_tokens", "n"),
    ("prompt tokens/step", "prompt_tokens", "n"),
    ("system s/step", "sys_s", "s"),
    ("minor faults/step", "minor_faults", "n"),
    ("peak RSS (GB)", "peak_rss_gb", "gb"),
    ("floor_s", "floor_s", "s"),
    ("step_s/floor_s", "floor_share", "x"),
]


def format_table(results: dict[str, dict[str, float]], pair: tuple[str, str] = ("ours", "trl")) -> str:
    """`results[side][key]` -> a fixed-width table with a column per side of `pair` and second/first."""
    first, second = pair
    headers = ["", SIDE_LABELS[first], SIDE_LABELS[second], f"{SHORT[second]}/{SHORT[first]}"]
    rows = []
    for label, key, kind in TABLE_ROWS:
        ours, trl = results.get(first, {}).get(key), results.get(second, {}).get(key)
        r = ratio(trl, ours)
        rows.append([label, _fmt(ours, kind), _fmt(trl, kind), "-" if r is None else f"{r:.2f}"])
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths)))]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append(
            "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
        )
    return "\n".join(lines)


def add_floor(summary: dict[str, float], flops: float, flops_per_s: float) -> None:
    summary["step_flops"] = flops
    summary["floor_s"] = flops / flops_per_s
    if "step_s" in summary:
        summary["floor_share"] = summary["step_s"] / summary["floor_s"]


# ---- measurements ------------------------------------------------------------------------------
def matmul_rates(trials: int = 5) -> tuple[float, float, float]:
    """(fp32 torch.mm, bf16, fp32 oneDNN) FLOP/s: the best of alternating trials, so a load spike from another
    process hits every kernel alike instead of deciding which one looks faster."""
    import torch

    from train.policy.precision import matmul_flops_per_s as rate
    from train.policy.precision import onednn_flops_per_s

    cpu = torch.device("cpu")
    fp32 = bf16 = onednn = 0.0
    for _ in range(trials):
        fp32 = max(fp32, rate(torch.float32, cpu, 1024, 0.3))
        bf16 = max(bf16, rate(torch.bfloat16, cpu, 512, 0.3))  # 512: the AVX2 fallback is ~100x slower
        onednn = max(onednn, onednn_flops_per_s(1024, 0.3))
    return fp32, bf16, onednn


def model_dims(model_path: str) -> ModelDims:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    skip = {id(p) for m in (emb, head) if m is not None for p in m.parameters()}
    body = sum(p.numel() for p in model.parameters() if id(p) not in skip)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return ModelDims(body, config.hidden_size, config.vocab_size, config.num_hidden_layers, heads * head_dim)


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # Linux: KiB


def _kernel_usage() -> tuple[float, int]:
    """(system CPU seconds, minor page faults) of this worker so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_stime, r.ru_minflt


def _add_kernel_usage(step: dict, before: tuple[float, int]) -> None:
    sys_s, faults = _kernel_usage()
    step["sys_s"], step["minor_faults"] = sys_s - before[0], faults - before[1]


def _worker_result(steps: list[dict], threads: int) -> dict:
    # The 1-minute load average at the end tells whether other processes shared the CPUs.
    from infra import allocator

    return {
        "steps": steps,
        "peak_rss_gb": _peak_rss_gb(),
        "threads": threads,
        "load_avg": os.getloadavg()[0],
        "allocator": allocator.describe(),
    }


def _our_overrides(args, run_dir: str) -> list[str]:
    return [
        f"model.path={args.model}",
        f"run_dir={run_dir}",
        "track=false",
        f"seed={args.seed}",
        f"total_steps={args.steps}",
        "save_every=0",
        f"data.prompts_per_step={args.prompts}",
        f"rollout.n={args.samples}",
        f"rollout.max_new_tokens={args.new_tokens}",
        "rollout.engine._target_=bench.train_step.FixedLengthVLLMEngine",
        "algorithm.use_kl_loss=false",
        "algorithm.use_kl_in_reward=false",
        f"policy.precision={args.precision}",
        *args.overrides,
    ]


def _step_prompts(args) -> tuple[list[dict], list[int]]:
    """The rows our trainer trains on in steps 1..S, in order, with their prompt token counts."""
    from transformers import AutoTokenizer

    from data_prep.datasets import load_prompt_rows
    from train.config import build_config
    from train.data import PromptSampler, encode_prompts

    cfg = build_config(overrides=_our_overrides(args, tempfile.gettempdir()))
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    rows = load_prompt_rows(cfg.data.train_path, cfg.data.builtin_size, cfg.seed)
    ids = encode_prompts(tokenizer, rows)
    kept = [(r, len(i)) for r, i in zip(rows, ids) if len(i) <= cfg.data.max_prompt_tokens]
    sampler = PromptSampler(len(kept), cfg.data.prompts_per_step, cfg.seed, cfg.data.shuffle)
    order = [i for step in range(1, args.steps + 1) for i in sampler.batch(step)]
    return [kept[i][0] for i in order], [kept[i][1] for i in order]


def run_ours(args, lora_rank: int = 0) -> dict:
    import torch

    from train.config import build_config
    from train.stages.grpo import GRPOTrainer

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-ours-") as run_dir:
        overrides = _our_overrides(args, run_dir) + ([f"policy.lora.rank={lora_rank}"] if lora_rank else [])
        trainer = GRPOTrainer(build_config(overrides=overrides))
        steps = []
        for step in range(1, args.steps + 1):
            rows = [trainer.prompt_ids[i] for i in trainer.sampler.batch(step)]
            kernel = _kernel_usage()
            m = trainer.step(step)
            n = args.samples
            steps.append(
                {
                    "step_s": m["timing/step_s"],
                    "rollout_s": m["timing/rollout_s"],
                    "reward_s": m["timing/reward_s"],
                    "update_s": m["timing/update_s"],
                    "weight_sync_s": m["timing/weight_sync_s"],
                    "weight_sync_bytes": m["perf/weight_sync_bytes"],
                    "weight_sync_adapter": m["rollout/weight_sync_adapter"],
                    "prompt_lens": [len(r) for r in rows],
                    "prompt_tokens": n * sum(len(r) for r in rows),
                    "response_tokens": round(m["train/response_length_mean"] * len(rows) * n),
                    "reward_mean": m["train/reward_mean"],
                }
            )
            _add_kernel_usage(steps[-1], kernel)
            print(f"[bench] ours step {step}: {m['timing/step_s']:.2f}s", flush=True)
        trainer.close()
    return _worker_result(steps, torch.get_num_threads())


def _trl_config_kwargs(args, out_dir: str) -> dict:
    """TRL's GRPOConfig for the same step as ours: one generation per step, no KL, a constant LR, CPU."""
    batch = args.prompts * args.samples
    return {
        "output_dir": out_dir,
        "use_cpu": True,
        "bf16": args.precision == "bf16",
        "gradient_checkpointing": False,
        "per_device_train_batch_size": batch,
        "gradient_accumulation_steps": 1,
        "num_generations": args.samples,
        "max_completion_length": args.new_tokens,
        "generation_batch_size": batch,  # => steps_per_generation=1 (TRL refuses both set)
        "generation_kwargs": {"min_new_tokens": args.new_tokens},
        "num_iterations": 1,
        "beta": 0.0,
        "temperature": 1.0,
        "top_p": 1.0,
        "learning_rate": 1e-6,
        "weight_decay": 0.01,
        "max_grad_norm": 1.0,
        "lr_scheduler_type": "constant",
        "max_steps": args.steps,
        "shuffle_dataset": False,  # the rows are already in our trainer's order
        "seed": args.seed,
        "report_to": [],
        "logging_steps": 1,
        "save_strategy": "no",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }


def _timed_trl_classes(args, prompt_lens: list[int], steps: list[dict]):
    """(a GRPOTrainer that times its generation and reward, a callback that appends each step's figures to
    `steps`): TRL only logs those times to wandb/mlflow/trackio."""
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    current: dict = {}

    class TimedGRPOTrainer(GRPOTrainer):
        """Adds the generation and reward time of the step (TRL only logs them to wandb/mlflow/trackio)."""

        def _generate(self, prompts):
            t0 = time.perf_counter()
            out = super()._generate(prompts)
            current["rollout_s"] = current.get("rollout_s", 0.0) + time.perf_counter() - t0
            current["prompt_tokens"] = current.get("prompt_tokens", 0) + sum(len(p) for p in out[0])
            current["response_tokens"] = current.get("response_tokens", 0) + sum(len(c) for c in out[1])
            current["response_length_min"] = min(len(c) for c in out[1])
            return out

        def _calculate_rewards(self, *a, **kw):
            t0 = time.perf_counter()
            out = super()._calculate_rewards(*a, **kw)
            current["reward_s"] = current.get("reward_s", 0.0) + time.perf_counter() - t0
            return out

    class StepTimer(TrainerCallback):
        def on_step_begin(self, targs, state, control, **kwargs):
            current.clear()
            current["t0"] = time.perf_counter()
            current["kernel"] = _kernel_usage()

        def on_step_end(self, targs, state, control, **kwargs):
            s = dict(current)
            s["step_s"] = time.perf_counter() - s.pop("t0")
            _add_kernel_usage(s, s.pop("kernel"))
            s["update_s"] = s["step_s"] - s.get("rollout_s", 0.0) - s.get("reward_s", 0.0)
            s["weight_sync_s"] = 0.0  # HF generate samples from the trained weights themselves
            step = len(steps)
            s["prompt_lens"] = prompt_lens[step * args.prompts : (step + 1) * args.prompts]
            steps.append(s)
            print(f"[bench] trl step {state.global_step}: {s['step_s']:.2f}s", flush=True)

    return TimedGRPOTrainer, StepTimer


def run_trl(args) -> dict:
    import torch
    from datasets import Dataset
    from trl import GRPOConfig

    from train.rewards.math_reward import MathReward

    torch.set_num_threads(args.threads)
    rows, prompt_lens = _step_prompts(args)
    dataset = Dataset.from_list([{"prompt": r["prompt"], "ground_truth": r["ground_truth"]} for r in rows])
    reward = MathReward()

    def math_reward(prompts, completions, ground_truth, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        result = reward([{"ground_truth": g} for g in ground_truth], texts, list(range(len(texts))))
        return result.scores

    steps: list[dict] = []
    TimedGRPOTrainer, StepTimer = _timed_trl_classes(args, prompt_lens, steps)
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as out_dir:
        config = GRPOConfig(**_trl_config_kwargs(args, out_dir))
        trainer = TimedGRPOTrainer(
            model=args.model,
            reward_funcs=math_reward,
            args=config,
            train_dataset=dataset,
            callbacks=[StepTimer()],
        )
        trainer.train()
    return _worker_result(steps, torch.get_num_threads())


class FixedLengthVLLMEngine(VLLMEngine):
    """The project's vLLM engine with EOS suppressed until max_new_tokens (vLLM `min_tokens`)."""

    def _params(self, sampling, seed):
        params = super()._params(sampling, seed)
        params.min_tokens = sampling.max_new_tokens
        return params


# ---- driver ------------------------------------------------------------------------------------
def add_workload_args(p: argparse.ArgumentParser) -> None:
    """The bench's workload (model, prompts x samples x new tokens, threads, seed): one definition for
    bench-train and bench-profile, so the profile is of the step the bench times."""
    p.add_argument("--model", default="default", help="default | tiny (random 2-layer Llama) | HF folder")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    p.add_argument("--seed", type=int, default=1)


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4, help="steps per side, the first is a warm-up (default 4)")
    p.add_argument("--precision", default="fp32", help="comma list of fp32,bf16 (bf16 is slow on AVX2 CPUs)")
    add_workload_args(p)
    p.add_argument(
        "--sides",
        default=None,
        help="comma list of ours,trl,lora (default ours,trl; ours,lora with --lora-rank)",
    )
    p.add_argument(
        "--lora-rank", type=int, default=0, help="the lora side's policy.lora.rank (default 16 when it runs)"
    )
    p.add_argument(
        "--allocators",
        default=None,
        help="comma list of tcmalloc,jemalloc,glibc,off: a table per setting, both sides under it"
        " (default: $RLPOST_ALLOCATOR, unset: glibc)",
    )
    p.add_argument(
        "--reuse", help="keep each side's raw result in DIR/<side>-<precision>.json; reuse existing"
    )
    p.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", help="key=value overrides for our side (train.config keys)")
    args = p.parse_args(argv)
    args.precisions = [x.strip() for x in args.precision.split(",") if x.strip()]
    bad = [x for x in args.precisions if x not in ("fp32", "bf16")]
    if bad:
        p.error(f"--precision: unknown {bad} (expected fp32 and/or bf16)")
    sides = args.sides or ("ours,lora" if args.lora_rank else "ours,trl")
    args.side_list = [x.strip() for x in sides.split(",") if x.strip()]
    from infra.allocator import MODES, AllocatorError, requested

    try:
        default = requested()
    except AllocatorError as exc:
        p.error(str(exc))
    args.allocator_list = [x.strip() for x in (args.allocators or default).split(",") if x.strip()]
    if any(a not in MODES for a in args.allocator_list):
        p.error(f"--allocators: expected a comma list of {MODES}")
    if any(s not in SIDES for s in args.side_list):
        p.error(f"--sides: expected a comma list of {SIDES}")
    if args.lora_rank < 0:
        p.error("--lora-rank must be >= 0")
    args.lora_rank = args.lora_rank or 16
    if args.steps < 1:
        p.error("--steps must be >= 1")
    return args


def _prefer_oom_kill() -> None:
    """Make the kernel's OOM killer pick this worker first, not a training job sharing the machine."""
    try:
        Path("/proc/self/oom_score_adj").write_text("1000")
    except OSError:
        pass


def _worker_main(args) -> None:
    _prefer_oom_kill()
    if args.worker == "trl":
        result = run_trl(args)
    else:
        result = run_ours(args, args.lora_rank if args.worker == "lora" else 0)
    Path(args.out).write_text(json.dumps(result))
    exit_now(0)  # no interpreter teardown: vLLM's, gloo's and the reward pools' threads outlive it


def _run_side(args, side: str, precision: str, env: dict, alloc: str) -> tuple[dict | None, str]:
    """(raw worker result, "") or (None, why it failed). With --reuse DIR, results are kept there and reused."""
    kept = Path(args.reuse) / f"{side}-{precision}-{alloc}.json" if args.reuse else None
    if kept is not None and kept.is_file():
        print(f"[bench] {side} {precision}: reusing {kept} (measured earlier, not in this run)", flush=True)
        return json.loads(kept.read_text()), ""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [sys.executable, "-m", "bench.train_step", "--worker", side, "--out", out, "--precision", precision]
    cmd += ["--steps", str(args.steps), "--model", args.model, "--prompts", str(args.prompts)]
    cmd += ["--samples", str(args.samples), "--new-tokens", str(args.new_tokens)]
    cmd += ["--threads", str(args.threads), "--seed", str(args.seed), "--lora-rank", str(args.lora_rank)]
    cmd += args.overrides
    print(f"[bench] {side} {precision} {alloc}: {' '.join(cmd[1:])}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env)
    try:
        if proc.returncode != 0:
            why = f"exit {proc.returncode}"
            if proc.returncode == -9:
                why += ": SIGKILL, e.g. the kernel's OOM killer when memory ran out"
            print(f"[bench] {side} {precision} FAILED ({why})", flush=True)
            return None, why
        result = json.loads(Path(out).read_text())
    finally:
        Path(out).unlink(missing_ok=True)
    print(f"[bench] {side} {precision} done in {time.perf_counter() - t0:.0f}s", flush=True)
    if kept is not None:
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(json.dumps(result))
    return result, ""


def _other_load() -> str:
    try:
        load1 = os.getloadavg()[0]
    except OSError:
        return ""
    return f"load average {load1:.2f} before the run"


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    if args.worker:
        args.precision = args.precisions[0]
        _worker_main(args)
        return

    import torch

    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false")
    torch.set_num_threads(args.threads)
    from infra.models import bench_model

    args.model, tmp_model = bench_model(args.model)

    print(f"[bench] {_other_load()}; {os.cpu_count()} CPUs, {args.threads} threads per side", flush=True)
    rates, fp32_rate, bf16_rate, accelerated = _machine_rates(args)
    dims = model_dims(args.model)
    tables = []
    for precision, alloc in [(p, a) for p in args.precisions for a in args.allocator_list]:
        rate = bf16_rate if precision == "bf16" else fp32_rate  # the floor at this precision
        tables.append(_precision_table(args, precision, alloc, env, dims, rate))
    print("=" * 100)
    print(f"[bench] {rates}")
    if not accelerated:
        print("[bench] bf16 is NOT accelerated on this CPU: bf16 rows are fallback-kernel timings")
    for t in tables:
        print("\n" + t)
    if tmp_model is not None:
        tmp_model.cleanup()


def _machine_rates(args) -> tuple[str, float, float, bool]:
    """(the rates line, fp32 floor rate, bf16 rate, whether bf16 is accelerated), printed as measured."""
    import torch

    torch_fp32_rate, bf16_rate, onednn_fp32_rate = matmul_rates()
    fp32_rate = max(torch_fp32_rate, onednn_fp32_rate)  # the floor: the machine's fastest fp32 kernel
    capability = torch.backends.cpu.get_cpu_capability()
    accelerated = bf16_rate >= 0.5 * fp32_rate
    rates = (
        f"matmul: fp32 {torch_fp32_rate / 1e9:.1f} GFLOP/s in torch.mm (MKL), {onednn_fp32_rate / 1e9:.1f} in"
        f" oneDNN; bf16 {bf16_rate / 1e9:.1f} GFLOP/s ({args.threads} threads, CPU capability {capability})"
    )
    print(f"[bench] {rates}", flush=True)
    if not accelerated:
        print(
            f"[bench] bf16 is NOT accelerated on this CPU (bf16 matmul {fp32_rate / bf16_rate:.0f}x slower "
            "than fp32): bf16 timings measure slow fallback kernels, not bf16 speed",
            flush=True,
        )
    return rates, fp32_rate, bf16_rate, accelerated


def _precision_table(args, precision: str, alloc: str, env: dict, dims, rate: float) -> str:
    """Every side run at one precision under one allocator setting, as one titled table with notes."""
    from infra import allocator

    results: dict[str, dict[str, float]] = {}
    notes = []
    for side in args.side_list:  # both sides under the same allocator setting
        raw, why = _run_side(
            args, side, precision, allocator.child_env(alloc, env, allocator.find_library(alloc)), alloc
        )
        if raw is None:
            notes.append(f"{side}: FAILED ({why})")
            continue
        notes.append(
            f"{side}: {raw['threads']} torch threads; allocator {raw.get('allocator', '?')}; 1-min load average"
            f" at its end {raw['load_avg']:.2f} on {os.cpu_count()} CPUs (above {args.threads} = other"
            " processes shared the CPUs)"
        )
        results[side] = _side_summary(args, side, raw, dims, rate, notes)
    timed_n = args.steps - (1 if args.steps > 1 else 0)
    title = (
        f"GRPO step, {precision}: {Path(args.model).name}, {args.prompts} prompts x {args.samples} samples "
        f"x {args.new_tokens} new tokens, no KL, median of {timed_n} timed step(s)"
        f"{' after 1 warm-up' if args.steps > 1 else ''}, OMP_NUM_THREADS={args.threads},"
        f" {allocator.ENV}={alloc}"
    )
    note = (
        f"floor_s = step FLOPs / {precision} matmul rate ({rate / 1e9:.1f} GFLOP/s); "
        f"step FLOPs {results.get('ours', results.get('trl', {})).get('step_flops', 0) / 1e12:.3f} T"
        f" (model body {dims.body_params / 1e6:.1f}M params, LM head {dims.hidden}x{dims.vocab});"
        " TRL's update_s = step - generate - reward (includes its scoring bookkeeping)"
    )
    pair = tuple((args.side_list + ["trl"])[:2]) if len(args.side_list) != 1 else (args.side_list[0], "trl")
    return "\n".join([title, format_table(results, pair), note, *notes])


def _side_summary(args, side: str, raw: dict, dims, rate: float, notes: list[str]) -> dict[str, float]:
    """One side's medians over its timed steps with the FLOPs floor; its remarks are appended to `notes`."""
    warmup = 1 if len(raw["steps"]) > 1 else 0
    summary = summarize(raw["steps"], warmup)
    summary["peak_rss_gb"] = raw["peak_rss_gb"]
    timed = raw["steps"][warmup:]
    flops = statistics.median(
        step_flops(dims, StepWork(s["prompt_lens"], _response_lens(s, args), args.samples)) for s in timed
    )
    add_floor(summary, flops, rate)
    if side == "lora":
        sync = "adapter (vLLM LoRARequest)" if timed[-1].get("weight_sync_adapter") else "merged weights"
        notes.append(f"lora: policy.lora.rank={args.lora_rank}; weight sync path {sync}")
    if side == "ours":  # the FLOPs it actually runs: each group's prompt once in training
        own = statistics.median(
            step_flops(dims, StepWork(s["prompt_lens"], _response_lens(s, args), args.samples), True)
            for s in timed
        )
        notes.append(
            f"ours shares each group's prompt in training (policy.share_prompts): its own step FLOPs"
            f" {own / 1e12:.3f} T, floor {own / rate:.2f} s, step_s/own floor"
            f" {summary.get('step_s', float('nan')) * rate / own:.2f}x"
        )
    summary["reward_mean"] = statistics.fmean(s.get("reward_mean", float("nan")) for s in timed)
    return summary


def _response_lens(step: dict, args) -> list[int]:
    """Per-sample response lengths (the workers report totals; lengths are forced, so spread evenly)."""
    total, count = int(step["response_tokens"]), len(step["prompt_lens"]) * args.samples
    base, extra = divmod(total, count)
    return [base + (1 if i < extra else 0) for i in range(count)]


if __name__ == "__main__":
    from infra import allocator

    allocator.ensure()  # before anything else: may re-exec this process with the allocator preloaded
    main()
