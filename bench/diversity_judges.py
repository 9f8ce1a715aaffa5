"""Time the equivalence judges and the partitioner: pairs/s per judge and cost versus group size n.

    python -m bench.diversity_judges                                  # rouge, embedding, tiny classifier
    python -m bench.diversity_judges --classifier default             # SmolLM2-135M body, random head
    python -m bench.diversity_judges --server http://127.0.0.1:8000 --server-model CKPT

Responses are the texts of the labelled pairs (bench/data), glued together up to
`--min-words` to mimic longer responses. A group of n holds both sides of n/2 random pairs (so some
responses are paraphrases of each other), shuffled; `--groups` groups form one training batch, and the
whole batch is partitioned in one `partition_groups` call, as the DARLING reward does. Union-find judges
all n(n-1)/2 pairs of a group; greedy judges only pairs with a class's first member, in rounds.
The classifier checkpoints built here have random heads: their timings are real, their verdicts are not.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from hydra.utils import instantiate

from bench.calibrate_judge import DEFAULT_PAIRS, load_labelled_pairs
from train.diversity.partition import MODES, partition_groups


class CountingJudge:
    """Wraps a judge to count the pairs and calls the partitioner sends it."""

    def __init__(self, judge) -> None:
        self.judge = judge
        self.pairs = 0
        self.calls = 0

    def equivalent(self, pairs: list[tuple[str, str]]) -> list[bool]:
        self.pairs += len(pairs)
        self.calls += 1
        return self.judge.equivalent(pairs)


def response_pairs(rows: list[dict], min_words: int, rng: random.Random) -> list[tuple[str, str]]:
    """(a, b) response pairs, each side lengthened with other rows' text to at least `min_words` words."""

    def lengthen(text: str) -> str:
        while len(text.split()) < min_words:
            text += " " + rng.choice(rows)["a"]
        return text

    return [(lengthen(r["a"]), lengthen(r["b"])) for r in rows]


def make_groups(pairs: list[tuple[str, str]], n: int, groups: int, rng: random.Random) -> list[list[str]]:
    out = []
    for _ in range(groups):
        texts = [t for pair in rng.sample(pairs, (n + 1) // 2) for t in pair][:n]
        rng.shuffle(texts)
        out.append(texts)
    return out


def time_pairs(judge, pairs: list[tuple[str, str]]) -> float:
    """Pairs per second of `judge.probabilities` on `pairs` (after a small warm-up call)."""
    judge.probabilities(pairs[:2])
    start = time.perf_counter()
    judge.probabilities(pairs)
    return len(pairs) / (time.perf_counter() - start)


def time_partition(judge, batch: list[list[str]], mode: str) -> tuple[float, int, int]:
    """Seconds to partition one batch of groups, pairs sent to the judge, judge calls."""
    counting = CountingJudge(judge)
    start = time.perf_counter()
    partition_groups(batch, counting, mode=mode)
    return time.perf_counter() - start, counting.pairs, counting.calls


def judge_configs(args: argparse.Namespace, workdir: Path) -> list[dict]:
    from train.diversity.classifier_checkpoint import build_pair_classifier

    configs: list[dict] = [
        {"_target_": "train.diversity.judges.RougeJudge"},
        {"_target_": "train.diversity.judges.EmbeddingJudge"},
    ]
    if args.classifier != "none" and (not args.only or args.only.lower() in "pairclassifierjudge"):
        if args.classifier == "tiny":
            path = build_pair_classifier(workdir / "tiny-pair-classifier")
        elif args.classifier == "default":
            from infra.models import ensure_default_model

            path = build_pair_classifier(
                workdir / "smollm2-pair-classifier", base_model=ensure_default_model()
            )
        else:
            path = Path(args.classifier)
        configs.append({"_target_": "train.diversity.judges.PairClassifierJudge", "model_path": str(path)})
    if args.server:
        configs.append(
            {
                "_target_": "train.diversity.judges.VLLMClassifyJudge",
                "base_url": args.server,
                "model": args.server_model,
            }
        )
    return configs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classifier", default="tiny", help="tiny | default (SmolLM2-135M) | CKPT | none")
    parser.add_argument("--server", default=None, help="base URL of a vLLM classify server (optional)")
    parser.add_argument("--server-model", default=None, help="model name/path served there")
    parser.add_argument("--only", default=None, help="time only judges whose class name contains this")
    parser.add_argument("--pairs", type=int, default=256, help="pairs timed for pairs/s")
    parser.add_argument("--sizes", default="4,8,16,32", help="group sizes n")
    parser.add_argument("--groups", type=int, default=8, help="groups per batch (prompts per step)")
    parser.add_argument("--min-words", type=int, default=0, help="lengthen each response to this many words")
    parser.add_argument("--data", default=str(DEFAULT_PAIRS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.server and not args.server_model:
        parser.error("--server needs --server-model (the checkpoint path or --served-model-name)")

    rng = random.Random(args.seed)
    pairs = response_pairs(load_labelled_pairs(args.data), args.min_words, rng)
    timed = [rng.choice(pairs) for _ in range(args.pairs)]
    sizes = [int(s) for s in args.sizes.split(",")]
    words = sum(len(a.split()) + len(b.split()) for a, b in timed) / (2 * len(timed))
    print(f"responses: {words:.0f} words on average; {args.groups} groups per batch")
    print(f"{'judge':<22} {'n':>3} {'mode':<10} {'pairs/grp':>9} {'calls':>5} {'s/batch':>8} {'ms/group':>9}")
    rates = {}
    with tempfile.TemporaryDirectory() as tmp:
        for cfg in judge_configs(args, Path(tmp)):
            name = cfg["_target_"].rsplit(".", 1)[-1]
            if args.only and args.only.lower() not in name.lower():
                continue
            judge = instantiate(cfg)
            rates[name] = time_pairs(judge, timed)
            for n in sizes:
                batch = make_groups(pairs, n, args.groups, rng)
                for mode in MODES:
                    seconds, judged, calls = time_partition(judge, batch, mode)
                    print(
                        f"{name:<22} {n:>3} {mode:<10} {judged / args.groups:>9.1f} {calls:>5} "
                        f"{seconds:>8.3f} {1000 * seconds / args.groups:>9.1f}"
                    )
            del judge
    print("\npairs/s (judge.probabilities on", len(timed), "pairs):")
    for name, rate in rates.items():
        print(f"  {name:<22} {rate:10.1f}")


if __name__ == "__main__":
    main()
