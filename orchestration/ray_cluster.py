"""A Ray cluster inside one multi-task scheduler job (what a multi-node training job needs).

Task 0 starts a Ray head (`ray start --head --block`, a child process it owns) and publishes its
address in a file under the run folder (a shared filesystem on a cluster); every other task joins it
with `ray start --address ... --block` and stays until task 0 is finished. Task 0 then runs the
training with `RAY_ADDRESS` set, so `ray.init()` in the trainer (e.g. train.rewards.ray_reward) connects
to this cluster. The same code runs under submitit's local executor (tasks on one machine, loopback)
and on Slurm (one task per node).
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import submitit

from infra.ray_connect import JOIN_TIMEOUT_S


def node_ip() -> str:
    """This node's address for Ray (RLPOST_RAY_NODE_IP overrides, e.g. an InfiniBand interface)."""
    if os.environ.get("RLPOST_RAY_NODE_IP"):
        return os.environ["RLPOST_RAY_NODE_IP"]
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _ray_cli() -> str:
    return str(Path(sys.executable).with_name("ray"))


def start_head(
    ip: str, num_cpus: int | None = None, temp_dir: str | None = None
) -> tuple[subprocess.Popen, str]:
    """Start a Ray head node in a child process; returns (process, "ip:port") once it accepts clients."""
    port = free_port()
    cmd = [_ray_cli(), "start", "--head", "--block", f"--node-ip-address={ip}", f"--port={port}",
           "--include-dashboard=false", "--disable-usage-stats"]  # fmt: skip
    if num_cpus is not None:
        cmd.append(f"--num-cpus={num_cpus}")
    if temp_dir:
        cmd.append(f"--temp-dir={temp_dir}")
    proc = subprocess.Popen(cmd, start_new_session=True)
    address = f"{ip}:{port}"
    _wait_port(ip, port, proc)
    return proc, address


def join(address: str, ip: str, num_cpus: int | None = None) -> subprocess.Popen:
    """Start a Ray worker node joined to `address` in a child process."""
    cmd = [_ray_cli(), "start", "--block", f"--address={address}", f"--node-ip-address={ip}",
           "--disable-usage-stats"]  # fmt: skip
    if num_cpus is not None:
        cmd.append(f"--num-cpus={num_cpus}")
    return subprocess.Popen(cmd, start_new_session=True)


def stop(proc: subprocess.Popen, timeout: float = 30) -> None:
    """Stop a node started here: SIGTERM makes `ray start --block` shut its Ray processes down."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_port(ip: str, port: int, proc: subprocess.Popen, timeout: float = JOIN_TIMEOUT_S) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"ray head exited with code {proc.returncode} before accepting clients")
        try:
            with socket.create_connection((ip, port), timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"ray head on {ip}:{port} did not answer within {timeout:.0f} s")


def _write_token(path: Path) -> None:
    """A fresh token for this job's Ray cluster, readable by the job's user only."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.touch(mode=0o600)
    tmp.write_text(secrets.token_hex(32))
    tmp.replace(path)


def _use_token(path: Path) -> None:
    """Token auth with the job's own token for this process and its children (head, worker, trainer).

    Ray 2.60 turns token auth on for a head whenever ~/.ray/auth_token exists, but `ray start --address`
    and `ray.init(address=...)` do not, so they were rejected ("InvalidAuthToken"); a per-job token in the
    rendezvous folder (a shared filesystem on a cluster) makes every node agree whatever ~ holds.
    """
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(path)


def ray_job(main: Callable[[], object], run_dir: Path, num_cpus: int | None = None) -> object:
    """Run `main` on task 0 of this multi-task job with a Ray cluster spanning all its tasks."""
    env = submitit.JobEnvironment()
    attempt = f"{env.job_id}-{os.environ.get('SLURM_RESTART_COUNT', '0')}"
    rendezvous = Path(run_dir) / "ray" / attempt
    rendezvous.mkdir(parents=True, exist_ok=True)
    head_file, done_file = rendezvous / "head_address", rendezvous / "done"
    token_file = rendezvous / "auth_token"
    ip = node_ip()
    if env.global_rank == 0:
        _write_token(token_file)
        _use_token(token_file)
        head, address = start_head(ip, num_cpus)
        tmp = rendezvous / ".head_address.tmp"
        tmp.write_text(address)
        tmp.replace(head_file)
        os.environ["RAY_ADDRESS"] = address
        os.environ["RLPOST_RAY_NODES"] = str(env.num_tasks)  # one Ray node per task
        try:
            return main()
        finally:
            done_file.write_text("done")
            stop(head)
    end = time.time() + JOIN_TIMEOUT_S
    while not head_file.is_file():
        if time.time() > end:
            raise TimeoutError(f"no Ray head address in {head_file} after {JOIN_TIMEOUT_S:.0f} s")
        time.sleep(0.5)
    _use_token(token_file)  # written before the head address was published
    worker = join(head_file.read_text().strip(), ip, num_cpus)
    try:
        while not done_file.is_file() and worker.poll() is None:
            time.sleep(1.0)
    finally:
        stop(worker)
    return None
