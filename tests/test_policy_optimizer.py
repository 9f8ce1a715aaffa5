"""The policy's optimizer: fused AdamW (one kernel over all parameters, not torch's per-tensor loop on CPU),
with the same update as torch's reference AdamW."""

import torch

from tests.applied_grads import applied_grads


def test_policy_step_is_fused_adamw_and_matches_the_reference(tiny_model, dist_group):
    from train.policy.fsdp import Policy

    policy = Policy(tiny_model, precision="fp32", lr=1e-3, weight_decay=0.1, grad_clip=1e9, pad_id=0)
    assert policy.optimizer.defaults["fused"] is True, "AdamW runs torch's per-tensor loop on CPU"
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 4000, (k,), generator=g).tolist() for k in (5, 9, 7)]
    responses = [torch.randint(10, 4000, (k,), generator=g).tolist() for k in (6, 11, 3)]
    params = dict(policy.model.named_parameters())
    before = {n: p.full_tensor().detach().clone() for n, p in params.items()}

    def loss_fn(mb, log_probs, entropy):
        return -(log_probs * mb.response_mask).sum() / 20.0, {}

    with applied_grads(policy) as grads:
        policy.train_step(prompts, responses, loss_fn, with_entropy=False)
    reference = {n: torch.nn.Parameter(t.clone()) for n, t in before.items()}
    for n, p in reference.items():
        p.grad = grads[n]
    torch.optim.AdamW(reference.values(), lr=1e-3, weight_decay=0.1, foreach=False).step()
    moved = 0
    for n, p in params.items():
        torch.testing.assert_close(p.full_tensor().detach(), reference[n].detach(), rtol=1e-6, atol=1e-7)
        moved += int(not torch.equal(p.full_tensor().detach(), before[n]))
    assert moved == len(params), "some parameters did not move: the comparison would prove nothing"
