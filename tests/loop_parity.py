"""Record the metrics of short seeded runs of every loop (GRPO with each estimator, SFT, DPO) as JSON.

`python -m tests.loop_parity --out FILE` trains 2 steps per case on a tiny random model (HF engine,
MLflow in a temporary SQLite store) and writes {case: {metric: {step: value}}} for the metrics that
depend only on the seed (no timings). tests/test_loop_parity.py reruns it and compares with
tests/data/loop_parity_before.json, recorded on main before the loops were merged into one (re-recorded when
the log-prob kernels changed, within 1.0e-5 relative: tests/test_loop_parity.py).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from infra.process_exit import exit_now
from train.rewards.base import RewardResult

COMMON = [
    "total_steps=2", "save_every=1", "keep_last=1", "seed=5", "data.prompts_per_step=2", "rollout.n=4",
    "rollout.max_new_tokens=10", "optim.lr=1e-3", "data.builtin_size=32",
    "policy.precision=fp32",  # the recorded figures are the fp32 path's (auto takes bf16 where it is faster)
    "policy.fp32_matmul=torch",  # ... with torch's kernel: oneDNN sums in another order (test_cpu_matmul.py)
    "policy.attn_implementation=sdpa",  # ... and the dense mask: the split sums in another order (test_attention.py)
    "policy.torch_compile=false",  # ... and eager log-prob kernels: compiled ones sum in fp64 (test_memory_bound.py)
    "rollout.engine._target_=train.rollout.hf_engine.HFEngine",
    "reward._target_=tests.loop_parity.VowelShareReward",
]  # fmt: skip
CLASSMATE = ["reward._target_=tests.loop_parity.ToyClassmateReward"]
GRPO_CASES: dict[str, list[str]] = {
    "grpo_val": ["val_every=1", "data.val_path=builtin:arithmetic", "data.val_size=4"],
    "rloo": ["algorithm.adv_estimator=rloo"],
    "reinforce_plus_plus": ["algorithm.adv_estimator=reinforce_plus_plus"],
    "remax": ["algorithm.adv_estimator=remax"],
    "dr_grpo_kl": [
        "algorithm.norm_adv_by_std_in_grpo=false",
        "algorithm.loss_agg_mode=seq-mean-token-sum-norm",
        "algorithm.use_kl_loss=true",
        "algorithm.use_kl_in_reward=true",
        "algorithm.entropy_coeff=0.01",
    ],  # fmt: skip
    "ppo_epochs": ["algorithm.ppo_epochs=2", "algorithm.ppo_mini_batch_size=1"],
    "gdpo": ["algorithm.adv_estimator=gdpo", *CLASSMATE],
    "grpo_w_classmate_all": [
        "algorithm.adv_estimator=grpo_w_classmate",
        "algorithm.token_level_classmate_reward_mode=all",
        *CLASSMATE,
    ],
    "gdpo_wo_bn": ["algorithm.adv_estimator=gdpo_wo_bn", *CLASSMATE],
}
STAGE_COMMON = [
    "total_steps=2", "save_every=1", "keep_last=1", "seed=5", "optim.lr=1e-3", "val_every=1",
    "data.batch_size=4", "data.val_size=4", "data.builtin_size=32", "policy.precision=fp32",
    "policy.fp32_matmul=torch", "policy.attn_implementation=sdpa", "policy.torch_compile=false",
]  # fmt: skip
TIMING = ("timing/", "perf/")


class VowelShareReward:
    """Varies on a random tiny model's gibberish, so the advantages are not all zero."""

    def __call__(self, rows, responses, group_index):
        scores = [sum(c in "aeiou" for c in r.lower()) / max(len(r), 1) for r in responses]
        return RewardResult(scores=scores, correct=[float(s > 0.2) for s in scores])


class ToyClassmateReward(VowelShareReward):
    """Classmate signals without classmate models: the CoT is the first half of the text, the classmate
    score its share of consonants."""

    provides_signals = ("classmate_scores", "cot_spans")

    def __call__(self, rows, responses, group_index):
        result = super().__call__(rows, responses, group_index)
        spans = [(0, len(r) // 2) for r in responses]
        cl = [sum(c.isalpha() and c not in "aeiou" for c in r[a:b].lower()) / max(b - a, 1) for r, (a, b) in zip(responses, spans)]  # fmt: skip
        if hasattr(result, "signals"):
            result.signals.update(classmate_scores=cl, cot_spans=spans)
        else:  # the RewardResult of main before issue 13
            result.classmate_scores, result.cot_spans = cl, spans
        return result


def _history(run_id: str) -> dict[str, dict[int, float]]:
    import mlflow

    client = mlflow.MlflowClient()
    run = client.get_run(run_id)
    out = {}
    for key in sorted(run.data.metrics):
        if key.startswith(TIMING):
            continue
        out[key] = {m.step: m.value for m in client.get_metric_history(run_id, key)}
    return out


def _run_grpo(model: Path, run_dir: Path, overrides: list[str]) -> str:
    from train.config import build_config
    from train.stages.grpo import run

    cfg = build_config(overrides=[f"model.path={model}", f"run_dir={run_dir}", *COMMON, *overrides])
    run(cfg)
    return (run_dir / "mlflow_run_id").read_text()


def _run_stage(kind: str, model: Path, run_dir: Path) -> str:
    from omegaconf import OmegaConf

    from train.config import merge_layers, override_layers

    if kind == "sft":
        from train.stages.sft import SFTStage as Stage
    else:
        from train.stages.dpo import DPOStage as Stage
    stage = Stage()
    cfg = merge_layers(
        OmegaConf.structured(stage.schema),
        override_layers([f"model.path={model}", f"run_dir={run_dir}", *STAGE_COMMON]),
    )
    stage.validate(cfg)
    stage.run(cfg)
    return (run_dir / "mlflow_run_id").read_text()


def record(out: Path, only: list[str] | None = None) -> dict:
    from infra.models import build_tiny_model
    from train.policy.distributed import init_distributed

    init_distributed()
    result: dict = {}
    saved_uri = os.environ.get("MLFLOW_TRACKING_URI")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp / 'mlflow.db'}"
        model = build_tiny_model(tmp / "model")
        for name, overrides in GRPO_CASES.items():
            if only and name not in only:
                continue
            result[name] = _history(_run_grpo(model, tmp / name, overrides))
        for kind in ("sft", "dpo"):
            if only and kind not in only:
                continue
            result[kind] = _history(_run_stage(kind, model, tmp / kind))
    if saved_uri is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = saved_uri
    out.write_text(json.dumps(result, indent=1, sort_keys=True))
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--only", nargs="*")
    a = p.parse_args()
    record(a.out, a.only)


if __name__ == "__main__":
    main()
    exit_now(0)
