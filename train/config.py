"""Every training knob, with its default and meaning (`python -m train --help` prints this list).

Experiments (`experiments/<name>.yaml`) override these under `config:`; command-line `key=value`
overrides come last. Components that can be swapped (rollout engine, reward) are Hydra `_target_`
dicts, so a new one is a config change, not an `if` chain.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

PROJECT_ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS_DIR = Path(os.environ.get("RLPOST_EXPERIMENTS_DIR", PROJECT_ROOT / "experiments"))


@dataclass
class ModelConfig:
    path: str = "default"  # HF checkpoint folder, or `default` = embedded SmolLM2-135M-Instruct


@dataclass
class DataConfig:
    train_path: str = "builtin:arithmetic"  # Parquet file (data_prep schema) or builtin:arithmetic
    val_path: str | None = None  # held-out Parquet file (or builtin:arithmetic, its test split) for val_every
    val_size: int = 200  # rows generated when val_path is builtin:arithmetic
    builtin_size: int = 2000  # rows generated for builtin:arithmetic
    prompts_per_step: int = 8  # prompts per rollout batch (x rollout.n samples each)
    max_prompt_tokens: int = 256  # longer prompts are dropped at load time (counted and reported)
    shuffle: bool = True


@dataclass
class RolloutConfig:
    engine: dict[str, Any] = field(
        default_factory=lambda: {"_target_": "train.rollout.vllm_engine.VLLMEngine", "kv_cache_gb": 1.0}
    )  # or {_target_: train.rollout.hf_engine.HFEngine}
    n: int = 4  # samples per prompt (the GRPO group size)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 64
    dtype: str = "auto"  # engine compute dtype; auto = the policy's resolved precision (float32 | bfloat16)
    max_model_len: int = 1024
    gpu_memory_utilization: float = 0.5  # GPU only: share of each GPU vLLM may take (weights + KV cache)
    tensor_parallel_size: int = 1  # GPU: ranks per vLLM TP group (consecutive ranks); must divide world_size
    sleep_level: int = (
        2  # GPU: vLLM sleep before the update (2 = drop weights+KV, 1 = weights to CPU, 0 = off)
    )
    enforce_eager: bool | None = None  # None = CUDA graphs on GPU, eager on CPU


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "grpo"  # grpo | rloo | reinforce_plus_plus | remax | gdpo | gdpo_wo_bn | grpo_w_classmate | grpo_main_classmate_separated
    token_level_classmate_reward_mode: str = "classmate_partial"  # classmate_partial | all
    norm_adv_by_std_in_grpo: bool = True  # False = Dr.GRPO advantages (s - group mean)
    loss_agg_mode: str = (
        "token-mean"  # token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm
    )
    loss_scale_factor: float | None = (
        None  # seq-mean-token-sum-norm divisor (default: rollout.max_new_tokens)
    )
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0  # dual-clip bound for negative advantages (> 1)
    use_kl_loss: bool = False  # KL to a frozen reference as a loss term
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"  # k1 | abs | k2 | mse | k3 | low_var_kl
    use_kl_in_reward: bool = False  # k1 KL subtracted from the reward instead (fixed beta)
    kl_in_reward_coef: float = 0.001
    entropy_coeff: float = 0.0
    ppo_mini_batch_size: int | None = None  # prompts per optimizer step; None = prompts_per_step (one update)
    ppo_epochs: int = 1


@dataclass
class OptimConfig:
    lr: float = 1e-6
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    grad_clip: float = 1.0
    warmup_steps: int = 0
    schedule: str = "constant"  # constant | cosine


@dataclass
class PolicyConfig:
    precision: str = "auto"  # auto | fp32 | bf16 (bf16 compute, fp32 master weights, fp32 gradient reduce); auto = bf16 where it multiplies faster (measured at start)
    gradient_checkpointing: bool = False  # activation checkpointing: recompute each layer in backward
    micro_batch_tokens: int = 2048  # token budget of one forward/backward micro-batch (padded tokens)
    share_prompts: bool = True  # a group's prompt runs through the model once, not n times (same log-probs)
    pack_sequences: bool = (
        False  # padding-free micro-batches (one packed row; for GPUs, wins over share_prompts)
    )
    attn_implementation: str = (
        "auto"  # auto | sdpa | flash_attention_2 | eager (auto: flash for packed rows on GPU when installed)
    )
    cpu_offload: bool = False  # GPU: keep parameter shards, gradients and optimizer step on the CPU


@dataclass
class TrainConfig:
    experiment: str = "adhoc"  # MLflow experiment name
    run_name: str | None = None  # default: <experiment>-s<seed>-<time>
    output_dir: str = "outputs"  # run folders go to <output_dir>/<experiment>/<run_name>
    run_dir: str | None = None  # explicit run folder (overrides output_dir/experiment/run_name)
    seed: int = 1
    total_steps: int = 20
    save_every: int = 10  # checkpoint every N steps (and at the end); 0 = only at the end
    keep_last: int | None = 2  # checkpoints kept (None = all)
    resume: bool = False  # continue from <run_dir>/checkpoints/latest in the same MLflow run
    val_every: int = 0  # greedy validation every N steps on data.val_path, logged as val/* (0 = off)
    log_every: int = 1
    world_size: int = 1  # ranks (torchrun is used when > 1)
    track: bool = True  # log to MLflow (MLFLOW_TRACKING_URI, else ./mlflow.db)
    parent_run_id: str | None = None  # set by sweeps: the sweep's MLflow run
    tags: dict[str, str] = field(default_factory=dict)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    reward: dict[str, Any] = field(
        default_factory=lambda: {"_target_": "train.rewards.math_reward.MathReward", "timeout_s": 3.0}
    )


class ConfigError(ValueError):
    pass


def experiment_file(name: str) -> Path:
    path = EXPERIMENTS_DIR / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in EXPERIMENTS_DIR.glob("*.yaml"))
        raise ConfigError(f"unknown experiment {name!r}: no {path} (known: {', '.join(known) or 'none'})")
    return path


def load_experiment(name: str) -> DictConfig:
    return OmegaConf.load(experiment_file(name))


def build_config(
    experiment: str | None = None, overrides: list[str] | None = None, preset: str | None = None
) -> DictConfig:
    """Base defaults <- experiment `config:` <- experiment `presets.<preset>` <- `key=value` overrides."""
    cfg = OmegaConf.structured(TrainConfig)
    layers = []
    if experiment:
        exp = load_experiment(experiment)
        layers.append(OmegaConf.create({"experiment": experiment}))
        layers.append(exp.get("config", OmegaConf.create()))
        if preset:
            layers.append(_preset(preset, exp.get("presets", {})))
    elif preset:
        layers.append(_preset(preset, {}))
    layers.extend(override_layers(overrides or []))
    cfg = merge_layers(cfg, layers)
    validate(cfg)
    return cfg


def override_layers(overrides: list[str]) -> list[DictConfig]:
    """`key=value` strings -> one config layer each (in order)."""
    layers = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(
                f"bad override {item!r}: expected key=value (python -m train --help lists the keys)"
            )
        layers.append(OmegaConf.from_dotlist([item]))
    return layers


def merge_layers(cfg: DictConfig, layers: list) -> DictConfig:
    """Merge layers onto a structured config in order; a bad key or type is a ConfigError naming the key.

    Shared by every config schema (GRPO here, the SFT/DPO stages in train/stages/).
    """
    try:
        for layer in layers:
            cfg = OmegaConf.merge(_drop_replaced_components(cfg, layer), layer)
    except Exception as exc:  # omegaconf's messages name the key; keep the first line
        key = getattr(exc, "full_key", None)
        where = f" for {key}" if key else ""
        raise ConfigError(f"bad config value{where}: {str(exc).splitlines()[0]}") from exc
    return cfg


def _preset(name: str, experiment_presets) -> DictConfig:
    """An experiment's own preset, else an algorithm preset (grpo, dr_grpo) from train.algorithms.presets."""
    from train.algorithms.presets import PRESETS

    if name in experiment_presets:
        return experiment_presets[name]
    if name in PRESETS:
        return OmegaConf.create({"algorithm": dict(PRESETS[name])})
    known = sorted(set(experiment_presets) | set(PRESETS))
    raise ConfigError(f"unknown preset {name!r} (known: {', '.join(known)})")


