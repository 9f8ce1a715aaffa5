"""What the offline stages (SFT, DPO) share beyond the loop (train/loop.py): their run-level config,
chat tokenization of prompt/response pairs, and the greedy held-out accuracy check."""

from __future__ import annotations

import resource
import statistics
from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from train.config import (
    ENGINE_SUPPLIED,
    ConfigError,
    RunConfig,
    validate_components,
    validate_engine,
    validate_run,
)
from train.data import encode_prompts
from train.loop import TrainingLoop
from train.policy.distributed import all_gather_objects
from train.rollout.base import SamplingConfig


@dataclass
class StageRunConfig(RunConfig):
    """RunConfig plus the offline stages' greedy accuracy switch."""

    val_accuracy: bool = False  # also greedy math accuracy (val/accuracy) of the held-out prompts


def validate_run_config(cfg: DictConfig, batch_size: int) -> None:
    """The run-level checks plus the batch size's and the accuracy engine's; each error names the key."""
    validate_run(cfg)
    validate_components(cfg, ENGINE_SUPPLIED)
    validate_engine(cfg)
    for ok, message in [
        (batch_size >= 1, "data.batch_size must be >= 1"),
        (batch_size % cfg.world_size == 0, "data.batch_size must be divisible by world_size"),
    ]:
        if not ok:
            raise ConfigError(f"bad config value: {message}")


def encode_chat(tokenizer, prompt: list[dict], response: str) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) exactly as the chat template lays out the assistant turn.

    The prompt ids are what the rollout engine is given (train.data.encode_prompts), the response ids
    the template's assistant content up to and including its end-of-turn token, so the model learns to
    stop where the rollout engine stops.
    """
    prompt_ids = encode_prompts(tokenizer, [{"prompt": prompt}])[0]
    prefix = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(
        [*prompt, {"role": "assistant", "content": response}], tokenize=False
    )
    if not full.startswith(prefix):
        raise ValueError("the chat template writes the assistant turn differently from its generation prompt")
    suffix = full[len(prefix) :]
    eos = tokenizer.eos_token
    if eos and eos in suffix:
        suffix = suffix[: suffix.rindex(eos) + len(eos)]
    return prompt_ids, tokenizer(suffix, add_special_tokens=False)["input_ids"]


def peak_memory_gb() -> float:
    """Peak memory of this process: CUDA allocations on GPU, else the peak resident set (CPU)."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # Linux: kilobytes


def shard(items: list, rank: int, world: int) -> list:
    """This rank's contiguous share of a step's batch (the batch size is divisible by the world size)."""
    per = len(items) // world
    return items[rank * per : (rank + 1) * per]


def greedy_accuracy(loop, items: list[tuple[list[int], str]]) -> dict[str, float]:
    """Greedy answers to held-out prompts (this rank's `items`: prompt ids, gold), graded by the math
    grader: `val/accuracy`. The loop's rollout engine is built on first use."""
    from math_grader import grade_batch, start_workers
    from train.loop import build_engine
    from train.rollout.weight_sync import sync_weights

    start_workers()  # ready by the time the greedy answers are generated

    if loop.engine is None:
        loop.engine = build_engine(loop.cfg, loop.weights, loop.policy.precision)
    sync_weights(loop.policy, loop.engine)
    correct: list[float] = []
    if items:
        sampling = SamplingConfig(n=1, temperature=0.0, max_new_tokens=loop.cfg.rollout.max_new_tokens)
        rollout = loop.engine.generate([p for p, _ in items], sampling)
        correct = grade_batch(rollout.texts, [g for _, g in items])
    everyone = [c for part in all_gather_objects(correct) for c in part]
    return {"val/accuracy": statistics.fmean(everyone)} if everyone else {}


def heldout_pass(loop, prompt_ids: list[list[int]], rows: list[dict]):
    """One validation pass of an RL stage (GRPO, expert iteration): `data.val_n` samples per held-out prompt
    (one greedy answer when 1) scored by the training reward, every rank's results gathered.

    Returns (rollout, reward, each sample's row, gathered) with gathered = (scores, correct or None, group ids
    made distinct across ranks, each rank's reward metrics)."""
    n = loop.cfg.data.val_n
    sampling = SamplingConfig(
        n=n,
        temperature=loop.cfg.data.val_temperature if n > 1 else 0.0,
        max_new_tokens=loop.cfg.rollout.max_new_tokens,
        seed=0,
    )
    sample = getattr(loop, "sample", None)  # the loop's rollout (multi-turn with env.*), else the engine's
    rollout = sample(prompt_ids, rows, sampling) if sample else loop.engine.generate(prompt_ids, sampling)
    sample_rows = [rows[g] for g in rollout.group_index]
    score = getattr(loop, "score", None)  # the loop's training reward (whole trajectories), else the reward's
    reward = (
        score(sample_rows, rollout)
        if score
        else loop.reward_fn(sample_rows, rollout.texts, rollout.group_index)
    )
    parts = all_gather_objects((reward.scores, reward.correct, rollout.group_index, reward.metrics))
    offset, groups = 0, []
    for p in parts:  # group ids are per rank: make them distinct across ranks
        groups += [offset + g for g in p[2]]
        offset = max(groups, default=-1) + 1
    correct = None if any(p[1] is None for p in parts) else [c for p in parts for c in p[1]]
    gathered = ([s for p in parts for s in p[0]], correct, groups, [p[3] for p in parts])
    return rollout, reward, sample_rows, gathered


class OfflineStage(TrainingLoop):
    """A loop over a fixed dataset of `data.batch_size` examples a step (SFT, DPO): validation when
    `data.val_path` is set, runs tagged with their stage kind."""

    accuracy_items: tuple | list = ()  # (prompt ids, gold) of this rank's validation prompts with a gold

    @property
    def examples_per_step(self) -> int:
        return self.cfg.data.batch_size

    def set_accuracy_items(self, prompts: list[list[int]], golds: list[str]) -> None:
        """What `val_accuracy` greedy-decodes: the validation prompts with a gold answer, this rank's share."""
        self.accuracy_items = [(x, g) for x, g in zip(prompts, golds) if g][self.rank :: self.world]

    def has_validation(self) -> bool:
        return bool(self.cfg.data.val_path)

    def tracking_tags(self) -> dict[str, str]:
        return {"rlpost.stage_kind": self.kind}

    def validate(self, step: int) -> dict[str, float]:
        """The stage's held-out loss (its `_held_out`), and with `val_accuracy` the greedy accuracy."""
        out = self._held_out()
        if self.cfg.val_accuracy:
            out.update(greedy_accuracy(self, self.accuracy_items))
        return out
