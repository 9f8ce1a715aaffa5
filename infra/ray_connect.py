"""Joining the job's Ray cluster from inside training (the Ray rollout engine, the Ray reward): the
cluster itself is started by orchestration/ray_cluster.py inside a multi-task scheduler job."""

from __future__ import annotations

import os
import time

JOIN_TIMEOUT_S = float(os.environ.get("RLPOST_RAY_JOIN_TIMEOUT_S", 300))


def wait_for_nodes(count: int, timeout: float = JOIN_TIMEOUT_S) -> None:
    """Block until `count` Ray nodes are alive (call after ray.init)."""
    import ray

    end = time.time() + timeout
    while sum(n["Alive"] for n in ray.nodes()) < count:
        if time.time() > end:
            raise TimeoutError(f"only {sum(n['Alive'] for n in ray.nodes())} of {count} Ray nodes joined")
        time.sleep(0.5)


def connect(address: str | None = None) -> None:
    """Join the job's Ray cluster (`address`, else RAY_ADDRESS, else a new local Ray: never a stale
    cluster some earlier process left in /tmp/ray; RAY_ADDRESS=auto joins a running one) once per process,
    and inside a multi-node job wait until all its nodes have joined, so SPREAD actors land on every node."""
    import ray

    if not ray.is_initialized():
        ray.init(address=address or os.environ.get("RAY_ADDRESS") or "local", log_to_driver=False)
    if os.environ.get("RLPOST_RAY_NODES"):
        wait_for_nodes(int(os.environ["RLPOST_RAY_NODES"]))
