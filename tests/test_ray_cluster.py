"""Ray across a multi-task job: task 0 starts a head, task 1 joins it (loopback here, one node per
task on a cluster), and the math reward runs as Ray actors placed on both nodes."""

import os

import pytest

from infra.models import PROJECT_ROOT
from train.rewards.base import RewardResult
from train.rewards.ray_reward import merge, split_by_group


def test_split_by_group_keeps_groups_whole_and_merge_restores_order():
    assert split_by_group([0, 0, 1, 1, 2, 2], 2) == [[0, 1, 4, 5], [2, 3]]
    assert split_by_group([5, 5, 7], 4) == [[0, 1], [2]]  # more workers than groups: no empty chunks
    chunks = [[0, 1, 4, 5], [2, 3]]
    results = [
        RewardResult(scores=[1, 2, 5, 6], correct=[1, 0, 1, 0], metrics={"m": 1.0}),
        RewardResult(scores=[3, 4], correct=[0, 1], metrics={"m": 4.0}),
    ]
    merged = merge(chunks, results, 6)
    assert merged.scores == [1, 2, 3, 4, 5, 6] and merged.correct == [1, 0, 0, 1, 1, 0]
    assert merged.metrics == {"m": pytest.approx(1.0 * 4 / 6 + 4.0 * 2 / 6)}  # = 2.0, weighted by samples
    assert merge([[1], [0]], [RewardResult([1.0]), RewardResult([2.0], correct=[1.0])], 2).correct is None


def _probe(run_dir: str):
    """The job's entry: a Ray cluster over the job's tasks, then the math reward as spread actors."""
    from orchestration.ray_cluster import ray_job

    def main():
        import ray

        from infra.ray_connect import wait_for_nodes
        from train.rewards.ray_reward import RayReward

        ray.init(log_to_driver=False)  # RAY_ADDRESS was set by ray_job
        wait_for_nodes(2)
        reward = RayReward({"_target_": "train.rewards.math_reward.MathReward", "num_workers": 1}, num_workers=2,
                           num_cpus_per_worker=1)  # fmt: skip
        rows = [{"ground_truth": "4"}, {"ground_truth": "4"}, {"ground_truth": "10"}, {"ground_truth": "10"}]
        responses = ["so \\boxed{4}", "it is 5", "\\boxed{10}", "\\boxed{11}"]
        result = reward(rows, responses, [0, 0, 1, 1])
        nodes = sorted(set(reward.node_ids()))
        alive = sum(n["Alive"] for n in ray.nodes())
        reward.close()
        ray.shutdown()
        return {"address": os.environ["RAY_ADDRESS"], "scores": result.scores, "nodes": nodes, "alive": alive}

    return ray_job(main, run_dir, num_cpus=1)


@pytest.mark.slow
@pytest.mark.heavy  # make test-all: a long integration run (docs/commands.md, Tests)
def test_ray_head_and_worker_in_a_two_task_job_place_reward_actors_on_both(tmp_path, monkeypatch):
    import submitit

    monkeypatch.setenv("PYTHONPATH", str(PROJECT_ROOT))
    monkeypatch.setenv("RLPOST_RAY_NODE_IP", "127.0.0.1")
    executor = submitit.LocalExecutor(folder=tmp_path / "logs")
    executor.update_parameters(nodes=1, tasks_per_node=2, timeout_min=10)
    job = executor.submit(_probe, str(tmp_path / "run"))
    try:
        head, worker = job.results()
    except Exception:
        logs = "\n".join(p.read_text()[-1500:] for p in sorted((tmp_path / "logs").glob("*_log.*")))
        raise AssertionError(logs) from None
    assert worker is None  # task 1 only served as a Ray node until task 0 finished
    assert head["address"].startswith("127.0.0.1:") and head["alive"] == 2
    assert len(head["nodes"]) == 2  # one reward actor per node (SPREAD)
    assert head["scores"] == [1.0, 0.0, 1.0, 0.0]  # the math grader, run inside the actors
