"""world_size > 1: torchrun starts the ranks, on one node (sweep jobs too) or across a job's nodes."""

import json
import socket
import threading
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from infra.models import PROJECT_ROOT
from orchestration.ranks import NodeLayout, launch_ranks, slurm_layout, torchrun_command
from train.config import build_config


def test_one_node_is_standalone_and_several_rendezvous_on_the_first():
    one = torchrun_command(Path("c.yaml"), 8, NodeLayout(1, 0, None))
    assert (
        "--standalone" in one
        and "--nproc-per-node=8" in one
        and one[-3:] == ["-m", "train.stages.grpo", "c.yaml"]
    )
    two = torchrun_command(Path("c.yaml"), 16, NodeLayout(2, 1, "gpu01"), port=29600)
    assert "--nproc-per-node=8" in two and "--nnodes=2" in two and "--node-rank=1" in two
    assert "--rdzv-endpoint=gpu01:29600" in two and "--standalone" not in two
    with pytest.raises(ValueError, match="not a multiple of the job's 3 nodes"):
        torchrun_command(Path("c.yaml"), 8, NodeLayout(3, 0, "gpu01"))


def test_layout_from_the_slurm_environment():
    assert slurm_layout({}) == NodeLayout(1, 0, None)
    assert slurm_layout({"SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0"}) == NodeLayout(1, 0, None)
    env = {"SLURM_JOB_NUM_NODES": "4", "SLURM_NODEID": "2", "RLPOST_RDZV_HOST": "gpu07"}
    assert slurm_layout(env) == NodeLayout(4, 2, "gpu07")


def _cfg(tiny_model, run_dir: Path):
    return build_config(
        overrides=[
            f"model.path={tiny_model}", f"run_dir={run_dir}", "run_name=ranks", "world_size=2", "total_steps=1",
            "save_every=1", "track=false", "rollout.engine._target_=train.rollout.hf_engine.HFEngine",
            "reward._target_=tests.rewards_for_tests.VowelShareReward", "data.prompts_per_step=2", "rollout.n=2",
            "rollout.max_new_tokens=4", "data.builtin_size=16", "policy.precision=fp32",
        ]
    )  # fmt: skip


@pytest.fixture()
def rank_env(monkeypatch) -> None:
    """What the ranks a test starts inherit: this checkout on their path, one thread each."""
    monkeypatch.setenv("PYTHONPATH", str(PROJECT_ROOT))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.heavy  # make test-all: a long integration run (docs/commands.md, Tests)
def test_two_nodes_train_one_world(tiny_model, tmp_path, rank_env):
    """Two 'nodes' on this machine, one rank each, meet at the rendezvous and train one step together."""
    cfg = _cfg(tiny_model, tmp_path / "run")
    port, codes = _free_port(), {}

    def node(rank: int) -> None:
        codes[rank] = launch_ranks(cfg, NodeLayout(2, rank, "127.0.0.1"), port=port)

    threads = [threading.Thread(target=node, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert codes == {0: 0, 1: 0}
    assert json.loads((tmp_path / "run" / "progress.json").read_text())["step"] == 1
    meta = json.loads((tmp_path / "run" / "checkpoints" / "step_000001" / "meta.json").read_text())
    assert meta["world_size"] == 2  # both ranks' RNG states were gathered: one world of 2


@pytest.mark.slow
@pytest.mark.heavy  # make test-all: a long integration run (docs/commands.md, Tests)
def test_a_sweep_job_with_world_size_2_starts_its_ranks(tiny_model, tmp_path, rank_env):
    from orchestration.job import TrainPoint, read_status

    cfg = _cfg(tiny_model, tmp_path / "point")
    TrainPoint()(OmegaConf.to_yaml(cfg))  # before: "world_size=2 but 1 ranks were started"
    status = read_status(tmp_path / "point")
    assert status["state"] == "done" and "train/reward_mean" in status["metrics"]


@pytest.mark.slow
@pytest.mark.heavy  # make test-all: a long integration run (docs/commands.md, Tests)
def test_a_checkpoint_saved_by_two_ranks_resumes_on_one(tiny_model, tmp_path, rank_env, dist_group):
    """Each of 2 ranks writes its own DCP shards; a 1-rank job resumes them (resharded) and trains on."""
    import torch
    from safetensors.torch import load_file

    from infra.checkpoint import layout as ckpt
    from orchestration.job import TrainPoint
    from train.stages.grpo import GRPOTrainer

    TrainPoint()(OmegaConf.to_yaml(_cfg(tiny_model, tmp_path / "point")))
    step = ckpt.latest_checkpoint(tmp_path / "point")
    shards = {p.name for p in (step / ckpt.STATE).iterdir()}
    assert {"__0_0.distcp", "__1_0.distcp"} <= shards and ckpt.read_meta(step)["world_size"] == 2

    cfg = _cfg(tiny_model, tmp_path / "point")
    cfg.world_size, cfg.resume, cfg.total_steps = 1, True, 2
    trainer = GRPOTrainer(cfg)
    try:
        assert trainer.start_step == 1
        saved = {}  # each of the 2 ranks wrote its share of the export: a file each
        for part in sorted(ckpt.hf_dir(step).glob("*.safetensors")):
            saved.update(load_file(part))
        assert len(saved) > 1
        for name, tensor in trainer.policy.full_weights():
            if name in saved:
                assert torch.equal(tensor, saved[name]), name
        assert trainer.policy.optimizer.state  # the AdamW moments came back, not fresh ones
        out = trainer.step(2)
        assert out["actor/grad_norm"] > 0
    finally:
        trainer.close()
