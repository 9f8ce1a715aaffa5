"""Shared test fixtures.

Benchmark data lives in ../shared beside the checkout; tests that read it skip when it is absent
(a user's clone has no ../shared).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED_DIR = Path(os.environ.get("RLPOST_SHARED_DIR", PROJECT_ROOT.parent / "shared"))
_EXIT_STATUS: list[int] = []


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--heavy", action="store_true",
        help="also run the tests marked heavy (long integration runs: `make test-all`)",
    )  # fmt: skip


def pytest_collection_modifyitems(config, items) -> None:
    """`make test` leaves out the tests marked `heavy` (deselected, counted in pytest's summary line);
    `make test-all` (`pytest --heavy`) runs them too. What is heavy is listed in docs/commands.md's Tests section."""
    if config.getoption("--heavy"):
        return
    heavy = [item for item in items if item.get_closest_marker("heavy")]
    if heavy:
        config.hook.pytest_deselected(items=heavy)
        items[:] = [item for item in items if not item.get_closest_marker("heavy")]


def pytest_sessionfinish(session, exitstatus) -> None:
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config) -> None:
    """Once pytest has reported, end a run that joined a process group (dist_group, FSDP2, vLLM in-process)
    through `exit_now` with pytest's own status: the interpreter's teardown could otherwise abort the process
    after every test passed (infra/process_exit.py says how; it happened to a 2-rank test worker in CI)."""
    import sys

    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None)
    if _EXIT_STATUS and dist is not None and dist.is_available() and dist.is_initialized():
        from infra.process_exit import exit_now

        exit_now(_EXIT_STATUS[-1])


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """Path of ../shared; skips the test when it is absent."""
    if not (SHARED_DIR / "data").is_dir():
        pytest.skip(f"no shared data at {SHARED_DIR} (set RLPOST_SHARED_DIR to a copy of it)")
    return SHARED_DIR


@pytest.fixture()
def mlflow_uri(tmp_path, monkeypatch) -> str:
    """A fresh SQLite MLflow store in the test's folder, set as MLFLOW_TRACKING_URI for the test."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A 2-layer random Llama with the embedded model's tokenizer (no network needed)."""
    from infra.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def dist_group():
    """A world-size-1 torch.distributed group in the test process (FSDP2 and vLLM join it)."""
    from train.policy.distributed import init_distributed

    return init_distributed()


@pytest.fixture(scope="session")
def vllm_engine(tiny_model, dist_group):
    """One colocated vLLM engine for the whole session (start-up costs ~20-35 s)."""
    from train.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(tiny_model, dtype="float32", max_model_len=512, seed=0)
    yield engine


@pytest.fixture(scope="session")
def make_checkpoint(tiny_model, dist_group):
    """`make(run_dir, step, seed=0) -> step folder`: a real train/checkpoint.py checkpoint of the tiny
    architecture with weights drawn from `seed` (different seeds give different generations)."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

    from tests.standin_policy import StandInPolicy
    from train.checkpoint import save_checkpoint

    config = AutoConfig.from_pretrained(tiny_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)

    def make(run_dir: Path, step: int, seed: int = 0) -> Path:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        return save_checkpoint(
            run_dir, step, StandInPolicy(model), tokenizer, {"step": step}, source_model=tiny_model
        )

    return make


@pytest.fixture(scope="session")
def judge_server(tmp_path_factory):
    """One real LLM server on loopback for the whole session, speaking the OpenAI chat-completions and the
    Anthropic Messages APIs (llm-katan, transformers backend, a tiny random Llama: replies are garbage).

    Yields an object with `.base_url` (server root; LLMClient adds /v1 for openai), `.model` (served
    name) and `.api_key` (checked by the server). Use it as
    `monkeypatch.setenv("JUDGE_KEY", judge_server.api_key)` +
    `LLMClient(f"openai/{judge_server.model}", base_url=judge_server.base_url, api_key_env="JUDGE_KEY")`.
    Start-up ~10-20 s; the server is stopped at session end.
    """
    from tests.judge_servers import build_judge_model, start_llm_katan

    workdir = tmp_path_factory.mktemp("judge_server")
    server = start_llm_katan(build_judge_model(workdir / "model"), workdir)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real single-node Slurm: slurm/local/start.sh installs (apt) and starts it when it is not up,
    and the session stops it again if it started it. Skips only when it cannot be installed."""
    import shutil
    import subprocess

    def answers() -> bool:
        if not shutil.which("srun"):
            return False
        try:  # a node held by jobs of a run that died makes srun wait: start.sh clears those
            probe = subprocess.run(
                ["srun", "--immediate=15", "-t", "1", "hostname"], capture_output=True, timeout=30
            )
        except subprocess.TimeoutExpired:
            return False
        return probe.returncode == 0

    was_up = answers()
    if not was_up:
        if os.geteuid() != 0 or not (shutil.which("slurmctld") or shutil.which("apt-get")):
            pytest.skip(
                "no Slurm here and it cannot be installed (needs root and apt-get): slurm/local/start.sh"
            )
        start = subprocess.run(
            [str(PROJECT_ROOT / "slurm" / "local" / "start.sh")], capture_output=True, text=True, timeout=900
        )
        if start.returncode != 0:
            pytest.fail(f"slurm/local/start.sh failed: {(start.stdout + start.stderr)[-2000:]}")
    yield
    if not was_up:
        subprocess.run([str(PROJECT_ROOT / "slurm" / "local" / "stop.sh")], capture_output=True, timeout=120)
