"""Start a run's `world_size` training ranks with torchrun: on one node, or across a Slurm job's nodes.

`python -m train` and sweep jobs (orchestration/job.py) both come here when `world_size > 1`. One node:
`torchrun --standalone --nproc-per-node=<world_size>`. Several nodes (a Slurm job with one task per node,
`nodes: N, tasks_per_node: 1` in the cluster profile): every node's task runs torchrun with
`--nnodes=N --node-rank=$SLURM_NODEID` and the c10d rendezvous on the job's first node, each node
starting world_size / N ranks, one per GPU. torchrun sets RANK / LOCAL_RANK / WORLD_SIZE; each rank
takes GPU LOCAL_RANK and joins the NCCL group (train/policy/distributed.py).

Preemption signals are the launcher's (train/preemption.py): torchrun and the ranks start with
SIGUSR2 ignored (Slurm signals every process of a job), the launcher turns SIGTERM / SIGUSR2 into a
request the ranks read at their next step boundary; they checkpoint together and exit, and
`launch_ranks` raises `Preempted` with the step and checkpoint they report.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from orchestration.preempt import forward_to_ranks, ignore_preempt_usr2
from train.preemption import CONTROL_DIR_ENV, read_outcome

RDZV_PORT = 29531


@dataclass(frozen=True)
class NodeLayout:
    nnodes: int
    node_rank: int
    master: str | None  # rendezvous host (None: standalone)


def slurm_layout(env: dict[str, str] | None = None) -> NodeLayout:
    """This node's place in a multi-node Slurm job from its environment; one standalone node otherwise."""
    env = dict(os.environ if env is None else env)
    nnodes = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1)
    if nnodes <= 1:
        return NodeLayout(1, 0, None)
    master = env.get("RLPOST_RDZV_HOST") or _first_host(env["SLURM_JOB_NODELIST"])
    return NodeLayout(nnodes, int(env.get("SLURM_NODEID", "0")), master)


def _first_host(nodelist: str) -> str:
    """The first host of a Slurm node list (`gpu[01-04]` -> gpu01), as `scontrol show hostnames` expands it."""
    out = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True
    )
    return out.stdout.split()[0]


def torchrun_command(cfg_path: Path, world_size: int, layout: NodeLayout, port: int = RDZV_PORT) -> list[str]:
    if world_size % layout.nnodes:
        raise ValueError(
            f"world_size={world_size} is not a multiple of the job's {layout.nnodes} nodes: "
            "set world_size to nodes x GPUs per node"
        )
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world_size // layout.nnodes}"]
    if layout.nnodes == 1:
        cmd.append("--standalone")
    else:
        cmd += [
            f"--nnodes={layout.nnodes}",
            f"--node-rank={layout.node_rank}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={layout.master}:{port}",
            f"--rdzv-id={os.environ.get('SLURM_JOB_ID', 'rlpost')}",
        ]
    return [*cmd, "-m", "train.stages.grpo", str(cfg_path)]


def launch_ranks(cfg: DictConfig, layout: NodeLayout | None = None, port: int = RDZV_PORT) -> int:
    """Run this node's ranks of `cfg` to the end; returns torchrun's exit status, or raises `Preempted`
    when a SIGTERM / SIGUSR2 stopped them (after their checkpoint)."""
    layout = layout or slurm_layout()
    with tempfile.TemporaryDirectory(prefix="rlpost-ranks-") as folder:
        control = Path(folder)  # the config, the launcher's request and the ranks' outcome
        (control / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(key, None)  # a parent launcher's values must not leak into torchrun's ranks
        env[CONTROL_DIR_ENV] = str(control)
        cmd = torchrun_command(control / "config.yaml", cfg.world_size, layout, port)
        with forward_to_ranks(control, say=lambda m: print(f"[launch] {m}", flush=True)):
            proc = subprocess.Popen(cmd, env=env, preexec_fn=ignore_preempt_usr2)
            code = proc.wait()
        stop = read_outcome(control)
    if stop is not None:
        raise stop
    return code
