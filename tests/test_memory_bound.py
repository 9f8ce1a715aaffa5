"""GPU memory properties of the policy, proven on CPU with the live-tensor tracker (train/policy/memory.py).

A micro-batch's vocabulary-sized tensors (logits, their gradient, fp32 temporaries) are bounded by the
positions the model keeps (at most the token budget, or one over-long sequence) times the vocabulary,
whatever the rows' lengths: a long-tailed batch (one 1024-token response among fifteen of 16) peaks no
higher than the same tokens spread evenly. Log-probs and entropy equal the old (b, R, V) formulation.
"""

from __future__ import annotations

import pytest
import torch

from train.policy.batching import collate, collate_packed, collate_shared
from train.policy.logprobs import entropy_from_logits, entropy_from_logits_chunked, logprobs_from_logits
from train.policy.memory import LiveTensorBytes, peak_tensor_bytes
from train.policy.packed_logprobs import (
    CHUNK_ELEMENTS,
    chunk_slices,
    kept_entropy,
    kept_log_probs,
    kept_log_probs_and_entropy,
    row_kernels,
    vocab_peak_bytes,
)

MB = 2**20


# ---- the tracker -----------------------------------------------------------------------------
def test_tracker_counts_live_storages_once_and_frees_them():
    def work():
        a = torch.zeros(1000)  # 4000 B
        b = torch.zeros(2000)  # 8000 B: 12000 live
        del a  # 8000
        view = b.view(-1)  # same storage: nothing new
        c = torch.ones(500)  # 2000 B: 10000 live
        return view, c

    (view, c), peak = peak_tensor_bytes(work)
    assert peak == 12_000
    with LiveTensorBytes() as m:
        x = torch.zeros(250)
        assert m.current == 1000
        x.untyped_storage().resize_(0)  # FSDP2 frees unsharded parameters this way
        assert m.current == 0
        x.untyped_storage().resize_(4000)
        assert m.current == 4000 and m.peak == 4000
        del x
        assert m.current == 0


def test_tracker_sees_the_backward():
    w = torch.randn(64, 64, requires_grad=True)

    def step():
        (w @ w).relu().sum().backward()

    _, peak = peak_tensor_bytes(step)
    # forward keeps w@w and relu's output (2 x 16 KiB); backward adds the gradients (w.grad among them)
    assert 3 * 64 * 64 * 4 <= peak <= 8 * 64 * 64 * 4


