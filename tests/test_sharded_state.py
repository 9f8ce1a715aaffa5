"""Sharded DCP checkpoints as training writes them (train/checkpoint.py): saved at 2 ranks, each writing its
own shards, resumed at 1 with the same weights and AdamW state; the streamed HF export holds exactly the
trained weights (fp32, or cast to bf16 in several files) and loads in transformers."""

import pytest
import torch

from tests.torchrun import run_worker

pytestmark = pytest.mark.slow


def _torchrun(world: int, model, folder, mode: str) -> None:
    run_worker("sharded_worker.py", world, str(model), str(folder), mode)


@pytest.fixture(scope="module")
def saved(tiny_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sharded")
    _torchrun(2, tiny_model, folder, "save")
    return folder


def test_each_rank_writes_its_own_shard_and_no_temporary_folder_is_left(saved):
    from infra.checkpoint import layout as layout
    from train import checkpoint as ckpt

    step = layout.latest_checkpoint(saved / "run")
    assert step == layout.step_dir(saved / "run", 1) and layout.is_complete(step)
    files = sorted(p.name for p in (step / layout.STATE).iterdir())
    assert ".metadata" in files and "__0_0.distcp" in files and "__1_0.distcp" in files
    manifest = layout.read_meta(step)[layout.MANIFEST]
    assert f"{layout.STATE}/__1_0.distcp" in manifest  # rank 1's file counts for completeness
    assert layout.read_meta(step)["world_size"] == 2
    assert not [p for p in layout.checkpoints_root(saved / "run").iterdir() if p.name.startswith(".")]
    assert "optimizer" not in ckpt.load_trainer_state(step)  # AdamW state lives in the shards only


def test_saved_at_two_ranks_resumes_at_one_with_the_same_weights_and_optimizer_state(tiny_model, saved):
    _torchrun(1, tiny_model, saved, "load")
    expected = torch.load(saved / "expected.pt", weights_only=False)
    loaded = torch.load(saved / "loaded-1.pt", weights_only=False)
    initial = _initial_weights(tiny_model)
    moved = 0
    for name, w in expected["weights"].items():
        torch.testing.assert_close(loaded["weights"][name], w, rtol=0, atol=0, msg=name)
        moved += int(not torch.equal(w, initial[name]))
    assert moved > 0, "the step changed no weight: the comparison would prove nothing"
    exp_state, got_state = expected["optim"]["state"], loaded["optim"]["state"]
    assert set(exp_state) == set(got_state) and exp_state
    for key, entry in exp_state.items():
        for field in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(got_state[key][field], entry[field], rtol=0, atol=0)


@pytest.mark.parametrize("export", ["checkpoint", "bf16"])
def test_hf_export_equals_the_trained_weights_and_loads_in_transformers(saved, export):
    from transformers import AutoModelForCausalLM

    from infra.checkpoint import layout as layout

    expected = torch.load(saved / "expected.pt", weights_only=False)["weights"]
    if export == "checkpoint":  # the step's own hf/, in the master weights' dtype
        folder, dtype = layout.hf_dir(layout.step_dir(saved / "run", 1)), torch.float32
        assert (folder / "tokenizer.json").is_file()
    else:  # cast to bf16, 1 MB files: the index path
        folder, dtype = saved / "hf-bf16", torch.bfloat16
        assert (folder / "model.safetensors.index.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    got = model.state_dict()
    for name, w in expected.items():
        torch.testing.assert_close(got[name], w.to(dtype), rtol=0, atol=0, msg=name)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied


def test_loading_a_folder_that_is_not_a_checkpoint_names_it(tiny_model, tmp_path, dist_group):
    from train.policy.fsdp import Policy
    from train.policy.sharded_state import load_sharded

    policy = Policy(tiny_model, pad_id=0)
    with pytest.raises(FileNotFoundError, match="not a sharded checkpoint"):
        load_sharded(policy, tmp_path)


def _initial_weights(model_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).state_dict()
