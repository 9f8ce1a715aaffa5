"""Behaviour unchanged by the one-loop refactor (issue 13): the same seeded 2-step runs of GRPO (every
estimator family, KL terms, PPO epochs), SFT and DPO log the same metrics as main did before it.

tests/data/loop_parity_before.json was written by `python -m tests.loop_parity` on main before the loops
were merged, and re-recorded once since, when the log-prob kernels were rewritten (issue 27: fp32 rounding
only); a metric the loop adds later is allowed, a changed or missing one is not.

The figures were recorded on one CPU; another CPU's fp32 kernels (AVX2 vs AVX-512 vector widths, oneDNN's
and MKL's blocking) sum in another order, so a figure may move by the fp32 rounding of the quantities it is
computed from. That rounding is the tolerance (`tolerance`): 1e-5 relative for every figure, and for figures
computed from log-probs, ROUNDINGS x eps32 x the magnitude of those log-probs, however close to zero the figure
itself is (a KL of 1e-7 between two equal policies is rounding noise, not a value to match to 1e-7):

- per-token log-prob figures (rollout correction's KL and chi2, PPO's KL, the KL loss, entropy, the policy
  loss): a random model's log-probs sit near -ln V (V the vocabulary), so ROUNDINGS x eps32 x ln V ~ 1.0e-5;
- figures summed over a response's tokens (the in-reward KL): max_new_tokens times that;
- DPO's rewards, margin and loss (beta x sums of a response's log-probs): ROUNDINGS x eps32 x beta x the
  largest summed log-prob the run logged (dpo/chosen_logps, dpo/rejected_logps).

A bug moves these figures by orders of magnitude more (a wrong sign, a missing mask, a stale reference).
Checked on an AVX-512 machine with ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2:
38 figures move past 1e-5 relative, the largest 3.8e-7 against a tolerance of 1.0e-5 (log-prob figures).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BEFORE = Path(__file__).parent / "data" / "loop_parity_before.json"
EPS32 = 2.0**-23  # torch.finfo(torch.float32).eps
ROUNDINGS = 8  # a log-prob's roundings before a figure: logits, logsumexp (max, sum, log), differences, means
TOKEN_FIGURES = ("rollout_corr/", "actor/ppo_kl", "actor/kl_loss", "actor/entropy", "actor/pg_loss",
                 "actor/reward_kl_penalty")  # fmt: skip
SEQUENCE_FIGURES = ("train/kl_in_reward",)
DPO_REWARD_FIGURES = ("dpo/rewards_", "dpo/val_rewards_", "dpo/loss", "dpo/val_loss")
DPO_BETA = 0.1  # train/stages/dpo.py's default (tests/loop_parity.py does not set it)


def _setting(name: str) -> int:
    from tests.loop_parity import COMMON

    return int(next(o.split("=", 1)[1] for o in COMMON if o.startswith(f"{name}=")))


def tolerance(case: dict[str, dict[str, float]], key: str, vocab: int, max_new_tokens: int) -> float:
    """The absolute tolerance of figure `key` of a recorded case: the fp32 rounding of what it is computed from."""
    token = ROUNDINGS * EPS32 * math.log(vocab)
    if key.startswith(TOKEN_FIGURES):
        return token
    if key.startswith(SEQUENCE_FIGURES):
        return token * max_new_tokens
    if key.startswith(DPO_REWARD_FIGURES):
        sums = [abs(v) for k in ("dpo/chosen_logps", "dpo/rejected_logps") for v in case.get(k, {}).values()]
        return ROUNDINGS * EPS32 * DPO_BETA * max(sums, default=0.0)
    return 0.0


def test_tolerances_come_from_the_quantities_not_the_figure():
    case = {"dpo/chosen_logps": {"1": -200.0}, "dpo/rejected_logps": {"1": -150.0}}
    assert tolerance(case, "rollout_corr/kl", 49152, 10) == pytest.approx(8 * 2.0**-23 * math.log(49152))
    assert tolerance(case, "train/kl_in_reward", 49152, 10) == pytest.approx(
        10 * 8 * 2.0**-23 * math.log(49152)
    )
    assert tolerance(case, "dpo/rewards_margin", 49152, 10) == pytest.approx(8 * 2.0**-23 * 0.1 * 200)
    assert tolerance(case, "train/reward_mean", 49152, 10) == 0.0  # sampled tokens and rewards: exact


def test_same_metrics_for_the_same_seed_as_before(tmp_path, dist_group):
    from transformers import AutoTokenizer

    from infra.models import resolve_model_path
    from tests.loop_parity import record

    vocab = len(AutoTokenizer.from_pretrained(resolve_model_path("default")))  # the tiny model's tokenizer
    max_new_tokens = _setting("rollout.max_new_tokens")
    before = json.loads(BEFORE.read_text())
    after = json.loads(json.dumps(record(tmp_path / "after.json")))  # same int -> str step keys
    assert sorted(after) == sorted(before)
    diffs = []
    for name, metrics in before.items():
        for key, by_step in metrics.items():
            got = after[name].get(key)
            if got is None:
                diffs.append(f"{name}: {key} no longer logged")
                continue
            abs_tol = max(1e-7, tolerance(metrics, key, vocab, max_new_tokens))
            for step, value in by_step.items():
                if step not in got or not math.isclose(got[step], value, rel_tol=1e-5, abs_tol=abs_tol):
                    diffs.append(
                        f"{name}: {key} step {step}: before {value}, now {got.get(step)} (tolerance {abs_tol:.2g})"
                    )
    assert not diffs, "\n".join(diffs)
