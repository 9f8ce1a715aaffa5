"""The CUDA allocator's segments: expandable while the policy computes, fixed from the weight sync (the
engine's wake-up) through generation (train/policy/segments.py). On CPU the switches are recorded, not applied."""

import pytest
import torch

import train.policy.segments as segments
from train.plan import main as plan
from train.policy.fsdp import Policy
from train.rollout.weight_sync import sync_weights


class Engine:
    """Takes merged weights and notes the allocator state it found when it took them."""

    takes_adapters = False
    weight_dtype = torch.float32

    def __init__(self) -> None:
        self.found: list = []

    def update_weights(self, named) -> None:
        self.found.append(segments.expandable_segments())
        for _ in named:
            pass


@pytest.fixture
def fresh_state(monkeypatch):
    monkeypatch.setattr(segments, "_state", None)
    monkeypatch.setattr(segments, "switches", [])


def _loss(mb, log_probs, entropy):
    return -(log_probs * mb.response_mask).sum(), {}


@pytest.mark.slow
def test_expandable_while_training_fixed_while_the_engine_takes_weights(tiny_model, dist_group, fresh_state):
    policy = Policy(
        tiny_model, pad_id=0, torch_compile=False, lora={"rank": 2}
    )  # a first forward in __init__
    assert segments.switches == [], "building the policy switched the allocator (the engine may start after)"
    engine = Engine()
    policy.compute_log_probs([[5, 6]], [[7, 8]])  # the step's log-prob passes: the engine sleeps
    policy.train_step([[5, 6]], [[7, 8]], _loss, with_entropy=False)
    sync_weights(policy, engine)  # the engine wakes and takes the weights
    policy.compute_log_probs([[5, 6]], [[7, 8]])  # the next step's passes
    assert engine.found == [False]
    assert segments.switches == [True, False, True]


def test_the_planner_says_what_it_predicts(capsys):
    plan(["experiment=darling_math", "preset=paper", "gpu=h100"])
    assert "memory per GPU (GiB): allocated (live tensors" in capsys.readouterr().out
