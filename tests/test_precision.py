"""policy.precision=auto: the choice rule, the kept measurement, and bf16 mixed-precision numerics vs fp32."""

import json

import pytest
import torch

from tests.applied_grads import applied_grads
from train.policy import precision as P


def test_choice_rule():
    assert P.choose(fp32_flops=100.0, bf16_flops=400.0) == "bf16"
    assert P.choose(fp32_flops=100.0, bf16_flops=110.0) == "fp32"  # under 1.2x: not worth the rounding
    assert P.choose(fp32_flops=100.0, bf16_flops=1.0) == "fp32"  # AVX2 fallback kernels


def test_explicit_precision_is_kept_and_a_bad_one_is_named():
    choice = P.resolve_precision("fp32", torch.device("cpu"), fp32_matmul="torch")  # nothing to measure
    assert choice.precision == "fp32" and choice.engine_dtype == "float32" and choice.fp32_flops is None
    with pytest.raises(ValueError, match="policy.precision='fp16'"):
        P.resolve_precision("fp16", torch.device("cpu"))


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLPOST_CACHE", str(tmp_path))
    P._measure.cache_clear()
    yield tmp_path
    P._measure.cache_clear()


def test_auto_decides_from_the_best_rates_ever_measured_on_the_machine(fresh_cache):
    choice = P.resolve_precision("auto", torch.device("cpu"))
    kept = json.loads(P._cache_file("cpu").read_text())
    assert kept["fp32_flops"] > 0 and kept["bf16_flops"] > 0
    # the decision weighs bf16 against the fp32 kernel in use (oneDNN's rate where auto picked it): both kept
    assert choice.bf16_flops == kept["bf16_flops"]
    assert choice.fp32_flops == (
        kept["fp32_onednn_flops"] if choice.fp32_kernel == "onednn" else kept["fp32_flops"]
    )
    assert choice.precision == P.choose(choice.fp32_flops, choice.bf16_flops)
    assert (
        "GFLOP/s" in choice.describe() and choice.as_params()["policy.precision_resolved"] == choice.precision
    )
    # rates kept from an idle moment beat this (maybe loaded) start's: the decision and the log use them
    for fp32, bf16, want in ((1e18, 5e18, "bf16"), (5e18, 1e18, "fp32")):
        P._measure.cache_clear()
        P._cache_file("cpu").write_text(json.dumps({"fp32_flops": fp32, "bf16_flops": bf16}))
        auto = P.resolve_precision("auto", torch.device("cpu"))
        assert (auto.precision, auto.fp32_flops, auto.bf16_flops) == (want, fp32, bf16)
    assert auto.engine_dtype == "float32"
    # a kept measurement taken under load is raised to this start's rates
    P._measure.cache_clear()
    P._cache_file("cpu").write_text(json.dumps({"fp32_flops": 1.0, "bf16_flops": 1.0}))
    P.resolve_precision("auto", torch.device("cpu"))
    raised = json.loads(P._cache_file("cpu").read_text())
    assert raised["fp32_flops"] > 1e6 and raised["bf16_flops"] > 1e6


def test_bf16_mixed_precision_loss_and_gradients_match_fp32(tiny_model, dist_group):
    """bf16 compute over fp32 master weights (FSDP2 MixedPrecisionPolicy) against plain fp32.

    Tolerances: bf16 keeps 8 significant bits (relative rounding 2^-9 = 0.2% per operation), and the tiny
    model's 2 layers compound it a few times: per-token log-probs within 0.05 nats (values around -8),
    the loss within 1%, every parameter's gradient within 5% relative L2 error, and the gradient
    directions agree (cosine > 0.998).
    """
    from train.policy.fsdp import Policy

    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 4000, (int(k),), generator=g).tolist() for k in (5, 9, 7, 12)]
    responses = [torch.randint(10, 4000, (int(k),), generator=g).tolist() for k in (6, 11, 3, 9)]
    adv = torch.randn(4, 11, generator=g)
    losses: dict[str, float] = {}

    def loss_fn_for(name):
        def loss_fn(mb, log_probs, entropy):
            loss = -(log_probs * adv[mb.rows, : log_probs.shape[1]] * mb.response_mask).sum() / 30.0
            losses[name] = losses.get(name, 0.0) + float(loss.detach())
            return loss, {}

        return loss_fn

    results = {}
    for name in ("fp32", "bf16"):
        policy = Policy(tiny_model, precision=name, lr=1e-9, grad_clip=1e9, pad_id=0)
        assert policy.precision == name
        lp, _ = policy.compute_log_probs(prompts, responses)
        with applied_grads(policy) as applied:
            policy.train_step(prompts, responses, loss_fn_for(name), with_entropy=False)
        grads = {n: g.float() for n, g in applied.items()}
        results[name] = (lp, grads)
    (lp32, g32), (lp16, g16) = results["fp32"], results["bf16"]
    assert not torch.equal(lp32, lp16), "bf16 ran in fp32: the comparison would prove nothing"
    torch.testing.assert_close(lp16, lp32, rtol=0, atol=0.05)
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=0.01)
    for name, grad in g32.items():
        rel = float((g16[name] - grad).norm() / grad.norm().clamp(min=1e-12))
        assert rel < 0.05, f"{name}: relative gradient error {rel:.3g}"
    flat32 = torch.cat([g.flatten() for g in g32.values()])
    flat16 = torch.cat([g16[n].flatten() for n in g32])
    assert float(torch.nn.functional.cosine_similarity(flat16, flat32, dim=0)) > 0.998


def test_kept_rates_are_per_instruction_set_cap(monkeypatch):
    """Rates measured with the kernels capped at AVX2 are not mixed with the machine's own (the kept best
    would otherwise make an AVX2-capped run pick bf16 from AVX-512 figures)."""
    from train.policy.precision import machine_key

    for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"):
        monkeypatch.delenv(k, raising=False)
    native = machine_key("cpu")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    capped = machine_key("cpu")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert len({native, capped, machine_key("cpu")}) == 3
