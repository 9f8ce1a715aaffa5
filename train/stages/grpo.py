"""GRPO (and every other registered estimator: DARLING, Classmate, ...) on the one training loop.

Each step reads like the algorithm: rollout -> reward -> advantage -> policy update(s) -> weight sync;
logging, validation schedule, checkpoints and resume are the loop's (train/loop.py). The advantage comes
from the method table (train/algorithms/registry.py): the step names no estimator, and gives each
what it declares it needs.

Every rank owns a colocated rollout engine and generates the groups of its share of the prompts, so
a group never spans ranks and advantages are computed locally; only the loss normalisers and the
logged figures are reduced across ranks.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from data_prep.datasets import load_prompt_rows
from train.algorithms import registry
from train.algorithms.classmate import char_span_to_token_span, cot_token_mask
from train.algorithms.losses import actor_loss, global_normalisers, kl_penalty
from train.config import train_schema, validate
from train.data import PromptSampler, encode_prompts
from train.loop import TrainingLoop, build_engine, run_loop
from train.policy.distributed import all_gather_objects, all_reduce_sum
from train.policy.fsdp import Policy
from train.rewards.base import RewardResult
from train.rollout.base import Rollout, SamplingConfig
from train.validation import heldout_metrics


def _padded(rows: list[list[float]], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r[:width], dtype=torch.float32)
    return out


def make_actor_loss_fn(algo, adv, mask, old_lp, ref_lp, scale_factor: float, world: int):
    """The actor loss of one mini-batch (rows of `adv`, `mask`, ...: (N, R)) as a per-micro-batch callback.

    Normalised over the whole mini-batch on all ranks, so micro-batch and rank splits give the
    gradient of one big batch.
    """
    pg_entry = registry.policy_loss(algo.policy_loss_mode)
    norms = global_normalisers(mask, scale_factor)
    norms["global_token_count"] = all_reduce_sum(norms["global_token_count"])
    norms["global_seq_count"] = all_reduce_sum(norms["global_seq_count"])
    local_tokens = max(float(mask.sum()), 1.0)

    def loss_fn(mb, log_probs, entropy):
        R, rows, dev = log_probs.shape[1], mb.rows, log_probs.device  # rows index these CPU tensors

        def pg_loss_fn(old, new, a, m):
            return pg_entry.fn(old, new, a, m, algo, {"entropy": entropy})

        loss, metrics = actor_loss(
            old_lp[rows, :R].to(dev) if old_lp is not None else log_probs.detach(),
            log_probs,
            adv[rows, :R].to(dev),
            mb.response_mask,
            pg_loss_fn=pg_loss_fn,
            entropy=entropy,
            entropy_coeff=algo.entropy_coeff,
            ref_log_prob=None if ref_lp is None else ref_lp[rows, :R].to(dev),
            use_kl_loss=algo.use_kl_loss,
            kl_loss_coef=algo.kl_loss_coef,
            kl_loss_type=algo.kl_loss_type,
            loss_agg_mode=algo.loss_agg_mode,
            **norms,
        )
        weight = float(mb.response_mask.sum()) / local_tokens  # metrics: token-weighted mean
        # FSDP averages gradients over ranks, while the normaliser already counts all ranks' tokens.
        return loss * world, {k: v * weight for k, v in metrics.items()}

    return loss_fn


class GRPOTrainer(TrainingLoop):
    """GRPO's part of the loop: prompts, reference policy, reward, engine and the RL step. `engine` lets
    a caller (tests, benchmarks) share one already-started rollout engine."""

    kind = "train"
    progress_metric = "train/reward_mean"

    def load_data(self) -> None:
        cfg = self.cfg
        rows = load_prompt_rows(cfg.data.train_path, cfg.data.builtin_size, cfg.seed)
        self.rows, dropped = self._fit_prompts(rows)
        if dropped:
            self.print(
                f"dropped {dropped} prompts longer than data.max_prompt_tokens={cfg.data.max_prompt_tokens}"
            )
        self.sampler = PromptSampler(len(self.rows), cfg.data.prompts_per_step, cfg.seed, cfg.data.shuffle)
        self.val_rows: list[dict] = []
        if cfg.val_every and cfg.data.val_path:
            val = load_prompt_rows(cfg.data.val_path, cfg.data.val_size, cfg.seed, split="test")
            self.val_rows = val[self.rank :: self.world]
            self.val_prompt_ids = encode_prompts(self.tokenizer, self.val_rows)

    def setup(self) -> None:
        cfg = self.cfg
        pol, algo = cfg.policy, cfg.algorithm
        self.ref = None
        if algo.use_kl_loss or algo.use_kl_in_reward:
            self.ref = Policy(
                self.model_path,
                precision=self.policy.precision,  # auto is resolved once, by the trained policy
                trainable=False,
                micro_batch_tokens=pol.micro_batch_tokens,
                share_prompts=pol.share_prompts,
                pad_id=self.pad_id,
            )
        self.reward_fn = instantiate(OmegaConf.to_container(cfg.reward, resolve=True))
        if self.engine is None:
            self.engine = build_engine(cfg, self.weights, self.policy.precision)
        else:  # a shared engine may hold other weights: start it from this policy's
            self.engine.update_weights(self.policy.full_weights())

    @property
    def examples_per_step(self) -> int:
        return self.cfg.data.prompts_per_step

    @property
    def estimator(self) -> registry.Entry:
        """The configured advantage estimator's table entry (looked up per step: a test may switch it)."""
        return registry.adv_estimator(self.cfg.algorithm.adv_estimator)

    def has_validation(self) -> bool:
        return bool(self.cfg.data.val_path)

    # ------------------------------------------------------------------------------------------
    def _fit_prompts(self, rows: list[dict]) -> tuple[list[dict], int]:
        ids = encode_prompts(self.tokenizer, rows)
        keep = [(r, i) for r, i in zip(rows, ids) if len(i) <= self.cfg.data.max_prompt_tokens]
        self.prompt_ids = [i for _, i in keep]
        return [r for r, _ in keep], len(rows) - len(keep)

    def _sampling(self, step: int) -> SamplingConfig:
        r = self.cfg.rollout
        seed = (self.cfg.seed * 1_000_003 + step) * 4096 + self.rank * 1024  # distinct per step and rank
        return SamplingConfig(
            n=r.n,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            max_new_tokens=r.max_new_tokens,
            seed=seed,
        )

    # ------------------------------------------------------------------------------------------
    def step(self, step: int) -> dict[str, float]:
        cfg, algo = self.cfg, self.cfg.algorithm
        t0 = time.perf_counter()
        # ---- rollout: this rank's share of the step's prompts ----
        batch = self.sampler.batch(step)
        per_rank = len(batch) // self.world
        mine = batch[self.rank * per_rank : (self.rank + 1) * per_rank]
        rows = [self.rows[i] for i in mine]
        rollout: Rollout = self.engine.generate([self.prompt_ids[i] for i in mine], self._sampling(step))
        t1 = time.perf_counter()
        # ---- reward ----
        sample_rows = [rows[g] for g in rollout.group_index]
        reward: RewardResult = self.reward_fn(sample_rows, rollout.texts, rollout.group_index)
        t2 = time.perf_counter()
        # ---- advantage ----
        width = max(max(len(r) for r in rollout.response_ids), 1)
        mask = _padded([[1.0] * len(r) for r in rollout.response_ids], width)
        scores = torch.tensor(reward.scores, dtype=torch.float32)
        group_index = torch.tensor(rollout.group_index)
        need_old = (
            algo.ppo_epochs > 1
            or (algo.ppo_mini_batch_size or cfg.data.prompts_per_step) < cfg.data.prompts_per_step
        )
        old_lp = (
            self.policy.compute_log_probs(rollout.prompt_ids, rollout.response_ids)[0] if need_old else None
        )
        ref_lp = self.ref.compute_log_probs(rollout.prompt_ids, rollout.response_ids)[0] if self.ref else None
        kl_in_reward = None
        if algo.use_kl_in_reward:
            old_for_kl = old_lp if old_lp is not None else _padded(rollout.response_logprobs, width)
            kl = kl_penalty(old_for_kl, ref_lp, "k1") * mask
            kl_in_reward = (kl.sum(-1)).mean().item()
            scores = scores - algo.kl_in_reward_coef * kl.sum(-1)  # k1 summed over the response
        ctx = registry.AdvantageContext(scores, mask, group_index)
        self._provide(ctx, mine, rows, rollout, reward)
        estimated = registry.as_output(self.estimator.fn(algo, ctx))
        advantages = estimated.advantages
        # ---- policy update(s), with the rollout engine's GPU memory released ----
        self.engine.sleep()
        update_metrics = self._update(rollout, advantages, mask, old_lp, ref_lp)
        update_metrics.update({f"advantage/{k}": v for k, v in estimated.metrics.items()})
        t3 = time.perf_counter()
        # ---- weight sync into the rollout engine ----
        self.engine.update_weights(self.policy.full_weights())
        t4 = time.perf_counter()
        return self._metrics(step, rollout, reward, update_metrics, kl_in_reward, (t0, t1, t2, t3, t4))

    def _greedy_baselines(self, prompt_indices: list[int], rows: list[dict]) -> torch.Tensor:
        """ReMax: one greedy rollout per prompt, scored by the same reward; (num_prompts,)."""
        sampling = SamplingConfig(
            n=1, temperature=0.0, max_new_tokens=self.cfg.rollout.max_new_tokens, seed=0
        )
        greedy = self.engine.generate([self.prompt_ids[i] for i in prompt_indices], sampling)
        reward = self.reward_fn(rows, greedy.texts, greedy.group_index)
        return torch.tensor(reward.scores, dtype=torch.float32)

    def _provide(self, ctx, prompt_indices: list[int], rows: list[dict], rollout: Rollout, reward) -> None:
        """Fill in what the estimator declares it needs (`needs=`), whichever estimator it is."""
        entry = self.estimator
        for need in entry.needs:
            if need == "baseline_scores":  # the reward of a greedy answer to the same prompt
                ctx.baseline_scores = self._greedy_baselines(prompt_indices, rows)[ctx.group_index]
            elif need.startswith("signals."):
                name = need.removeprefix("signals.")
                ctx.signals[name] = self._signal(name, rollout, reward, ctx.response_mask)
            else:
                raise ValueError(
                    f"algorithm.adv_estimator={entry.name} needs {need}, which this trainer has not"
                )

    def _signal(self, name: str, rollout: Rollout, reward: RewardResult, mask: torch.Tensor):
        """A reward signal; `<x>_token_mask` is made from the reward's `<x>_spans` (characters) here."""
        base = name.removesuffix("_token_mask")
        source = f"{base}_spans" if base != name else name
        if source not in reward.signals:
            hint = f": use {self.estimator.hint}" if self.estimator.hint else ""
            raise ValueError(
                f"algorithm.adv_estimator={self.estimator.name} needs the reward signal {source}, "
                f"which {type(self.reward_fn).__name__} does not give{hint}"
            )
        if source == name:
            return reward.signals[name]
        spans = [
            char_span_to_token_span(
                lambda k, ids=ids: len(self.tokenizer.decode(ids[:k], skip_special_tokens=True)),
                len(ids),
                span,
            )
            for ids, span in zip(rollout.response_ids, reward.signals[source])
        ]
        token_mask = cot_token_mask(spans, mask)
        reward.metrics[f"{base}_token_fraction"] = float(token_mask.sum() / mask.sum().clamp(min=1.0))
        return token_mask

    def _update(self, rollout: Rollout, advantages, mask, old_lp, ref_lp) -> dict[str, float]:
        """ppo_epochs x mini-batches optimizer steps over this rollout."""
        cfg, algo = self.cfg, self.cfg.algorithm
        n = cfg.rollout.n
        prompts_here = len(rollout) // n
        mini_prompts = (algo.ppo_mini_batch_size or cfg.data.prompts_per_step) // self.world
        sums: dict[str, float] = {}
        updates = 0
        for _epoch in range(algo.ppo_epochs):
            for start in range(0, prompts_here, mini_prompts):
                idx = list(range(start * n, min(prompts_here, start + mini_prompts) * n))
                loss_fn = make_actor_loss_fn(
                    algo,
                    advantages[idx],
                    mask[idx],
                    None if old_lp is None else old_lp[idx],
                    None if ref_lp is None else ref_lp[idx],
                    scale_factor=algo.loss_scale_factor or cfg.rollout.max_new_tokens,
                    world=self.world,
                )
                # micro-batch rows index into this mini-batch, as the tensors given to the loss do
                metrics = self.policy.train_step(
                    [rollout.prompt_ids[i] for i in idx],
                    [rollout.response_ids[i] for i in idx],
                    loss_fn,
                    with_entropy=True,  # always reported; differentiated only when entropy_coeff != 0
                    entropy_grad=algo.entropy_coeff != 0,
                )
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + v
                updates += 1
        out = {k: v / updates for k, v in sums.items()}
        out["actor/updates"] = float(updates)
        out["actor/lr"] = self.policy.lr
        return out

    def _metrics(
        self, step, rollout: Rollout, reward: RewardResult, update, kl_in_reward, t
    ) -> dict[str, float]:
        t0, t1, t2, t3, t4 = t
        lengths = [len(r) for r in rollout.response_ids]
        gathered = all_gather_objects(
            {
                "scores": reward.scores,
                "correct": reward.correct,
                "lengths": lengths,
                "clipped": [f == "length" for f in rollout.finish_reasons],
                "prompt_lengths": [len(p) for p in rollout.prompt_ids],
                "update": update,
                "reward_metrics": reward.metrics,
            }
        )
        scores = [s for g in gathered for s in g["scores"]]
        all_lengths = [x for g in gathered for x in g["lengths"]]
        m: dict[str, float] = {
            "train/reward_mean": statistics.fmean(scores),
            "train/reward_std": statistics.pstdev(scores) if len(scores) > 1 else 0.0,
            "train/response_length_mean": statistics.fmean(all_lengths),
            "train/response_length_max": float(max(all_lengths)),
            "train/response_clip_ratio": statistics.fmean([c for g in gathered for c in g["clipped"]]),
            "train/prompt_length_mean": statistics.fmean([x for g in gathered for x in g["prompt_lengths"]]),
        }
        if all(g["correct"] is not None for g in gathered):
            m["train/accuracy"] = statistics.fmean([c for g in gathered for c in g["correct"]])
        for key in gathered[0]["update"]:
            m[key] = statistics.fmean(g["update"][key] for g in gathered)
        for key in gathered[0]["reward_metrics"]:
            m[f"reward/{key}"] = statistics.fmean(g["reward_metrics"][key] for g in gathered)
        if kl_in_reward is not None:
            m["train/kl_in_reward"] = kl_in_reward
        total_tokens = sum(all_lengths)
        m.update(
            {
                "timing/rollout_s": t1 - t0,
                "timing/reward_s": t2 - t1,
                "timing/update_s": t3 - t2,
                "timing/weight_sync_s": t4 - t3,
                "timing/step_s": t4 - t0,
                "perf/rollout_tokens_per_s": total_tokens / max(t1 - t0, 1e-9),
                "perf/train_tokens_per_s": (
                    total_tokens + sum(x for g in gathered for x in g["prompt_lengths"])
                )
                / max(t3 - t2, 1e-9),
            }
        )
        return m

    def validate(self, step: int) -> dict[str, float]:
        """Held-out answers scored by the training reward: `val/*` metrics (train/validation.py).

        One greedy answer per prompt, or `data.val_n` samples at `data.val_temperature` (pass@1..n and the
        reward's diversity figures: distinct correct answers per prompt, distinct_k)."""
        n = self.cfg.data.val_n
        sampling = SamplingConfig(
            n=n,
            temperature=self.cfg.data.val_temperature if n > 1 else 0.0,
            max_new_tokens=self.cfg.rollout.max_new_tokens,
            seed=0,
        )
        rollout = self.engine.generate(self.val_prompt_ids, sampling)
        rows = [self.val_rows[g] for g in rollout.group_index]
        reward = self.reward_fn(rows, rollout.texts, rollout.group_index)
        gathered = all_gather_objects((reward.scores, reward.correct, rollout.group_index, reward.metrics))
        offset, groups = 0, []
        for g in gathered:  # group ids are per rank: make them distinct across ranks
            groups += [offset + i for i in g[2]]
            offset = max(groups, default=-1) + 1
        figures = {k: statistics.fmean(g[3][k] for g in gathered) for k in gathered[0][3]}
        correct = None if any(g[1] is None for g in gathered) else [c for g in gathered for c in g[1]]
        out = heldout_metrics([s for g in gathered for s in g[0]], correct, groups, figures)
        return out

    def one_line(self, step: int, m: dict[str, float]) -> str:
        return _one_line(step, self.cfg.total_steps, m)

    def close(self) -> None:
        super().close()
        if hasattr(self.reward_fn, "close"):  # e.g. the classmate reward's own engines
            self.reward_fn.close()