SWAPPABLE = ("reward", "reward.judge", "reward.quality", "rollout.engine")  # nested ones: DARLING's parts


def _drop_replaced_components(cfg: DictConfig, layer: DictConfig) -> DictConfig:
    """A layer naming a new `_target_` replaces the whole component dict (old kwargs would not fit)."""
    for path in SWAPPABLE:
        new = OmegaConf.select(layer, f"{path}._target_", default=None)
        if new is not None and new != OmegaConf.select(cfg, f"{path}._target_", default=None):
            OmegaConf.update(cfg, path, {}, merge=False)
    return cfg


def validate(cfg: DictConfig) -> None:
    """Checks omegaconf's types cannot express; each error names the key and what is allowed."""
    checks = [
        (cfg.data.prompts_per_step > 0, "data.prompts_per_step must be > 0"),
        (cfg.rollout.n >= 1, "rollout.n must be >= 1"),
        (cfg.rollout.max_new_tokens >= 1, "rollout.max_new_tokens must be >= 1"),
        (cfg.rollout.temperature >= 0, "rollout.temperature must be >= 0"),
        (cfg.total_steps >= 1, "total_steps must be >= 1"),
        (cfg.world_size >= 1, "world_size must be >= 1"),
        (
            cfg.data.prompts_per_step % cfg.world_size == 0,
            "data.prompts_per_step must be divisible by world_size",
        ),
        (cfg.algorithm.clip_ratio_c > 1, "algorithm.clip_ratio_c must be > 1"),
        (cfg.optim.lr > 0, "optim.lr must be > 0"),
        (cfg.policy.precision in ("auto", "fp32", "bf16"), "policy.precision must be auto, fp32 or bf16"),
        (
            cfg.rollout.tensor_parallel_size >= 1 and cfg.world_size % cfg.rollout.tensor_parallel_size == 0,
            "rollout.tensor_parallel_size must divide world_size",
        ),
        (0 < cfg.rollout.gpu_memory_utilization <= 1, "rollout.gpu_memory_utilization must be in (0, 1]"),
        (cfg.rollout.sleep_level in (0, 1, 2), "rollout.sleep_level must be 0, 1 or 2"),
        (cfg.algorithm.ppo_epochs >= 1, "algorithm.ppo_epochs must be >= 1"),
    ]
    mini = cfg.algorithm.ppo_mini_batch_size
    if mini is not None:
        checks.append(
            (
                mini > 0 and cfg.data.prompts_per_step % mini == 0,
                "algorithm.ppo_mini_batch_size must divide data.prompts_per_step",
            )
        )
    for ok, message in checks:
        if not ok:
            raise ConfigError(f"bad config value: {message}")


