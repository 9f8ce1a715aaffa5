"""A rank with fewer micro-batches pads with empty ones that take its peers' layout and attention path
(batching.empty_micro_batch): 2 gloo ranks with uneven batches, every attention call recorded per rank."""

import json

import pytest

from tests.padding_worker import LAYOUTS
from tests.torchrun import run_worker

pytestmark = pytest.mark.slow


@pytest.mark.heavy  # make test-all: a long integration run (docs/commands.md, Tests)
def test_padding_micro_batches_take_the_real_ones_path(tiny_model, tmp_path):
    run_worker("padding_worker.py", 2, str(tiny_model), str(tmp_path), timeout=240)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for layout in LAYOUTS:
        calls = [ranks[0][layout], ranks[1][layout]]
        assert len(calls[0]) == len(calls[1]) > 1, f"{layout}: the ranks ran different micro-batch counts"
        assert any(c["padding"] for c in calls[1]), f"{layout}: rank 1 did not pad (the test proves nothing)"
        real = {json.dumps(c["path"]) for rank in calls for c in rank if not c["padding"]}
        padding = {json.dumps(c["path"]) for c in calls[1] if c["padding"]}
        assert len(real) == 1, f"{layout}: real micro-batches took several paths {real}"
        assert padding == real, f"{layout}: padding took {padding}, the real micro-batches {real}"
