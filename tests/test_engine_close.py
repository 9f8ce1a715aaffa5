"""Closing one in-process vLLM engine leaves the others (and the trainer's process group) working."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from train.rollout.base import SamplingConfig
from train.rollout.vllm_engine import VLLMEngine

pytestmark = pytest.mark.slow


def test_closing_a_second_engine_keeps_the_shared_one_working(tiny_model, vllm_engine):
    import torch
    from transformers import AutoModelForCausalLM

    # the session's engine may hold weights an earlier test trained: give it the model's own first
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    vllm_engine.update_weights((name, p.detach()) for name, p in model.named_parameters())
    sampling = SamplingConfig(n=1, temperature=0.0, max_new_tokens=4, seed=0)
    before = vllm_engine.generate([[1, 2, 3]], sampling).response_ids
    second = VLLMEngine(tiny_model, dtype="float32", max_model_len=256, seed=0)
    assert second.generate([[1, 2, 3]], sampling).response_ids == before
    second.close()
    assert dist.is_initialized(), "closing an engine destroyed the trainer's process group"
    assert vllm_engine.generate([[1, 2, 3]], sampling).response_ids == before