# ---- kept-position log-probs equal the old (b, R, V) formulation --------------------------------
def _layouts():
    g = torch.Generator().manual_seed(0)
    prompts = [[1, 2, 3], [1, 2, 3], [4, 5], [1, 2, 3], [4, 5]]
    responses = [torch.randint(6, 40, (n,), generator=g).tolist() for n in (4, 1, 6, 0, 3)]
    rows = list(range(5))
    yield "plain", collate(prompts, responses, rows, pad_id=0)
    yield "shared", collate_shared(prompts, responses, [[0, 1, 3], [2, 4]], pad_id=0)
    yield "packed", collate_packed(prompts, responses, rows, pad_id=0)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kept_log_probs_and_entropy_equal_the_padded_formulation(dtype, compiled):
    """Eager kernels: the same log-probs bit for bit as the (b, R, V) formulation; compiled (fused loops, fp64
    sums): within fp32 rounding. Entropy (its own rounding) within fp32 rounding either way; gradients as exact
    as one rounding of the fp32 result allows."""
    kernels = row_kernels(compiled)
    same = torch.equal if not compiled else lambda a, b: torch.allclose(a, b, rtol=0, atol=4e-6)

    g = torch.Generator().manual_seed(1)
    for name, mb in _layouts():
        U, V = mb.input_ids.shape[0], 40
        K = mb.keep.numel()
        logits = (torch.randn(U, K, V, generator=g) * 4).to(dtype)
        logits[0, 0, 7] = float("-inf")  # a masked vocabulary entry stays finite in both
        unit = mb.gather_unit if mb.gather_unit is not None else torch.arange(U)[:, None]
        col = mb.gather_col if mb.gather_col is not None else torch.arange(K)[None, :]
        weights = torch.randn(mb.response_ids.shape, generator=g)

        old_in = logits.clone().requires_grad_(True)
        old = logprobs_from_logits(old_in[unit, col], mb.response_ids)  # the (b, R, V) copy
        (old * weights).sum().backward()
        new_in = logits.clone().requires_grad_(True)
        new = kept_log_probs(new_in, mb.kept_index(K), mb.response_ids, chunk_size=3, kernels=kernels)
        (new * weights).sum().backward()
        assert same(new, old), name
        assert torch.isfinite(new).all()
        if dtype == torch.float32:  # shared prompts: first-token gradients summed in another order
            torch.testing.assert_close(new_in.grad, old_in.grad, rtol=0, atol=1e-6)
        else:  # bf16 gradients: one rounding of the fp32 sum (the old code rounded each row, then summed)
            exact = logits.float().requires_grad_(True)
            (logprobs_from_logits(exact[unit, col], mb.response_ids) * weights).sum().backward()
            new_err = (new_in.grad.float() - exact.grad).abs().max()
            assert new_err <= (old_in.grad.float() - exact.grad).abs().max(), name
            torch.testing.assert_close(new_in.grad.float(), exact.grad, rtol=2**-8, atol=1e-6)

        old_h = entropy_from_logits_chunked(logits[unit, col])
        h_metric = kept_entropy(logits, mb.kept_index(K), with_grad=False, chunk_size=3, kernels=kernels)
        torch.testing.assert_close(h_metric, old_h, rtol=1e-5, atol=1e-5)
        old_e = logits.clone().requires_grad_(True)
        (entropy_from_logits(old_e[unit, col]) * weights).sum().backward()  # the entropy in the loss
        new_e = logits.clone().requires_grad_(True)
        new_h = kept_entropy(new_e, mb.kept_index(K), with_grad=True, chunk_size=3, kernels=kernels)
        new_lp = kept_log_probs(new_e, mb.kept_index(K), mb.response_ids, chunk_size=3, kernels=kernels)
        (new_h * weights).sum().backward(retain_graph=True)
        assert torch.equal(new_e, logits), "the backward changed the saved logits"
        (new_lp * 0).sum().backward()  # the log-probs' backward still finds its saved logits intact
        assert same(new_h, h_metric), name  # the same kernel with and without grad
        assert torch.isfinite(new_e.grad).all() and new_e.grad[0, 0, 7] == 0  # p = 0 at a -inf logit
        tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 2**-7, "atol": 1e-3}
        torch.testing.assert_close(new_e.grad.float(), old_e.grad.float(), **tol)

        # one pass for both (the update's entropy metric): the same log-probs and gradient, the same entropy
        both_in = logits.clone().requires_grad_(True)
        lp, h = kept_log_probs_and_entropy(
            both_in, mb.kept_index(K), mb.response_ids, chunk_size=3, kernels=kernels
        )
        (lp * weights).sum().backward()
        assert same(lp, new) and torch.equal(both_in.grad, new_in.grad), name
        assert not h.requires_grad and torch.isfinite(h).all(), name
        assert same(h, h_metric), name


