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

import torch
from omegaconf import DictConfig

from data_prep.datasets import load_sft_rows
from data_prep.packing import PACK_LOSS, pack_documents
from data_prep.sft_math import BUILTIN, split_response
from train.algorithms.aggregation import agg_loss
from train.config import ConfigError
from train.data import PromptSampler
from train.loop import run_loop
from train.policy.distributed import all_reduce_sum
from train.stages.common import (
    OfflineStage,
    StageRunConfig,
    encode_chat,
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
    loss_normalization: str = "token_mean"  # token_mean | sequence_constant (CS336: sum / constant / seqs)
    normalize_constant: float = 1.0  # sequence_constant: each sequence's summed NLL is divided by this
    min_tokens: int = 0  # shorter examples (prompt + response) are dropped at load time (counted)
    max_response_tokens: int | None = None  # examples with a longer response are dropped (counted)
    pack: bool = False  # packed blocks (data_prep/packing.py): batch_size = blocks per step, no padding
    block_size: int = 256  # pack: tokens predicted per block
    pack_loss: str = "response"  # pack: train on response tokens (+ EOS) | all tokens (the course)


@dataclass
class SFTConfig(StageRunConfig):
    data: SFTDataConfig = field(default_factory=SFTDataConfig)


def encode_examples(
    tokenizer, rows: list[dict], max_tokens: int, min_tokens: int = 0, max_response_tokens: int | None = None
) -> tuple[list, list, list, int, list]:
    """(prompt ids, response ids, golds, number dropped for length, token masks) of SFT schema rows; the
    length filter keeps min_tokens <= prompt + response <= max_tokens and response <= max_response_tokens.

    A row whose `extra_info.tools` names tools, or that holds tool messages or several assistant turns, is a
    multi-turn trace (train/env/tool_format.py `trace_ids`): its mask is 1 on the model's turns and 0 on the
    tool results between them (the loss is on the model's turns only); a single-turn row's mask is None."""
    from data_prep.schema import extra_info_of

    prompts, responses, golds, masks, dropped = [], [], [], [], 0
    for i, row in enumerate(rows):
        tools = _trace_tools(row, extra_info_of(row))
        if tools is None:
            prompt, response = split_response(row, f"row {i}")
            (p, r), m = encode_chat(tokenizer, prompt, response), None
        else:
            p, r, m = _encode_trace(tokenizer, row["prompt"], tools, f"row {i}")
        too_long = max_response_tokens is not None and len(r) > max_response_tokens
        if not min_tokens <= len(p) + len(r) <= max_tokens or too_long:
            dropped += 1
            continue
        prompts.append(p)
        responses.append(r)
        golds.append(row["ground_truth"])
        masks.append(m)
    return prompts, responses, golds, dropped, masks


def _trace_tools(row: dict, info: dict) -> list | None:
    """The tools a multi-turn trace was made with (names), or None for a single-turn example."""
    roles = [m["role"] for m in row["prompt"]]
    if "tools" in info:
        return list(info["tools"] or [])
    return [] if "tool" in roles or roles.count("assistant") > 1 else None


def _encode_trace(tokenizer, messages: list[dict], tools: list, where: str):
    from train.env.registry import build_tools
    from train.env.tool_format import ChatFormat, trace_ids

    try:
        fmt = ChatFormat(tokenizer, [t.schema() for t in build_tools(tools).values()])
        return trace_ids(fmt, messages)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def token_masks_of(responses: list[list[int]], masks: list) -> torch.Tensor | None:
    """The (rows, longest response) training mask of encoded examples, or None when no row is a trace."""
    if all(m is None for m in masks):
        return None
    out = torch.zeros(len(responses), max(len(r) for r in responses))
    for i, (r, m) in enumerate(zip(responses, masks)):
        out[i, : len(r)] = torch.tensor(m if m is not None else [1] * len(r), dtype=torch.float32)
    return out


LOSS_NORMALIZATIONS = ("token_mean", "sequence_constant")


def make_sft_loss_fn(
    global_token_count: float,
    world: int,
    normalization: str = "token_mean",
    normalize_constant: float = 1.0,
    global_seq_count: float = 1.0,
    token_mask: torch.Tensor | None = None,
):
    """Per-micro-batch loss, x world size (FSDP averages gradients over ranks); the micro-batch losses add up
    to the step's loss whatever the micro-batch split:

    - `token_mean`: -sum(log p) / (response tokens of the whole step on all ranks);
    - `sequence_constant` (CS336's `sft_microbatch_train_step`): each sequence's -sum(log p) divided by
      `normalize_constant`, averaged over the step's sequences on all ranks -- the course's per-micro-batch
      mean divided by the gradient accumulation steps, summed over equal micro-batches.

    `token_mask` (rows x response tokens of this rank's step, 1 = trained) narrows the response mask (packed
    blocks: the prompt tokens inside a block)."""
    if normalization not in LOSS_NORMALIZATIONS:
        raise ValueError(
            f"SFT loss normalization must be one of {LOSS_NORMALIZATIONS}, got {normalization!r}"
        )

    def loss_fn(mb, log_probs, entropy):
        mask = mb.response_mask
        if token_mask is not None:
            mask = mask * token_mask[mb.rows, : log_probs.shape[1]].to(mask.device)
        if normalization == "token_mean":
            loss = agg_loss(-log_probs, mask, "token-mean", global_token_count=global_token_count)
        else:
            scale = normalize_constant * global_seq_count
            loss = agg_loss(-log_probs, mask, "seq-mean-token-sum-norm", loss_scale_factor=scale)
        return loss * world, {"sft/loss": loss.item()}

    return loss_fn


def sft_update(
    policy,
    prompts: list[list[int]],
    responses: list[list[int]],
    world: int,
    normalization: str = "token_mean",
    normalize_constant: float = 1.0,
    token_mask: torch.Tensor | None = None,
) -> dict[str, float]:
    """One SFT optimizer step on this rank's (prompt ids, response ids): the SFT stage's and expert
    iteration's update. `sft/loss` is the step's loss summed over ranks (the whole batch's)."""
    if token_mask is None:
        tokens = all_reduce_sum(sum(len(r) for r in responses))
    else:
        tokens = all_reduce_sum(float(token_mask.sum()))
    sequences = all_reduce_sum(len(responses))
    loss_fn = make_sft_loss_fn(tokens, world, normalization, normalize_constant, sequences, token_mask)
    metrics = policy.train_step(prompts, responses, loss_fn, with_entropy=False)
    metrics["sft/loss"] = all_reduce_sum(metrics.get("sft/loss", 0.0))
    metrics["sft/response_tokens"] = tokens
    return metrics


class SFTTrainer(OfflineStage):
    kind = run_name_part = "sft"
    progress_metric = "sft/loss"

    def load_data(self) -> None:
        cfg, d = self.cfg, self.cfg.data
        rows = load_sft_rows(d.train_path, d.builtin_size, cfg.seed, split="train")
        self.prompts, self.responses, _, dropped, masks = encode_examples(
            self.tokenizer, rows, d.max_tokens, d.min_tokens, d.max_response_tokens
        )
        limits = f"data.min_tokens={d.min_tokens} data.max_tokens={d.max_tokens}" + (
            f" data.max_response_tokens={d.max_response_tokens}" if d.max_response_tokens is not None else ""
        )
        if dropped:
            self.print(f"dropped {dropped} examples outside the length limits ({limits})")
        if not self.prompts:
            raise ValueError(f"data.train_path={d.train_path}: no SFT example fits {limits}")
        self.token_masks = token_masks_of(self.responses, masks)  # multi-turn traces: the model's turns
        if d.pack and self.token_masks is not None:
            raise ValueError(
                f"data.train_path={d.train_path}: multi-turn traces cannot be packed yet; set data.pack=false"
            )
        if d.pack:  # fixed-length blocks of the concatenated examples: (first token, block_size targets)
            blocks, masks = pack_documents(
                self.prompts, self.responses, self.tokenizer.eos_token_id, d.block_size, d.pack_loss
            )
            if not blocks:
                raise ValueError(
                    f"data.train_path={d.train_path}: its {sum(map(len, self.responses))} response tokens "
                    f"fill no block of data.block_size={d.block_size}: lower data.block_size"
                )
            self.print(f"packed {len(self.prompts)} examples into {len(blocks)} blocks of {d.block_size}")
            self.prompts, self.responses = [b[:1] for b in blocks], [b[1:] for b in blocks]
            self.token_masks = torch.tensor(masks)
        self.sampler = PromptSampler(len(self.prompts), d.batch_size, cfg.seed, d.shuffle)
        self.val: tuple[list, list] = ([], [])
        self.val_masks: list = []
        if cfg.val_every and d.val_path:
            val_rows = load_sft_rows(d.val_path, d.val_size, cfg.seed, split="test")[: d.val_size]
            p, r, golds, _, m = encode_examples(self.tokenizer, val_rows, d.max_tokens)
            self.val = (p[self.rank :: self.world], r[self.rank :: self.world])
            self.val_masks = m[self.rank :: self.world]
            self.set_accuracy_items(p, golds)

    def step(self, step: int) -> dict[str, float]:
        d = self.cfg.data
        t0 = time.perf_counter()
        mine = shard(self.sampler.batch(step), self.rank, self.world)
        prompts = [self.prompts[i] for i in mine]
        responses = [self.responses[i] for i in mine]
        token_mask = None if self.token_masks is None else self.token_masks[mine]
        metrics = sft_update(
            self.policy,
            prompts,
            responses,
            self.world,
            d.loss_normalization,
            d.normalize_constant,
            token_mask,
        )
        seconds = time.perf_counter() - t0
        processed = all_reduce_sum(sum(len(p) + len(r) for p, r in zip(prompts, responses)))
        return {
            "sft/loss": metrics["sft/loss"],
            "sft/response_tokens": metrics["sft/response_tokens"],
            "actor/grad_norm": metrics["actor/grad_norm"],
            "actor/lr": self.policy.lr,
            "actor/micro_batches": metrics["actor/micro_batches"],
            "timing/step_s": seconds,
            "perf/train_tokens_per_s": processed / max(seconds, 1e-9),
            "perf/peak_memory_gb": peak_memory_gb(),
        }

    def _held_out(self) -> dict[str, float]:
        """Token-mean NLL of the held-out responses (`sft/val_loss`; traces: the model's turns only)."""
        prompts, responses = self.val
        nll, tokens = 0.0, 0
        if prompts:
            log_probs, _ = self.policy.compute_log_probs(prompts, responses)
            mask = token_masks_of(responses, self.val_masks)
            if mask is not None:
                log_probs = log_probs * mask[:, : log_probs.shape[1]]
            nll = -float(log_probs.sum())
            tokens = int(mask.sum()) if mask is not None else sum(len(r) for r in responses)
        nll, tokens = all_reduce_sum(nll), all_reduce_sum(tokens)
        return {"sft/val_loss": nll / tokens} if tokens else {}


class SFTStage:
    """The `_target_` of an SFT stage in an experiment's `stages:` block (orchestration/pipeline.py)."""

    schema = SFTConfig

    def validate(self, cfg: DictConfig) -> None:
        validate_run_config(cfg, cfg.data.batch_size)
        d = cfg.data
        for ok, message in [
            (
                d.loss_normalization in LOSS_NORMALIZATIONS,
                f"data.loss_normalization must be one of {LOSS_NORMALIZATIONS}",
            ),
            (d.normalize_constant > 0, "data.normalize_constant must be > 0"),
            (d.block_size >= 1, "data.block_size must be >= 1"),
            (d.pack_loss in PACK_LOSS, f"data.pack_loss must be one of {PACK_LOSS}"),
            (0 <= d.min_tokens <= d.max_tokens, "data.min_tokens must be in [0, data.max_tokens]"),
        ]:
            if not ok:
                raise ConfigError(f"bad config value: {message}")

    def run(self, cfg: DictConfig, engine=None) -> dict[str, float]:
        return run_loop(SFTTrainer, cfg, engine=engine)
