"""GRPO steps of an experiment with the HF rollout engine, measured: the GPU check of issue 14.

    python -m bench.gpu_check --model DIR [--experiment grpo_math] [--steps 2] [--out FILE] [key=value ...]

Runs on a GPU or the CPU (whatever torch sees), without MLflow. Per step it prints and stores the loss,
reward, grad norm, the update's time, its FLOPs (bench/train_step.py's count for the tokens actually trained,
shared prompts included) and MFU against the device's dense peak (GPU datasheet; on CPU the measured
matmul rate of the chosen precision), the peak GPU memory allocated during the update beside the
planner's prediction for the same config (train/plan.py, same prompt/response lengths as measured), and the
frames torch.compile compiled during the step (0 once warm: the log-prob kernels compile at start-up).

What it depends on (kept stable on purpose, so the check cannot rot unseen; tests/test_bench_checks.py
runs it on the CPU): `GRPOTrainer(cfg)`, `.step(step)` -> metrics, `.policy`, `.model_path`, `.close()`;
`Policy.train_step(prompt_ids, response_ids, ...)`, which it wraps on the instance to time every optimizer
step; `Policy.device` and `.precision_choice`; the metric names actor/pg_loss, actor/grad_norm,
train/reward_mean, train/accuracy, train/response_length_mean, timing/rollout_s.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from bench.train_step import model_dims
from train.flops import ModelDims, StepWork, training_flops


class UpdateMeter:
    """Wraps a policy's public `train_step` (every optimizer step of the update goes through it) and records
    its time, the FLOPs of the rows it trained and, on a GPU, the peak memory allocated during it. It depends
    on `Policy.train_step(prompt_ids, response_ids, loss_fn, ...)` and on nothing inside the trainer."""

    def __init__(self, policy, dims: ModelDims, shared_prompts: bool) -> None:
        self.policy, self.dims, self.shared_prompts = policy, dims, shared_prompts
        self.inner = policy.train_step
        policy.train_step = self  # an instance attribute: the class and other policies are untouched
        self.reset()

    def reset(self) -> dict:
        """The figures since the last reset (the update of one step), and start again."""
        done = getattr(self, "figures", {})
        self.figures = {"update_s": 0.0, "update_flops": 0.0, "optimizer_steps": 0, "trained_tokens": 0}
        return done

    def __call__(self, prompt_ids, response_ids, *args, **kwargs):
        cuda = self.policy.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.figures.setdefault("allocated_before_gib", torch.cuda.memory_allocated() / 2**30)
        t0 = time.perf_counter()
        out = self.inner(prompt_ids, response_ids, *args, **kwargs)
        if cuda:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() / 2**30
            self.figures["peak_update_gib"] = max(self.figures.get("peak_update_gib", 0.0), peak)
            reserved = torch.cuda.max_memory_reserved() / 2**30
            self.figures["peak_reserved_gib"] = max(self.figures.get("peak_reserved_gib", 0.0), reserved)
        self.figures["update_s"] += time.perf_counter() - t0
        work = rows_work(prompt_ids, response_ids)
        self.figures["update_flops"] += training_flops(self.dims, work, self.shared_prompts)
        self.figures["optimizer_steps"] += 1
        self.figures["trained_tokens"] += sum(map(len, prompt_ids)) + sum(map(len, response_ids))
        self.figures["prompt_len_mean"] = sum(work.prompt_lens) / max(len(work.prompt_lens), 1)
        return out


def compiled_frames() -> int:
    """Frames torch.compile has compiled in this process so far: a step that compiles (a recompile for a new
    shape, grad mode or dtype) shows as a non-zero difference, and its time as compilation, not work."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["ok"])


def rows_work(prompt_ids: list[list[int]], response_ids: list[list[int]]) -> StepWork:
    """The rows of one `train_step` as a StepWork: runs of equal consecutive prompts are one group (a GRPO
    group); groups of unequal sizes count every row as its own group."""
    groups: list[int] = []
    for i, p in enumerate(prompt_ids):
        if i and p == prompt_ids[i - 1]:
            groups[-1] += 1
        else:
            groups.append(1)
    if len(set(groups)) == 1:
        starts = [sum(groups[:g]) for g in range(len(groups))]
        return StepWork([len(prompt_ids[s]) for s in starts], [len(r) for r in response_ids], groups[0])
    return StepWork([len(p) for p in prompt_ids], [len(r) for r in response_ids], 1)


