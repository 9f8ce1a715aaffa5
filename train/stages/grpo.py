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
from train import checkpoint as ckpt
from train.algorithms import registry
from train.algorithms.classmate import char_span_to_token_span, cot_token_mask
from train.algorithms.dapo import (
    check_gen_batches,
    filter_values,
    overlong_penalty,
    select_groups,
    varied_groups,
)
from train.algorithms.gae import actor_trains_at, value_loss
from train.algorithms.kl_control import KLController
from train.algorithms.losses import actor_loss, apply_kl_in_reward, global_normalisers, kl_penalty
from train.algorithms.rollout_correction import mismatch_metrics, rollout_correction
from train.config import train_schema, validate
from train.data import PromptSampler, encode_prompts
from train.loop import TrainingLoop, build_engine, engine_dtype, run_loop
from train.policy.distributed import all_gather_objects, all_reduce_max, all_reduce_sum
from train.policy.fsdp import Policy
from train.rewards.base import RewardResult
from train.rollout.base import Rollout, SamplingConfig
from train.validation import heldout_metrics


def _padded(rows: list[list[float]], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r[:width], dtype=torch.float32)
    return out


def make_actor_loss_fn(
    algo, adv, mask, old_lp, ref_lp, scale_factor: float, world: int, is_weights=None, seen_lp=None
):
    """The actor loss of one mini-batch (rows of `adv`, `mask`, ...: (N, R)) as a per-micro-batch callback.

    Normalised over the whole mini-batch on all ranks, so micro-batch and rank splits give the
    gradient of one big batch. `mask` is the loss mask (the response mask, or masked IS's); `is_weights`
    (N, R) the rollout-correction weights or None; `seen_lp` (N, R), when given, receives the detached
    log-probs of this update's forward (the trainer's old log-probs of a single on-policy update).
    """
    pg_entry = registry.policy_loss(algo.policy_loss_mode)
    own_weights = pg_entry.applies_is_weights  # e.g. geo_mean: the loss mode weighs by is_weights itself
    norms = global_normalisers(mask, scale_factor)
    norms["global_token_count"] = all_reduce_sum(norms["global_token_count"])
    norms["global_seq_count"] = all_reduce_sum(norms["global_seq_count"])
    local_tokens = max(float(mask.sum()), 1.0)

    def loss_fn(mb, log_probs, entropy):
        R, rows, dev = log_probs.shape[1], mb.rows, log_probs.device  # rows index these CPU tensors
        if seen_lp is not None:
            seen_lp[rows, :R] = (log_probs.detach() * mb.response_mask).cpu()
        loss_mask = mask[rows, :R].to(dev)
        weights = None if is_weights is None else is_weights[rows, :R].to(dev)

        def pg_loss_fn(old, new, a, m):
            return pg_entry.fn(old, new, a, m, algo, {"entropy": entropy, "is_weights": weights})

        loss, metrics = actor_loss(
            old_lp[rows, :R].to(dev) if old_lp is not None else log_probs.detach(),
            log_probs,
            adv[rows, :R].to(dev),
            loss_mask,
            pg_loss_fn=pg_loss_fn,
            entropy=entropy,
            entropy_coeff=algo.entropy_coeff,
            ref_log_prob=None if ref_lp is None else ref_lp[rows, :R].to(dev),
            use_kl_loss=algo.use_kl_loss,
            kl_loss_coef=algo.kl_loss_coef,
            kl_loss_type=algo.kl_loss_type,
            loss_agg_mode=algo.loss_agg_mode,
            is_weights=None if own_weights else weights,
            **norms,
        )
        weight = float(loss_mask.sum()) / local_tokens  # metrics: token-weighted mean
        # FSDP averages gradients over ranks, while the normaliser already counts all ranks' tokens.
        return loss * world, {k: v * weight for k, v in metrics.items()}

    return loss_fn