def _reference_fp64(logits, index, labels, weights, with_entropy=True):
    """log-probs, entropy, and the gradient of sum(weights x (log-probs + entropy)) (without the entropy when
    not `with_entropy`), all in fp64."""
    z = logits.double().requires_grad_(True)
    flat = z.reshape(-1, z.shape[-1])
    logp = torch.log_softmax(flat, dim=-1)
    lp = logp[index, labels]
    p = logp.exp()
    h = -(p * torch.where(p > 0, logp, 0.0)).sum(-1)[index]
    (weights * (lp + h if with_entropy else lp)).sum().backward()
    return lp, h, z.grad


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_row_kernels_match_fp64_on_a_real_vocabulary(compiled):
    """Real vocabulary width (49152), logits spread as a trained model's (one dominant token, p near 1, where
    a bf16 sum of -p g and g would lose 1 - p), positions shared by several tokens (the shared-prompt layout's
    first tokens), chunks that split the rows unevenly: log-probs, entropy and the gradient of both in the
    loss match an fp64 reference within fp32 rounding (bf16 roundings for the bf16 gradient)."""
    kernels = row_kernels(compiled)
    g = torch.Generator().manual_seed(3)
    N, V = 7, 49_152
    logits32 = torch.randn(N, V, generator=g) * 2
    logits32[:, 11] += 17  # p(11) ~ 0.98: the label entry's gradient g (1 - p) is small beside g
    logits32[2, 100:200] = float("-inf")
    index = torch.tensor(
        [0, 0, 0, 1, 2, 3, 4, 5, 6, 6]
    )  # position 0: three tokens, two of them the same label
    labels = torch.tensor([11, 11, 5, 11, 7, 11, 300, 11, 11, 9])
    weights = torch.randn(index.shape, generator=g)
    for dtype in (torch.float32, torch.bfloat16):
        logits = logits32.to(dtype)
        want_lp, want_h, want_grad = _reference_fp64(logits, index, labels, weights)
        x = logits.clone().requires_grad_(True)
        lp = kept_log_probs(x, index, labels, chunk_size=3, kernels=kernels)
        h = kept_entropy(x, index, with_grad=True, chunk_size=3, kernels=kernels)
        (weights * (lp + h)).sum().backward()
        torch.testing.assert_close(lp.double(), want_lp, rtol=0, atol=4e-6)
        torch.testing.assert_close(h.double(), want_h, rtol=0, atol=4e-6)
        # fp32 itself knows 1 - p only to a few 2^-24: an absolute error of a few 2^-23 x |g| at the labels
        fp32_floor = 32 * 2**-23 * weights.abs().max().item()
        # bf16: the log-prob's and the entropy's gradients each rounded once, then summed by autograd
        grad_tol = 2**-7 if dtype == torch.bfloat16 else 1e-5
        torch.testing.assert_close(x.grad.double(), want_grad, rtol=grad_tol, atol=fp32_floor)

        # the log-prob gradient alone at the labels with p near 1 (row 0: two tokens' g (1 - p) summed): one
        # rounding of the fp32 value, 2^-8 relative in bf16; a bf16 -p g plus g would be off by up to 2^-8 |g|,
        # several % of g (1 - p) here
        want_lp_grad = _reference_fp64(logits, index, labels, weights, with_entropy=False)[2]
        y = logits.clone().requires_grad_(True)
        (weights * kept_log_probs(y, index, labels, chunk_size=3, kernels=kernels)).sum().backward()
        one_rounding = 2**-8 if dtype == torch.bfloat16 else 2**-24  # unit roundoff: 8 significant bits
        for row in (0, 1, 3, 5, 6):
            want = want_lp_grad[row, 11]
            err = abs(y.grad[row, 11].double() - want)
            assert err <= one_rounding * abs(want) + fp32_floor, (dtype, row, err.item(), want.item())


def test_vocab_peak_formula_counts_logits_gradient_and_chunks():
    V = 49_152
    rows = CHUNK_ELEMENTS // V + 1  # a one-row tail joins the last chunk
    assert vocab_peak_bytes(1000, V, 2, backward=False) == 1000 * V * 2 + 4 * rows * V * 4
    assert vocab_peak_bytes(1000, V, 2, backward=True) == 2 * 1000 * V * 2 + 4 * rows * V * 4
    assert (
        vocab_peak_bytes(1000, V, 2, backward=True, entropy_grad=True) == 3 * 1000 * V * 2 + 4 * rows * V * 4
    )


# ---- the policy on a long-tailed batch: peak bounded by kept positions x vocabulary --------------
def _batch(lengths: list[int]):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 4000, (32,), generator=g).tolist() for _ in range(2)]
    responses = [torch.randint(10, 4000, (n,), generator=g).tolist() for n in lengths]
    return [p for p in prompts for _ in range(8)], responses  # 2 groups of 8 (a GRPO batch)


