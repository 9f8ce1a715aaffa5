"""GRPO (and every other registered estimator: DARLING, Classmate, ...) on the one training loop.

A step is a short pipeline over one batch (train/batch.py): generate -> reward -> the inputs the step
needs -> step plug-ins -> advantage -> policy update(s) -> weight sync. Logging, the validation schedule,
checkpoints and resume are the loop's (train/loop.py). The advantage estimator and the trainer-side
features (overlong shaping, KL in the reward, rollout IS/RS, ...) come from the method table
(train/algorithms/registry.py): each declares what it needs (old/reference log-probs, critic values,
greedy baselines, reward signals), the providers below compute exactly that, and the step names none of
them.

Every rank owns a colocated rollout engine and generates the groups of its share of the prompts, so
a group never spans ranks and advantages are computed locally; only the loss normalisers and the
logged figures are reduced across ranks.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.distributed as dist
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from data_prep.datasets import load_prompt_rows
from train import checkpoint as ckpt
from train import samples
from train.algorithms import registry
from train.algorithms.actor_loss import actor_loss
from train.algorithms.aggregation import global_normalisers
from train.algorithms.classmate import char_span_to_token_span, cot_token_mask
from train.algorithms.dapo import (
    check_gen_batches,
    filter_values,
    select_groups,
    turn_overlong_penalty,
    varied_groups,
)
from train.algorithms.gae import actor_trains_at, value_loss
from train.batch import Batch
from train.config import train_schema, validate
from train.config.errors import ConfigError
from train.data import PromptSampler, encode_prompts
from train.env.registry import build_agent
from train.env.registry import enabled as env_enabled
from train.heldout_metrics import heldout_metrics
from train.loop import TrainingLoop, build_engine, engine_dtype, run_loop
from train.policy.distributed import all_gather_objects, all_reduce_max, all_reduce_sum
from train.policy.fsdp import Policy
from train.rewards.base import RewardResult
from train.rewards.trajectory import score_rollout
from train.rollout.agent_loop import env_metrics
from train.rollout.base import SamplingConfig, step_sampling
from train.rollout.weight_sync import sync_weights
from train.stages.common import heldout_pass

# Who computes each input an estimator or a step plug-in may need (registry.INPUTS), in the order they
# run: (trainer method, needs the rollout engine awake). Engine inputs run before the engine sleeps. A
# method gets (batch, need) and returns batch[need], or None when the batch already holds it.
INPUT_PROVIDERS: dict[str, tuple[str, bool]] = {
    "baseline_scores": ("_greedy_baselines", True),  # ReMax: the reward of a greedy answer to the prompt
    "rollout_log_probs": ("_rollout_log_probs", False),  # the engine's, returned with the samples
    "old_log_probs": ("_old_log_probs", False),  # the policy's before this step's update
    "ref_log_probs": ("_ref_log_probs", False),  # the frozen reference policy's
    "values": ("_values", False),  # the critic's value of each response token's state
    registry.SIGNALS: ("_signal", False),  # signals.<x>: the reward's signal x; <x>_token_mask from <x>_spans
}


def provider(need: str) -> tuple[str, bool]:
    """The INPUT_PROVIDERS row of `need` (a `signals.<name>` need: the `signals.` row)."""
    return INPUT_PROVIDERS[registry.input_row(need)]


def _normalisers(mask: torch.Tensor, scale_factor: float) -> dict:
    norms = global_normalisers(mask, scale_factor)
    norms["global_token_count"] = all_reduce_sum(norms["global_token_count"])
    norms["global_seq_count"] = all_reduce_sum(norms["global_seq_count"])
    return norms


def make_actor_loss_fn(algo, batch: Batch, scale_factor: float, world: int, seen_lp=None):
    """The actor loss of one mini-batch as a per-micro-batch callback.

    Reads `batch["advantages"]`, the loss mask (`batch["loss_mask"]`, e.g. masked IS's, else the response
    mask), and when present `old_log_probs`, `ref_log_probs`, `is_weights` (all (N, R)). Normalised over
    the whole mini-batch on all ranks, so micro-batch and rank splits give the gradient of one big batch.
    `seen_lp` (N, R), when given, receives the detached log-probs of this update's forward (the old
    log-probs of a single on-policy update).
    """
    pg_entry = registry.policy_loss(algo.policy_loss_mode)
    own_weights = pg_entry.applies_is_weights  # e.g. geo_mean: the loss mode weighs by is_weights itself
    # bypass mode (verl's rollout_correction.bypass_mode): the engine's log-probs are the old ones, and the
    # loss mode corrects on pi_current / pi_rollout itself
    old_name = "rollout_log_probs" if algo.policy_loss_mode == "bypass_mode" else "old_log_probs"
    adv, old_lp, ref_lp = batch["advantages"], batch.get(old_name), batch.get("ref_log_probs")
    mask, is_weights = batch.get("loss_mask", batch["response_mask"]), batch.get("is_weights")
    norms = _normalisers(mask, scale_factor)
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


def make_critic_loss_fn(algo, critic_cfg, batch: Batch, scale_factor: float, world: int):
    """The clipped value loss of one mini-batch (`batch["returns"]` against `batch["values"]`, the values
    at the rollout), normalised like the actor's."""
    returns, old_values, mask = batch["returns"], batch["values"], batch["response_mask"]
    norms = _normalisers(mask, scale_factor)
    local_tokens = max(float(mask.sum()), 1.0)

    def loss_fn(mb, values, _entropy):
        R, rows, dev = values.shape[1], mb.rows, values.device
        token_mask = mask[rows, :R].to(dev)  # the model's tokens (multi-turn: not the environment's)
        loss, metrics = value_loss(
            values,
            returns[rows, :R].to(dev),
            old_values[rows, :R].to(dev),
            token_mask,
            critic_cfg.cliprange_value,
            algo.loss_agg_mode,
            **norms,
        )
        weight = float(token_mask.sum()) / local_tokens
        return loss * world, {k: v * weight for k, v in metrics.items()}

    return loss_fn