def make_critic_loss_fn(algo, critic_cfg, returns, old_values, mask, scale_factor: float, world: int):
    """The clipped value loss of one mini-batch (rows of `returns`, ...: (N, R)), normalised like the actor's."""
    norms = global_normalisers(mask, scale_factor)
    norms["global_token_count"] = all_reduce_sum(norms["global_token_count"])
    norms["global_seq_count"] = all_reduce_sum(norms["global_seq_count"])
    local_tokens = max(float(mask.sum()), 1.0)

    def loss_fn(mb, values, _entropy):
        R, rows, dev = values.shape[1], mb.rows, values.device
        loss, metrics = value_loss(
            values,
            returns[rows, :R].to(dev),
            old_values[rows, :R].to(dev),
            mb.response_mask,
            critic_cfg.cliprange_value,
            algo.loss_agg_mode,
            **norms,
        )
        weight = float(mb.response_mask.sum()) / local_tokens
        return loss * world, {k: v * weight for k, v in metrics.items()}

    return loss_fn


class _RowView:
    """`tensor[idx]` for writing: `view[rows, :R] = x` writes into `tensor[idx[rows], :R]`."""

    def __init__(self, tensor: torch.Tensor, idx: list[int]) -> None:
        self.tensor, self.idx = tensor, torch.tensor(idx)

    def __setitem__(self, key, value) -> None:
        rows, cols = key
        self.tensor[self.idx[rows], cols] = value


def _subset(rollout: Rollout, reward: RewardResult, idx: list[int]) -> tuple[Rollout, RewardResult]:
    """Rows `idx` of a rollout and its reward, groups renumbered 0.. in order of first appearance."""
    renumber: dict[int, int] = {}
    for i in idx:
        renumber.setdefault(rollout.group_index[i], len(renumber))
    part = Rollout(
        [rollout.prompt_ids[i] for i in idx],
        [rollout.response_ids[i] for i in idx],
        [rollout.response_logprobs[i] for i in idx],
        [rollout.texts[i] for i in idx],
        [rollout.finish_reasons[i] for i in idx],
        [renumber[rollout.group_index[i]] for i in idx],
    )
    signals = {k: [v[i] for i in idx] for k, v in reward.signals.items()}
    result = RewardResult(
        scores=[reward.scores[i] for i in idx],
        correct=None if reward.correct is None else [reward.correct[i] for i in idx],
        metrics=dict(reward.metrics),
        signals=signals,
    )
    return part, result


