"""policy.fp32_matmul: fp32 linear layers through oneDNN (train/policy/cpu_matmul.py).

The oneDNN path must give fp32 results (not bf16/TF32-rounded ones), the same gradients as F.linear to
fp32 rounding, actually run in oneDNN (recorded at the dispatcher, so a silent fallback to MKL fails), and
be chosen by measurement, with a bad value named in one line.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from train.policy import cpu_matmul as C
from train.policy import precision as P

pytestmark = pytest.mark.skipif(not C.onednn_available(), reason="this torch build has no oneDNN")


class OpLog(TorchDispatchMode):
    """Names of the aten/mkldnn ops dispatched inside the block (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm())


@pytest.mark.parametrize("with_bias", [True, False])
def test_forward_and_gradients_match_f_linear(with_bias):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 37, 96, generator=g, requires_grad=True)
    w = torch.randn(160, 96, generator=g, requires_grad=True)
    b = torch.randn(160, generator=g, requires_grad=True) if with_bias else None
    up = torch.randn(3, 37, 160, generator=g)
    ours = C.onednn_linear(x, w, b)
    (ours * up).sum().backward()
    got = [t.grad.clone() for t in (x, w, b) if t is not None]
    for t in (x, w, b):
        if t is not None:
            t.grad = None
    ref = torch.nn.functional.linear(x, w, b)
    (ref * up).sum().backward()
    want = [t.grad for t in (x, w, b) if t is not None]
    assert ours.shape == ref.shape and _rel(ours, ref) < 1e-6
    for a, e in zip(got, want):
        assert a.shape == e.shape and _rel(a, e) < 1e-6


def test_products_are_fp32_not_reduced_precision():
    """Against fp64: the relative error stays at fp32's ~1e-7 scale; a bf16 product errs ~1e-3."""
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(256, 2048, generator=g), torch.randn(512, 2048, generator=g)
    exact = x.double() @ w.double().t()
    err = _rel(C.onednn_linear(x, w).double(), exact)
    bf16_err = _rel((x.bfloat16() @ w.bfloat16().t()).double(), exact)
    assert err < 1e-6 < 1e-4 < bf16_err


def test_empty_batch_and_other_dtypes_take_f_linear():
    w = torch.randn(8, 4, requires_grad=True)
    assert C.onednn_linear(torch.randn(0, 4), w).shape == (0, 8)
    xb = torch.randn(2, 4).bfloat16()
    assert C.onednn_linear(xb, w.detach().bfloat16()).dtype == torch.bfloat16


def test_routed_model_runs_its_products_in_onednn(tiny_model):
    """Every plain Linear is swapped (same state dict), logits and gradients agree with the unrouted
    model, and the dispatcher sees no MKL product for a linear: 3 oneDNN calls each (y, dx, dW)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation="sdpa")
    routed = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation="sdpa")
    linears = sum(type(m) is torch.nn.Linear for m in routed.modules())
    assert C.route_linears(routed) == linears > 0
    assert all(type(m) is not torch.nn.Linear for m in routed.modules())
    assert routed.state_dict().keys() == plain.state_dict().keys()
    ids = torch.randint(10, 4000, (2, 11), generator=torch.Generator().manual_seed(2))
    with OpLog() as log:
        out = routed(input_ids=ids).logits
        out.float().logsumexp(-1).sum().backward()
    ref = plain(input_ids=ids).logits
    ref.float().logsumexp(-1).sum().backward()
    assert _rel(out, ref) < 1e-5
    for (name, p), (_, q) in zip(routed.named_parameters(), plain.named_parameters()):
        assert _rel(p.grad, q.grad) < 1e-4, name
    assert log.ops.count("mkldnn._linear_pointwise") == 3 * linears
    assert not {"aten.mm", "aten.addmm", "aten.bmm"} & set(log.ops), sorted(set(log.ops))


def test_kernel_choice_is_measured_and_bad_values_are_named():
    assert C.pick_kernel("auto", torch_flops=200.0, onednn_flops=480.0) == "onednn"
    assert C.pick_kernel("auto", torch_flops=200.0, onednn_flops=220.0) == "torch"  # under 1.2x: noise
    assert C.pick_kernel("torch", 200.0, 480.0) == "torch" and C.pick_kernel("onednn", 500.0, 1.0) == "onednn"
    with pytest.raises(ValueError, match="policy.fp32_matmul='mkl'"):
        C.pick_kernel("mkl", 1.0, 1.0)
    with pytest.raises(ValueError, match="policy.fp32_matmul='blas'"):
        P.resolve_precision("fp32", torch.device("cpu"), "blas")
    explicit = P.resolve_precision("fp32", torch.device("cpu"), "torch")
    assert explicit.fp32_kernel == "torch" and explicit.fp32_flops is None and not explicit.onednn_linears


def test_auto_weighs_bf16_against_the_fp32_kernel_in_use(tmp_path, monkeypatch):
    """Kept rates decide: oneDNN 2x torch.mm makes fp32 the faster choice against a 1.5x bf16."""
    import json

    monkeypatch.setenv("RLPOST_CACHE", str(tmp_path))
    P._measure.cache_clear()
    try:
        P._cache_file("cpu").parent.mkdir(parents=True, exist_ok=True)
        rates = {"fp32_flops": 1e18, "bf16_flops": 1.5e18, "fp32_onednn_flops": 2e18}
        P._cache_file("cpu").write_text(json.dumps(rates))
        auto = P.resolve_precision("auto", torch.device("cpu"))
        assert (auto.precision, auto.fp32_kernel, auto.fp32_flops, auto.fp32_torch_flops) == (
            "fp32",
            "onednn",
            2e18,
            1e18,
        )
        assert auto.onednn_linears and "in onednn (torch.mm 1000000000" in auto.describe()
        assert auto.as_params()["policy.fp32_matmul_resolved"] == "onednn"
        kept_torch = P.resolve_precision("auto", torch.device("cpu"), "torch")
        assert (kept_torch.precision, kept_torch.fp32_kernel) == ("bf16", "torch")
    finally:
        P._measure.cache_clear()
