"""Rollout engines as Ray actors spread over a cluster's nodes (a swappable `rollout.engine`).

    rollout:
      engine:
        _target_: train.rollout.ray_engine.RayEngine
        num_engines: 4
        num_cpus_per_engine: 8      # and/or num_gpus_per_engine: 1
        engine: {_target_: train.rollout.vllm_engine.VLLMEngine, kv_cache_gb: 4}

The trainer keeps its own process for the policy update; each actor owns one inner engine (vLLM or HF)
built from the same model folder. A batch is split into contiguous runs of whole prompts, one per actor,
and each run samples with `seed + its first row`, so row i always samples with seed + i: the tokens do
not depend on how many engines there are. New weights are put in Ray's object store once and every
actor loads them from there. Connects to `address`, else `RAY_ADDRESS` (set by
orchestration.ray_cluster inside a multi-node job), else starts a local Ray.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path

import torch
from hydra.utils import instantiate

from infra.ray_connect import connect
from train.batch import Batch
from train.components import target_params
from train.rollout.base import ENGINE_ARGS, SamplingConfig

DEFAULT_INNER = {"_target_": "train.rollout.vllm_engine.VLLMEngine"}


def split_prompts(num_prompts: int, parts: int) -> list[range]:
    """Contiguous prompt ranges, sizes differing by at most one; empty ranges are dropped.
    E.g. 5 prompts over 2 parts -> [range(0, 3), range(3, 5)]."""
    base, extra = divmod(num_prompts, parts)
    ranges, start = [], 0
    for k in range(parts):
        size = base + (1 if k < extra else 0)
        if size:
            ranges.append(range(start, start + size))
        start += size
    return ranges


class _EngineActor:
    def __init__(self, spec: dict, kwargs: dict) -> None:
        self.engine = instantiate(spec, **kwargs)

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig) -> Batch:
        return self.engine.generate(prompt_ids, sampling)

    def sequence_logprobs(self, prompt_ids, response_ids) -> list[list[float]]:
        return self.engine.sequence_logprobs(prompt_ids, response_ids)

    def update_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.engine.update_weights(iter(weights.items()))

    def sleep(self) -> None:
        self.engine.sleep()

    def close(self) -> None:
        self.engine.close()


class RayEngine:
    """A RolloutEngine whose generation runs in `num_engines` Ray actors."""

    def __init__(
        self,
        model_path: str | Path,
        engine: Mapping | None = None,
        num_engines: int = 2,
        num_cpus_per_engine: float = 1.0,
        num_gpus_per_engine: float = 0.0,
        address: str | None = None,
        **engine_kwargs: object,
    ) -> None:
        import ray

        if num_engines < 1:
            raise ValueError(f"rollout.engine.num_engines={num_engines}: needs at least 1 engine")
        connect(address)
        spec = dict(engine or DEFAULT_INNER)
        if spec.get("_target_", "").endswith("RayEngine"):
            raise ValueError("rollout.engine.engine: a RayEngine cannot wrap another RayEngine")
        # LoRA adapters are not routed to the actors (no load_adapter here): they get merged weights, so their
        # engines start without adapter slots (train/rollout/weight_sync.py)
        engine_kwargs.pop("lora_rank", None)
        _, params = target_params("rollout.engine.engine", spec["_target_"])
        takes = {p.name for p in params or ()} if params and not any(p.var_keyword for p in params) else None
        # what the trainer supplies every engine (ENGINE_ARGS) goes on only where the inner engine takes it
        kwargs = {
            "model_path": str(model_path),
            **{k: v for k, v in engine_kwargs.items() if takes is None or k in takes or k not in ENGINE_ARGS},
        }
        remote = ray.remote(
            num_cpus=num_cpus_per_engine, num_gpus=num_gpus_per_engine, scheduling_strategy="SPREAD"
        )(_EngineActor)
        self.actors = [remote.remote(spec, kwargs) for _ in range(num_engines)]
        nodes = self.node_ids()  # waits until every engine is up: a failed start raises here, not mid-step
        print(f"[ray] {num_engines} rollout engine(s) on {len(set(nodes))} node(s)", flush=True)

    def node_ids(self) -> list[str]:
        """The Ray node each engine runs on (placement check)."""
        import ray

        return ray.get([a.node_id.remote() for a in self.actors])

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig) -> Batch:
        import ray

        ranges = split_prompts(len(prompt_ids), len(self.actors))
        futures = [
            actor.generate.remote(
                [prompt_ids[p] for p in r], replace(sampling, seed=sampling.seed + r.start * sampling.n)
            )
            for actor, r in zip(self.actors, ranges)
        ]
        return Batch.concat(ray.get(futures))  # group indices offset to the whole batch's

    def sequence_logprobs(
        self, prompt_ids: list[list[int]], response_ids: list[list[int]]
    ) -> list[list[float]]:
        import ray

        ranges = split_prompts(len(prompt_ids), len(self.actors))
        futures = [
            actor.sequence_logprobs.remote([prompt_ids[i] for i in r], [response_ids[i] for i in r])
            for actor, r in zip(self.actors, ranges)
        ]
        return [lp for part in ray.get(futures) for lp in part]

    def sleep(self) -> None:
        """Every actor's engine releases its accelerator memory until the next update_weights."""
        import ray

        ray.get([a.sleep.remote() for a in self.actors])

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        import ray

        weights = ray.put({name: t.detach().cpu().contiguous() for name, t in named_tensors})
        ray.get([a.update_weights.remote(weights) for a in self.actors])

    def close(self) -> None:
        import ray

        for actor in self.actors:
            try:
                ray.get(actor.close.remote(), timeout=60)
            except Exception:  # a dead actor: killing it below is all that is left to do
                pass
            ray.kill(actor)
        self.actors = []
