"""Expert iteration (CS336 assignment 5): sample, keep the correct answers, SFT on them, repeat.

`python -m train trainer=expert_iteration` runs it on the one training loop (train/loop.py: policy,
checkpoints, resume, MLflow, validation) with GRPO's data, rollout and reward keys, so the two compare at
equal samples. One loop step is one round:

1. `data.prompts_per_step` questions (a batch D_b, the same deterministic order as GRPO's), `rollout.n`
   samples each (G) from the current policy;
2. the reward grades them; a sample is kept when it is correct (`RewardResult.correct == 1`) and, with
   `ei.require_format`, in the reward's format (its `format` signal: train/rewards/r1_zero_reward.py);
3. `ei.sft_epochs` passes over the kept samples (all ranks' kept samples, one shuffled order), in SFT
   optimizer steps of `ei.batch_size` samples, through the SFT stage's update (train/stages/sft.py
   `sft_update`, `ei.loss_normalization`); a round that keeps nothing makes no update;
4. the rollout engine gets the new weights.

Curves: `ei/round`, `ei/kept_fraction`, `ei/kept_samples`, `ei/sft_updates`, `sft/loss` (mean over the
round's updates), and the rollout's `train/reward_mean`, `train/accuracy`, `reward/*` (e.g. the format x answer
rates), `train/response_length_mean`; `val/*` as GRPO's (held-out prompts scored by the training reward).
"""

from __future__ import annotations

import statistics
import time

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from data_prep.datasets import load_prompt_rows
from train.data import PromptSampler, encode_prompts
from train.heldout_metrics import heldout_metrics
from train.loop import TrainingLoop, build_engine
from train.policy.distributed import all_gather_objects, all_reduce_sum
from train.rewards.base import RewardResult
from train.rollout.base import SamplingConfig, step_sampling
from train.rollout.weight_sync import sync_weights
from train.stages.common import heldout_pass, peak_memory_gb, shard
from train.stages.sft import sft_update


def kept_indices(reward: RewardResult, require_format: bool) -> list[int]:
    """Samples expert iteration trains on: correct, and in format when `require_format`."""
    if reward.correct is None:
        raise ValueError("expert iteration keeps correct samples: the reward must report `correct`")
    fmt = reward.signals.get("format")
    if require_format and fmt is None:
        raise ValueError("ei.require_format=true but the reward reports no `format` signal")
    return [
        i
        for i, c in enumerate(reward.correct)
        if c == 1.0 and (not require_format or fmt[i] == 1.0)  # type: ignore[index]
    ]


def sft_batches(num: int, batch_size: int, epochs: int, seed: int) -> list[list[int]]:
    """`epochs` shuffled passes over `num` samples in batches of `batch_size` (the last one may be short)."""
    out = []
    for epoch in range(epochs):
        order = torch.randperm(num, generator=torch.Generator().manual_seed(seed * 1009 + epoch)).tolist()
        out += [order[i : i + batch_size] for i in range(0, num, batch_size)]
    return out


