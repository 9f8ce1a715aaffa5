"""A slow file system on rank 0 (the HF export's writes, the deletion of pruned steps) does not hold the other
ranks inside a collective of the default process group, whose timeout (NCCL's watchdog: 10 minutes) is
shorter than that work can take (issue 24 item 13). On CPU the default group is gloo with an 8 s timeout and
rank 0's writes or deletions take 20 s each."""

from __future__ import annotations

import json

import pytest

from infra.checkpoint import layout as ckpt
from tests.slow_io_worker import SLOW_S
from tests.torchrun import run_worker

pytestmark = pytest.mark.slow


@pytest.mark.heavy  # make test-all: a long integration run (docs/commands.md, Tests)
@pytest.mark.parametrize("mode", ["export", "prune"])
def test_slow_file_work_on_rank_0_does_not_time_out_the_others(tiny_model, tmp_path, mode):
    run_worker("slow_io_worker.py", 2, str(tiny_model), str(tmp_path), mode, timeout=600)
    saved = [s for s, _ in ckpt.list_checkpoints(tmp_path / "run")]
    assert saved == ([2] if mode == "prune" else [1])
    if mode == "prune":  # the deletion ran beside the save, not inside it
        spent = json.loads((tmp_path / "rank1.json").read_text())["save_s"]
        assert spent[1] < SLOW_S, spent
    hf = ckpt.hf_dir(ckpt.step_dir(tmp_path / "run", saved[-1]))
    assert (hf / "model.safetensors.index.json").is_file()  # two ranks wrote a share each
