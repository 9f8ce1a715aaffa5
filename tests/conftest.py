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
