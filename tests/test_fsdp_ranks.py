"""FSDP2 on CPU (gloo): a 2-rank update computes the 1-rank update's gradient for the same batch."""

import pytest
import torch

from tests.torchrun import run_worker

pytestmark = pytest.mark.slow


def _update(model, tmp_path, world: int, mode: str) -> dict:
    out = tmp_path / f"w{world}-{mode}.pt"
    run_worker("fsdp_worker.py", world, str(model), str(out), mode)
    return torch.load(out)


@pytest.mark.parametrize("mode", ["token-mean", pytest.param("seq-mean-token-mean", marks=pytest.mark.heavy)])
def test_two_rank_update_equals_one_rank(tiny_model, tmp_path, mode):
    one = _update(tiny_model, tmp_path, 1, mode)
    two = _update(tiny_model, tmp_path, 2, mode)
    assert one["grad_norm"] == pytest.approx(two["grad_norm"], rel=1e-4)
    assert one["grad_norm"] > 1e-3, "zero gradient: the comparison would prove nothing"
    for name, g1 in one["grads"].items():
        g2 = two["grads"][name]
        diff = (g2 - g1).abs().max().item()
        assert diff <= 1e-7 + 1e-4 * g1.abs().max().item(), f"{name}: max |2-rank - 1-rank| = {diff:.3g}"
