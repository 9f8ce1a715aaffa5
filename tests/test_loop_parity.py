"""Behaviour unchanged by the one-loop refactor (issue 13): the same seeded 2-step runs of GRPO (every
estimator family, KL terms, PPO epochs), SFT and DPO log the same metrics as main did before it.

tests/data/loop_parity_before.json was written by `python -m tests.loop_parity` on main before the loops
were merged, and re-recorded once since, when the log-prob kernels were rewritten (issue 27: fp32 rounding
only, every one of the 352 figures within 1.0e-5 relative of the first recording; the 168 metrics added
since were recorded with them); a metric the loop adds later is allowed, a changed or missing one is not.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BEFORE = Path(__file__).parent / "data" / "loop_parity_before.json"


def test_same_metrics_for_the_same_seed_as_before(tmp_path, dist_group):
    from tests.loop_parity import record

    before = json.loads(BEFORE.read_text())
    after = json.loads(json.dumps(record(tmp_path / "after.json")))  # same int -> str step keys
    assert sorted(after) == sorted(before)
    diffs = []
    for case, metrics in before.items():
        for key, by_step in metrics.items():
            got = after[case].get(key)
            if got is None:
                diffs.append(f"{case}: {key} no longer logged")
                continue
            for step, value in by_step.items():
                if step not in got or not math.isclose(got[step], value, rel_tol=1e-5, abs_tol=1e-7):
                    diffs.append(f"{case}: {key} step {step}: before {value}, now {got.get(step)}")
    assert not diffs, "\n".join(diffs)