LONG = [1024] + [16] * 15
EVEN = [sum(LONG) // 16] * 16


def _peaks(policy, prompts, responses):
    def loss_fn(mb, log_probs, entropy):
        return -(log_probs * mb.response_mask).sum() / 1000, {}

    _, lp_peak = peak_tensor_bytes(policy.compute_log_probs, prompts, responses, with_entropy=True)
    policy.train_step(prompts, responses, loss_fn)  # the optimizer state exists before the measurement
    _, step_peak = peak_tensor_bytes(policy.train_step, prompts, responses, loss_fn)
    kept = max(mb.keep.numel() * mb.input_ids.shape[0] for mb in policy.micro_batches(prompts, responses))
    return lp_peak, step_peak, kept


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["shared", "packed"])
def test_long_tailed_batch_peak_is_bounded_by_kept_positions_not_the_longest_row(
    tiny_model, dist_group, layout
):
    from train.policy.fsdp import Policy

    kw = {"share_prompts": layout == "shared", "pack_sequences": layout == "packed"}
    policy = Policy(tiny_model, lr=1e-3, micro_batch_tokens=2048, pad_id=0, **kw)
    V = policy.config.vocab_size
    assert V == 49_152  # the real tokenizer's vocabulary: the logits dominate
    state = sum(p.numel() * 4 for p in policy.model.parameters())  # gradients (and clip temporaries)
    activations = 32 * MB  # 2 layers x hidden 128 over ~2k tokens, with margin
    peaks, kept_of = {}, {}
    for name, lengths in (("long", LONG), ("even", EVEN)):
        lp, step, kept = _peaks(policy, *_batch(lengths))
        peaks[name], kept_of[name] = (lp, step), kept
        lp_bound = vocab_peak_bytes(kept, V, 4, backward=False) + activations
        step_bound = vocab_peak_bytes(kept, V, 4, backward=True) + 2 * state + activations
        assert lp <= lp_bound, f"{name}: compute_log_probs peak {lp / MB:.0f} MiB > {lp_bound / MB:.0f} MiB"
        assert step <= step_bound, f"{name}: train_step peak {step / MB:.0f} MiB > {step_bound / MB:.0f} MiB"
    # the same tokens with one long row: no growth (old code: 2.0x and 4.8x in the shared layout). The update
    # keeps 1.15x: its vocabulary terms are smaller than the log-prob pass's since the backward works in place
    # (long 725 / even 657 MiB), leaving visible the CPU split attention's responses padded to the longest in
    # their unit (~70 MiB here; GPUs run FlexAttention on the unpadded layout)
    assert peaks["long"][0] <= 1.1 * peaks["even"][0], peaks
    assert peaks["long"][1] <= 1.15 * peaks["even"][1], peaks

    def entropy_loss(mb, log_probs, entropy):  # entropy in the loss: its gradient through the logits too
        return -((log_probs + 0.01 * entropy) * mb.response_mask).sum() / 1000, {}

    prompts, responses = _batch(LONG)
    _, peak = peak_tensor_bytes(policy.train_step, prompts, responses, entropy_loss, entropy_grad=True)
    bound = (
        vocab_peak_bytes(kept_of["long"], V, 4, backward=True, entropy_grad=True) + 2 * state + activations
    )
    assert peak <= bound, f"train_step with entropy_grad peak {peak / MB:.0f} MiB > {bound / MB:.0f} MiB"


# ---- micro-batches exist one at a time ------------------------------------------------------------
def _tensor_bytes(mb) -> int:
    return sum(v.untyped_storage().nbytes() for v in vars(mb).values() if isinstance(v, torch.Tensor))