class GRPOTrainer(TrainingLoop):
    """GRPO's part of the loop: prompts, reference policy, reward, engine and the RL step. `engine` lets
    a caller (tests, benchmarks) share one already-started rollout engine."""

    kind = "train"
    progress_metric = "train/reward_mean"

    def load_data(self) -> None:
        cfg = self.cfg
        # multi-turn rollouts (env.tools / env.interaction): prompts describe the tools; engine attached in setup
        self.agent = (
            build_agent(cfg.env, None, self.tokenizer, say=self.print) if env_enabled(cfg.env) else None
        )
        rows = load_prompt_rows(cfg.data.train_path, cfg.data.builtin_size, cfg.seed)
        self.rows, dropped = self._fit_prompts(rows)
        if dropped:
            self.print(
                f"dropped {dropped} prompts longer than data.max_prompt_tokens={cfg.data.max_prompt_tokens}"
            )
        if rows and not self.rows:  # one line, not the sampler's traceback on an empty dataset
            raise ConfigError(
                f"data.max_prompt_tokens={cfg.data.max_prompt_tokens} drops all {len(rows)} prompts of "
                f"{cfg.data.train_path} (tools described in the prompt make it longer): raise it"
            )
        self.sampler = PromptSampler(len(self.rows), cfg.data.prompts_per_step, cfg.seed, cfg.data.shuffle)
        self.val_rows: list[dict] = []
        if cfg.val_every and cfg.data.val_path:
            val = load_prompt_rows(cfg.data.val_path, cfg.data.val_size, cfg.seed, split="test")
            self.val_rows = val[self.rank :: self.world]
            self.val_prompt_ids = self._encode(self.val_rows)

    def setup(self) -> None:
        cfg = self.cfg
        pol, algo = cfg.policy, cfg.algorithm
        needs = self._needs()
        self.ref = None
        if "ref_log_probs" in needs and self.policy.lora.enabled:  # the base: adapters off, no second copy
            self.ref = self.policy.frozen_base()
        elif "ref_log_probs" in needs:
            # precision, layout and attention as the trained policy resolved them
            self.ref = Policy(self.model_path, trainable=False, **self.policy.companion_kwargs())
        # the step plug-ins' state (e.g. the in-reward KL coefficient), saved with each checkpoint
        self.plugin_state: dict = {}
        for plugin in registry.step_plugins():
            self.plugin_state.update(plugin.state(algo) if plugin.state else {})
        self.extra_gen_batches = 0  # dynamic sampling: generation batches drawn beyond one per step
        if "values" in needs:  # PPO with a critic
            from infra.models import resolve_model_path
            from train.policy.critic import Critic

            crit = cfg.critic
            self.critic = Critic(
                resolve_model_path(crit.model_path) if crit.model_path else self.model_path,
                lr=crit.lr,
                weight_decay=crit.weight_decay,
                grad_clip=crit.grad_clip,
                gradient_checkpointing=pol.gradient_checkpointing,
                total_steps=cfg.total_steps,
                **self.policy.companion_kwargs(),
            )
        self.reward_fn = instantiate(OmegaConf.to_container(cfg.reward, resolve=True))
        if self.engine is None:
            self.engine = build_engine(cfg, self.weights, self.policy.precision)
            self._attach_agent()
        else:  # a shared engine may hold other weights: start it from this policy's
            want = getattr(torch, engine_dtype(cfg, self.policy.precision))
            have = getattr(self.engine, "weight_dtype", getattr(self.engine, "dtype", want))
            if have != want:  # its samples then differ from a run that builds its own engine
                self.print(
                    f"the shared rollout engine computes in {have}, not the {want} this policy's precision asks for"
                )
            sync_weights(self.policy, self.engine)
            self._attach_agent()

    def _attach_agent(self) -> None:
        if self.agent is not None:
            self.agent.attach(self.engine)

    def _encode(self, rows: list[dict]) -> list[list[int]]:
        """Prompt ids of data rows: with tools, the chat with the tools described (the agent's format)."""
        if self.agent is not None:
            return self.agent.encode(rows)
        return encode_prompts(self.tokenizer, rows, self.cfg.data.prompt_template)

    def sample(self, prompt_ids: list[list[int]], rows: list[dict], sampling: SamplingConfig) -> Batch:
        """The rollout of these prompts: one response each, or multi-turn trajectories with env.*"""
        if self.agent is not None:
            return self.agent.generate(prompt_ids, rows, sampling)
        return self.engine.generate(prompt_ids, sampling)

    def score(self, rows: list[dict], rollout: Batch) -> RewardResult:
        """The training reward of `rollout`'s samples (whole trajectories, env.reward_weight: rewards/trajectory.py)."""
        return score_rollout(self.reward_fn, rows, rollout, self.cfg.env.reward_weight)

    @property
    def examples_per_step(self) -> int:
        return self.cfg.data.prompts_per_step

    def extra_state(self) -> dict:
        return {**self.plugin_state, "extra_gen_batches": self.extra_gen_batches}

    def restore(self, state: dict) -> None:
        self.plugin_state.update({k: state[k] for k in self.plugin_state if k in state})
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
        ids = self._encode(rows)
        keep = [(r, i) for r, i in zip(rows, ids) if len(i) <= self.cfg.data.max_prompt_tokens]
        self.prompt_ids = [i for _, i in keep]
        return [r for r, _ in keep], len(rows) - len(keep)

    def _sampling(self, step: int, gen_batch: int = 0) -> SamplingConfig:
        """`gen_batch`: the generation batch of the step (> 0 only under DAPO dynamic sampling)."""
        return step_sampling(self.cfg.rollout, self.cfg.seed, step, self.rank, gen_batch)

    # ------------------------------------------------------------------------------------------
    def step(self, step: int) -> dict[str, float]:
        """generate -> reward -> inputs -> plug-ins -> estimator -> update -> weight sync."""
        t0 = time.perf_counter()
        batch, figures, (t_rollout, t_reward) = self._generate(step)  # + DAPO dynamic sampling
        if self.agent is not None:
            figures.update(env_metrics(batch.episodes, self.agent.last_stats))
        needs = self._needs()
        self._provide(batch, [n for n in needs if provider(n)[1]])
        self.engine.sleep()  # release the engine's memory before any log-prob pass (verl's order)
        self._provide(batch, [n for n in needs if not provider(n)[1]])
        figures.update(self._plugins("after_reward", batch))
        figures.update(self._plugins("before_estimator", batch))
        estimated = registry.as_output(self.estimator.fn(self.cfg.algorithm, self._advantage_context(batch)))
        batch["advantages"] = estimated.advantages
        if estimated.returns is not None:
            batch["returns"] = estimated.returns
        figures.update(self._plugins("before_update", batch))
        figures.update(self._update(batch, step))
        figures.update(self._plugins("after_update", batch))
        figures.update({f"advantage/{k}": v for k, v in estimated.metrics.items()})
        t3 = time.perf_counter()
        figures.update(sync_weights(self.policy, self.engine))  # the adapter alone, or every weight
        times = (t0, t0 + t_rollout, t0 + t_rollout + t_reward, t3, time.perf_counter())
        samples.log_rollout(
            self.tracker, "train", step, batch.rows, batch, batch, batch["advantages"],
            batch["response_mask"], self.cfg.log_samples_every,
        )  # fmt: skip
        return self._metrics(batch, figures, times)

    def _generate(self, step: int) -> tuple[Batch, dict[str, float], tuple[float, float]]:
        """This rank's samples with their reward; with `algorithm.filter_groups` (DAPO dynamic sampling),
        groups whose rewards are all equal are dropped and further generation batches drawn (the next
        prompts of the data order) until every rank has its share, at most `max_num_gen_batches`.
        Returns (batch, sampling figures, (rollout s, reward s))."""
        algo = self.cfg.algorithm
        per_rank = self.cfg.data.prompts_per_step // self.world
        parts: list[Batch] = []
        times = [0.0, 0.0]
        while True:
            parts.append(self._rollout(step, len(parts), per_rank, times))
            if not algo.filter_groups:
                return parts[0], {}, tuple(times)
            batch = Batch.concat(parts)
            overlong = None
            if algo.overlong_buffer_len > 0:  # seq_reward counts DAPO's overlong penalty, as the plug-in does
                overlong = turn_overlong_penalty(  # the model's turns only, as the plug-in
                    batch.padded(batch.model_token_mask()),
                    self.cfg.rollout.max_new_tokens,
                    algo.overlong_buffer_len,
                    algo.overlong_penalty_factor,
                )
            metric = filter_values(algo.filter_groups_metric, batch.scores, batch.correct, overlong)
            group_index = torch.tensor(batch.group_index)
            keep = varied_groups(metric, group_index)
            idx, groups = select_groups(keep, group_index, per_rank)
            # one decision for all ranks: they share the prompt order, so they draw batches together
            fewest = -all_reduce_max(-groups)
            if not check_gen_batches(len(parts), algo.max_num_gen_batches, fewest, per_rank):
                break
        self.extra_gen_batches += len(parts) - 1
        generated = len(set(batch.group_index))
        varied = len({g for g, k in zip(batch.group_index, keep.tolist()) if k})
        figures = {
            "train/num_gen_batches": float(len(parts)),
            "train/dropped_groups": all_reduce_sum(generated - varied),
            "train/generated_groups": all_reduce_sum(generated),
        }
        return batch.select(idx.tolist()), figures, tuple(times)

    def _rollout(self, step: int, gen_batch: int, per_rank: int, times: list[float]) -> Batch:
        """One generation batch of this rank's prompts, with the reward's outputs ((rollout s, reward s)
        added to `times`)."""
        mine = self.sampler.batch(step + self.extra_gen_batches + gen_batch)
        mine = mine[self.rank * per_rank : (self.rank + 1) * per_rank]
        t = time.perf_counter()
        prompts, rows = [self.prompt_ids[i] for i in mine], [self.rows[i] for i in mine]
        batch = self.sample(prompts, rows, self._sampling(step, gen_batch))
        times[0] += time.perf_counter() - t
        batch.rows = [self.rows[mine[g]] for g in batch.group_index]
        t = time.perf_counter()
        batch.add_reward(self.score(batch.rows, batch))
        times[1] += time.perf_counter() - t
        # environment tokens (multi-turn) are 0: no loss, entropy, KL or per-token figure sees them
        batch["response_mask"] = batch.padded(batch.model_token_mask())
        batch["rewards"] = torch.tensor(batch.scores, dtype=torch.float32)  # what plug-ins shape
        if all(len(lp) == len(r) for lp, r in zip(batch.response_logprobs, batch.response_ids)):
            batch["rollout_log_probs"] = batch.padded(batch.response_logprobs)
        return batch

    # ---- what the step needs, and who provides it ---------------------------------------------
    def _needs(self) -> list[str]:
        """The inputs of this step, in the providers' order: the estimator's, the enabled plug-ins' and the
        update's (old log-probs for more than one optimizer step, or the engine's in bypass mode; reference
        ones for the KL loss)."""
        algo, pps = self.cfg.algorithm, self.cfg.data.prompts_per_step
        wanted = {*self.estimator.needs, *(n for p in registry.step_plugins(algo) for n in p.needs)}
        if algo.policy_loss_mode == "bypass_mode":  # the engine's log-probs stand in for the old ones
            wanted.add("rollout_log_probs")
        elif algo.ppo_epochs > 1 or (algo.ppo_mini_batch_size or pps) < pps:
            wanted.add("old_log_probs")
        if algo.use_kl_loss:
            wanted.add("ref_log_probs")
        rows = list(INPUT_PROVIDERS)
        return sorted(wanted, key=lambda n: (rows.index(registry.input_row(n)), n))

    def _provide(self, batch: Batch, needs: list[str]) -> None:
        """Compute each input of `needs` into the batch (those it does not hold yet), by its table row."""
        for need in needs:
            if need not in batch:
                value = getattr(self, provider(need)[0])(batch, need)
                if value is not None:
                    batch[need] = value

    def _greedy_baselines(self, batch: Batch, need: str) -> torch.Tensor:
        """ReMax: one greedy rollout per prompt, scored by the same reward; (B,), each row its group's."""
        first: dict[int, int] = {}
        for i, g in enumerate(batch.group_index):
            first.setdefault(g, i)
        order = [first[g] for g in range(batch.num_groups)]
        sampling = SamplingConfig(
            n=1, temperature=0.0, max_new_tokens=self.cfg.rollout.max_new_tokens, seed=0
        )
        greedy = self.sample([batch.prompt_ids[i] for i in order], [batch.rows[i] for i in order], sampling)
        reward = self.score([batch.rows[i] for i in order], greedy)
        return torch.tensor(reward.scores, dtype=torch.float32)[torch.tensor(batch.group_index)]

    def _rollout_log_probs(self, batch: Batch, need: str) -> torch.Tensor:
        bypass = self.cfg.algorithm.policy_loss_mode == "bypass_mode"
        raise RuntimeError(
            f"algorithm.{'policy_loss_mode=bypass_mode' if bypass else 'rollout_is / rollout_rs'} needs "
            f"the rollout engine's log-probs, which {type(self.engine).__name__} did not return"
        )

    def _old_log_probs(self, batch: Batch, need: str) -> torch.Tensor:
        return self.policy.compute_log_probs(batch.prompt_ids, batch.response_ids)[0]

    def _ref_log_probs(self, batch: Batch, need: str) -> torch.Tensor:
        return self.ref.compute_log_probs(batch.prompt_ids, batch.response_ids)[0]

    def _values(self, batch: Batch, need: str) -> torch.Tensor:
        return self.critic.compute_values(batch.prompt_ids, batch.response_ids)

    def _signal(self, batch: Batch, need: str) -> torch.Tensor | None:
        """`signals.<x>`: the reward's signal x, which stays where the reward put it (None; a KeyError naming
        the signals it gave when it gave no x); `signals.<x>_token_mask`: the (B, T) response-token mask
        made from the reward's `<x>_spans` (characters)."""
        name = need.removeprefix(registry.SIGNALS)
        if not name.endswith("_token_mask"):
            batch.signal(name)
            return None
        base = name.removesuffix("_token_mask")
        spans = [
            char_span_to_token_span(
                lambda k, ids=ids: len(self.tokenizer.decode(ids[:k], skip_special_tokens=True)),
                len(ids),
                span,
            )
            for ids, span in zip(batch.response_ids, batch.signal(f"{base}_spans"))
        ]
        mask = batch["response_mask"]
        token_mask = cot_token_mask(spans, mask)
        batch.reward_metrics[f"{base}_token_fraction"] = float(token_mask.sum() / mask.sum().clamp(min=1.0))
        return token_mask

    def _advantage_context(self, batch: Batch) -> registry.AdvantageContext:
        signals = {}
        for need in self.estimator.needs:  # what the signals. row provided: a made mask, or the reward's own
            if registry.input_row(need) == registry.SIGNALS:
                name = need.removeprefix(registry.SIGNALS)
                signals[name] = batch[need] if need in batch else batch.signal(name)
        return registry.AdvantageContext(
            batch["rewards"],
            batch["response_mask"],
            torch.tensor(batch.group_index),
            token_rewards=batch.get("token_rewards"),
            baseline_scores=batch.get("baseline_scores"),
            values=batch.get("values"),
            signals=signals,
        )

    def _plugins(self, point: str, batch: Batch) -> dict[str, float]:
        """Run the step plug-ins enabled at `point`, in registration order; their figures."""
        ctx = registry.StepContext(self.cfg.rollout.max_new_tokens, self.plugin_state, all_reduce_sum)
        figures: dict[str, float] = {}
        for plugin in registry.step_plugins(self.cfg.algorithm, point):
            figures.update(plugin.fn(self.cfg.algorithm, batch, ctx))
        return figures

    # ---- the update -------------------------------------------------------------------------------
    def _update(self, batch: Batch, step: int) -> dict[str, float]:
        """The critic's, then the actor's optimizer steps over this batch (the first
        `critic.warmup_steps` steps train the critic alone)."""
        out = self._update_critic(batch) if self.critic is not None else {}
        if self.critic is None or actor_trains_at(step - 1, self.cfg.critic.warmup_steps):
            out.update(self._update_actor(batch))
        else:  # critic warm-up: the actor waits until the value head has learnt something
            out.update({"actor/updates": 0.0, "actor/grad_norm": 0.0, "actor/lr": self.policy.lr})
        return out

    def _mini_batches(self, batch: Batch, epochs: int):
        """(first row, mini-batch) of each optimizer step: `epochs` passes over `ppo_mini_batch_size`-prompt
        mini-batches."""
        cfg = self.cfg
        rows = (cfg.algorithm.ppo_mini_batch_size or cfg.data.prompts_per_step) // self.world * cfg.rollout.n
        for _epoch in range(epochs):
            yield from zip(range(0, len(batch), rows), batch.chunk(rows))

    def _update_actor(self, batch: Batch) -> dict[str, float]:
        """ppo_epochs x mini-batches optimizer steps. Without old log-probs (one on-policy update), those
        of the update's own forward are kept as `batch["old_log_probs"]` (for the mismatch figures)."""
        cfg, algo = self.cfg, self.cfg.algorithm
        seen = torch.zeros_like(batch["response_mask"]) if "old_log_probs" not in batch else None
        sums: dict[str, float] = {}
        updates = 0
        for start, mini in self._mini_batches(batch, algo.ppo_epochs):
            mini_seen = None if seen is None else torch.zeros_like(mini["response_mask"])
            loss_fn = make_actor_loss_fn(
                algo,
                mini,
                scale_factor=algo.loss_scale_factor or cfg.rollout.max_new_tokens,
                world=self.world,
                seen_lp=mini_seen,
            )
            metrics = self.policy.train_step(
                mini.prompt_ids,
                mini.response_ids,
                loss_fn,
                with_entropy=True,  # always reported; differentiated only when entropy_coeff != 0
                entropy_grad=algo.entropy_coeff != 0,
            )
            if seen is not None:
                seen[start : start + len(mini)] = mini_seen
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v
            updates += 1
        if seen is not None:
            batch["old_log_probs"] = seen
        out = {k: v / updates for k, v in sums.items()}
        out["actor/updates"] = float(updates)
        out["actor/lr"] = self.policy.lr
        return out

    def _update_critic(self, batch: Batch) -> dict[str, float]:
        """critic.ppo_epochs (default: algorithm.ppo_epochs) x mini-batches of the clipped value loss."""
        cfg = self.cfg
        sums: dict[str, float] = {}
        updates = 0
        for _start, mini in self._mini_batches(batch, cfg.critic.ppo_epochs or cfg.algorithm.ppo_epochs):
            loss_fn = make_critic_loss_fn(
                cfg.algorithm,
                cfg.critic,
                mini,
                scale_factor=cfg.algorithm.loss_scale_factor or cfg.rollout.max_new_tokens,
                world=self.world,
            )
            metrics = self.critic.train_step(mini.prompt_ids, mini.response_ids, loss_fn, with_entropy=False)
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v
            updates += 1
        out = {k: v / updates for k, v in sums.items()}
        mask = batch["response_mask"]
        out["critic/lr"] = self.critic.lr
        out["critic/values_mean"] = float((batch["values"] * mask).sum() / mask.sum().clamp(min=1))
        out["critic/returns_mean"] = float((batch["returns"] * mask).sum() / mask.sum().clamp(min=1))
        return out

    def _metrics(self, batch: Batch, figures: dict[str, float], t) -> dict[str, float]:
        t0, t1, t2, t3, t4 = t
        lengths = [len(r) for r in batch.response_ids]
        gathered = all_gather_objects(
            {
                "scores": batch.scores,
                "correct": batch.correct,
                "lengths": lengths,
                "clipped": [f == "length" for f in batch.finish_reasons],
                "prompt_lengths": [len(p) for p in batch.prompt_ids],
                "update": figures,
                "reward_metrics": batch.reward_metrics,
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
        """Held-out answers scored by the training reward: `val/*` metrics (train/heldout_metrics.py).

        One greedy answer per prompt, or `data.val_n` samples at `data.val_temperature` (pass@1..n and the
        reward's diversity figures: distinct correct answers per prompt, distinct_k)."""
        rollout, reward, rows, (scores, correct, groups, metrics) = heldout_pass(
            self, self.val_prompt_ids, self.val_rows
        )
        samples.log_rollout(self.tracker, "val", step, rows, rollout, reward)
        figures = {k: statistics.fmean(m[k] for m in metrics) for k in metrics[0]}
        out = heldout_metrics(scores, correct, groups, figures)
        if self.agent is not None:  # tool use on the held-out prompts, every rank's trajectories
            episodes = [e for part in all_gather_objects(rollout.episodes) for e in part]
            env = env_metrics(episodes)
            out.update({f"val/{k.removeprefix('env/')}": env[k] for k in VAL_ENV_FIGURES})
            out["val/tool_call_rate"] = env["env/used_tools_rate"]
        return out

    def one_line(self, step: int, m: dict[str, float]) -> str:
        return _one_line(step, self.cfg.total_steps, m)

    def close(self) -> None:
        super().close()
        if self.agent is not None:
            self.agent.close()
        if hasattr(self.reward_fn, "close"):  # e.g. the classmate reward's own engines
            self.reward_fn.close()


VAL_ENV_FIGURES = ("env/turns_mean", "env/tool_calls_mean", "env/tool_error_rate", "env/truncated_rate")


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
    """The `_target_` of a GRPO stage in an experiment's `stages:` block (orchestration/pipeline.py)."""

    @property
    def schema(self) -> type:
        return train_schema()

    def validate(self, cfg: DictConfig) -> None:
        validate(cfg)

    def run(self, cfg: DictConfig, engine=None) -> dict[str, float]:
        return run(cfg, engine=engine)


if __name__ == "__main__":  # torchrun entry: python -m train.stages.grpo <config.yaml>
    from infra.process_exit import exit_now

    run(OmegaConf.load(sys.argv[1]))
    if dist.is_initialized():
        dist.destroy_process_group()
    exit_now(0)
