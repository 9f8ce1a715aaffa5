"""Measure a model's starting accuracy on a dataset, so a task is neither hopeless nor solved for RL.

Samples one reply per prompt with vLLM (in-process, works on CPU) and grades it like the project's
grader: the last ``\\boxed{}`` content, else the last number, compared with the gold as integers.
Prints accuracy overall and per ``extra_info`` key (default: difficulty).

    python -m bench.calibrate_task --model /tmp/smol_hf --data data/arithmetic/test.parquet --n 200
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from data_prep.schema import extra_info_of, read_parquet


def is_correct(reply: str, ground_truth: str) -> bool:
    """Graded by the training reward's grader, so calibration measures what RL will optimise."""
    from math_grader import grade

    return grade(reply, ground_truth) == 1.0


def accuracy_table(rows: Sequence[dict], correct: Sequence[bool], keys: Sequence[str]) -> list[str]:
    """Lines "key=value: acc (k/n)" for each group of each key, then the overall line."""
    lines = []
    for key in keys:
        groups: dict[str, list[bool]] = defaultdict(list)
        for row, ok in zip(rows, correct, strict=True):
            groups[str(extra_info_of(row).get(key))].append(ok)
        for value in sorted(groups):
            hits = groups[value]
            lines.append(f"{key}={value}: {sum(hits) / len(hits):.1%} ({sum(hits)}/{len(hits)})")
    lines.append(f"overall: {sum(correct) / max(len(correct), 1):.1%} ({sum(correct)}/{len(correct)})")
    return lines


def sample_replies(model: str, prompts: list[list[dict]], temperature: float, max_tokens: int, seed: int):
    """One sampled reply per prompt, from the training rollout engine (vLLM, in this process)."""
    from transformers import AutoTokenizer

    from train.data import encode_prompts
    from train.rollout.base import SamplingConfig
    from train.rollout.vllm_engine import VLLMEngine

    ids = encode_prompts(AutoTokenizer.from_pretrained(model), [{"prompt": p} for p in prompts])
    engine = VLLMEngine(model, dtype="float32", seed=seed, max_model_len=1024, sleep_level=0)
    sampling = SamplingConfig(n=1, temperature=temperature, max_new_tokens=max_tokens, seed=seed)
    return engine.generate(ids, sampling).texts


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="HF model folder or name")
    parser.add_argument("--data", type=Path, required=True, help="schema Parquet file")
    parser.add_argument("--n", type=int, default=200, help="grade the first N rows")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--by", default="difficulty", help="comma-separated extra_info keys to group by")
    parser.add_argument("--dump", type=Path, help="write prompt/reply/gold/correct JSONL here")
    args = parser.parse_args(argv)

    rows = read_parquet(args.data)[: args.n]
    start = time.monotonic()
    replies = sample_replies(
        args.model, [r["prompt"] for r in rows], args.temperature, args.max_tokens, args.seed
    )
    correct = [is_correct(reply, row["ground_truth"]) for reply, row in zip(replies, rows, strict=True)]
    print(
        f"{args.model} on {args.data} (first {len(rows)} rows, T={args.temperature}, "
        f"max_tokens={args.max_tokens}, seed={args.seed}, {time.monotonic() - start:.0f}s)"
    )
    for line in accuracy_table(rows, correct, [k for k in args.by.split(",") if k]):
        print(line)
    if args.dump:
        with args.dump.open("w") as f:
            for row, reply, ok in zip(rows, replies, correct, strict=True):
                record = {"prompt": row["prompt"], "reply": reply, "gold": row["ground_truth"], "correct": ok}
                f.write(json.dumps(record | {"extra_info": extra_info_of(row)}) + "\n")
        print(f"wrote {len(rows)} graded replies to {args.dump}")


if __name__ == "__main__":
    from infra.process_exit import exit_now

    main()
    exit_now(0)  # no teardown: vLLM's in-process engine threads outlive it (infra/process_exit.py)
