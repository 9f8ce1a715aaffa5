"""`make bench-evals`: a fixed math500 subset with the default model, through this harness (in-process
vLLM + the training grader) and through lm-evaluation-harness (a task file over the same local JSONL, its
HF backend), in one run; prints samples/s, tokens/s and the speed ratio (target >= 3x).

    python -m bench.evals_harness                                   # the full measurement (100 problems, 512 tokens)
    python -m bench.evals_harness --problems 4 --max-tokens 32      # a quick check that both sides run

Both sides use the same prompts (the Qwen CoT system message + problem, the model's chat template),
greedy decoding, fp32 on CPU and the same token budget. Timed: generation + grading, after each side has
loaded its model (start-up is reported separately). Tokens/s counts completion tokens with the model's
tokenizer for both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from data_prep.math_jsonl import QWEN_MATH_COT_SYSTEM
from evals.common.generation import Sampling, VLLMGenerator
from evals.math import default_data_dir
from math_grader import grade_batch

TASK_YAML = """task: rlpost_math500_subset
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data_file}
test_split: test
output_type: generate_until
doc_to_text: "{{{{problem}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: []
  max_gen_toks: {max_tokens}
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


def write_subset(data_dir: Path, problems: int, out_dir: Path) -> Path:
    """The first `problems` lines of math500/test.jsonl, copied to a temp file both sides read."""
    src = data_dir / "math500" / "test.jsonl"
    if not src.is_file():
        raise SystemExit(f"error: math data file not found: {src} (set --data-dir or $RLPOST_MATH_DATA)")
    lines = [ln for ln in src.read_text().splitlines() if ln.strip()][:problems]
    out = out_dir / "math500_subset.jsonl"
    out.write_text("\n".join(lines) + "\n")
    return out


def bench_ours(model: Path, subset: Path, max_tokens: int, batch_size: int) -> dict:
    from data_prep.math_jsonl import load_math_jsonl

    rows = load_math_jsonl(subset, "math500")
    t0 = time.time()
    gen = VLLMGenerator(max_model_len=max_tokens + 1024)
    gen.load(model)
    startup = time.time() - t0
    t0 = time.time()
    texts = []
    for i in range(0, len(rows), batch_size):
        outs = gen.generate([r["prompt"] for r in rows[i : i + batch_size]], Sampling(max_tokens=max_tokens))
        texts += [o[0] for o in outs]
    acc = sum(grade_batch(texts, [r["ground_truth"] for r in rows])) / len(rows)
    seconds = time.time() - t0
    tokens = gen.stats.completion_tokens
    gen.close()
    return {"startup_s": startup, "seconds": seconds, "samples": len(rows), "tokens": tokens, "acc": acc}


def bench_lm_eval(model: Path, subset: Path, max_tokens: int, batch_size: int, work: Path) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager
    from transformers import AutoTokenizer

    task_dir = work / "lm_eval_tasks"
    task_dir.mkdir(exist_ok=True)
    (task_dir / "rlpost_math500_subset.yaml").write_text(
        TASK_YAML.format(data_file=subset, max_tokens=max_tokens)
    )
    from lm_eval.models.huggingface import HFLM

    t0 = time.time()
    lm = HFLM(pretrained=str(model), dtype="float32", device="cpu", batch_size=batch_size)
    startup = time.time() - t0
    t0 = time.time()
    out = lm_eval.simple_evaluate(
        model=lm,
        tasks=["rlpost_math500_subset"],
        task_manager=TaskManager(include_path=str(task_dir)),
        apply_chat_template=True,
        system_instruction=QWEN_MATH_COT_SYSTEM,
        log_samples=True,
    )
    samples = out["samples"]["rlpost_math500_subset"]
    texts = [s["resps"][0][0] for s in samples]
    acc = sum(grade_batch(texts, [s["target"] for s in samples])) / len(samples)
    seconds = time.time() - t0
    tok = AutoTokenizer.from_pretrained(str(model))
    tokens = sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)
    return {"startup_s": startup, "seconds": seconds, "samples": len(samples), "tokens": tokens, "acc": acc}


def _line(name: str, r: dict) -> str:
    return (
        f"{name:10s} {r['samples'] / r['seconds']:8.3f} samples/s {r['tokens'] / r['seconds']:9.1f} tok/s "
        f"| {r['samples']} samples {r['tokens']} tokens in {r['seconds']:.1f}s (+{r['startup_s']:.1f}s load) "
        f"acc {r['acc']:.3f}"
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m bench.evals_harness", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--problems", type=int, default=100, help="the first N math500 problems")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument(
        "--model", default=None, help="HF folder (default: the embedded SmolLM2-135M-Instruct)"
    )
    parser.add_argument(
        "--data-dir", type=Path, default=None, help="default $RLPOST_MATH_DATA or ../shared/data/math"
    )
    parser.add_argument("--batch-size", type=int, default=64, help="ours: prompts per generate call")
    parser.add_argument("--hf-batch-size", type=int, default=8, help="lm-eval HF backend batch size")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    from infra.models import ensure_default_model

    model = Path(args.model) if args.model else Path(ensure_default_model())
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="bench-evals-") as tmp:
        subset = write_subset(Path(args.data_dir or default_data_dir()), args.problems, Path(tmp))
        ours = bench_ours(model, subset, args.max_tokens, args.batch_size)
        print(_line("ours", ours), flush=True)
        theirs = bench_lm_eval(model, subset, args.max_tokens, args.hf_batch_size, Path(tmp))
        print(_line("lm-eval", theirs), flush=True)
    ratio = (ours["samples"] / ours["seconds"]) / (theirs["samples"] / theirs["seconds"])
    load = os.getloadavg()[0]
    print(f"speed-up (samples/s, ours / lm-eval hf): {ratio:.2f}x (target >= 3x); load average {load:.1f}")
    result = {"ours": ours, "lm_eval": theirs, "ratio": ratio, "load_avg": load, "args": vars(args)}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    main()
