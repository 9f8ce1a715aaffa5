"""LoRA (policy.lora, PEFT) on the FSDP2 policy and the one loop: only adapters train, the base stays as it
was, the reference is the base with adapters off, every method runs, checkpoints hold the adapters and
export a PEFT adapter folder (or merged weights) that transformers/PEFT read back."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from train.config import ConfigError, build_config, merge_layers, override_layers

LORA = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}
PROMPTS = [[1, 2, 3, 4], [1, 2, 3, 4], [9, 8, 7]]
RESPONSES = [[5, 6, 7], [8, 9], [4, 4, 4, 4]]


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _nll(mb, log_probs, entropy):
    return -(log_probs * mb.response_mask).sum(), {}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_only_adapters_train_and_the_frozen_base_is_the_reference(tiny_model, dist_group, precision):
    from train.policy.fsdp import Policy

    policy = Policy(tiny_model, precision=precision, lr=1e-2, lora=LORA)
    names = {id(p): n for n, p in policy.model.named_parameters()}
    in_optimizer = [names[id(p)] for g in policy.optimizer.param_groups for p in g["params"]]
    # 2 layers x 3 targets x (A, B)
    assert len(in_optimizer) == 12 and all(".lora_A." in n or ".lora_B." in n for n in in_optimizer)
    base_dtypes = {p.dtype for n, p in policy.model.named_parameters() if not p.requires_grad}
    assert base_dtypes == {torch.bfloat16 if precision == "bf16" else torch.float32}
    assert all(p.requires_grad == (".lora_" in n) for n, p in policy.model.named_parameters())

    reference = Policy(tiny_model, precision=precision, trainable=False)
    ref_lp, _ = reference.compute_log_probs(PROMPTS, RESPONSES)
    start, _ = policy.compute_log_probs(PROMPTS, RESPONSES)
    torch.testing.assert_close(start, ref_lp)  # lora_B starts at zero: the adapted model is the base
    before = {n: _full(p).detach().clone() for n, p in policy.model.named_parameters()}
    for _ in range(2):
        metrics = policy.train_step(PROMPTS, RESPONSES, _nll)
    assert metrics["actor/grad_norm"] > 0
    for name, param in policy.model.named_parameters():
        same = torch.equal(before[name], _full(param).detach())
        assert same != (".lora_" in name), name  # adapters moved, every base weight is bit-identical
    moved, _ = policy.compute_log_probs(PROMPTS, RESPONSES)
    assert (moved - start).abs().max() > 1e-2
    base, _ = policy.frozen_base().compute_log_probs(PROMPTS, RESPONSES)
    torch.testing.assert_close(base, ref_lp)  # adapters off = the base model, no second copy
    after, _ = policy.compute_log_probs(PROMPTS, RESPONSES)
    torch.testing.assert_close(after, moved)  # the adapters are back on after the reference pass


def test_merged_weights_are_the_adapted_model(tiny_model, dist_group):
    """full_weights() under LoRA = base + alpha/r * B A with HF names: a plain HF model loaded with them gives
    the LoRA policy's log-probs (what the merged sync and save_hf_merged hand out)."""
    from transformers import AutoModelForCausalLM

    from train.policy.fsdp import Policy

    policy = Policy(tiny_model, precision="fp32", lr=1e-2, lora=LORA)
    for _ in range(2):
        policy.train_step(PROMPTS, RESPONSES, _nll)
    merged = dict(policy.full_weights())
    plain = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    assert set(merged) == {n for n, _ in plain.named_parameters()}
    plain.load_state_dict(merged, strict=False)
    ids = torch.tensor([PROMPTS[0] + RESPONSES[0]])
    logits = plain(ids).logits[0, len(PROMPTS[0]) - 1 : -1].log_softmax(-1)
    want = logits.gather(-1, torch.tensor(RESPONSES[0])[:, None])[:, 0]
    got, _ = policy.compute_log_probs(PROMPTS[:1], RESPONSES[:1])
    torch.testing.assert_close(got[0], want, atol=1e-5, rtol=1e-5)


def test_target_modules_that_match_nothing_are_refused_in_one_line(tiny_model, dist_group):
    from train.policy.fsdp import Policy
    from train.policy.lora import LoraError

    with pytest.raises(LoraError) as err:
        Policy(tiny_model, lora={"rank": 4, "target_modules": ["qkv_proj"]})
    msg = str(err.value)
    assert "\n" not in msg and "policy.lora.target_modules=['qkv_proj']" in msg and "q_proj" in msg


