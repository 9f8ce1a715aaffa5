"""The GPU path's structure on CPU ranks (gloo): a Qwen3-shaped model of 2 layers with the real 151,936-token
vocabulary, packed rows, uneven per-rank batches, LoRA off and on. One update at 4 ranks gives the 1-rank
gradient; its DCP checkpoint resumed at 2 ranks gives the 1-rank second update and AdamW state. (Not the
weights after AdamW: its normalised step turns the rounding of near-zero gradients into differences of up to
the learning rate.)"""

import json
import time

import pytest
import torch

from tests import paper_ranks_worker as worker
from tests.paper_ranks_worker import LORA
from tests.torchrun import run_worker

pytestmark = [pytest.mark.slow, pytest.mark.heavy]  # make test-all (docs/commands.md, Tests)


@pytest.fixture(scope="module")
def qwen3_shape(tmp_path_factory):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, tie_word_embeddings=True,
                         max_position_embeddings=512)  # fmt: skip
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("qwen3") / "model"
    Qwen3ForCausalLM(config).save_pretrained(folder)
    return folder


def _close(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), what
    for name, x in a.items():
        diff = (b[name] - x).abs().max().item()
        assert diff <= 1e-7 + 1e-4 * x.abs().max().item(), f"{what} {name}: max |diff| = {diff:.3g}"


def _run(model, folder, world: int, phase: str, src) -> tuple[dict, float, list]:
    """`world` ranks under torchrun; 1 rank in this process (the test session's group of one)."""
    folder.mkdir()
    t0 = time.perf_counter()
    if world == 1:
        worker.main(str(model), str(folder), phase, str(src))
    else:
        run_worker("paper_ranks_worker.py", world, str(model), str(folder), phase, str(src), timeout=300)
    took = time.perf_counter() - t0
    ranks = [json.loads((folder / f"rss{r}.json").read_text()) for r in range(world)]
    print(
        f"world {world} {phase}: {took:.1f} s; per rank: peak RSS {[round(r['max_rss_mib']) for r in ranks]} MiB, "
        f"CPU {[round(r['cpu_s'], 1) for r in ranks]} s, micro-batches {[r['real_micro_batches'] for r in ranks]}"
    )
    return torch.load(folder / "result.pt"), took, ranks


def test_four_ranks_and_a_two_rank_resume_equal_one_rank(qwen3_shape, tmp_path, dist_group):
    one, _, _ = _run(qwen3_shape, tmp_path / "w1", 1, "first", tmp_path)
    four, _, ranks4 = _run(qwen3_shape, tmp_path / "w4", 4, "first", tmp_path)
    two, _, ranks2 = _run(qwen3_shape, tmp_path / "w2", 2, "resume", tmp_path / "w4")
    for ranks in (ranks4, ranks2):  # uneven: some ranks ran padding micro-batches
        assert len({r["real_micro_batches"] for r in ranks}) > 1
    for name in LORA:
        assert one[name]["first"]["grad_norm"] > 1e-3, "zero gradient: the comparison would prove nothing"
        assert four[name]["first"]["grad_norm"] == pytest.approx(one[name]["first"]["grad_norm"], rel=1e-4)
        _close(one[name]["first"]["grads"], four[name]["first"]["grads"], f"lora {name}, update 1, 4 ranks:")
        assert two[name]["second"]["grad_norm"] == pytest.approx(one[name]["second"]["grad_norm"], rel=1e-4)
        _close(one[name]["second"]["grads"], two[name]["second"]["grads"], f"lora {name}, update 2, 2 ranks:")
        # AdamW's moments after update 2: update 1's (restored from the 4-rank save) carried into it
        _close(one[name]["adam"], two[name]["adam"], f"lora {name}, AdamW state after update 2:")
