"""A reward computed by Ray actors spread over the cluster's nodes (a swappable `reward:` component).

    reward:
      _target_: train.rewards.ray_reward.RayReward
      num_workers: 4
      reward: {_target_: train.rewards.math_reward.MathReward, timeout_s: 3.0}

Each actor builds the inner reward once; a batch is split by whole groups (group-relative rewards such
as DARLING see complete groups) and the results are put back in sample order. Connects to
`address`, else `RAY_ADDRESS` (set by orchestration.ray_cluster in a multi-node job), else starts a
local Ray.
"""

from __future__ import annotations

from collections.abc import Mapping

from hydra.utils import instantiate

from infra.ray_connect import connect
from train.rewards.base import RewardFn, RewardResult


class _RewardWorker:
    def __init__(self, reward) -> None:  # a `_target_` dict, or an already built reward (pickled here)
        self.fn = instantiate(reward) if isinstance(reward, Mapping) else reward

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def score(self, rows: list[dict], responses: list[str], group_index: list[int]) -> RewardResult:
        return self.fn(rows, responses, group_index)


def split_by_group(group_index: list[int], parts: int) -> list[list[int]]:
    """Sample indices in `parts` chunks of whole groups (round-robin over groups in first-seen order);
    empty chunks are dropped. E.g. group_index [0,0,1,1,2,2], parts 2 -> [[0,1,4,5],[2,3]]."""
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(group_index):
        groups.setdefault(g, []).append(i)
    chunks: list[list[int]] = [[] for _ in range(parts)]
    for k, members in enumerate(groups.values()):
        chunks[k % parts].extend(members)
    return [c for c in chunks if c]


def merge(chunks: list[list[int]], results: list[RewardResult], size: int) -> RewardResult:
    """Results of `chunks` back in sample order; metrics averaged weighted by chunk size."""
    scores = [0.0] * size
    correct: list[float] | None = [0.0] * size if all(r.correct is not None for r in results) else None
    metrics: dict[str, float] = {}
    for idx, res in zip(chunks, results):
        for j, i in enumerate(idx):
            scores[i] = res.scores[j]
            if correct is not None:
                correct[i] = res.correct[j]
        for k, v in res.metrics.items():
            metrics[k] = metrics.get(k, 0.0) + v * len(idx) / size
    return RewardResult(scores=scores, correct=correct, metrics=metrics)


class RayReward:
    def __init__(
        self,
        reward: Mapping | RewardFn,
        num_workers: int = 2,
        address: str | None = None,
        num_cpus_per_worker: float = 1.0,
    ) -> None:
        import ray

        connect(address)
        remote = ray.remote(num_cpus=num_cpus_per_worker, scheduling_strategy="SPREAD")(_RewardWorker)
        # Hydra builds nested `_target_` dicts before calling us (recursive instantiate): then the
        # built reward is shipped to each actor; a plain dict (`_recursive_: false`) is built there.
        spec = dict(reward) if isinstance(reward, Mapping) else reward
        self.workers = [remote.remote(spec) for _ in range(num_workers)]
        print(f"[ray] {num_workers} reward worker(s) on {len(set(self.node_ids()))} node(s)", flush=True)

    def node_ids(self) -> list[str]:
        """The Ray node each worker runs on (placement check)."""
        import ray

        return ray.get([w.node_id.remote() for w in self.workers])

    def __call__(self, rows: list[dict], responses: list[str], group_index: list[int]) -> RewardResult:
        import ray

        chunks = split_by_group(group_index, len(self.workers))
        futures = [
            w.score.remote([rows[i] for i in idx], [responses[i] for i in idx], [group_index[i] for i in idx])
            for w, idx in zip(self.workers, chunks)
        ]
        return merge(chunks, ray.get(futures), len(responses))

    def close(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)
        self.workers = []