def test_micro_batches_are_built_and_moved_one_at_a_time(tiny_model, dist_group):
    from train.policy.batching import plan_layout
    from train.policy.fsdp import Policy

    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(10, 4000, (24,), generator=g).tolist() for _ in range(12)]
    rows = [p for p in prompts for _ in range(4)]
    responses = [torch.randint(10, 4000, (40,), generator=g).tolist() for _ in rows]
    policy = Policy(tiny_model, trainable=False, micro_batch_tokens=400, pad_id=0)  # shared prompts
    builders = plan_layout("shared", rows, responses, 400, 0)
    sizes = [_tensor_bytes(build()) for build in builders]
    building = max(peak_tensor_bytes(build)[1] for build in builders)  # one micro-batch and its temporaries
    assert len(sizes) >= 6 and sum(sizes) > 4 * max(sizes)  # the whole batch's inputs would show
    _, peak = peak_tensor_bytes(lambda: [mb.rows.numel() for mb in policy.micro_batches(rows, responses)])
    # the one the caller holds and the next being built, never the whole batch (old code: all of them)
    assert peak <= building + max(sizes) + 4096, (peak, building, max(sizes), sum(sizes))


def test_a_machine_that_cannot_compile_fails_at_start_in_one_line(tmp_path):
    """policy.torch_compile=true where inductor finds no C++ compiler: the policy's start-up warm-up raises one
    line naming the key to turn off (a fresh process: no compiled kernel cached in memory or on disk)."""
    import os
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from train.policy.fsdp import vocab_kernels\n"
        "try:\n"
        "    vocab_kernels(True, 64, torch.float32)\n"
        "except RuntimeError as err:\n"
        "    print('ERR', err)\n"
        "print('eager ok', vocab_kernels(False, 64, torch.float32) is not None)\n"
    )
    env = {
        **os.environ,
        "CXX": str(tmp_path / "no-such-c++"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind"),
    }
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    err_lines = [line for line in out.stdout.splitlines() if line.startswith("ERR")]
    assert len(err_lines) == 1, out.stdout + out.stderr[-2000:]
    assert "policy.torch_compile=false" in err_lines[0] and "\n" not in err_lines[0]
    assert "eager ok True" in out.stdout


def test_chunks_never_end_in_a_single_row():
    assert chunk_slices(7, 3) == [slice(0, 3), slice(3, 7)]
    assert chunk_slices(8, 3) == [slice(0, 3), slice(3, 6), slice(6, 8)]
    assert chunk_slices(6, 3) == [slice(0, 3), slice(3, 6)]
    assert chunk_slices(1, 3) == [slice(0, 1)]
    assert chunk_slices(4, 1) == [slice(0, 1), slice(1, 2), slice(2, 3), slice(3, 4)]


def test_compiled_kernels_compile_once_at_start_up():
    """After the policy's start-up warm-up, the log-prob pass (no grad) and an update (forward with grad, the
    backward, the entropy in the loss) over chunks of several sizes, a one-row tail and two vocabularies
    compile nothing more: on an H100 a warm-up run with grad on recompiled every kernel in the first update
    (grad mode and requires_grad are guarded). A fresh process, so no other test's compiled graphs are cached."""
    import subprocess
    import sys

    code = """
import torch, torch._dynamo
from train.policy.fsdp import vocab_kernels
from train.policy.packed_logprobs import kept_entropy, kept_log_probs_and_entropy
k = vocab_kernels(True, 1000, torch.bfloat16)
torch._dynamo.config.error_on_recompile = True
for n, vocab in ((50, 1000), (7, 3000)):
    z = torch.randn(n, vocab).bfloat16().requires_grad_(True)
    idx = torch.arange(n).repeat(2)
    lab = torch.randint(0, vocab, idx.shape)
    with torch.no_grad():
        kept_log_probs_and_entropy(z, idx, lab, chunk_size=3, kernels=k)
    lp, h = kept_log_probs_and_entropy(z, idx, lab, chunk_size=3, kernels=k)
    (lp.sum() + kept_entropy(z, idx, True, chunk_size=3, kernels=k).sum()).backward()
    assert torch.isfinite(z.grad.float()).all()
print("compiled once")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "compiled once" in out.stdout, out.stderr[-3000:]
