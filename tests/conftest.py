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


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """Path of ../shared; skips the test when it is absent."""
    if not (SHARED_DIR / "data").is_dir():
        pytest.skip(f"no shared data at {SHARED_DIR} (set RLPOST_SHARED_DIR to a copy of it)")
    return SHARED_DIR


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A 2-layer random Llama with the embedded model's tokenizer (no network needed)."""
    from train.models import build_tiny_model

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
