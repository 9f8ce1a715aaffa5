"""The policy is built on the meta device and each rank reads only its rows of every parameter from the
safetensors (train/policy/meta_init.py): host memory per rank ~1/world of the model, weights identical to
`from_pretrained`'s (issue 24 item 9)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.torchrun import run_worker
from train.policy.meta_init import READ_CHUNK_BYTES

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def big_model(tmp_path_factory):
    """~340 MB of fp32 weights (hidden 1024, 4 layers, the real 49,152-token vocabulary, tied embeddings)."""
    from infra.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("big") / "model", hidden_size=1024, num_layers=4)


@pytest.mark.heavy  # make test-all: a long integration run (docs/commands.md, Tests)
def test_a_non_zero_rank_holds_half_the_model_while_building(tiny_model, big_model, tmp_path):
    out = tmp_path / "rss.json"
    run_worker("meta_build_worker.py", 2, str(tiny_model), str(big_model), str(out))
    got = json.loads(out.read_text())
    assert got["identical"], "the built weights differ from from_pretrained's"
    model = got["model_bytes"]
    assert model > 300e6
    rank1 = next(r["build_peak_growth"] for r in got["ranks"] if r["rank"] == 1)
    # its half of the shards, one read buffer, and a little for the Python objects of the build
    bound = model / 2 + READ_CHUNK_BYTES + 16 * 2**20
    assert rank1 <= bound, f"rank 1 peak host growth {rank1 / 2**20:.0f} MiB > {bound / 2**20:.0f} MiB"


def test_the_critic_has_the_causal_lms_trunk_and_a_fresh_head(tiny_model, dist_group):
    from transformers import AutoModelForCausalLM

    from train.policy.critic import Critic

    trunk = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).state_dict()
    one, two = Critic(tiny_model, pad_id=0).full_state_dict(), Critic(tiny_model, pad_id=0).full_state_dict()
    assert {k for k in one if k not in trunk} == {"score.weight", "score.bias"}
    for k, v in one.items():
        if k in trunk:
            assert torch.equal(v, trunk[k]), k
        assert torch.equal(v, two[k]), f"{k}: not the same on every build (ranks would disagree)"
    assert one["score.bias"].abs().max() == 0 and 0.01 < float(one["score.weight"].std()) < 0.04


def test_a_folder_without_safetensors_is_named(tmp_path, tiny_model, dist_group):
    import shutil

    from train.policy.fsdp import Policy
    from train.policy.meta_init import WeightsError

    folder = tmp_path / "bin-model"
    shutil.copytree(tiny_model, folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(WeightsError, match="no \\*.safetensors there"):
        Policy(folder, pad_id=0)
