"""Compare the project's algorithms with verl's own functions on random inputs (not part of the test suite).

    python -m bench.verl_parity --verl-src DIR [--seed 0] [--out parity.md]

DIR is a checkout of verl's repository (the folder holding ``verl/``; default ``$VERL_SRC``). Nothing of
verl is copied or re-implemented here: its ``core_algos.py`` and ``rollout_corr_helper.py`` are imported
from DIR and called on the same random tensors as the project's functions. verl is not installed in the
project's environment, so the import skips verl's package ``__init__`` (which needs Ray-side packages)
and puts empty placeholder modules for two packages those two files only name at import time
(``tensordict``, ``codetiming``); transformers' renamed ``AutoModelForVision2Seq`` is aliased, and
``rollout_corr_helper.DataProto`` (only used to wrap the IS weights it returns) is a holder of tensors.
The functions compared run verl's real code.

Rollout correction is compared as the trainer calls it (``rollout_correction.rollout_correction``
against verl's ``compute_rollout_correction_and_rejection_mask``): every IS level x batch normalisation x
rejection criterion (verl's k1/k2/k3 token, sequence-sum/mean/max options, chained), on ordinary inputs
and on inputs where some tokens have |log rho| > 20; so are the loss modes' ``ppo_kl`` metrics.

Prints one markdown row per algorithm: the largest absolute difference (values, and gradients where the
function is a loss; relative for metrics that reach 1e10 on extreme inputs, marked so) and whether it is
within 1e-6 (float64 inputs). A row whose project side raises is reported as NaN (not equal) with the
error, so the table always completes.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import math
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from train.algorithms import (
    actor_loss,
    aggregation,
    gae,
    group_estimators,
    policy_losses,
    rollout_correction,
)
from train.algorithms import advantages as adv
from train.algorithms import kl as kl_terms
from train.algorithms.kl_control import KLController

D = torch.float64
ATOL = 1e-6
PLACEHOLDER_PACKAGES = {"tensordict", "codetiming"}


class _Placeholder(types.ModuleType):
    """A module whose every attribute is an empty class: enough for names used in annotations/imports."""

    __path__: list[str] = []

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {"__init__": lambda self, *a, **k: None})


class _PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] not in PLACEHOLDER_PACKAGES:
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        return _Placeholder(spec.name)

    def exec_module(self, module):
        pass


class _TensorHolder:
    """Stands in for verl's ``DataProto`` (which needs tensordict) where a helper only wraps tensors in
    one and the caller reads them back: ``DataProto.from_dict(tensors=d).batch[key]``."""

    def __init__(self, tensors: dict) -> None:
        self.batch = tensors

    @classmethod
    def from_dict(cls, tensors: dict, **_kw) -> _TensorHolder:
        return cls(dict(tensors))


def import_verl(src: Path) -> SimpleNamespace:
    """verl's core_algos, rollout_corr_helper, torch_functional and ActorConfig from a source checkout."""
    root = src / "verl"
    if not (root / "trainer" / "ppo" / "core_algos.py").is_file():
        raise SystemExit(f"--verl-src {src}: no verl/trainer/ppo/core_algos.py there (give a verl checkout)")
    package = types.ModuleType("verl")
    package.__path__ = [str(root)]
    sys.modules["verl"] = package
    sys.meta_path.append(_PlaceholderFinder())
    import transformers

    if not hasattr(transformers, "AutoModelForVision2Seq"):
        transformers.AutoModelForVision2Seq = transformers.AutoModelForImageTextToText
    core = importlib.import_module("verl.trainer.ppo.core_algos")
    rc = importlib.import_module("verl.trainer.ppo.rollout_corr_helper")
    rc.DataProto = _TensorHolder  # its combined entry point wraps the weights in a DataProto
    return SimpleNamespace(
        core=core,
        rc=rc,
        F=importlib.import_module("verl.utils.torch_functional"),
        ActorConfig=importlib.import_module("verl.workers.config").ActorConfig,
    )