def _one_line(step: int, total: int, m: dict[str, float]) -> str:
    acc = f" acc {m['train/accuracy']:.3f}" if "train/accuracy" in m else ""
    return (
        f"[train] step {step}/{total} reward {m['train/reward_mean']:.3f}{acc} len {m['train/response_length_mean']:.1f}"
        f" kl {m.get('actor/ppo_kl', 0):.2e} clip {m.get('actor/pg_clipfrac', 0):.3f} gnorm {m['actor/grad_norm']:.3f}"
        f" | {m['timing/step_s']:.1f}s (rollout {m['timing/rollout_s']:.1f} reward {m['timing/reward_s']:.1f}"
        f" update {m['timing/update_s']:.1f} sync {m['timing/weight_sync_s']:.1f}) {m['perf/rollout_tokens_per_s']:.0f} tok/s"
    )


def run(cfg: DictConfig, engine=None) -> dict[str, float]:
    """Train with this (already validated) config; marks the MLflow run FAILED with the error on a crash."""
    return run_loop(GRPOTrainer, cfg, engine=engine)


class GRPOStage:
    """The `_target_` of a GRPO stage in an experiment's `stages:` block (train/pipeline.py)."""

    @property
    def schema(self) -> type:
        return train_schema()

    def validate(self, cfg: DictConfig) -> None:
        validate(cfg)

    def run(self, cfg: DictConfig, engine=None) -> dict[str, float]:
        return run(cfg, engine=engine)


if __name__ == "__main__":  # torchrun entry: python -m train.stages.grpo <config.yaml>
    run(OmegaConf.load(sys.argv[1]))
    if dist.is_initialized():
        dist.destroy_process_group()
    os._exit(0)
