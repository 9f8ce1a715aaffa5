"""GRPO steps of an experiment with the HF rollout engine, measured: the GPU check of issue 14.

    python -m bench.gpu_check --model DIR [--experiment grpo_math] [--steps 2] [--out FILE] [key=value ...]

Runs on a GPU or the CPU (whatever torch sees), without MLflow. Per step it prints and stores the loss,
reward, grad norm, the update's time, its FLOPs (bench/train_step.py's count for the tokens actually trained,
shared prompts included) and MFU against the device's dense peak (GPU datasheet; on CPU the measured
matmul rate of the chosen precision), and the peak GPU memory allocated during the update beside the
planner's prediction for the same config (train/plan.py, same prompt/response lengths as measured).
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
from train.stages.grpo import GRPOTrainer


class MeasuredTrainer(GRPOTrainer):
    """The trainer with the update's time, FLOPs and peak memory recorded (nothing else changes)."""

    def _update(self, batch, step):
        cuda = self.policy.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        out = super()._update(batch, step)
        if cuda:
            torch.cuda.synchronize()
        self.measured = {"update_s": time.perf_counter() - t0}
        if cuda:
            self.measured["allocated_before_gib"] = before / 2**30
            self.measured["peak_update_gib"] = torch.cuda.max_memory_allocated() / 2**30
            self.measured["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
        n = self.cfg.rollout.n
        prompt_lens = [len(batch.prompt_ids[g * n]) for g in range(len(batch) // n)]
        self.measured["work"] = (prompt_lens, [len(r) for r in batch.response_ids], n)
        return out


def main(argv: list[str] | None = None) -> None:
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
    from train.plan import GPUS, arch_of, memory, workload_from_config

    with tempfile.TemporaryDirectory(prefix="gpu-check-") as run_dir:
        overrides = [
            f"model.path={args.model}", f"run_dir={run_dir}", "track=false", f"total_steps={args.steps}",
            "save_every=0", "val_every=0", "rollout.engine._target_=train.rollout.hf_engine.HFEngine",
            *args.overrides,
        ]  # fmt: skip
        cfg = build_config(args.experiment, overrides)
        trainer = MeasuredTrainer(cfg)
        device = trainer.policy.device
        choice = trainer.policy.precision_choice
        dims: ModelDims = model_dims(str(trainer.model_path))
        if device.type == "cuda":
            spec = GPUS[args.gpu]
            peak = (spec["bf16_tflops"] if choice.precision == "bf16" else spec["fp32_tflops"]) * 1e12
            peak_note = f"{args.gpu} datasheet dense {choice.precision} {peak / 1e12:.0f} TFLOP/s"
        else:
            peak = choice.bf16_flops if choice.precision == "bf16" else choice.fp32_flops
            peak = peak or 1.0
            peak_note = f"measured {choice.precision} matmul {peak / 1e9:.0f} GFLOP/s"
        header = {
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "torch": torch.__version__,
            "precision": choice.describe(),
            "attn_implementation": trainer.policy.attn_implementation,
            "peak": peak_note,
        }
        print(json.dumps(header), flush=True)
        steps = []
        for step in range(1, args.steps + 1):
            m = trainer.step(step)
            meas = trainer.measured
            prompt_lens, response_lens, n = meas.pop("work")
            flops = training_flops(dims, StepWork(prompt_lens, response_lens, n), cfg.policy.share_prompts)
            row = {
                "step": step,
                "pg_loss": m.get("actor/pg_loss"),
                "reward_mean": m["train/reward_mean"],
                "accuracy": m.get("train/accuracy"),
                "grad_norm": m["actor/grad_norm"],
                "response_length_mean": m["train/response_length_mean"],
                "rollout_s": m["timing/rollout_s"],
                "update_flops": flops,
                "mfu": flops / meas["update_s"] / peak,
                **meas,
            }
            if device.type == "cuda":  # the planner at the lengths this step actually had
                arch, _ = arch_of(str(trainer.model_path))
                mean_prompt = round(sum(prompt_lens) / len(prompt_lens))
                w = workload_from_config(cfg, mean_prompt)
                mem = memory(arch, w, GPUS[args.gpu]["memory_gib"])
                row["planned_update_gib"] = mem["peak_update"]
                row["planned_parts_gib"] = {
                    k: round(mem[k], 3)
                    for k in (
                        "params_fp32",
                        "grads_fp32",
                        "adamw_fp32",
                        "unsharded_layers",
                        "logits",
                        "vllm_asleep",
                    )
                }
                row["planned_activations_gib"] = mem[
                    "activations_ckpt" if w.gradient_checkpointing else "activations_no_ckpt"
                ]
            steps.append(row)
            print(json.dumps(row), flush=True)
        trainer.close()
    if args.out:
        Path(args.out).write_text(json.dumps({"header": header, "steps": steps}, indent=1))


if __name__ == "__main__":
    main()
