"""The rollout engine interface: token ids in, sampled token ids and their log-probs out.

Engines never see text or chat templates: the trainer tokenizes once, so the ids the engine samples
from are exactly the ids the policy is trained on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # config validation reads ENGINE_ARGS without importing torch
    import torch

    from train.batch import Batch

# What the trainer gives an engine's constructor (train/loop.py engine_spec), besides its own
# `rollout.engine.<argument>` settings: the policy's weights always; the compute dtype (the policy's
# resolved precision) and the run's seed where the engine takes them and the config does not set them.
ENGINE_ARGS = {
    "model_path": "the policy's weights (model.path; not a rollout.engine key)",
    "dtype": "the policy's resolved precision",
    "seed": "the run's seed",
    "lora_rank": "policy.lora.rank (the engine serves the policy LoRA adapters; 0 = full weights)",
}


@dataclass
class SamplingConfig:
    """Sampling settings for one `generate` call (from the `rollout` config)."""

    n: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 64
    seed: int = 0  # request i of a call samples with seed + i: reproducible whatever the batch
    stop: list[str] = field(default_factory=list)


def step_sampling(rollout, run_seed: int, step: int, rank: int, gen_batch: int = 0) -> SamplingConfig:
    """The `rollout` config's sampling for one step of a training loop, its seed distinct per step, rank and
    generation batch (`gen_batch` > 0 only under DAPO dynamic sampling)."""
    return SamplingConfig(
        n=rollout.n,
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        max_new_tokens=rollout.max_new_tokens,
        seed=(run_seed * 1_000_003 + step) * 4096 + rank * 1024 + (gen_batch << 40),
    )


@dataclass
class TurnOutput:
    """One finished request of an engine's turn-level API (`submit` / `step`): what the model sampled."""

    request_id: str
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" or "length"


class RolloutEngine(Protocol):
    """What the trainer and the evals need from a generator. Built from `rollout.engine` (its `_target_`
    and its own settings) with ENGINE_ARGS; a class may define `check_settings(world_size, **arguments)`,
    raising a ValueError that names the key, which config validation runs before any model loads."""

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig) -> Batch:
        """n samples per prompt as a Batch (rows only), prompt-major: sample j of prompt p is row p * n + j."""
        ...

    def sequence_logprobs(
        self, prompt_ids: list[list[int]], response_ids: list[list[int]]
    ) -> list[list[float]]:
        """Log-probs the engine's current weights give each response token (teacher-forced)."""
        ...

    def sleep(self) -> None:
        """Release accelerator memory before the policy update (vLLM sleep mode); `update_weights` wakes."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new policy weights in memory (HF parameter names)."""
        ...

    def close(self) -> None: ...

    # Optional, for multi-turn rollouts that keep the engine busy while tools run (train/rollout/agent_loop.py);
    # an engine without them generates each turn of all waiting trajectories as one batch.
    # def submit(self, prompt_ids: list[int], sampling: SamplingConfig, seed: int) -> str: queue one sample
    # def step(self) -> list[TurnOutput]: one engine iteration; the requests that finished in it
    # def pending(self) -> int: requests queued or running


def expand_groups(prompt_ids: list[list[int]], n: int) -> tuple[list[list[int]], list[int]]:
    """Repeat each prompt n times, prompt-major, with its group index."""
    rows = [ids for ids in prompt_ids for _ in range(n)]
    groups = [p for p in range(len(prompt_ids)) for _ in range(n)]
    return rows, groups