def random_batch(gen: torch.Generator, groups: int = 6, n: int = 4, T: int = 16, singleton: bool = True):
    """Scores on the last valid token (plus small per-token rewards), masks with random lengths >= 1."""
    B = groups * n + (1 if singleton else 0)
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).to(D)
    scores = torch.randn(B, generator=gen, dtype=D)
    token_rewards = (
        adv.scores_to_token_rewards(scores, mask) + 0.01 * torch.randn(B, T, generator=gen, dtype=D) * mask
    )
    index = np.array([f"p{i // n}" for i in range(B)], dtype=object)
    group_index = torch.tensor([i // n for i in range(B)])
    return SimpleNamespace(
        B=B, T=T, mask=mask, token_rewards=token_rewards, index=index, group_index=group_index
    )


def maxdiff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    a, b = torch.as_tensor(a, dtype=D), torch.as_tensor(b, dtype=D)
    if mask is not None:
        a, b = a[mask.bool()], b[mask.bool()]
    return float((a - b).abs().max()) if a.numel() else 0.0


Row = tuple[str, str, float, str]


def estimator_rows(verl, gen) -> list[Row]:
    core, rows = verl.core, []
    b = random_batch(gen)
    r, m, idx, g = b.token_rewards, b.mask, b.index, b.group_index

    def add(name, test, ours, theirs, on_valid=False):
        rows.append((name, test, maxdiff(ours, theirs, m if on_valid else None), ""))

    theirs, _ = core.compute_grpo_outcome_advantage(r.clone(), m, idx, norm_adv_by_std_in_grpo=True)
    add("grpo", "tests/test_advantages.py", adv.compute_grpo_outcome_advantage(r, g, m), theirs)
    theirs, _ = core.compute_grpo_outcome_advantage(r.clone(), m, idx, norm_adv_by_std_in_grpo=False)
    add("grpo (Dr.GRPO, no std)", "tests/test_advantages.py", adv.compute_grpo_outcome_advantage(r, g, m, norm_adv_by_std_in_grpo=False), theirs)  # fmt: skip
    theirs, _ = core.compute_rloo_outcome_advantage(r.clone(), m, idx)
    add("rloo", "tests/test_advantages.py", adv.compute_rloo_outcome_advantage(r, g, m), theirs)
    cfg = SimpleNamespace(gamma=0.95)
    theirs, _ = core.compute_reinforce_plus_plus_outcome_advantage(r.clone(), m, config=cfg)
    add("reinforce_plus_plus (gamma .95)", "tests/test_advantages.py", adv.compute_reinforce_plus_plus_outcome_advantage(r, g, m, gamma=0.95), theirs)  # fmt: skip
    baselines = torch.randn(b.B, generator=gen, dtype=D)
    theirs, _ = core.compute_remax_outcome_advantage(r.clone(), baselines, m)
    add("remax", "tests/test_advantages.py", adv.compute_remax_outcome_advantage(r, g, m, baselines), theirs, on_valid=True)  # fmt: skip
    theirs, _ = core.compute_reinforce_plus_plus_baseline_outcome_advantage(r.clone(), m, idx, config=cfg)
    add("reinforce_plus_plus_baseline", "tests/test_group_estimators.py", group_estimators.compute_reinforce_plus_plus_baseline_outcome_advantage(r, g, m), theirs)  # fmt: skip
    theirs, _ = core.compute_opo_outcome_advantage(r.clone(), m, idx)
    add(
        "opo",
        "tests/test_group_estimators.py",
        group_estimators.compute_opo_outcome_advantage(r, g, m),
        theirs,
    )
    theirs, _ = core.compute_gpg_outcome_advantage(r.clone(), m, idx)
    add("gpg (estimator)", "tests/test_group_estimators.py", group_estimators.compute_gpg_outcome_advantage(r, g, m), theirs)  # fmt: skip
    no_single = random_batch(gen, singleton=False)
    for norm in (True, False):
        theirs, _ = core.compute_grpo_passk_outcome_advantage(
            no_single.token_rewards.clone(),
            no_single.mask,
            no_single.index,
            config={"norm_adv_by_std_in_grpo": norm},
        )
        ours = group_estimators.compute_grpo_passk_outcome_advantage(
            no_single.token_rewards, no_single.group_index, no_single.mask, norm_adv_by_std_in_grpo=norm
        )
        rows.append(
            (f"grpo_passk (norm={norm})", "tests/test_group_estimators.py", maxdiff(ours, theirs), "")
        )
    values = torch.randn(b.B, b.T, generator=gen, dtype=D)
    theirs_adv, theirs_ret = core.compute_gae_advantage_return(r.clone(), values, m, gamma=0.99, lam=0.95)
    ours = gae.compute_gae_advantage_return(r, values, m, gamma=0.99, lam=0.95)
    rows.append(("gae (advantages, valid tokens)", "tests/test_gae_critic.py", maxdiff(ours.advantages, theirs_adv, m), "verl leaves padding non-zero; the project zeroes it"))  # fmt: skip
    rows.append(("gae (returns, valid tokens)", "tests/test_gae_critic.py", maxdiff(ours.returns, theirs_ret, m), ""))  # fmt: skip
    add("masked_whiten", "tests/test_advantages.py", adv.masked_whiten(values, m) * m, verl.F.masked_whiten(values, m) * m)  # fmt: skip
    return rows


def _grad(fn: Callable, log_prob: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    lp = log_prob.clone().requires_grad_()
    loss = fn(lp)
    (g,) = torch.autograd.grad(loss, lp)
    return loss.detach(), g


def _actor_cfg(verl, **kw):
    """verl's ActorConfig for one loss; `policy_loss={...}` sets fields of its frozen policy_loss part."""
    policy_loss = kw.pop("policy_loss", {})
    cfg = verl.ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, **kw)
    for k, v in policy_loss.items():
        object.__setattr__(cfg.policy_loss, k, v)
    return cfg


def loss_rows(verl, gen) -> list[Row]:
    """Every policy loss mode, the value loss, the KL estimators and the aggregation modes against verl."""
    b = random_batch(gen)
    m = b.mask
    old = -torch.rand(b.B, b.T, generator=gen, dtype=D) * 4
    logp = old + 0.3 * torch.randn(b.B, b.T, generator=gen, dtype=D)
    advs = torch.randn(b.B, b.T, generator=gen, dtype=D) * m
    rows = _policy_loss_rows(verl, m, old, logp, advs)
    rows += _value_loss_rows(verl, gen, b)
    rows += _kl_rows(verl, gen, b, logp)
    for agg in aggregation.LOSS_AGG_MODES:
        mat = torch.randn(b.B, b.T, generator=gen, dtype=D)
        rows.append((f"agg_loss {agg}", "tests/test_losses.py", maxdiff(aggregation.agg_loss(mat, m, agg), verl.core.agg_loss(mat, m, agg)), ""))  # fmt: skip
    return rows


def _policy_loss_rows(verl, m, old, logp, advs) -> list[Row]:
    """Loss and gradient of each policy loss mode (vanilla in every aggregation mode)."""
    core, rows = verl.core, []

    def compare(name, test, ours_fn, verl_fn, agg, seed=None, note=""):
        if seed is not None:
            torch.manual_seed(seed)
        ours_loss, ours_grad = _grad(lambda lp: aggregation.agg_loss(ours_fn(lp)[0], m, agg), logp)
        if seed is not None:
            torch.manual_seed(seed)
        verl_loss, verl_grad = _grad(lambda lp: verl_fn(lp)[0], logp)
        rows.append((name, test, max(maxdiff(ours_loss, verl_loss), maxdiff(ours_grad, verl_grad)), note))

    low, high = 0.2, 0.28
    for agg in aggregation.LOSS_AGG_MODES:
        cfg = _actor_cfg(verl, clip_ratio_low=low, clip_ratio_high=high, loss_agg_mode=agg)
        compare(
            f"vanilla ({agg})",
            "tests/test_losses.py",
            lambda lp, agg=agg: actor_loss._ppo_terms(old, lp, advs, m, low, high, 3.0),
            lambda lp, cfg=cfg, agg=agg: core.compute_policy_loss_vanilla(old, lp, advs, m, agg, cfg),
            agg,
        )
    cfg = _actor_cfg(verl, clip_ratio_low=3e-4, clip_ratio_high=4e-4)
    compare(
        "gspo (seq-mean-token-mean)",
        "tests/test_policy_losses.py",
        lambda lp: policy_losses.gspo_loss(old, lp, advs, m, 3e-4, 4e-4),
        lambda lp: core.compute_policy_loss_gspo(old, lp, advs, m, "token-mean", cfg),
        "seq-mean-token-mean",
        note="verl forces seq-mean-token-mean whatever loss_agg_mode says",
    )
    cfg = _actor_cfg(verl, clip_ratio_low=low, clip_ratio_high=high)
    compare(
        "cispo",
        "tests/test_policy_losses.py",
        lambda lp: policy_losses.cispo_loss(old, lp, advs, m, low, high),
        lambda lp: core.compute_policy_loss_cispo(old, lp, advs, m, "token-mean", cfg),
        "token-mean",
    )
    compare(
        "gpg (loss)",
        "tests/test_policy_losses.py",
        lambda lp: policy_losses.gpg_loss(old, lp, advs, m),
        lambda lp: core.compute_policy_loss_gpg(old, lp, advs, m, "token-mean", cfg),
        "token-mean",
    )
    cfg = _actor_cfg(verl, clip_ratio_low=low, clip_ratio_high=high, policy_loss={"clip_cov_ratio": 0.05})
    compare(
        "clip_cov (ratio .05, same RNG seed)",
        "tests/test_policy_losses.py",
        lambda lp: policy_losses.clip_cov_loss(old, lp, advs, m, low, high, 0.05, 1.0, 5.0),
        lambda lp: core.compute_policy_loss_clip_cov(old, lp, advs, m, "token-mean", cfg),
        "token-mean",
        seed=123,
    )
    cfg = _actor_cfg(verl, policy_loss={"kl_cov_ratio": 0.05, "ppo_kl_coef": 0.1})
    compare(
        "kl_cov (ratio .05)",
        "tests/test_policy_losses.py",
        lambda lp: policy_losses.kl_cov_loss(old, lp, advs, m, 0.05, 0.1),
        lambda lp: core.compute_policy_loss_kl_cov(old, lp, advs, m, "token-mean", cfg),
        "token-mean",
    )
    cfg = _actor_cfg(verl, tau_pos=1.0, tau_neg=1.05)
    compare(
        "sapo (seq-mean-token-mean)",
        "tests/test_policy_losses.py",
        lambda lp: policy_losses.sapo_loss(old, lp, advs, m, 1.0, 1.05),
        lambda lp: core.compute_policy_loss_sapo(old, lp, advs, m, "token-mean", cfg),
        "seq-mean-token-mean",
        note="verl forces seq-mean-token-mean",
    )
    return rows


def _value_loss_rows(verl, gen, b) -> list[Row]:
    core, m = verl.core, b.mask
    returns, values = (
        torch.randn(b.B, b.T, generator=gen, dtype=D),
        torch.randn(b.B, b.T, generator=gen, dtype=D),
    )
    vpreds = values + 0.5 * torch.randn(b.B, b.T, generator=gen, dtype=D)
    ours_loss, ours_grad = _grad(lambda v: gae.value_loss(v, returns, values, m, 0.2)[0], vpreds)
    verl_loss, verl_grad = _grad(lambda v: core.compute_value_loss(v, returns, values, m, 0.2)[0], vpreds)
    return [("value loss (clip .2)", "tests/test_gae_critic.py", max(maxdiff(ours_loss, verl_loss), maxdiff(ours_grad, verl_grad)), "")]  # fmt: skip


def _kl_rows(verl, gen, b, logp) -> list[Row]:
    """The KL estimators, their straight-through '+' variants and the KL in the reward."""
    core, m, rows = verl.core, b.mask, []
    ref = logp + 0.2 * torch.randn(b.B, b.T, generator=gen, dtype=D)
    for kind in ("k1", "abs", "k2", "low_var_kl"):
        ours_v, ours_g = _grad(lambda lp, k=kind: kl_terms.kl_penalty(lp, ref, k).sum(), logp)
        verl_v, verl_g = _grad(lambda lp, k=kind: core.kl_penalty(lp, ref, k).sum(), logp)
        rows.append((f"kl_penalty {kind}", "tests/test_losses.py", max(maxdiff(ours_v, verl_v), maxdiff(ours_g, verl_g)), ""))  # fmt: skip
    for kind in ("k1+", "low_var_kl+"):
        try:
            core.kl_penalty(logp, ref, kind)
            note = "verl ran it"
        except NotImplementedError:
            note = "verl raises NotImplementedError for '+' names; compared with verl's base value and k2 gradient"
        ours_v, ours_g = _grad(lambda lp, k=kind: kl_terms.kl_penalty(lp, ref, k).sum(), logp)
        verl_v = core.kl_penalty(logp, ref, kind[:-1]).sum()
        _, verl_g = _grad(lambda lp: core.kl_penalty(lp, ref, "k2").sum(), logp)
        rows.append((f"kl_penalty {kind}", "tests/test_policy_losses.py", max(maxdiff(ours_v, verl_v), maxdiff(ours_g, verl_g)), note))  # fmt: skip
    theirs = core.compute_rewards(b.token_rewards, logp, ref, 0.05)
    ours, _ = kl_terms.apply_kl_in_reward(b.token_rewards, logp, ref, m, 0.05, "k1")
    rows.append(("kl in reward (k1, per token)", "tests/test_group_estimators.py", maxdiff(ours, theirs, m), "verl's compute_rewards (apply_kl_penalty needs DataProto)"))  # fmt: skip
    return rows


def control_and_correction_rows(verl, gen) -> list[Row]:
    core, rc, rows = verl.core, verl.rc, []
    theirs = core.AdaptiveKLController(0.05, 0.1, 1000)
    ours = KLController(0.05, "adaptive", target_kl=0.1, horizon=1000)
    worst = 0.0
    for kl in torch.rand(50, generator=gen, dtype=D).tolist():
        theirs.update(kl * 0.3, 64)
        worst = max(worst, abs(ours.update(kl * 0.3, 64) - theirs.value))
    rows.append(("adaptive KL controller (50 updates)", "tests/test_dapo_rollout_correction.py", worst, ""))
    b = random_batch(gen)
    m = b.mask
    train = -torch.rand(b.B, b.T, generator=gen, dtype=D) * 4
    rollout = train + 0.3 * torch.randn(b.B, b.T, generator=gen, dtype=D)
    log_ratio = train - rollout
    for level in ("token", "sequence"):
        for norm in (False, True):
            theirs, _ = rc.compute_rollout_correction_weights(log_ratio, m, level, 2.0, norm)
            ours, _ = rollout_correction.truncated_is_weights(log_ratio, m, level, 2.0, norm)
            rows.append((f"TIS weights ({level}, batch_normalize={norm})", "tests/test_dapo_rollout_correction.py", maxdiff(ours, theirs, m), ""))  # fmt: skip
    for ours_level, verl_option in (
        ("token", "token_k1"),
        ("sequence", "seq_sum_k1"),
        ("geometric", "seq_mean_k1"),
    ):
        # verl's k1 bounds apply to pi_rollout / pi_train (token_k1 = -log ratio): ours [.6, 1.8] = verl [1/1.8, 1/.6]
        theirs, _ = rc.compute_rollout_rejection_mask(log_ratio, m, verl_option, f"{1 / 1.8}_{1 / 0.6}")
        ours, _ = rollout_correction.masked_is_mask(log_ratio, m, ours_level, 0.6, 1.8)
        rows.append((f"masked IS ({ours_level} = verl {verl_option})", "tests/test_dapo_rollout_correction.py", maxdiff(ours, theirs), "verl's k1 bounds are on the inverse ratio"))  # fmt: skip
    theirs = rc.compute_offpolicy_metrics(train, rollout, m)
    ours = rollout_correction.mismatch_metrics(train, rollout, m)
    keys = ("kl", "k3_kl", "training_ppl", "rollout_ppl", "log_ppl_abs_diff", "chi2_token")
    worst = max(abs(ours[f"rollout_corr/{k}"] - theirs[k]) for k in keys)
    rows.append((f"mismatch metrics ({', '.join(keys)})", "tests/test_dapo_rollout_correction.py", worst, "verl divides by count + 1e-8"))  # fmt: skip
    return rows


def _log_probs(gen, b, extreme: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, rollout) log-probs (B, T): ratios near 1, or with ~1 token in 8 off by 20-40 nats."""
    train = -torch.rand(b.B, b.T, generator=gen, dtype=D) * 4
    rollout = train + 0.3 * torch.randn(b.B, b.T, generator=gen, dtype=D)
    if extreme:
        far = torch.rand(b.B, b.T, generator=gen) < 0.125
        shift = (20 + 20 * torch.rand(b.B, b.T, generator=gen, dtype=D)) * torch.sign(
            torch.randn(b.B, b.T, generator=gen, dtype=D)
        )
        rollout = torch.where(far, rollout + shift, rollout)
    return train, rollout


def _rc_cfg(**overrides) -> SimpleNamespace:
    knobs = rollout_correction.ROLLOUT_CORRECTION_KNOBS
    cfg = {k: v.default if hasattr(v, "default") else v[0] for k, v in knobs.items()}
    return SimpleNamespace(**{**cfg, **overrides})


# verl's rejection options with thresholds that reject a share of the ordinary inputs (log rho ~ N(0, .3^2))
RS_CASES = (
    ("token_k1", "0.6_1.8"),
    ("seq_sum_k1", "0.3_3.0"),
    ("seq_mean_k1", "0.8_1.25"),
    ("token_k2", "0.05"),
    ("token_k3", "0.05"),
    ("seq_sum_k2", "0.5"),
    ("seq_sum_k3", "0.5"),
    ("seq_mean_k2", "0.05"),
    ("seq_mean_k3", "0.05"),
    ("seq_max_k2", "0.2"),
    ("seq_max_k3", "0.2"),
    ("token_k1,seq_max_k3", "0.6_1.8,0.3"),
    ("token_k2,seq_mean_k1,seq_sum_k3", "0.1,0.8_1.25,0.5"),
    ("token_k2,token_k3", "0.05"),
)
IS_CASES = (None, ("token", False), ("token", True), ("sequence", False), ("sequence", True))


def _attempt(fn: Callable[[], float]) -> tuple[float, str]:
    try:
        return fn(), ""
    except Exception as exc:  # noqa: BLE001 - a row whose project side raises is reported, not fatal
        return float("nan"), f"project raised {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"


def rollout_correction_rows(verl, gen) -> list[Row]:
    """The trainer's one entry point against verl's combined IS + rejection, ordinary and extreme inputs."""
    rc, rows = verl.rc, []
    test = "tests/test_dapo_rollout_correction.py"
    b = random_batch(gen)
    m = b.mask
    for extreme in (False, True):
        train, rollout = _log_probs(gen, b, extreme)
        tag = "log rho beyond +-20 on ~1/8 tokens" if extreme else "ordinary"
        for rs, threshold in (*RS_CASES, (None, None)):
            for case in IS_CASES:
                if rs is None and case is None:
                    continue
                level, norm = case if case is not None else (None, False)
                theirs_w, theirs_mask, _ = rc.compute_rollout_correction_and_rejection_mask(
                    train, rollout, m, level, 2.0 if level else None, norm, rs, threshold
                )
                theirs_w = None if theirs_w is None else theirs_w.batch["rollout_is_weights"]
                cfg = _rc_cfg(rollout_is=level, rollout_is_batch_normalize=norm, rollout_rs=rs, rollout_rs_threshold=threshold)  # fmt: skip

                def diff(cfg=cfg, theirs_w=theirs_w, theirs_mask=theirs_mask, train=train, rollout=rollout):
                    mask, w, _ = rollout_correction.rollout_correction(train, rollout, m, cfg)
                    d = maxdiff(mask, theirs_mask)
                    if (w is None) != (theirs_w is None):
                        return float("inf")
                    # the weights where the loss uses them (verl's also carry values on rejected tokens)
                    return d if w is None else max(d, maxdiff(w, theirs_w, theirs_mask))

                worst, note = _attempt(diff)
                kept = float(theirs_mask.sum() / m.sum())
                name = f"rollout correction (IS {level or 'off'}{', batch-normalised' if norm else ''}; RS {rs or 'off'} {threshold or ''}; {tag})"  # fmt: skip
                rows.append((name, test, worst, note or f"verl keeps {kept:.0%} of tokens"))
        # the mismatch metrics, k3_kl exact (relative: it reaches ~1e10 on the extreme inputs)
        theirs = rc.compute_offpolicy_metrics(train, rollout, m)
        ours = rollout_correction.mismatch_metrics(train, rollout, m)
        keys = ("kl", "k3_kl", "training_ppl", "rollout_ppl", "log_ppl_abs_diff", "chi2_token")
        worst = max(abs(ours[f"rollout_corr/{k}"] - theirs[k]) / max(1.0, abs(theirs[k])) for k in keys)
        rows.append(
            (f"mismatch metrics ({tag}; relative above 1)", test, worst, f"k3_kl = {theirs['k3_kl']:.3g}")
        )
    return rows


def loss_metric_and_mode_rows(verl, gen) -> list[Row]:
    """ppo_kl of every loss mode on extreme log-ratios; geo_mean and bypass_mode against verl."""
    b = random_batch(gen)
    m = b.mask
    old, _ = _log_probs(gen, b, False)
    logp = old + 0.3 * torch.randn(b.B, b.T, generator=gen, dtype=D)
    far = torch.rand(b.B, b.T, generator=gen) < 0.125
    logp_far = torch.where(far, logp + 25 * torch.sign(torch.randn(b.B, b.T, generator=gen, dtype=D)), logp)
    advs = torch.randn(b.B, b.T, generator=gen, dtype=D) * m
    rows = _ppo_kl_metric_rows(verl, m, old, logp_far, advs)
    rows += _geo_mean_rows(verl, gen, b, old, logp, advs)
    rows += _bypass_mode_rows(verl, b, old, logp, logp_far, advs)
    return rows


def _ppo_kl_metric_rows(verl, m, old, logp_far, advs) -> list[Row]:
    """Each loss mode's ppo_kl metric on log ratios of +-25 against verl's."""
    core, rows = verl.core, []
    clip = _actor_cfg(verl, clip_ratio_low=0.2, clip_ratio_high=0.28)
    modes = (
        (
            "vanilla",
            lambda lp: actor_loss._ppo_terms(old, lp, advs, m, 0.2, 0.28, 3.0),
            core.compute_policy_loss_vanilla,
            clip,
        ),  # fmt: skip
        (
            "gspo",
            lambda lp: policy_losses.gspo_loss(old, lp, advs, m, 0.2, 0.28),
            core.compute_policy_loss_gspo,
            clip,
        ),  # fmt: skip
        (
            "cispo",
            lambda lp: policy_losses.cispo_loss(old, lp, advs, m, 0.2, 0.28),
            core.compute_policy_loss_cispo,
            clip,
        ),  # fmt: skip
        (
            "sapo",
            lambda lp: policy_losses.sapo_loss(old, lp, advs, m, 1.0, 1.05),
            core.compute_policy_loss_sapo,
            _actor_cfg(verl, tau_pos=1.0, tau_neg=1.05),
        ),  # fmt: skip
        (
            "geo_mean",
            lambda lp: policy_losses.geo_mean_loss(old, lp, advs, m, 0.2, 0.28),
            core.compute_policy_loss_geo_mean,
            clip,
        ),  # fmt: skip
    )
    for name, ours_fn, verl_fn, cfg in modes:
        ours_kl, note = _attempt(lambda ours_fn=ours_fn: ours_fn(logp_far)[1]["ppo_kl"])
        _, theirs = verl_fn(old, logp_far, advs, m, "token-mean", cfg)
        rows.append((f"{name} ppo_kl metric (log ratio +-25 on ~1/8 tokens)", "tests/test_policy_losses.py", abs(ours_kl - theirs["actor/ppo_kl"]), note))  # fmt: skip
    return rows


def _geo_mean_rows(verl, gen, b, old, logp, advs) -> list[Row]:
    """geo_mean loss and gradient (verl averages over sequences: seq-mean-token-mean), without and with IS."""
    core, m, rows = verl.core, b.mask, []
    clip = _actor_cfg(verl, clip_ratio_low=0.2, clip_ratio_high=0.28)
    weights = torch.exp(0.2 * torch.randn(b.B, b.T, generator=gen, dtype=D)).clamp(max=2.0) * m
    for w in (None, weights):

        def geo_diff(w=w):
            ours_l, ours_g = _grad(lambda lp: aggregation.agg_loss(policy_losses.geo_mean_loss(old, lp, advs, m, 0.2, 0.28, w)[0], m, "seq-mean-token-mean"), logp)  # fmt: skip
            verl_l, verl_g = _grad(lambda lp: core.compute_policy_loss_geo_mean(old, lp, advs, m, "token-mean", clip, rollout_is_weights=w)[0], logp)  # fmt: skip
            return max(maxdiff(ours_l, verl_l), maxdiff(ours_g, verl_g))

        worst, note = _attempt(geo_diff)
        label = "with IS weights (geometric mean per sequence)" if w is not None else "no IS weights"
        rows.append((f"geo_mean loss ({label})", "tests/test_policy_losses.py", worst, note or "verl's loss_agg_mode is ignored; ours with seq-mean-token-mean"))  # fmt: skip
    return rows


def _bypass_mode_rows(verl, b, old, logp, logp_far, advs) -> list[Row]:
    """bypass mode: old = rollout log-probs; IS/RS on pi_current / pi_rollout inside the loss."""
    core, m, rows = verl.core, b.mask, []
    rollout = old
    cases = [(lt, rs, th, lp) for lt in ("ppo_clip", "reinforce") for lp in ("ordinary", "+-25") for rs, th in ((None, None), ("token_k1", "0.6_1.8"), ("seq_mean_k3,token_k2", "0.02,0.1"))]  # fmt: skip
    for loss_type, rs, threshold, inputs in cases:
        current = logp if inputs == "ordinary" else logp_far
        corr = {"rollout_is": "sequence" if loss_type == "reinforce" else "token", "rollout_is_threshold": 2.0, "rollout_is_batch_normalize": False, "rollout_rs": rs, "rollout_rs_threshold": threshold, "loss_type": loss_type}  # fmt: skip
        cfg = _actor_cfg(
            verl, clip_ratio_low=0.2, clip_ratio_high=0.28, policy_loss={"rollout_correction": corr}
        )
        # verl's engine normalisers: the mini-batch's response tokens (known before the forward)
        object.__setattr__(cfg, "global_batch_info", {"dp_size": 1, "batch_num_tokens": m.sum(), "global_batch_size": b.B})  # fmt: skip
        ours_cfg = _rc_cfg(**{k: v for k, v in corr.items() if k != "loss_type"}, loss_type=loss_type, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)  # fmt: skip

        def bypass_diff(cfg=cfg, ours_cfg=ours_cfg, current=current):
            ours_l, ours_g = _grad(lambda lp: aggregation.agg_loss(policy_losses.bypass_mode_loss(rollout, lp, advs, m, ours_cfg)[0], m, "token-mean"), current)  # fmt: skip
            verl_l, verl_g = _grad(lambda lp: core.compute_policy_loss_bypass_mode(rollout, lp, advs, m, "token-mean", cfg)[0], current)  # fmt: skip
            return max(maxdiff(ours_l, verl_l), maxdiff(ours_g, verl_g))

        worst, note = _attempt(bypass_diff)
        rows.append((f"bypass_mode ({loss_type}, IS {corr['rollout_is']}, RS {rs or 'off'}; log ratios {inputs})", "tests/test_policy_losses.py", worst, note or "token-mean over the response tokens (verl's engine global_batch_info)"))  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--verl-src", default=os.environ.get("VERL_SRC"), help="verl checkout (holds verl/)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="also write the table to this markdown file")
    args = parser.parse_args(argv)
    if not args.verl_src:
        raise SystemExit("give --verl-src DIR (a verl checkout) or set VERL_SRC")
    verl = import_verl(Path(args.verl_src))
    gen = torch.Generator().manual_seed(args.seed)
    rows = estimator_rows(verl, gen) + loss_rows(verl, gen) + control_and_correction_rows(verl, gen)
    rows += rollout_correction_rows(verl, gen) + loss_metric_and_mode_rows(verl, gen)
    lines = [
        f"| algorithm | pinned by | max abs diff vs verl (seed {args.seed}, float64) | equal (<= {ATOL}) | note |",
        "|---|---|---|---|---|",
    ]
    for name, test, diff, note in rows:
        equal = "yes" if diff <= ATOL and not math.isnan(diff) else "NO"
        lines.append(f"| {name} | `{test}` | {diff:.2e} | {equal} | {note} |")
    table = "\n".join(lines)
    rc_rows = [
        r for r in rows if r[0].startswith(("rollout correction", "TIS", "masked IS", "mismatch", "bypass"))
    ]
    summary = "\n".join(
        f"{label}: {len(rs)} configurations, largest difference {max(d for _, _, d, _ in rs):.2e}, "
        f"{sum(1 for _, _, d, _ in rs if not d <= ATOL)} not equal"
        for label, rs in (("all rows", rows), ("rollout-correction rows", rc_rows))
    )
    print(table + "\n\n" + summary)
    if args.out:
        Path(args.out).write_text(table + "\n\n" + summary + "\n")
    return 0 if all(d <= ATOL for _, _, d, _ in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
