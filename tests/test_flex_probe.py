"""bench/flex_probe.py on the CPU: the layouts it draws and one run of each case kind (forward only here)."""

from __future__ import annotations

import json

import pytest
import torch

from bench import flex_probe


def test_segments_follow_the_shared_prompt_layout():
    seg = flex_probe.segments_for(2, 3000, prompt=512)
    assert seg.shape == (2, 3000) and (seg[:, :512] == 0).all()
    for row in seg:
        ids = row[512:]
        assert (ids >= 1).all()  # the unit is full: responses to the end, no padding
        assert (ids.diff() >= 0).all() and set(ids.diff().tolist()) <= {0, 1}  # 1, 2, ... in runs


@pytest.mark.slow
def test_each_case_times_every_stage_and_writes_its_record(tmp_path):
    out = tmp_path / "flex.json"
    rows = flex_probe.main(["--cases", "shared:2x640,packed:1x1024", "--out", str(out)])
    assert [r["case"] for r in rows] == ["shared:2x640", "packed:1x1024"]
    for row in rows:
        for stage in ("mask_cold_s", "mask_warm_s", "forward_cold_s", "forward_warm_s"):
            assert isinstance(row[stage], float), (stage, row[stage])  # a number, not an error line
        assert "backward_cold_s" not in row  # no CPU backward for FlexAttention
        assert 0 < row["mask_sparsity"] < 100
    assert json.loads(out.read_text())["cases"] == rows


def test_a_malformed_case_is_named():
    with pytest.raises(SystemExit, match="--cases: 'shared:16384'"):
        flex_probe.main(["--cases", "shared:16384"])


def test_a_failing_stage_is_recorded_in_one_line_and_the_probe_goes_on():
    record: dict = {}
    with flex_probe.Stage("boom_s", 60, False, record):
        raise RuntimeError("first line\nsecond line")
    assert record == {"boom_s": "error: RuntimeError: first line"}
    torch.zeros(1)  # still running
