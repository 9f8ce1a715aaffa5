"""`make bench-sft`: SFT tokens/s with packed blocks against padded examples, same model, data and tokens.

    python -m bench.sft_packing [--model default|tiny|DIR] [--steps 4] [--batch 16] [--block-size 256]
                                [--precision fp32|bf16|auto] [--micro-batch-tokens 2048]

Unpacked: the SFT stage's layout, `--batch` examples of builtin:sft_math per step (token-budget
micro-batches, each row padded to its micro-batch's longest). Packed (data_prep/packing.py): the same
examples concatenated with EOS and cut into `--block-size` blocks, as many blocks per step as hold the
unpacked step's tokens. Both take optimizer steps through the SFT stage's update (`sft_update`) on the same
policy class; the first step of each is a warm-up, the figure is the median over the rest of real
(non-padding) tokens per second, plus the padded share of the computed positions. Prints one table and
the ratio packed / unpacked, with this machine's core count and load (figures differ by machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def padded_share(prompts: list[list[int]], responses: list[list[int]], micro_batches) -> float:
    """Share of the computed positions that are padding, over a step's micro-batches."""
    real = sum(len(p) + len(r) for p, r in zip(prompts, responses))
    computed = sum(int(mb.input_ids.numel()) for mb in micro_batches)
    return 1.0 - real / max(computed, 1)


def run_mode(policy, prompts, responses, masks, steps: int, batch: int) -> dict[str, float]:
    import torch

    from train.stages.sft import sft_update

    rates, pads = [], []
    for step in range(steps):
        idx = [(step * batch + i) % len(prompts) for i in range(batch)]
        p, r = [prompts[i] for i in idx], [responses[i] for i in idx]
        mask = None if masks is None else torch.tensor([masks[i] for i in idx])
        t0 = time.perf_counter()
        sft_update(policy, p, r, 1, token_mask=mask)
        seconds = time.perf_counter() - t0
        if step > 0:  # the first step warms up
            rates.append(sum(len(a) + len(b) for a, b in zip(p, r)) / seconds)
            pads.append(padded_share(p, r, policy.micro_batches(p, r)))
    return {"tokens_per_s": statistics.median(rates), "padded_share": statistics.fmean(pads)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--block-size", type=int, default=256)
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--micro-batch-tokens", type=int, default=2048)
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    from data_prep.packing import pack_documents
    from data_prep.sft_math import sft_rows
    from infra.models import build_tiny_model, resolve_model_path
    from train.policy.distributed import init_distributed
    from train.policy.fsdp import Policy
    from train.stages.sft import encode_examples

    init_distributed()
    if args.model == "tiny":
        import tempfile
        from pathlib import Path

        model = build_tiny_model(Path(tempfile.mkdtemp()) / "tiny")
    else:
        model = resolve_model_path(args.model)
    tok = AutoTokenizer.from_pretrained(model)
    rows = sft_rows(args.batch * args.steps, seed=1)
    prompts, responses, _, _, _ = encode_examples(tok, rows, 512)
    blocks, masks = pack_documents(prompts, responses, tok.eos_token_id, args.block_size)
    step_tokens = statistics.fmean(len(p) + len(r) for p, r in zip(prompts, responses)) * args.batch
    blocks_per_step = max(1, round(step_tokens / (args.block_size + 1)))
    results = {}
    for mode in ("unpacked", "packed"):
        policy = Policy(
            model,
            precision=args.precision,
            lr=1e-5,
            micro_batch_tokens=args.micro_batch_tokens,
            share_prompts=False,
            pad_id=tok.pad_token_id or 0,
        )
        if mode == "unpacked":
            results[mode] = run_mode(policy, prompts, responses, None, args.steps, args.batch)
        else:
            results[mode] = run_mode(
                policy, [b[:1] for b in blocks], [b[1:] for b in blocks], masks, args.steps, blocks_per_step
            )
        del policy
    load = os.getloadavg()[0]
    print(
        f"SFT tokens/s, model {args.model}, {os.cpu_count()} cores (load {load:.1f}), precision "
        f"{args.precision}, {args.batch} examples (~{step_tokens:.0f} tokens) per unpacked step, "
        f"{blocks_per_step} blocks of {args.block_size} per packed step, median of {args.steps - 1} steps"
    )
    print(f"{'mode':<10} {'tokens/s':>10} {'padded':>8}")
    for mode, r in results.items():
        print(f"{mode:<10} {r['tokens_per_s']:>10.0f} {r['padded_share']:>8.1%}")
    print(
        f"packed / unpacked: {results['packed']['tokens_per_s'] / results['unpacked']['tokens_per_s']:.2f}x"
    )
    return 0


if __name__ == "__main__":
    from infra.process_exit import exit_now

    exit_now(main())  # no interpreter teardown: gloo's threads outlive it (infra/process_exit.py)