def _peak(gpu: str, device: torch.device, choice) -> tuple[float, str]:
    """(the dense peak FLOP/s MFU is against, how it was found): the GPU's datasheet, or on the CPU the
    measured matmul rate of the chosen precision."""
    from train.plan import GPUS

    if device.type == "cuda":
        spec = GPUS[gpu]
        peak = (spec["bf16_tflops"] if choice.precision == "bf16" else spec["fp32_tflops"]) * 1e12
        return peak, f"{gpu} datasheet dense {choice.precision} {peak / 1e12:.0f} TFLOP/s"
    peak = choice.bf16_flops if choice.precision == "bf16" else choice.fp32_flops
    peak = peak or 1.0
    return peak, f"measured {choice.precision} matmul {peak / 1e9:.0f} GFLOP/s"


def _step_row(step: int, m: dict, meas: dict, frames: int, peak: float) -> dict:
    """One step's row: the trainer's metrics, the meter's figures and the MFU."""
    return {
        "step": step,
        "pg_loss": m.get("actor/pg_loss"),
        "reward_mean": m.get("train/reward_mean"),
        "accuracy": m.get("train/accuracy"),
        "grad_norm": m.get("actor/grad_norm"),
        "response_length_mean": m.get("train/response_length_mean"),
        "rollout_s": m.get("timing/rollout_s"),
        "compiled_frames": frames,
        "mfu": meas["update_flops"] / meas["update_s"] / peak,
        **meas,
    }


PLANNED_PARTS = ("params_fp32", "grads_fp32", "adamw_fp32", "unsharded_layers", "logits", "vllm_asleep")


def _planned(cfg, model_path: str, gpu: str, prompt_len_mean: float) -> dict:
    """The planner's memory prediction (train/plan.py) for this config at the measured prompt length."""
    from train.plan import GPUS, arch_of, memory, workload_from_config

    arch, _ = arch_of(model_path)
    w = workload_from_config(cfg, round(prompt_len_mean))
    mem = memory(arch, w, GPUS[gpu]["memory_gib"])
    return {
        "planned_update_gib": mem["peak_update"],
        "planned_parts_gib": {k: round(mem[k], 3) for k in PLANNED_PARTS},
        "planned_activations_gib": mem[
            "activations_ckpt" if w.gradient_checkpointing else "activations_no_ckpt"
        ],
    }


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--experiment", default="grpo_math")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument(
        "--gpu", default="h100", help="planner GPU kind and datasheet peak (h100 | h200 | a100-80g)"
    )
    p.add_argument("--out")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)

    from train.config import build_config

    with tempfile.TemporaryDirectory(prefix="gpu-check-") as run_dir:
        overrides = [
            f"model.path={args.model}", f"run_dir={run_dir}", "track=false", f"total_steps={args.steps}",
            "save_every=0", "val_every=0", "rollout.engine._target_=train.rollout.hf_engine.HFEngine",
            *args.overrides,
        ]  # fmt: skip
        cfg = build_config(args.experiment, overrides)
        from train.stages.grpo import GRPOTrainer

        trainer = GRPOTrainer(cfg)
        device = trainer.policy.device
        choice = trainer.policy.precision_choice
        dims: ModelDims = model_dims(str(trainer.model_path))
        meter = UpdateMeter(
            trainer.policy, dims, bool(cfg.policy.share_prompts and not cfg.policy.pack_sequences)
        )
        peak, peak_note = _peak(args.gpu, device, choice)
        header = {
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "torch": torch.__version__,
            "precision": choice.describe(),
            "attn_implementation": trainer.policy.attn_implementation,
            "peak": peak_note,
        }
        print(json.dumps(header), flush=True)
        steps = []
        try:
            for step in range(1, args.steps + 1):
                frames_before = compiled_frames()
                m = trainer.step(step)
                meas = meter.reset()
                if not meas.get("optimizer_steps"):
                    raise SystemExit(
                        f"step {step}: Policy.train_step was never called (nothing was measured)"
                    )
                row = _step_row(step, m, meas, compiled_frames() - frames_before, peak)
                if device.type == "cuda":  # the planner at the lengths this step actually had
                    row |= _planned(cfg, str(trainer.model_path), args.gpu, meas["prompt_len_mean"])
                steps.append(row)
                print(json.dumps(row), flush=True)
        finally:
            trainer.close()
    if args.out:
        Path(args.out).write_text(json.dumps({"header": header, "steps": steps}, indent=1))
    return steps


if __name__ == "__main__":
    main()
