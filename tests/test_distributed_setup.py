"""The process group's backend and the CUDA check of train/policy/distributed.py (issue 24, items 6 and 11)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from torch.distributed.distributed_c10d import BackendConfig

from infra.models import PROJECT_ROOT
from train.policy.distributed import cuda_expected, process_group_backend, require_usable_cuda


def test_gpu_ranks_get_gloo_beside_nccl_for_host_tensors():
    """cpu_offload keeps shards, gradients and AdamW on the host: their collectives need a CPU backend."""
    gpu = BackendConfig(process_group_backend("cuda")).get_device_backend_map()
    assert gpu == {"cuda": "nccl", "cpu": "gloo"}
    assert process_group_backend("cpu") == "gloo"


def test_what_makes_cuda_expected():
    assert cuda_expected({}, None) is None  # the CPU build, nothing asked: the CPU is intended
    assert "CUDA 13.0 build" in cuda_expected({}, "13.0")
    assert "SLURM_GPUS_ON_NODE=8" in cuda_expected({"SLURM_GPUS_ON_NODE": "8"}, None)
    assert cuda_expected({"SLURM_GPUS_ON_NODE": "0"}, None) is None
    assert cuda_expected({"RLPOST_DEVICE": "cuda"}, None) == "RLPOST_DEVICE=cuda"
    assert cuda_expected({"RLPOST_DEVICE": "cpu", "SLURM_GPUS_ON_NODE": "8"}, "13.0") is None
    assert cuda_expected({"CUDA_VISIBLE_DEVICES": ""}, "13.0") is None  # GPUs hidden on purpose


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="the refusal is for nodes where CUDA is not usable"
)
def test_a_run_expecting_cuda_without_it_is_refused_in_one_line(tiny_model, tmp_path):
    with pytest.raises(ValueError, match=r"CUDA expected \(RLPOST_DEVICE=cuda\).*RLPOST_DEVICE=cpu"):
        require_usable_cuda({"RLPOST_DEVICE": "cuda"})
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "RLPOST_DEVICE": "cuda", "SLURM_GPUS_ON_NODE": "8"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "train", f"model.path={tiny_model}", f"run_dir={tmp_path / 'run'}",
           "track=false", "total_steps=1"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert lines[-1].startswith("error: CUDA expected (RLPOST_DEVICE=cuda)"), lines[-3:]
    assert not (tmp_path / "run" / "checkpoints").exists()