def describe() -> str:
    """The option list for --help: every key with its default and the comment beside it in this file."""
    import inspect
    import re

    source = inspect.getsource(inspect.getmodule(describe))
    comments: dict[tuple[str, str], str] = {}
    current = ""
    for line in source.splitlines():
        m = re.match(r"class (\w+)Config", line)
        if m:
            current = m.group(1)
        m = re.match(r"\s+(\w+): [^=]+= .*?#\s*(.*)$", line)
        if m:
            comments[(current, m.group(1))] = m.group(2)
    section_class = {
        "": "Train",
        "model": "Model",
        "data": "Data",
        "rollout": "Rollout",
        "algorithm": "Algorithm",
        "optim": "Optim",
        "policy": "Policy",
    }
    lines = []
    flat = OmegaConf.to_container(OmegaConf.structured(TrainConfig))
    for key, value in _walk(flat):
        section = key.split(".")[0] if "." in key else ""
        cls = section_class.get(section, "")
        note = comments.get((cls, key.split(".")[-1] if section in section_class else key.split(".")[0]), "")
        lines.append(f"  {key}={value!r}" + (f"    # {note}" if note else ""))
    return "\n".join(lines)


def _walk(d: dict, prefix: str = ""):
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and not any(str(x).startswith("_target_") for x in v):
            yield from _walk(v, key + ".")
        else:
            yield key, v
