"""Rollout/trainer log-prob mismatch on one batch: the vLLM engine's log-probs of its own samples vs the
trainer's teacher-forced log-probs of the same tokens, at each precision the trainer pairs them in
(fp32 training with a float32 engine, bf16 training with a bfloat16 engine).

    python -m bench.rollout_mismatch [--model PATH] [--prompts 8] [--n 4] [--max-new-tokens 64]
                                     [--precisions fp32,bf16]

Prints one line per precision with ``rollout_correction.mismatch_metrics`` (mean KL(rollout || train),
k3 KL, max and min token ratio pi_train / pi_rollout) and the share of tokens TIS at 2.0 would truncate.
Defaults: the embedded model, the builtin arithmetic prompts, temperature 1.
"""

from __future__ import annotations

import argparse
import time

import torch

from data_prep.datasets import load_prompt_rows
from infra.models import resolve_model_path
from infra.process_exit import exit_now
from train.algorithms.rollout_correction import mismatch_metrics, truncated_is_weights
from train.policy.distributed import init_distributed
from train.policy.fsdp import Policy
from train.rollout.base import SamplingConfig
from train.rollout.vllm_engine import VLLMEngine

ENGINE_DTYPE = {"fp32": "float32", "bf16": "bfloat16"}


def padded(rows: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(max(len(r) for r in rows), 1)
    values, mask = torch.zeros(len(rows), width), torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        values[i, : len(r)] = torch.tensor(r, dtype=torch.float32)
        mask[i, : len(r)] = 1
    return values, mask


def measure(model: str, precision: str, prompts: int, n: int, max_new_tokens: int, seed: int) -> dict:
    init_distributed()  # the trainer's order: process group, policy, then the colocated engine
    policy = Policy(model, precision=precision, trainable=False)
    engine = VLLMEngine(model, dtype=ENGINE_DTYPE[precision], max_model_len=1024, seed=seed, sleep_level=0)
    rows = load_prompt_rows("builtin:arithmetic", prompts, seed)[:prompts]
    tok = engine.tokenizer
    texts = [tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in rows]
    prompt_ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    t0 = time.perf_counter()
    rollout = engine.generate(
        prompt_ids, SamplingConfig(n=n, temperature=1.0, max_new_tokens=max_new_tokens, seed=seed)
    )
    t1 = time.perf_counter()
    policy.pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    train_lp, _ = policy.compute_log_probs(rollout.prompt_ids, rollout.response_ids)
    t2 = time.perf_counter()
    engine.close()
    rollout_lp, mask = padded(rollout.response_logprobs)
    train_lp = train_lp[:, : mask.shape[1]]
    metrics = mismatch_metrics(train_lp, rollout_lp, mask)
    _, tis = truncated_is_weights(train_lp.double() - rollout_lp.double(), mask, "token", 2.0)
    metrics.update(tis)
    metrics.update({"tokens": int(mask.sum()), "generate_s": t1 - t0, "train_logprob_s": t2 - t1})
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default", help="model folder (default: the embedded model)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    model = str(resolve_model_path(args.model))
    for precision in args.precisions.split(","):
        m = measure(model, precision, args.prompts, args.n, args.max_new_tokens, args.seed)
        print(
            f"[mismatch] {precision} (engine {ENGINE_DTYPE[precision]}): {m['tokens']} tokens, "
            f"mean KL {m['rollout_corr/kl']:.3e}, k3 KL {m['rollout_corr/k3_kl']:.3e}, "
            f"max ratio {m['rollout_corr/ratio_max']:.6f}, min ratio {m['rollout_corr/ratio_min']:.6f}, "
            f"TIS(2.0) truncates {m['rollout_corr/is_fraction_truncated']:.2%} | "
            f"generate {m['generate_s']:.1f}s, trainer log-probs {m['train_logprob_s']:.1f}s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    exit_now(main())
