"""LoRA with the real vLLM engine: each step syncs only the adapter (a new LoRARequest), and the engine's
greedy answers are then those of the HF policy with the adapter merged; the evals serve a LoRA checkpoint's
adapter folder (merged onto its base)."""

from __future__ import annotations

import pytest
import torch

from train.config import build_config

pytestmark = pytest.mark.slow

PROMPTS = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10]]


@pytest.fixture(scope="module")
def lora_engine(tiny_model, dist_group):
    from train.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(tiny_model, dtype="float32", max_model_len=256, seed=0, lora_rank=4)
    yield engine
    engine.close()


def _hf_greedy(model, prompts, n):
    out = []
    for ids in prompts:
        gen = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0)
        out.append(gen[0, len(ids) :].tolist())
    return out


def test_adapter_sync_reaches_vllm_and_matches_the_merged_policy(tiny_model, lora_engine, tmp_path):
    from transformers import AutoModelForCausalLM

    from train.rollout.base import SamplingConfig
    from train.stages.grpo import GRPOTrainer

    cfg = build_config(
        overrides=[
            f"model.path={tiny_model}", f"run_dir={tmp_path / 'run'}", "track=false", "total_steps=2",
            "save_every=0", "reward._target_=tests.rewards_for_tests.VowelShareReward", "data.prompts_per_step=2",
            "data.builtin_size=8", "rollout.n=3", "rollout.max_new_tokens=6", "optim.lr=5e-2", "policy.precision=fp32",
            "policy.lora.rank=4", "policy.lora.alpha=16", "policy.lora.target_modules=[q_proj,v_proj,down_proj]",
        ]
    )  # fmt: skip
    cfg.run_name = "lora-vllm"
    trainer = GRPOTrainer(cfg, engine=lora_engine)
    metrics = trainer.step(1)
    assert metrics["rollout/weight_sync_adapter"] == 1.0
    assert metrics["perf/weight_sync_bytes"] == trainer.policy.adapter_bytes()  # adapters only, fp32
    assert metrics["perf/weight_sync_bytes"] < 0.05 * sum(
        t.numel() * 4 for _, t in trainer.policy.full_weights()
    )
    assert lora_engine.lora_request is not None
    greedy = SamplingConfig(n=1, temperature=0.0, max_new_tokens=8)
    after = lora_engine.generate(PROMPTS, greedy).response_ids
    merged = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    merged.load_state_dict(dict(trainer.policy.full_weights()), strict=False)
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    assert after == _hf_greedy(merged, PROMPTS, 8)
    assert after != _hf_greedy(base, PROMPTS, 8)  # the adapter changed what the engine generates
    trainer.close()


def test_evals_serve_a_lora_checkpoint_merged_onto_its_base(tiny_model, dist_group, vllm_engine, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from evals.common.checkpoints import resolve
    from evals.common.generation import VLLMGenerator
    from train import checkpoint as ckpt
    from train.policy.fsdp import Policy
    from train.rollout.base import SamplingConfig

    policy = Policy(
        tiny_model, precision="fp32", lr=5e-2, lora={"rank": 4, "alpha": 16, "target_modules": ["q_proj"]}
    )
    for _ in range(3):
        policy.train_step(
            PROMPTS, [[5, 6, 7], [8, 9]], lambda mb, lp, e: (-(lp * mb.response_mask).sum(), {})
        )
    step = ckpt.save_checkpoint(
        tmp_path / "run",
        3,
        policy,
        AutoTokenizer.from_pretrained(tiny_model),
        {"step": 3},
        source_model=tiny_model,
    )
    (ref,) = resolve(str(step))
    assert (ref.path / "adapter_config.json").is_file()
    gen = VLLMGenerator(engine=vllm_engine)
    gen.load(ref.path)
    got = gen.engine.generate(PROMPTS, SamplingConfig(n=1, temperature=0.0, max_new_tokens=8)).response_ids
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    want = _hf_greedy(PeftModel.from_pretrained(base, str(ref.path)).merge_and_unload(), PROMPTS, 8)
    assert got == want


@pytest.mark.heavy  # make test-all: a long integration run (docs/commands.md, Tests)
def test_classmate_trains_adapters_with_merged_sync_into_a_plain_engine(tiny_model, vllm_engine, tmp_path):
    """Classmate-CoT (GDPO, token-level classmate advantages) under LoRA, rolled out by a vLLM engine started
    without adapters: the merged weights are streamed in and the engine then generates the merged policy's
    greedy answers."""
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    from infra.models import build_tiny_model
    from train.rollout.base import SamplingConfig
    from train.stages.grpo import GRPOTrainer

    classmate = build_tiny_model(tmp_path / "classmate", seed=7)
    cfg = build_config(
        overrides=[
            f"model.path={tiny_model}", f"run_dir={tmp_path / 'run'}", "track=false", "total_steps=1",
            "save_every=0", "data.prompts_per_step=2", "data.builtin_size=16", "rollout.n=4",
            "rollout.max_new_tokens=12", "optim.lr=5e-2", "policy.precision=fp32", "policy.lora.rank=4",
        ]
    )  # fmt: skip
    cfg.algorithm.adv_estimator = "gdpo"
    cfg.reward = OmegaConf.create(
        {
            "_target_": "tests.test_classmate_train.ParityGradedClassmateReward",
            "think_start": None, "think_end": " ", "use_classmate_main_cond": "always", "max_new_tokens": 6,
            "classmates": [{"_target_": "train.rewards.classmate_reward.EngineClassmate",
                            "model_path": str(classmate), "max_model_len": 512}],
        }
    )  # fmt: skip
    cfg.run_name = "lora-classmate"
    trainer = GRPOTrainer(cfg, engine=vllm_engine)
    metrics = trainer.step(1)
    assert metrics["rollout/weight_sync_adapter"] == 0.0
    assert metrics["perf/weight_sync_bytes"] == 4 * sum(t.numel() for _, t in trainer.policy.full_weights())
    merged = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    merged.load_state_dict(dict(trainer.policy.full_weights()), strict=False)
    got = vllm_engine.generate(PROMPTS, SamplingConfig(n=1, temperature=0.0, max_new_tokens=8)).response_ids
    assert got == _hf_greedy(merged, PROMPTS, 8)
    trainer.close()
