"""SFT: next-token loss on the response tokens of chat examples, on the RL policy (FSDP2), with its
checkpoints and MLflow conventions.

Loss: token-mean over the step's whole batch (all micro-batches, all ranks) of -log p(response token),
prompt tokens masked out. Token-budget micro-batches and gradient accumulation come from
`Policy.train_step`; the schedule (constant/cosine, warm-up) from `optim.*`. Metrics: `sft/loss`,
`sft/val_loss` (held-out examples, every `val_every` steps, also at step 0), `val/accuracy` (greedy,
math grader; `val_accuracy=true`), `perf/train_tokens_per_s`, `perf/peak_memory_gb`, `actor/grad_norm`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from omegaconf import DictConfig

from data_prep.datasets import load_sft_rows
from data_prep.sft_math import BUILTIN, split_response
from train.algorithms.aggregation import agg_loss
from train.data import PromptSampler
from train.loop import run_loop
from train.policy.distributed import all_reduce_sum
from train.stages.common import (
    OfflineStage,
    StageRunConfig,
    encode_chat,
    greedy_accuracy,
    peak_memory_gb,
    shard,
    validate_run_config,
)


@dataclass
class SFTDataConfig:
    train_path: str = (
        BUILTIN  # Parquet (data_prep schema, last message = the response), .jsonl, or builtin:sft_math
    )
    val_path: str | None = BUILTIN  # held-out examples for sft/val_loss (builtin:sft_math = its test split)
    builtin_size: int = 2000  # rows generated for builtin:sft_math
    val_size: int = 64  # held-out rows used (the first N)
    batch_size: int = 16  # examples per optimizer step (over all ranks)
    max_tokens: int = 512  # longer examples (prompt + response) are dropped at load time (counted)
    shuffle: bool = True


@dataclass
class SFTConfig(StageRunConfig):
    data: SFTDataConfig = field(default_factory=SFTDataConfig)


def encode_examples(tokenizer, rows: list[dict], max_tokens: int) -> tuple[list, list, list, int]:
    """(prompt ids, response ids, golds, number dropped for length) of SFT schema rows."""
    prompts, responses, golds, dropped = [], [], [], 0
    for i, row in enumerate(rows):
        prompt, response = split_response(row, f"row {i}")
        p, r = encode_chat(tokenizer, prompt, response)
        if len(p) + len(r) > max_tokens:
            dropped += 1
            continue
        prompts.append(p)
        responses.append(r)
        golds.append(row["ground_truth"])
    return prompts, responses, golds, dropped


def make_sft_loss_fn(global_token_count: float, world: int):
    """Per-micro-batch loss: -sum(log p) / (tokens of the whole step on all ranks), x world size
    (FSDP averages gradients over ranks). The micro-batch losses then add up to the step's token-mean."""

    def loss_fn(mb, log_probs, entropy):
        loss = agg_loss(-log_probs, mb.response_mask, "token-mean", global_token_count=global_token_count)
        return loss * world, {"sft/loss": loss.item()}

    return loss_fn


class SFTTrainer(OfflineStage):
    kind = run_name_part = "sft"
    progress_metric = "sft/loss"

    def load_data(self) -> None:
        cfg, d = self.cfg, self.cfg.data
        self.accuracy_items: list[tuple[list[int], str]] = []  # (prompt ids, gold) of this rank
        rows = load_sft_rows(d.train_path, d.builtin_size, cfg.seed, split="train")
        self.prompts, self.responses, _, dropped = encode_examples(self.tokenizer, rows, d.max_tokens)
        if dropped:
            self.print(f"dropped {dropped} examples longer than data.max_tokens={d.max_tokens}")
        if not self.prompts:
            raise ValueError(
                f"data.train_path={d.train_path}: no SFT example fits data.max_tokens={d.max_tokens}"
            )
        self.sampler = PromptSampler(len(self.prompts), d.batch_size, cfg.seed, d.shuffle)
        self.val: tuple[list, list] = ([], [])
        if cfg.val_every and d.val_path:
            val_rows = load_sft_rows(d.val_path, d.val_size, cfg.seed, split="test")[: d.val_size]
            p, r, golds, _ = encode_examples(self.tokenizer, val_rows, d.max_tokens)
            self.val = (p[self.rank :: self.world], r[self.rank :: self.world])
            self.accuracy_items = [(x, g) for x, g in zip(p, golds) if g][self.rank :: self.world]

    def step(self, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        mine = shard(self.sampler.batch(step), self.rank, self.world)
        prompts = [self.prompts[i] for i in mine]
        responses = [self.responses[i] for i in mine]
        tokens = all_reduce_sum(sum(len(r) for r in responses))
        metrics = self.policy.train_step(
            prompts, responses, make_sft_loss_fn(tokens, self.world), with_entropy=False
        )
        seconds = time.perf_counter() - t0
        processed = all_reduce_sum(sum(len(p) + len(r) for p, r in zip(prompts, responses)))
        return {
            "sft/loss": all_reduce_sum(metrics["sft/loss"]),
            "sft/response_tokens": tokens,
            "actor/grad_norm": metrics["actor/grad_norm"],
            "actor/lr": self.policy.lr,
            "actor/micro_batches": metrics["actor/micro_batches"],
            "timing/step_s": seconds,
            "perf/train_tokens_per_s": processed / max(seconds, 1e-9),
            "perf/peak_memory_gb": peak_memory_gb(),
        }

    def validate(self, step: int) -> dict[str, float]:
        out = self._held_out()
        if self.cfg.val_accuracy:
            out.update(greedy_accuracy(self, self.accuracy_items))
        return out

    def _held_out(self) -> dict[str, float]:
        """Token-mean NLL of the held-out responses (`sft/val_loss`)."""
        prompts, responses = self.val
        nll, tokens = 0.0, 0
        if prompts:
            log_probs, _ = self.policy.compute_log_probs(prompts, responses)
            nll, tokens = -float(log_probs.sum()), sum(len(r) for r in responses)
        nll, tokens = all_reduce_sum(nll), all_reduce_sum(tokens)
        return {"sft/val_loss": nll / tokens} if tokens else {}


class SFTStage:
    """The `_target_` of an SFT stage in an experiment's `stages:` block (train/pipeline.py)."""

    schema = SFTConfig

    def validate(self, cfg: DictConfig) -> None:
        validate_run_config(cfg, cfg.data.batch_size)

    def run(self, cfg: DictConfig, engine=None) -> dict[str, float]:
        return run_loop(SFTTrainer, cfg, engine=engine)
