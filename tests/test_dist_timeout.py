"""The process group's timeout (`dist_timeout_s`): a rank that waits in a collective for a peer still
generating fails past it, so the project's setting must exceed the generation skew (distributed.py)."""

import json

import pytest

from tests.dist_timeout_worker import SKEW_S
from tests.torchrun import run_worker

pytestmark = pytest.mark.slow


def _outcome(tmp_path, timeout: str) -> dict:
    run_worker("dist_timeout_worker.py", 2, str(tmp_path), timeout, timeout=120)
    return json.loads((tmp_path / "rank0.json").read_text())


def test_a_short_timeout_fails_the_wait_for_a_slow_generator(tmp_path):
    waited = _outcome(tmp_path, "1")  # 1 s < the 3 s skew
    assert not waited["ok"], "a 1 s group timeout did not end a 3 s wait: the timeout is not applied"


def test_the_project_setting_outlasts_the_skew(tmp_path):
    waited = _outcome(tmp_path, "project")
    assert waited["ok"], waited["error"]


def test_the_config_default_is_the_group_default():
    import dataclasses

    from train.config import RunConfig
    from train.policy.distributed import DIST_TIMEOUT_S

    default = {f.name: f.default for f in dataclasses.fields(RunConfig)}["dist_timeout_s"]
    assert default == DIST_TIMEOUT_S > 20 * 60 > SKEW_S  # the planner's ~20 min paper step, and more