def test_lora_config_keys_and_their_errors():
    cfg = build_config(overrides=["policy.lora.rank=16", "policy.lora.target_modules=[q_proj,v_proj]"])
    assert cfg.policy.lora.rank == 16 and list(cfg.policy.lora.target_modules) == ["q_proj", "v_proj"]
    assert build_config().policy.lora.rank == 0  # off by default
    for bad, key in [
        ("policy.lora.rank=-1", "policy.lora.rank=-1"),
        ("policy.lora.dropout=1.0", "policy.lora.dropout=1.0"),
        ("policy.lora.alpha=0", "policy.lora.alpha=0"),
    ]:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            build_config(overrides=["policy.lora.rank=8", bad])
    with pytest.raises(ConfigError, match="policy.lora.target_modules"):
        build_config(overrides=["policy.lora.rank=8", "policy.lora.target_modules=[]"])


def _grpo_cfg(tiny_model, run_dir, *extra):
    return build_config(
        overrides=[
            f"model.path={tiny_model}", f"run_dir={run_dir}", "track=false", "total_steps=2", "save_every=0",
            "reward._target_=tests.rewards_for_tests.VowelShareReward", "data.prompts_per_step=2",
            "data.builtin_size=8", "rollout.n=3", "rollout.max_new_tokens=6", "optim.lr=1e-2",
            "rollout.engine._target_=train.rollout.hf_engine.HFEngine", "policy.lora.rank=4",
            "policy.lora.target_modules=[q_proj,v_proj]", *extra,
        ]
    )  # fmt: skip