def _concat(parts: list[tuple[Rollout, RewardResult]]) -> tuple[Rollout, RewardResult]:
    """Generation batches back to back, group indices offset so they stay distinct."""
    out_r = Rollout([], [], [], [], [], [])
    scores, correct, signals, metrics = [], [], {}, {}
    offset = 0
    for rollout, reward in parts:
        out_r.prompt_ids += rollout.prompt_ids
        out_r.response_ids += rollout.response_ids
        out_r.response_logprobs += rollout.response_logprobs
        out_r.texts += rollout.texts
        out_r.finish_reasons += rollout.finish_reasons
        out_r.group_index += [g + offset for g in rollout.group_index]
        offset += max(rollout.group_index, default=-1) + 1
        scores += reward.scores
        correct = None if correct is None or reward.correct is None else correct + reward.correct
        for k, v in reward.signals.items():
            signals.setdefault(k, []).extend(v)
        for k, v in reward.metrics.items():
            metrics[k] = metrics.get(k, 0.0) + v / len(parts)
    return out_r, RewardResult(scores, correct, metrics, signals)


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
            self.val_prompt_ids = encode_prompts(self.tokenizer, self.val_rows, cfg.data.prompt_template)

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
        kc = algo.kl_ctrl
        self.kl_ctrl = KLController(kc.kl_coef, kc.type, kc.target_kl, kc.horizon)
        self.extra_gen_batches = 0  # dynamic sampling: generation batches drawn beyond one per step
        if "values" in self.estimator.needs:  # PPO with a critic
            from train.models import resolve_model_path
            from train.policy.critic import Critic

            crit = cfg.critic
            self.critic = Critic(
                resolve_model_path(crit.model_path) if crit.model_path else self.model_path,
                precision=pol.precision,
                lr=crit.lr,
                weight_decay=crit.weight_decay,
                grad_clip=crit.grad_clip,
                gradient_checkpointing=pol.gradient_checkpointing,
                micro_batch_tokens=pol.micro_batch_tokens,
                share_prompts=pol.share_prompts,
                total_steps=cfg.total_steps,
                pad_id=self.pad_id,
            )
        self.reward_fn = instantiate(OmegaConf.to_container(cfg.reward, resolve=True))
        if self.engine is None:
            self.engine = build_engine(cfg, self.weights, self.policy.precision)
        else:  # a shared engine may hold other weights: start it from this policy's
            want = getattr(torch, engine_dtype(cfg, self.policy.precision))
            have = getattr(self.engine, "weight_dtype", getattr(self.engine, "dtype", want))
            if have != want:  # its samples then differ from a run that builds its own engine
                self.print(
                    f"the shared rollout engine computes in {have}, not the {want} this policy's precision asks for"
                )
            self.engine.update_weights(self.policy.full_weights())

    @property
    def examples_per_step(self) -> int:
        return self.cfg.data.prompts_per_step

    def extra_state(self) -> dict:
        return {"kl_coef": self.kl_ctrl.value, "extra_gen_batches": self.extra_gen_batches}

    def restore(self, state: dict) -> None:
        self.kl_ctrl.value = float(state.get("kl_coef", self.kl_ctrl.value))
        self.extra_gen_batches = int(state.get("extra_gen_batches", 0))
        if self.critic is not None:
            ckpt.restore_critic(self.latest_checkpoint, self.critic, state, self.rank)

    @property
    def estimator(self) -> registry.Entry:
        """The configured advantage estimator's table entry (looked up per step: a test may switch it)."""
        return registry.adv_estimator(self.cfg.algorithm.adv_estimator)

    def has_validation(self) -> bool:
        return bool(self.cfg.data.val_path)

    # ------------------------------------------------------------------------------------------
    def _fit_prompts(self, rows: list[dict]) -> tuple[list[dict], int]:
        ids = encode_prompts(self.tokenizer, rows, self.cfg.data.prompt_template)
        keep = [(r, i) for r, i in zip(rows, ids) if len(i) <= self.cfg.data.max_prompt_tokens]
        self.prompt_ids = [i for _, i in keep]
        return [r for r, _ in keep], len(rows) - len(keep)

    def _sampling(self, step: int, gen_batch: int = 0) -> SamplingConfig:
        """`gen_batch`: the generation batch of the step (> 0 only under DAPO dynamic sampling)."""
        r = self.cfg.rollout
        # distinct per step, rank and generation batch
        seed = (self.cfg.seed * 1_000_003 + step) * 4096 + self.rank * 1024 + (gen_batch << 40)
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
        # ---- rollout + reward (DAPO dynamic sampling: more generation batches until the groups vary) ----
        mine, rows, rollout, reward, sampling, (t_rollout, t_reward) = self._generate(step)
        t2 = t0 + t_rollout + t_reward
        # ---- advantage ----
        width = max(max(len(r) for r in rollout.response_ids), 1)
        mask = _padded([[1.0] * len(r) for r in rollout.response_ids], width)
        scores = torch.tensor(reward.scores, dtype=torch.float32)
        extra: dict[str, float] = dict(sampling)
        if algo.overlong_buffer_len > 0:  # DAPO: soft penalty over the last tokens before the limit
            penalty = overlong_penalty(
                mask.sum(-1),
                cfg.rollout.max_new_tokens,
                algo.overlong_buffer_len,
                algo.overlong_penalty_factor,
            )
            scores = scores + penalty
            extra["train/overlong_penalty_mean"] = float(penalty.mean())
            extra["train/overlong_penalised_share"] = float((penalty < 0).float().mean())
        group_index = torch.tensor(rollout.group_index)
        # bypass mode (verl's rollout_correction.bypass_mode): the engine's log-probs are the old ones and the
        # loss mode corrects on pi_current / pi_rollout itself; else IS/rejection on pi_old / pi_rollout here
        bypass = algo.policy_loss_mode == "bypass_mode"
        correcting = (algo.rollout_is is not None or algo.rollout_rs is not None) and not bypass
        need_old = not bypass and (
            algo.ppo_epochs > 1
            or (algo.ppo_mini_batch_size or cfg.data.prompts_per_step) < cfg.data.prompts_per_step
            or correcting
        )
        old_lp = (
            self.policy.compute_log_probs(rollout.prompt_ids, rollout.response_ids)[0] if need_old else None
        )
        ref_lp = self.ref.compute_log_probs(rollout.prompt_ids, rollout.response_ids)[0] if self.ref else None
        has_rollout_lp = all(
            len(lp) == len(r) for lp, r in zip(rollout.response_logprobs, rollout.response_ids)
        )
        rollout_lp = _padded(rollout.response_logprobs, width) if has_rollout_lp else None
        ctx = registry.AdvantageContext(scores, mask, group_index)
        kl_in_reward = None
        if algo.use_kl_in_reward:  # verl's apply_kl_penalty: beta * kl at every token
            old_for_kl = old_lp if old_lp is not None else rollout_lp
            beta = self.kl_ctrl.value
            ctx.token_rewards, kl_metrics = apply_kl_in_reward(
                scores, old_for_kl, ref_lp, mask, beta, algo.kl_penalty
            )
            ctx.scores = ctx.token_rewards.sum(-1)
            kl_in_reward = (kl_penalty(old_for_kl, ref_lp, algo.kl_penalty) * mask).sum(-1).mean().item()
            current = all_reduce_sum(kl_metrics["actor/reward_kl_penalty"] * len(scores))
            total = all_reduce_sum(len(scores))
            self.kl_ctrl.update(current / total, int(total))  # the next step's coefficient
            extra.update(kl_metrics)
        self._provide(ctx, mine, rows, rollout, reward)
        estimated = registry.as_output(self.estimator.fn(algo, ctx))
        advantages = estimated.advantages
        # ---- rollout/trainer mismatch: TIS weights and masked IS on pi_train(old) / pi_rollout ----
        loss_mask, is_weights = mask, None
        if (correcting or bypass) and rollout_lp is None:
            raise RuntimeError(
                f"algorithm.{'policy_loss_mode=bypass_mode' if bypass else 'rollout_is / rollout_rs'} needs "
                f"the rollout engine's log-probs, which {type(self.engine).__name__} did not return"
            )
        if correcting:
            loss_mask, is_weights, rc_metrics = rollout_correction(old_lp, rollout_lp, mask, algo)
            extra.update(rc_metrics)
        # ---- critic, then policy update(s), with the rollout engine's GPU memory released ----
        self.engine.sleep()
        if self.critic is not None:
            extra.update(self._update_critic(rollout, ctx.values, estimated.returns, mask))
        seen_lp = torch.zeros_like(mask) if old_lp is None and rollout_lp is not None else None
        if self.critic is None or actor_trains_at(step - 1, cfg.critic.warmup_steps):
            anchor = rollout_lp if bypass else old_lp
            update_metrics = self._update(rollout, advantages, loss_mask, anchor, ref_lp, is_weights, seen_lp)
        else:  # critic warm-up: the actor waits until the value head has learnt something
            update_metrics = {"actor/updates": 0.0, "actor/grad_norm": 0.0, "actor/lr": self.policy.lr}
            seen_lp = None
        if rollout_lp is not None and (old_lp is not None or seen_lp is not None):
            train_lp = old_lp if old_lp is not None else seen_lp
            extra.update(mismatch_metrics(train_lp, rollout_lp, mask))  # every step
        update_metrics.update(extra)
        update_metrics.update({f"advantage/{k}": v for k, v in estimated.metrics.items()})
        t3 = time.perf_counter()
        # ---- weight sync into the rollout engine ----
        self.engine.update_weights(self.policy.full_weights())
        t4 = time.perf_counter()
        return self._metrics(
            step, rollout, reward, update_metrics, kl_in_reward, (t0, t0 + t_rollout, t2, t3, t4)
        )

    def _generate(self, step: int):
        """This rank's prompts, their rollout and reward; with `algorithm.filter_groups` (DAPO dynamic
        sampling), groups whose rewards are all equal are dropped and further generation batches drawn
        (the next prompts of the data order) until every rank has its share, at most
        `max_num_gen_batches`. Returns (prompt indices, rows, rollout, reward, metrics, (rollout s, reward s))."""
        algo = self.cfg.algorithm
        per_rank = self.cfg.data.prompts_per_step // self.world
        parts, prompts = [], []
        t_rollout = t_reward = 0.0
        gen_batches = 0
        while True:
            batch = self.sampler.batch(step + self.extra_gen_batches + gen_batches)
            mine = batch[self.rank * per_rank : (self.rank + 1) * per_rank]
            rows = [self.rows[i] for i in mine]
            t = time.perf_counter()
            rollout = self.engine.generate(
                [self.prompt_ids[i] for i in mine], self._sampling(step, gen_batches)
            )
            t_rollout += time.perf_counter() - t
            t = time.perf_counter()
            reward = self.reward_fn(
                [rows[g] for g in rollout.group_index], rollout.texts, rollout.group_index
            )
            t_reward += time.perf_counter() - t
            gen_batches += 1
            parts.append((rollout, reward))
            prompts += mine
            if not algo.filter_groups:
                return mine, rows, rollout, reward, {}, (t_rollout, t_reward)
            rollout, reward = _concat(parts)
            overlong = None
            if algo.overlong_buffer_len > 0:  # seq_reward counts DAPO's overlong penalty, as in step()
                lengths = torch.tensor([len(r) for r in rollout.response_ids])
                overlong = overlong_penalty(
                    lengths,
                    self.cfg.rollout.max_new_tokens,
                    algo.overlong_buffer_len,
                    algo.overlong_penalty_factor,
                )
            metric = filter_values(algo.filter_groups_metric, reward.scores, reward.correct, overlong)
            group_index = torch.tensor(rollout.group_index)
            keep = varied_groups(metric, group_index)
            idx, groups = select_groups(keep, group_index, per_rank)
            # one decision for all ranks: they share the prompt order, so they draw batches together
            fewest = -all_reduce_max(-groups)
            if not check_gen_batches(gen_batches, algo.max_num_gen_batches, fewest, per_rank):
                break
        self.extra_gen_batches += gen_batches - 1
        generated = len(set(rollout.group_index))
        varied = len({g for g, k in zip(rollout.group_index, keep.tolist()) if k})
        order = list(dict.fromkeys(rollout.group_index[i] for i in idx.tolist()))
        rollout, reward = _subset(rollout, reward, idx.tolist())
        mine = [prompts[g] for g in order]
        sampling = {
            "train/num_gen_batches": float(gen_batches),
            "train/dropped_groups": all_reduce_sum(generated - varied),
            "train/generated_groups": all_reduce_sum(generated),
        }
        return mine, [self.rows[i] for i in mine], rollout, reward, sampling, (t_rollout, t_reward)

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
            if need == "values":  # the critic's value of each response token's state
                ctx.values = self.critic.compute_values(rollout.prompt_ids, rollout.response_ids)
            elif need == "baseline_scores":  # the reward of a greedy answer to the same prompt
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

    def _mini_batches(self, rollout: Rollout, epochs: int):
        """Row indices of each optimizer step: `epochs` passes over `ppo_mini_batch_size`-prompt mini-batches."""
        cfg = self.cfg
        n = cfg.rollout.n
        prompts_here = len(rollout) // n
        mini_prompts = (cfg.algorithm.ppo_mini_batch_size or cfg.data.prompts_per_step) // self.world
        for _epoch in range(epochs):
            for start in range(0, prompts_here, mini_prompts):
                yield list(range(start * n, min(prompts_here, start + mini_prompts) * n))

    def _update(
        self, rollout: Rollout, advantages, mask, old_lp, ref_lp, is_weights=None, seen_lp=None
    ) -> dict[str, float]:
        """ppo_epochs x mini-batches optimizer steps over this rollout (`mask`: the loss mask)."""
        cfg, algo = self.cfg, self.cfg.algorithm
        sums: dict[str, float] = {}
        updates = 0
        for idx in self._mini_batches(rollout, algo.ppo_epochs):
            loss_fn = make_actor_loss_fn(
                algo,
                advantages[idx],
                mask[idx],
                None if old_lp is None else old_lp[idx],
                None if ref_lp is None else ref_lp[idx],
                scale_factor=algo.loss_scale_factor or cfg.rollout.max_new_tokens,
                world=self.world,
                is_weights=None if is_weights is None else is_weights[idx],
                seen_lp=None if seen_lp is None else _RowView(seen_lp, idx),
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

    def _update_critic(self, rollout: Rollout, values, returns, mask) -> dict[str, float]:
        """critic.ppo_epochs (default: algorithm.ppo_epochs) x mini-batches of the clipped value loss."""
        cfg = self.cfg
        sums: dict[str, float] = {}
        updates = 0
        for idx in self._mini_batches(rollout, cfg.critic.ppo_epochs or cfg.algorithm.ppo_epochs):
            loss_fn = make_critic_loss_fn(
                cfg.algorithm,
                cfg.critic,
                returns[idx],
                values[idx],
                mask[idx],
                scale_factor=cfg.algorithm.loss_scale_factor or cfg.rollout.max_new_tokens,
                world=self.world,
            )
            metrics = self.critic.train_step(
                [rollout.prompt_ids[i] for i in idx],
                [rollout.response_ids[i] for i in idx],
                loss_fn,
                with_entropy=False,
            )
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v
            updates += 1
        out = {k: v / updates for k, v in sums.items()}
        out["critic/lr"] = self.critic.lr
        out["critic/values_mean"] = float((values * mask).sum() / mask.sum().clamp(min=1))
        out["critic/returns_mean"] = float((returns * mask).sum() / mask.sum().clamp(min=1))
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
    if "train/num_gen_batches" in m:  # DAPO dynamic sampling
        acc += f" gen {m['train/num_gen_batches']:.0f} dropped {m['train/dropped_groups']:.0f}"
    if "critic/vf_loss" in m:
        acc += f" vf_loss {m['critic/vf_loss']:.3g}"
    return (
        f"[train] step {step}/{total} reward {m['train/reward_mean']:.3f}{acc} len {m['train/response_length_mean']:.1f}"
        f" kl {m.get('actor/ppo_kl', 0):.2e} clip {m.get('actor/pg_clipfrac', 0):.3f} gnorm {m['actor/grad_norm']:.3f}"
        f" | {m['timing/step_s']:.1f}s (rollout {m['timing/rollout_s']:.1f} reward {m['timing/reward_s']:.1f}"
        f" update {m['timing/update_s']:.1f} sync {m['timing/weight_sync_s']:.1f}) {m['perf/rollout_tokens_per_s']:.0f} tok/s"
    )


def run(cfg: DictConfig, engine=None) -> dict[str, float]:
    """Train with this (already validated) config; marks the MLflow run FAILED with the error on a crash."""
    if cfg.get("trainer", "grpo") == "expert_iteration":  # the same loop, data, rollout and reward keys
        from train.stages.expert_iteration import ExpertIterationTrainer

        return run_loop(ExpertIterationTrainer, cfg, engine=engine)
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