class ExpertIterationTrainer(TrainingLoop):
    kind = run_name_part = "ei"
    progress_metric = "ei/kept_fraction"

    def load_data(self) -> None:
        cfg = self.cfg
        template = cfg.data.prompt_template
        rows = load_prompt_rows(cfg.data.train_path, cfg.data.builtin_size, cfg.seed)
        ids = encode_prompts(self.tokenizer, rows, template)
        keep = [k for k, i in enumerate(ids) if len(i) <= cfg.data.max_prompt_tokens]
        if len(keep) < len(rows):
            self.print(f"dropped {len(rows) - len(keep)} prompts longer than data.max_prompt_tokens")
        self.rows, self.prompt_ids = [rows[k] for k in keep], [ids[k] for k in keep]
        self.sampler = PromptSampler(len(self.rows), cfg.data.prompts_per_step, cfg.seed, cfg.data.shuffle)
        self.val_rows: list[dict] = []
        if cfg.val_every and cfg.data.val_path:
            val = load_prompt_rows(cfg.data.val_path, cfg.data.val_size, cfg.seed, split="test")
            self.val_rows = val[self.rank :: self.world]
            self.val_prompt_ids = encode_prompts(self.tokenizer, self.val_rows, template)

    def setup(self) -> None:
        self.reward_fn = instantiate(OmegaConf.to_container(self.cfg.reward, resolve=True))
        if self.engine is None:
            self.engine = build_engine(self.cfg, self.weights, self.policy.precision)
        else:  # a shared engine may hold other weights
            sync_weights(self.policy, self.engine)

    @property
    def examples_per_step(self) -> int:
        return self.cfg.data.prompts_per_step

    def has_validation(self) -> bool:
        return bool(self.cfg.data.val_path)

    def _sampling(self, step: int) -> SamplingConfig:
        return step_sampling(self.cfg.rollout, self.cfg.seed, step, self.rank)

    def step(self, step: int) -> dict[str, float]:
        ei = self.cfg.ei
        t0 = time.perf_counter()
        mine = shard(self.sampler.batch(step), self.rank, self.world)
        rollout = self.engine.generate([self.prompt_ids[i] for i in mine], self._sampling(step))
        t1 = time.perf_counter()
        rows = [self.rows[mine[g]] for g in rollout.group_index]
        reward = self.reward_fn(rows, rollout.texts, rollout.group_index)
        kept = kept_indices(reward, ei.require_format)
        t2 = time.perf_counter()
        # every rank trains on every rank's kept samples (same order), so all take the same optimizer steps
        parts = all_gather_objects(
            {
                "kept": [(rollout.prompt_ids[i], rollout.response_ids[i]) for i in kept],
                "scores": reward.scores,
                "correct": reward.correct,
                "lengths": [len(r) for r in rollout.response_ids],
                "metrics": reward.metrics,
            }
        )
        pool = [pair for p in parts for pair in p["kept"]]
        losses, tokens, updates = self._sft_round(pool, step)
        t3 = time.perf_counter()
        if updates:
            sync_weights(self.policy, self.engine)
        t4 = time.perf_counter()
        scores = [s for p in parts for s in p["scores"]]
        lengths = [x for p in parts for x in p["lengths"]]
        out = {
            "ei/round": float(step),
            "ei/kept_samples": float(len(pool)),
            "ei/kept_fraction": len(pool) / max(len(scores), 1),
            "ei/sft_updates": float(updates),
            "train/reward_mean": statistics.fmean(scores),
            "train/accuracy": statistics.fmean(c for p in parts for c in p["correct"]),
            "train/response_length_mean": statistics.fmean(lengths),
            "actor/lr": self.policy.lr,
            "timing/rollout_s": t1 - t0,
            "timing/reward_s": t2 - t1,
            "timing/update_s": t3 - t2,
            "timing/weight_sync_s": t4 - t3,
            "timing/step_s": t4 - t0,
            "perf/rollout_tokens_per_s": sum(lengths) / max(t1 - t0, 1e-9),
            "perf/train_tokens_per_s": all_reduce_sum(tokens) / max(t3 - t2, 1e-9),
            "perf/peak_memory_gb": peak_memory_gb(),
        }
        if losses:
            out["sft/loss"] = statistics.fmean(losses)
        for key in parts[0]["metrics"]:
            out[f"reward/{key}"] = statistics.fmean(p["metrics"][key] for p in parts)
        return out

    def _sft_round(self, pool: list[tuple[list[int], list[int]]], step: int) -> tuple[list[float], int, int]:
        """SFT on the round's kept (prompt, response) pairs, ei.sft_epochs passes of ei.batch_size: the
        losses, this rank's trained tokens and the optimizer steps taken."""
        ei = self.cfg.ei
        losses, tokens, updates = [], 0, 0
        for batch in sft_batches(len(pool), ei.batch_size, ei.sft_epochs, self.cfg.seed * 100_003 + step):
            if len(batch) < self.world:
                continue  # a short last batch with fewer samples than ranks
            here = [pool[i] for i in shard(batch, self.rank, self.world)]
            m = sft_update(
                self.policy,
                [p for p, _ in here],
                [r for _, r in here],
                self.world,
                ei.loss_normalization,
                ei.normalize_constant,
            )
            losses.append(m["sft/loss"])
            tokens += sum(len(p) + len(r) for p, r in here)
            updates += 1
        return losses, tokens, updates

    def validate(self, step: int) -> dict[str, float]:
        """Held-out prompts scored by the training reward (GRPO's `val/*`): greedy, or data.val_n samples."""
        _, _, _, (scores, correct, groups, metrics) = heldout_pass(self, self.val_prompt_ids, self.val_rows)
        out = heldout_metrics(scores, correct, groups)
        for key in metrics[0]:
            out[f"val/{key}"] = statistics.fmean(m[key] for m in metrics)
        return out

    def one_line(self, step: int, m: dict[str, float]) -> str:
        loss = f" sft_loss {m['sft/loss']:.4f}" if "sft/loss" in m else ""
        return (
            f"[ei] round {step}/{self.cfg.total_steps} kept {m['ei/kept_samples']:.0f}"
            f" ({m['ei/kept_fraction']:.3f}) updates {m['ei/sft_updates']:.0f}{loss}"
            f" acc {m['train/accuracy']:.3f} reward {m['train/reward_mean']:.3f}"
            f" | {m['timing/step_s']:.1f}s (rollout {m['timing/rollout_s']:.1f} update {m['timing/update_s']:.1f})"
        )
