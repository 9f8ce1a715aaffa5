"""DPO on the RL policy (FSDP2): preference pairs, summed response log-probs, a cached reference.

Per pair, with summed response log-probs pi (policy) and ref (reference = the starting model):
L = -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r))), averaged over the step's pairs on all ranks
(`train.algorithms.dpo.dpo_loss`, the one implementation).

Token-budget micro-batches split a pair's two answers apart, and L is not linear in them, so each step
makes two passes: a no-grad pass for the summed log-probs, then a backward pass of the linear surrogate
sum_i w_i * log pi(y_i) with w_i = dL/dpi_i from autograd through `dpo_loss` (w_c = -beta*sigmoid(-beta*h)/G,
w_r = +beta*sigmoid(-beta*h)/G). Its gradient at the current weights equals dL/dtheta exactly, for any
micro-batch or rank split, at the cost of one extra forward pass.

Reference log-probs are computed once, before the first step, for every pair the run will see (the
sampler's batches of steps 1..total_steps, and the held-out pairs), by a frozen copy of the starting
model, and cached in `<run_dir>/ref_logprobs.pt` (a resumed run reads them back).

Metrics: `dpo/loss`, `dpo/rewards_accuracy` (share of pairs with chosen reward > rejected reward),
`dpo/rewards_margin`, `dpo/rewards_chosen`, `dpo/rewards_rejected` (rewards = beta * (pi - ref)), the
same with `dpo/val_` on held-out pairs, and `val/accuracy` (greedy, math grader) when `val_accuracy`.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field

import torch
from omegaconf import DictConfig

from data_prep.datasets import load_pairs
from data_prep.preference import BUILTIN
from data_prep.schema import extra_info_of
from train.algorithms.dpo import dpo_loss
from train.config import ConfigError
from train.data import PromptSampler
from train.loop import run_loop
from train.policy.distributed import all_gather_objects, all_reduce_sum
from train.policy.fsdp import Policy
from train.stages.common import (
    OfflineStage,
    StageRunConfig,
    encode_chat,
    peak_memory_gb,
    shard,
    validate_run_config,
)

REF_CACHE = "ref_logprobs.pt"


@dataclass
class PreferenceDataConfig:
    train_path: str = (
        BUILTIN  # pairs: .jsonl or Parquet (data_prep/preference.py), or builtin:arithmetic_pairs
    )
    val_path: str | None = BUILTIN  # held-out pairs for dpo/val_* (builtin: its test split)
    builtin_size: int = 2000  # pairs generated for builtin:arithmetic_pairs
    val_size: int = 64  # held-out pairs used (the first N)
    batch_size: int = 16  # pairs per optimizer step (over all ranks)
    max_tokens: int = 512  # pairs whose prompt + longer answer exceed this are dropped at load time
    shuffle: bool = True


@dataclass
class DPOConfig(StageRunConfig):
    beta: float = 0.1  # strength of the implicit KL to the reference (larger = stay closer)
    data: PreferenceDataConfig = field(default_factory=PreferenceDataConfig)


# ---- pure functions -----------------------------------------------------------------------------
def dpo_sequence_weights(
    pi_chosen: torch.Tensor,
    pi_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    global_pair_count: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, float]]:
    """dL/dpi of every answer, by autograd through `dpo_loss`.

    All inputs (B,): summed response log-probs. Returns (w_chosen (B,), w_rejected (B,), loss scalar,
    dpo_loss's metrics), loss = sum over these pairs / global_pair_count (its share of the step's loss).
    """
    chosen = pi_chosen.detach().clone().requires_grad_(True)
    rejected = pi_rejected.detach().clone().requires_grad_(True)
    loss, metrics = dpo_loss(
        chosen, rejected, ref_chosen, ref_rejected, beta, global_pair_count=global_pair_count
    )
    loss.backward()
    return chosen.grad.detach(), rejected.grad.detach(), loss.detach(), metrics


def make_weighted_logp_loss_fn(weights: torch.Tensor, world: int):
    """Per-micro-batch surrogate sum_rows weights[row] * (summed response log-prob of row), x world size
    (FSDP averages gradients over ranks). weights: (N,) over the rows given to `Policy.train_step`."""

    def loss_fn(mb, log_probs, entropy):
        masked = torch.where(mb.response_mask.bool(), log_probs, torch.zeros_like(log_probs))
        return (masked.sum(-1) * weights[mb.rows].to(log_probs.device)).sum() * world, {}

    return loss_fn


def encode_pairs(tokenizer, pairs: list[dict], max_tokens: int) -> tuple[list, list, list, list, int]:
    """(prompt ids, chosen ids, rejected ids, golds, number dropped for length)."""
    prompts, chosen, rejected, golds, dropped = [], [], [], [], 0
    for pair in pairs:
        p, c = encode_chat(tokenizer, pair["prompt"], pair["chosen"])
        _, r = encode_chat(tokenizer, pair["prompt"], pair["rejected"])
        if len(p) + max(len(c), len(r)) > max_tokens:
            dropped += 1
            continue
        prompts.append(p)
        chosen.append(c)
        rejected.append(r)
        golds.append(str(extra_info_of(pair).get("ground_truth", "")))
    return prompts, chosen, rejected, golds, dropped


class DPOTrainer(OfflineStage):
    kind = run_name_part = "dpo"
    progress_metric = "dpo/loss"

    def load_data(self) -> None:
        cfg, d = self.cfg, self.cfg.data
        pairs = load_pairs(d.train_path, d.builtin_size, cfg.seed, split="train")
        self.prompts, self.chosen, self.rejected, _, dropped = encode_pairs(
            self.tokenizer, pairs, d.max_tokens
        )
        if dropped:
            self.print(f"dropped {dropped} pairs longer than data.max_tokens={d.max_tokens}")
        if not self.prompts:
            raise ValueError(f"data.train_path={d.train_path}: no pair fits data.max_tokens={d.max_tokens}")
        self.sampler = PromptSampler(len(self.prompts), d.batch_size, cfg.seed, d.shuffle)
        self.val = ([], [], [])
        if cfg.val_every and d.val_path:
            val_pairs = load_pairs(d.val_path, d.val_size, cfg.seed, split="test")[: d.val_size]
            p, c, r, golds, _ = encode_pairs(self.tokenizer, val_pairs, d.max_tokens)
            self.val = (p, c, r)
            self.set_accuracy_items(p, golds)

    def setup(self) -> None:
        self.ref_train, self.ref_val = self._reference_logprobs()

    # ---- reference ------------------------------------------------------------------------------
    def _reference_logprobs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, 2) and (N_val, 2) summed reference log-probs [chosen, rejected]; NaN for unused pairs.

        Cached in the run folder; only pairs missing from the cache are computed (by a frozen copy of
        the starting model, never by a resumed checkpoint's weights)."""
        used = sorted({i for s in range(1, self.cfg.total_steps + 1) for i in self.sampler.batch(s)})
        fingerprint = self._fingerprint()
        path = self.run_dir / REF_CACHE
        train = torch.full((len(self.prompts), 2), float("nan"))
        val = torch.full((len(self.val[0]), 2), float("nan"))
        if path.is_file():
            cached = torch.load(path, map_location="cpu")
            if cached.get("fingerprint") == fingerprint:
                train, val = cached["train"], cached["val"]
            else:
                self.print(f"{path} was made for other data or another reference model: recomputing it")
        missing = [i for i in used if math.isnan(train[i, 0])]
        missing_val = [i for i in range(len(val)) if math.isnan(val[i, 0])]
        if not missing and not missing_val:
            self.print(f"reference log-probs from {path}")
            return train, val
        t0 = time.perf_counter()
        if self.policy.lora.enabled:  # the base model: the policy with its adapters off, no second copy
            ref = self.policy.frozen_base()
        else:
            # precision, layout and attention as the trained policy resolved them
            ref = Policy(self.model_path, trainable=False, **self.policy.companion_kwargs())
        self._fill(train, ref, self.prompts, self.chosen, self.rejected, missing)
        self._fill(val, ref, *self.val, missing_val)
        del ref
        if self.rank == 0:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            torch.save({"fingerprint": fingerprint, "train": train, "val": val}, tmp)
            tmp.replace(path)
        seconds = time.perf_counter() - t0
        self.print(
            f"reference log-probs of {len(missing)} + {len(missing_val)} pairs in {seconds:.1f}s -> {path}"
        )
        return train, val

    def _fill(self, out: torch.Tensor, policy: Policy, prompts, chosen, rejected, indices: list[int]) -> None:
        """Write the summed log-probs of the given pairs into out[i] = [chosen, rejected] (this rank
        computes every world-th pair; all ranks end with all values). Collective: every rank calls it."""
        mine = indices[self.rank :: self.world]
        values = []
        if mine:
            lp, _ = policy.compute_log_probs(
                [prompts[i] for i in mine] * 2, [chosen[i] for i in mine] + [rejected[i] for i in mine]
            )
            seq = lp.sum(-1)
            values = list(zip(mine, seq[: len(mine)].tolist(), seq[len(mine) :].tolist()))
        for part in all_gather_objects(values):
            for i, c, r in part:
                out[i, 0], out[i, 1] = c, r

    def _fingerprint(self) -> str:
        """What the cached reference log-probs depend on: the reference model and the token ids."""
        h = hashlib.sha256(str(self.model_path.resolve()).encode())
        for seqs in (self.prompts, self.chosen, self.rejected, *self.val):
            h.update(json.dumps(seqs).encode())
        return h.hexdigest()

    # ---- one step -------------------------------------------------------------------------------
    def step(self, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        mine = shard(self.sampler.batch(step), self.rank, self.world)
        b = len(mine)
        prompts = [self.prompts[i] for i in mine] * 2
        responses = [self.chosen[i] for i in mine] + [self.rejected[i] for i in mine]
        pairs = all_reduce_sum(b)
        seq = self.policy.compute_log_probs(prompts, responses)[0].sum(-1)  # pass 1: no grad
        ref = self.ref_train[mine]
        w_c, w_r, loss, metrics = dpo_sequence_weights(
            seq[:b], seq[b:], ref[:, 0], ref[:, 1], self.cfg.beta, pairs
        )
        update = self.policy.train_step(  # pass 2: the linear surrogate's backward
            prompts,
            responses,
            make_weighted_logp_loss_fn(torch.cat([w_c, w_r]), self.world),
            with_entropy=False,
        )
        seconds = time.perf_counter() - t0
        processed = all_reduce_sum(sum(len(p) + len(r) for p, r in zip(prompts, responses)))
        out = {"dpo/loss": all_reduce_sum(float(loss))}
        out.update(_pair_weighted(metrics, b, pairs, prefix="dpo/"))
        out["dpo/chosen_logps"] = all_reduce_sum(float(seq[:b].sum())) / pairs
        out["dpo/rejected_logps"] = all_reduce_sum(float(seq[b:].sum())) / pairs
        out.update(
            {
                "actor/grad_norm": update["actor/grad_norm"],
                "actor/lr": self.policy.lr,
                "actor/micro_batches": update["actor/micro_batches"],
                "timing/step_s": seconds,
                "perf/train_tokens_per_s": processed / max(seconds, 1e-9),
                "perf/peak_memory_gb": peak_memory_gb(),
            }
        )
        return out

    def _held_out(self) -> dict[str, float]:
        prompts, chosen, rejected = self.val
        n = len(prompts)
        if n == 0:
            return {}
        mine = list(range(n))[self.rank :: self.world]
        seq = self.policy.compute_log_probs(
            [prompts[i] for i in mine] * 2, [chosen[i] for i in mine] + [rejected[i] for i in mine]
        )[0].sum(-1)
        ref = self.ref_val[mine]
        loss, metrics = dpo_loss(
            seq[: len(mine)], seq[len(mine) :], ref[:, 0], ref[:, 1], self.cfg.beta, global_pair_count=n
        )
        out = {"dpo/val_loss": all_reduce_sum(float(loss))}
        out.update(_pair_weighted(metrics, len(mine), n, prefix="dpo/val_"))
        return out


def _pair_weighted(metrics: dict[str, float], local_pairs: int, total_pairs: float, prefix: str) -> dict:
    """dpo_loss's per-rank means ("rewards/accuracy") -> all-rank means ("dpo/rewards_accuracy")."""
    return {
        prefix + k.replace("/", "_"): all_reduce_sum(v * local_pairs if math.isfinite(v) else 0.0)
        / total_pairs
        for k, v in metrics.items()
    }


class DPOStage:
    """The `_target_` of a DPO stage in an experiment's `stages:` block (orchestration/pipeline.py)."""

    schema = DPOConfig

    def validate(self, cfg: DictConfig) -> None:
        validate_run_config(cfg, cfg.data.batch_size)
        if not cfg.beta > 0:
            raise ConfigError("bad config value: beta must be > 0")

    def run(self, cfg: DictConfig, engine=None) -> dict[str, float]:
        return run_loop(DPOTrainer, cfg, engine=engine)