@pytest.mark.slow
def test_grpo_with_kl_loss_uses_the_base_as_reference(tiny_model, dist_group, tmp_path, monkeypatch):
    import mlflow

    from train.policy.fsdp import FrozenBase
    from train.stages.grpo import GRPOTrainer

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    cfg = _grpo_cfg(tiny_model, tmp_path / "run", "algorithm.use_kl_loss=true", "algorithm.kl_loss_type=k3")
    cfg.track, cfg.run_name = True, "lora-kl"
    trainer = GRPOTrainer(cfg)
    params = mlflow.MlflowClient().get_run(trainer.run_id).data.params
    assert params["rollout/weight_sync"] == "merged" and params["policy.lora.rank"] == "4"
    assert isinstance(trainer.ref, FrozenBase) and trainer.ref.policy is trainer.policy
    first = trainer.step(1)
    second = trainer.step(2)
    assert first["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # adapters start as the identity
    assert second["actor/kl_loss"] > 0  # the adapted policy moved away from its own base
    # the HF engine takes no adapters: merged weights, all of them, counted
    assert second["rollout/weight_sync_adapter"] == 0.0
    n_weights = sum(t.numel() for _, t in trainer.policy.full_weights())
    assert second["perf/weight_sync_bytes"] == trainer.engine.dtype.itemsize * n_weights
    trainer.close()


def _stage_cfg(stage, tiny_model, run_dir, *extra):
    cfg = merge_layers(
        OmegaConf.structured(stage.schema),
        override_layers(
            [
                f"model.path={tiny_model}", f"run_dir={run_dir}", "total_steps=2", "save_every=0", "track=false",
                "data.builtin_size=16", "data.batch_size=4", "optim.lr=1e-2", "seed=3",
                "policy.lora.rank=4", "policy.lora.target_modules=[q_proj,v_proj]", *extra,
            ]
        ),
    )  # fmt: skip
    stage.validate(cfg)
    return cfg


METHODS = {
    "grpo": [],
    "rloo": ["algorithm.adv_estimator=rloo"],
    "remax": ["algorithm.adv_estimator=remax"],
    "darling": [
        "data.train_path=builtin:multi_answer", "reward._target_=train.rewards.darling_reward.DarlingReward",
        "reward.judge._target_=train.diversity.judges.AnswerAwareJudge", "algorithm.adv_estimator=grpo",
    ],
}  # fmt: skip


def _adapters_moved_and_base_kept(policy, before):
    moved = kept = 0
    for name, param in policy.model.named_parameters():
        same = torch.equal(before[name], _full(param).detach())
        if ".lora_" in name:
            moved += not same
        else:
            kept += same
            assert same, name
    return moved, kept


@pytest.mark.slow
@pytest.mark.parametrize("method", [*METHODS, "sft", "dpo"])
def test_every_method_trains_adapters_only(method, tiny_model, dist_group, tmp_path):
    """One loop, every method (GRPO with registered estimators, DARLING, SFT, DPO) under policy.lora."""
    from train.stages.dpo import DPOStage, DPOTrainer
    from train.stages.grpo import GRPOTrainer
    from train.stages.sft import SFTStage, SFTTrainer

    if method == "sft":
        trainer = SFTTrainer(_stage_cfg(SFTStage(), tiny_model, tmp_path / "run"))
    elif method == "dpo":
        trainer = DPOTrainer(_stage_cfg(DPOStage(), tiny_model, tmp_path / "run", "beta=0.5"))
    else:
        cfg = _grpo_cfg(tiny_model, tmp_path / "run", *METHODS[method])
        cfg.run_name = method
        trainer = GRPOTrainer(cfg)
    before = {n: _full(p).detach().clone() for n, p in trainer.policy.model.named_parameters()}
    metrics = trainer.step(1)
    metrics.update(trainer.step(2))
    grad_norm = metrics.get("actor/grad_norm", metrics.get("sft/grad_norm", metrics.get("dpo/grad_norm")))
    assert grad_norm is None or math.isfinite(grad_norm)
    moved, kept = _adapters_moved_and_base_kept(trainer.policy, before)
    assert moved > 0 and kept > 0
    if method == "dpo":
        assert metrics["dpo/rewards_margin"] != pytest.approx(0.0, abs=1e-7)  # moved from the base reference
    trainer.close()


@pytest.mark.slow
def test_checkpoint_holds_adapters_and_exports_a_peft_folder_or_merged_weights(
    tiny_model, dist_group, tmp_path
):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from train import checkpoint as ckpt
    from train.policy.fsdp import Policy

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    policy = Policy(tiny_model, precision="fp32", lr=1e-2, lora=LORA)
    for _ in range(2):
        policy.train_step(PROMPTS, RESPONSES, _nll)
    want, _ = policy.compute_log_probs(PROMPTS, RESPONSES)
    adapter_step = ckpt.save_checkpoint(
        tmp_path / "a", 2, policy, tokenizer, {"step": 2}, source_model=tiny_model
    )
    merged_step = ckpt.save_checkpoint(
        tmp_path / "m", 2, policy, tokenizer, {"step": 2}, source_model=tiny_model, hf_merged=True
    )
    hf = ckpt.hf_dir(adapter_step)
    assert (hf / "adapter_config.json").is_file() and (hf / "adapter_model.safetensors").is_file()
    assert not (hf / "model.safetensors").exists()
    from evals.common.checkpoints import resolve

    assert [r.path for r in resolve(str(adapter_step))] == [hf.resolve()]  # the evals take the step
    state_bytes = sum(f.stat().st_size for f in (adapter_step / "state").rglob("*") if f.is_file())
    base_bytes = (tiny_model / "model.safetensors").stat().st_size
    assert state_bytes < base_bytes / 5  # adapters + their AdamW state, not the frozen base

    def log_probs(model):
        out = []
        for p, r in zip(PROMPTS, RESPONSES):
            lp = model(torch.tensor([p + r])).logits[0, len(p) - 1 : -1].log_softmax(-1)
            out.append(lp.gather(-1, torch.tensor(r)[:, None])[:, 0])
        return out

    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    with torch.no_grad():
        for got_model in (
            PeftModel.from_pretrained(base, str(hf)),  # transformers + PEFT read the adapter folder
            AutoModelForCausalLM.from_pretrained(ckpt.hf_dir(merged_step), dtype=torch.float32),
        ):
            for row, lp in enumerate(log_probs(got_model)):
                torch.testing.assert_close(lp, want[row, : len(lp)], atol=1e-5, rtol=1e-5)

    # resume: a fresh LoRA policy from the base files + the adapters and AdamW state of state/
    fresh = Policy(tiny_model, precision="fp32", lr=1e-2, lora=LORA)
    ckpt.restore_policy(adapter_step, fresh, ckpt.load_trainer_state(adapter_step), 0)
    got, _ = fresh.compute_log_probs(PROMPTS, RESPONSES)
    torch.testing.assert_close(got, want)
    policy.train_step(PROMPTS, RESPONSES, _nll)
    fresh.train_step(PROMPTS, RESPONSES, _nll)  # same optimizer state: the same next step
    torch.testing.assert_close(
        fresh.compute_log_probs(PROMPTS, RESPONSES)[0], policy.compute_log_probs(PROMPTS, RESPONSES)[0]
    )


@pytest.mark.slow
@pytest.mark.heavy  # make test-all: a long integration run (docs/commands.md, Tests)
def test_two_gloo_ranks_train_the_adapters_as_one_and_resume_at_one(tiny_model, tmp_path):
    """FSDP2 over 2 gloo ranks: the adapters after one step equal one rank's on the whole batch, the frozen
    base is the reference, and the 2-rank checkpoint (adapters + AdamW state, sharded) resumes at 1 rank."""
    from tests.torchrun import run_worker

    run_worker("lora_worker.py", 2, str(tiny_model), str(tmp_path / "two"), "step")
    run_worker("lora_worker.py", 1, str(tiny_model), str(tmp_path / "one"), "step")
    run_worker("lora_worker.py", 1, str(tiny_model), str(tmp_path / "two"), "load")
    two, one = torch.load(tmp_path / "two" / "step-2.pt"), torch.load(tmp_path / "one" / "step-1.pt")
    loaded = torch.load(tmp_path / "two" / "load-1.pt")
    assert len(two["adapters"]) == 12
    for key, value in two["adapters"].items():
        torch.testing.assert_close(value, one["adapters"][key], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(loaded["adapters"][key], value)
    torch.testing.assert_close(two["base"], two["reference"])
    state_two, state_loaded = two["optim"]["state"], loaded["optim"]["state"]
    assert set(state_two) == set(state_loaded) and all(".lora_" in k for k in state_two)
    for key in state_two:
        torch.testing.assert_close(state_loaded[key]["exp_avg_sq"], state_two[key]["exp_avg_sq"])


def test_an_adapter_folder_as_model_path_is_refused_with_the_fix(tmp_path):
    from infra.checkpoint.adapter import write_adapter_folder
    from infra.models import ModelNotFoundError, resolve_model_path
    from train.policy.lora import LoraSettings

    folder = write_adapter_folder(tmp_path / "hf", {}, LoraSettings(rank=4).peft_config(), tmp_path)
    with pytest.raises(ModelNotFoundError, match="LoRA adapter folder.*save_hf_merged=true"):
        resolve_model_path(str(folder))


def test_a_lora_stage_feeding_another_must_export_merged_weights(tmp_path, monkeypatch):
    """make pipeline: a LoRA stage's hf/ is an adapter folder, which the next stage cannot start from; the
    plan refuses it in one line naming the key, and accepts it with save_hf_merged=true."""
    from orchestration.pipeline import plan
    from tests.test_pipeline import _tiny_stages, _write_experiment

    monkeypatch.setattr("train.config.EXPERIMENTS_DIR", tmp_path)
    monkeypatch.setenv("RLPOST_EXPERIMENTS_DIR", str(tmp_path))  # as tests/test_pipeline.py's fixture
    _write_experiment(tmp_path, "pipe", _tiny_stages(tmp_path / "model", tmp_path / "out"))
    with pytest.raises(ConfigError, match=r"sft.save_hf_merged=true"):
        plan("pipe", ["sft.policy.lora.rank=4"])
    stages = plan("pipe", ["sft.policy.lora.rank=4", "sft.save_hf_merged=true"])
    assert stages[-1].cfg.model.path.endswith("/hf")


def test_vllm_engine_arguments_for_adapters():
    """vLLM takes adapters up to max_lora_rank, one of its fixed sizes: the smallest that holds the rank."""
    from train.rollout.vllm_engine import engine_kwargs, lora_slot_rank

    plain = engine_kwargs("cpu", "float32", 0, 256, 1)
    assert "enable_lora" not in plain
    kwargs = engine_kwargs("cuda", "bfloat16", 0, 256, 1, lora_rank=20)
    assert kwargs["enable_lora"] and kwargs["max_loras"] == 1 and kwargs["max_lora_rank"] == 32
    assert [lora_slot_rank(r) for r in (1, 4, 16, 64, 300)] == [1, 8, 16, 64, 320]
    with pytest.raises(ValueError, match="policy.lora.rank=600"):
        lora_slot_rank(600)


def test_gradient_checkpointing_trains_the_adapters_as_without(tiny_model, dist_group):
    """Recomputed layers (use_reentrant=False) give the adapters the same gradient though no input of the
    checkpointed blocks requires grad (the embedding is frozen)."""
    from train.policy.fsdp import Policy

    steps = []
    for checkpointing in (False, True):
        policy = Policy(
            tiny_model, precision="fp32", lr=1e-2, lora=LORA, gradient_checkpointing=checkpointing
        )
        metrics = policy.train_step(PROMPTS, RESPONSES, _nll)
        steps.append((metrics["actor/grad_norm"], dict(policy.adapter_weights())))
    assert steps[0][0] > 0 and steps[1][0] == pytest.approx(steps[0][0], rel=1e-5)
    for key, value in steps[0][1].items():
        torch.testing.assert_close(steps[1][1][key], value)
