"""Every training knob, with its default and meaning (`python -m train --help` prints this list:
train/help.py reads the comment beside each field here).

Experiments (`experiments/<name>.yaml`) override these under `config:`; command-line `key=value`
overrides come last. Components that can be swapped (rollout engine, reward) are Hydra `_target_`
dicts, so a new one is a config change, not an `if` chain.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from infra.models import PROJECT_ROOT


def checked(
    default: Any,
    rule: str = "",
    valid: Callable[[Any], bool] | None = None,
    choices: tuple | None = None,
    note: str = "",
) -> Any:
    """A config field whose value `check_fields` checks: the range sits beside the declaration, declared as
    the method table's knobs are (train/algorithms/registry.py Knob). `note` ends the error line."""
    from train.algorithms.registry import Knob

    knob = Knob(default, note, type(default), choices=choices, valid=valid, rule=rule)
    return field(default=default, metadata={"knob": knob})


EXPERIMENTS_DIR = Path(os.environ.get("RLPOST_EXPERIMENTS_DIR", PROJECT_ROOT / "experiments"))


@dataclass
class ModelConfig:
    path: str = "default"  # HF checkpoint folder, or `default` = embedded SmolLM2-135M-Instruct


@dataclass
class DataConfig:
    train_path: str = "builtin:arithmetic"  # Parquet file (data_prep schema) or builtin:arithmetic
    val_path: str | None = None  # held-out Parquet file (or builtin:arithmetic, its test split) for val_every
    val_size: int = 200  # rows generated when val_path is builtin:arithmetic
    val_n: int = checked(
        1, ">= 1", lambda n: n >= 1
    )  # samples per held-out prompt: 1 = one greedy answer; n > 1 = n samples, pass@1..n
    val_temperature: float = checked(
        1.0, ">= 0", lambda t: t >= 0
    )  # sampling temperature of held-out answers when val_n > 1
    builtin_size: int = 2000  # rows generated for builtin:arithmetic
    prompts_per_step: int = checked(
        8, "> 0", lambda n: n > 0
    )  # prompts per rollout batch (x rollout.n samples each)
    max_prompt_tokens: int = checked(
        256, ">= 1", lambda n: n >= 1
    )  # longer prompts are dropped at load time (counted and reported)
    shuffle: bool = True
    prompt_template: str | None = None  # null = chat template; r1_zero | question_only (plain text, CS336)


@dataclass
class RolloutConfig:
    # the engine and its own settings (rollout.engine.<argument>: e.g. max_model_len, dtype, and on GPUs
    # gpu_memory_utilization, tensor_parallel_size, sleep_level, enforce_eager for vLLM), or
    # {_target_: train.rollout.hf_engine.HFEngine}; dtype defaults to the policy's resolved precision
    engine: dict[str, Any] = field(
        default_factory=lambda: {"_target_": "train.rollout.vllm_engine.VLLMEngine", "kv_cache_gb": 1.0}
    )
    n: int = checked(4, ">= 1", lambda n: n >= 1)  # samples per prompt (the GRPO group size)
    temperature: float = checked(1.0, ">= 0", lambda t: t >= 0)
    top_p: float = checked(1.0, "in (0, 1]", lambda p: 0 < p <= 1)
    top_k: int = -1
    max_new_tokens: int = checked(64, ">= 1", lambda n: n >= 1)


@dataclass
class KLCtrlConfig:
    """The in-reward KL coefficient (`use_kl_in_reward`; estimator: `algorithm.kl_penalty`), verl's names."""

    type: str = checked(
        "fixed", choices=("fixed", "adaptive")
    )  # fixed | adaptive (moves kl_coef toward target_kl, Ziegler et al. 2019)
    kl_coef: float = checked(
        0.001, ">= 0", lambda c: c >= 0
    )  # the (initial) coefficient beta of the in-reward KL
    target_kl: float = checked(0.1, "> 0", lambda k: k > 0)  # adaptive: target mean per-token KL
    horizon: int = checked(
        10000, "> 0", lambda h: h > 0
    )  # adaptive: responses over which the coefficient moves (larger = slower)


@dataclass
class CriticConfig:
    """The value model of PPO with a critic (`algorithm.adv_estimator=gae`); unused otherwise."""

    model_path: str | None = None  # None = the policy's starting model (a fresh value head on its trunk)
    lr: float = checked(1e-5, "> 0", lambda x: x > 0)
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    cliprange_value: float = checked(
        0.5, "> 0", lambda x: x > 0
    )  # clipped value loss: V may move at most this far from the rollout's V
    warmup_steps: int = checked(
        0, ">= 0", lambda n: n >= 0
    )  # the first N steps train the critic alone (verl: trainer.critic_warmup)
    ppo_epochs: int | None = checked(
        None, ">= 1", lambda n: n >= 1, note="or null"
    )  # None = algorithm.ppo_epochs


@dataclass
class AlgorithmConfig:
    """Shared by every method; each estimator's and policy loss's own knobs (`algorithm.<knob>`) are
    added from the method table (train/algorithms/registry.py) by `algorithm_schema()`."""

    adv_estimator: str = "grpo"  # a registered advantage estimator (the list: python -m train --help)
    policy_loss_mode: str = "vanilla"  # a registered policy loss (verl: actor.policy_loss.loss_mode)
    loss_agg_mode: str = (
        "token-mean"  # token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm
    )
    loss_scale_factor: float | None = checked(
        None, "> 0", lambda x: x > 0, note="or null = rollout.max_new_tokens"
    )  # seq-mean-token-sum-norm divisor (default: rollout.max_new_tokens)
    use_kl_loss: bool = False  # KL to a frozen reference as a loss term
    kl_loss_coef: float = checked(0.001, ">= 0", lambda c: c >= 0)
    kl_loss_type: str = (
        "low_var_kl"  # k1 | abs | k2 | mse | k3 | low_var_kl; a '+' suffix (k3+): k2's gradient
    )
    use_kl_in_reward: bool = False  # KL to the reference subtracted from the reward at every token (verl)
    kl_ctrl: KLCtrlConfig = field(default_factory=lambda: KLCtrlConfig())
    entropy_coeff: float = 0.0
    ppo_mini_batch_size: int | None = None  # prompts per optimizer step; None = prompts_per_step (one update)
    ppo_epochs: int = checked(1, ">= 1", lambda n: n >= 1)


@dataclass
class OptimConfig:
    lr: float = checked(1e-6, "> 0", lambda x: x > 0)
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    grad_clip: float = 1.0
    warmup_steps: int = checked(0, ">= 0", lambda n: n >= 0)
    schedule: str = checked("constant", choices=("constant", "cosine"))


@dataclass
class LoraConfig:
    """LoRA adapters (PEFT) on the policy: only they train; the base stays frozen (train/policy/lora.py)."""

    rank: int = checked(
        0, ">= 0", lambda n: n >= 0, note="0 = off"
    )  # adapter rank r; 0 = every weight trains
    alpha: float = checked(32.0, "> 0", lambda a: a > 0)  # the adapter's update is scaled by alpha / rank
    dropout: float = checked(0.0, "in [0, 1)", lambda p: 0 <= p < 1)  # dropout on the adapters' input
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )  # module names (suffixes) that get adapters, or [all-linear]


@dataclass
class PolicyConfig:
    precision: str = checked(
        "auto", choices=("auto", "fp32", "bf16")
    )  # auto | fp32 | bf16 (bf16 compute, fp32 master weights, fp32 gradient reduce); auto = bf16 where it multiplies faster (measured at start)
    gradient_checkpointing: bool = False  # activation checkpointing: recompute each layer in backward
    micro_batch_tokens: int = checked(
        2048, ">= 1", lambda n: n >= 1
    )  # token budget of one forward/backward micro-batch (padded tokens)
    share_prompts: bool = True  # a group's prompt runs through the model once, not n times (same log-probs)
    pack_sequences: bool = (
        False  # padding-free micro-batches (one packed row; for GPUs, wins over share_prompts)
    )
    attn_implementation: str = "auto"  # auto | sdpa | sdpa_shared_prompt | flex_attention | flash_attention_2 | eager (auto: flex_attention on GPU; on CPU sdpa_shared_prompt for shared-prompt units, else sdpa)
    fp32_matmul: str = checked(
        "auto", choices=("auto", "onednn", "torch")
    )  # CPU, fp32: which kernel multiplies matrices: torch's BLAS (MKL on x86) or oneDNN; auto = oneDNN where measured >= 1.2x faster
    torch_compile: bool = True  # compile the log-prob/entropy maths over the vocabulary (fused loops; as verl's actor.use_torch_compile)
    cpu_offload: bool = False  # GPU: keep parameter shards, gradients and optimizer step on the CPU
    lora: LoraConfig = field(default_factory=LoraConfig)  # rank > 0: train LoRA adapters only (PEFT)


@dataclass
class RunConfig:
    """Run-level knobs every loop shares (train/loop.py): GRPO here, SFT and DPO in train/stages/."""

    experiment: str = "adhoc"  # MLflow experiment name
    run_name: str | None = None  # default: <experiment>[-<stage>]-s<seed>-<time>
    output_dir: str = "outputs"  # run folders go to <output_dir>/<experiment>/<run_name>
    run_dir: str | None = None  # explicit run folder (overrides output_dir/experiment/run_name)
    seed: int = 1
    total_steps: int = checked(20, ">= 1", lambda n: n >= 1)  # optimizer steps (GRPO: rollout steps)
    save_every: int = checked(
        10, ">= 0", lambda n: n >= 0, note="0 = only at the end"
    )  # checkpoint every N steps (and at the end); 0 = only at the end
    keep_last: int | None = checked(
        2, ">= 1", lambda n: n >= 1, note="or null = keep all"
    )  # checkpoints kept, >= 1 (null = all)
    save_hf_dtype: str = checked(
        "float32", choices=("float32", "bfloat16")
    )  # each checkpoint's hf/ export: float32 | bfloat16 (resuming reads state/)
    save_hf_merged: bool = False  # under policy.lora: hf/ holds merged weights, not the PEFT adapter folder
    resume: bool = False  # continue from <run_dir>/checkpoints/latest in the same MLflow run
    checkpoint_on_preempt: bool = True  # SIGTERM/SIGUSR2 (preemption, scancel, time limit): checkpoint, exit
    preempt_grace_s: float = checked(
        20.0, ">= 0", lambda x: x >= 0, note="0 = no limit"
    )  # budget from such a signal to the exit, step then save: past it the step (then the save) is abandoned
    val_every: int = checked(
        0, ">= 0", lambda n: n >= 0, note="0 = off"
    )  # held-out validation before training, every N steps and at the end, val/* (0 = off)
    log_every: int = checked(1, ">= 1", lambda n: n >= 1)
    world_size: int = checked(1, ">= 1", lambda n: n >= 1)  # ranks (torchrun is used when > 1)
    dist_timeout_s: float = checked(
        7200.0, "> 0", lambda x: x > 0
    )  # collectives' timeout (NCCL and gloo): above the longest wait of a rank for the slowest one's generation
    track: bool = True  # log to MLflow (MLFLOW_TRACKING_URI, else ./mlflow.db)
    parent_run_id: str | None = None  # set by sweeps: the sweep's MLflow run
    tags: dict[str, str] = field(default_factory=dict)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    # GRPO's rollouts; the offline stages' greedy accuracy check uses engine and max_new_tokens
    rollout: RolloutConfig = field(default_factory=RolloutConfig)


@dataclass
class ExpertIterationConfig:
    """`trainer=expert_iteration` (train/stages/expert_iteration.py): each step is one round: rollout.n
    samples for each of data.prompts_per_step questions, keep the correct ones, SFT on them."""

    sft_epochs: int = 1  # passes over a round's kept samples
    batch_size: int = 8  # kept samples per SFT optimizer step (over all ranks)
    require_format: bool = False  # also keep only samples in the reward's format (its `format` signal)
    loss_normalization: str = "token_mean"  # token_mean | sequence_constant (the SFT stage's options)
    normalize_constant: float = 1.0  # sequence_constant: each sequence's summed NLL is divided by this


@dataclass
class EnvConfig:
    """Multi-turn rollouts (train/rollout/agent_loop.py): tools the model may call and an environment it talks
    to. Off while `tools` is empty and `interaction` null (one prompt, one response)."""

    multi_turn: bool | None = (
        None  # null: on when tools or an interaction are set; true: the agent loop even without
    )
    tools: Any = field(
        default_factory=list
    )  # a list of names (calculator, python, catalog: train/env/registry.py) or {_target_: ...} entries; or "a,b"
    interaction: Any = (
        None  # an environment per trajectory: a name (answer_check) or {_target_: ...}; null = tools only
    )
    max_turns: int = checked(4, ">= 1", lambda n: n >= 1)  # model turns per trajectory
    max_total_tokens: int | None = checked(
        None, ">= 1", lambda n: n >= 1, note="or null = max_turns x rollout.max_new_tokens"
    )  # response tokens per trajectory, model and environment turns together
    max_observation_tokens: int = checked(
        256, ">= 1", lambda n: n >= 1
    )  # a longer tool result is cut (an error)
    tool_timeout_s: float = checked(
        10.0, "> 0", lambda x: x > 0
    )  # a call still running this long is an error
    tool_workers: int = checked(
        8, ">= 1", lambda n: n >= 1
    )  # threads running tool calls and environment steps
    schedule: str = checked(
        "async", choices=("async", "sync")
    )  # async: the engine generates for others while one waits; sync: turn-synchronous batches
    tool_format: str = checked(
        "auto", choices=("auto", "native", "fallback")
    )  # native: the chat template's own tools; fallback: <tool_call> JSON described in the system prompt


TRAINERS = ("grpo", "expert_iteration")


@dataclass
class TrainConfig(RunConfig):
    """GRPO (`python -m train`): the run keys plus prompts, the method and the reward."""

    trainer: str = "grpo"  # grpo (every estimator) | expert_iteration (the `ei:` keys)
    ei: ExpertIterationConfig = field(default_factory=ExpertIterationConfig)
    data: DataConfig = field(default_factory=DataConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    env: EnvConfig = field(default_factory=EnvConfig)  # tools and environments (multi-turn rollouts)
    log_samples_every: int = 10  # rollouts (8 groups) as MLflow artifacts: step 1, every N steps (0 = off)
    reward: dict[str, Any] = field(
        default_factory=lambda: {"_target_": "train.rewards.math_reward.MathReward", "timeout_s": 3.0}
    )


class ConfigError(ValueError):
    pass


def algorithm_schema() -> type:
    """AlgorithmConfig plus every registered knob (typed, with its default)."""
    from train.algorithms.registry import knobs

    fields = []
    for name, knob in knobs().items():
        kind = knob.value_type if knob.default is not None or knob.type is None else knob.type | None
        fields.append((name, kind, field(default=knob.default)))
    return make_dataclass("AlgorithmConfig", fields, bases=(AlgorithmConfig,))


def train_schema() -> type:
    """The GRPO run schema: TrainConfig with the method table's knobs under `algorithm`."""
    algorithm = algorithm_schema()
    return make_dataclass(
        "TrainConfig", [("algorithm", algorithm, field(default_factory=algorithm))], bases=(TrainConfig,)
    )


def experiment_file(name: str) -> Path:
    path = EXPERIMENTS_DIR / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in EXPERIMENTS_DIR.glob("*.yaml"))
        raise ConfigError(f"unknown experiment {name!r}: no {path} (known: {', '.join(known) or 'none'})")
    return path


EXPERIMENT_SECTIONS = ("config", "presets", "sweep", "stages")  # each a mapping when present
MAX_YAML_DEPTH, MAX_YAML_NODES = 32, 100_000  # far above any experiment; OmegaConf recurses, slowly


def _check_shape(value, path: Path) -> None:
    """ConfigError for YAML nested deeper than MAX_YAML_DEPTH or (aliases repeated) larger than
    MAX_YAML_NODES, checked on libyaml's fast parse before OmegaConf builds it (seconds, then RecursionError)."""
    todo, seen = [(value, 1)], 0
    while todo:
        v, depth = todo.pop()
        seen += 1
        if depth > MAX_YAML_DEPTH or seen > MAX_YAML_NODES:
            deep = f"nested deeper than {MAX_YAML_DEPTH} levels"
            raise ConfigError(
                f"{path}: {deep if depth > MAX_YAML_DEPTH else 'too large (aliases repeated?)'}"
            )
        items = v.values() if isinstance(v, dict) else v if isinstance(v, list) else ()
        todo += [(x, depth + 1) for x in items]


def load_experiment(name: str) -> DictConfig:
    """An experiment file (a mapping of config, presets, sweep, stages), or ConfigError naming the file
    and where or what is wrong in it."""
    import yaml

    path = experiment_file(name)
    try:
        _check_shape(yaml.load(path.read_bytes(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)), path)
        exp = OmegaConf.load(path)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = (getattr(exc, "problem", None) or str(exc).splitlines()[0]).strip()
        raise ConfigError(f"{path}: not valid YAML{where} ({what})") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deep to read") from None
    except Exception as exc:  # noqa: BLE001 - bytes that are not UTF-8, values OmegaConf refuses
        first = next((ln for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise ConfigError(f"{path}: cannot be read ({first.strip()[:160]})") from None
    if not isinstance(exp, DictConfig):
        raise ConfigError(f"{path}: holds a list, not a mapping of {', '.join(EXPERIMENT_SECTIONS)}")
    raw = OmegaConf.to_container(exp, resolve=False)
    for section in EXPERIMENT_SECTIONS:
        if raw.get(section) is not None and not isinstance(raw[section], dict):
            raise ConfigError(f"{path}: `{section}:` is {str(raw[section])[:40]!r}, not a mapping of keys")
    return exp


def split_cli(argv: list[str]) -> tuple[str | None, str | None, list[str]]:
    """`experiment=X preset=Y key=value ...` -> (experiment, preset, the overrides), as every CLI takes them."""
    experiment = preset = None
    overrides = []
    for arg in argv:
        if arg.startswith("experiment="):
            experiment = arg.split("=", 1)[1]
        elif arg.startswith("preset="):
            preset = arg.split("=", 1)[1]
        else:
            overrides.append(arg)
    return experiment, preset, overrides


def build_config(
    experiment: str | None = None, overrides: list[str] | None = None, preset: str | None = None
) -> DictConfig:
    """Base defaults <- experiment `config:` <- experiment `presets.<preset>` <- `key=value` overrides."""
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
    # Run keys and components first, on an untyped merge: their errors come before the method table
    # (and torch) is imported to type the `algorithm` knobs.
    untyped = merge_layers(
        OmegaConf.create(OmegaConf.to_container(OmegaConf.structured(TrainConfig))), layers
    )
    with contextlib.suppress(TypeError):  # a badly typed value: the typed merge below names it
        validate_run(untyped)
    validate_components(untyped, ENGINE_SUPPLIED)
    cfg = merge_layers(OmegaConf.structured(train_schema()), layers)
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
    refuse_secrets(cfg)
    return cfg


def refuse_secrets(cfg: DictConfig) -> None:
    """A config is written to sweep files, config.yaml and MLflow, so it must not hold a key."""
    from infra.redact import secrets_in

    found = secrets_in(OmegaConf.to_container(cfg, resolve=False))
    if found:
        raise ConfigError(
            f"{', '.join(found)} holds a secret (an API key, token or password); configs are written to "
            "disk and MLflow, so keys come only from the environment: export it and name the variable "
            f"instead, e.g. {found[0].rsplit('.', 1)[0] + '.' if '.' in found[0] else ''}api_key_env=MY_KEY"
        )


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


def _fail_first(checks: list[tuple[bool, str]]) -> None:
    for ok, message in checks:
        if not ok:
            raise ConfigError(f"bad config value: {message}")


def check_fields(cfg: DictConfig, schema: type, prefix: str = "") -> None:
    """The ranges and choices declared beside each field (`checked`), nested configs included."""
    for f in dataclasses.fields(schema):
        knob = f.metadata.get("knob")
        value = cfg.get(f.name) if f.name in cfg else None
        if knob is not None:
            problem = knob.problem(value)
            if problem:
                note = f" ({knob.doc})" if knob.doc else ""
                raise ConfigError(f"bad config value: {prefix}{f.name}={value!r} {problem}{note}")
        elif f.default_factory is not dataclasses.MISSING and isinstance(value, DictConfig):
            default = f.default_factory()
            if dataclasses.is_dataclass(default):
                check_fields(value, type(default), f"{prefix}{f.name}.")


def validate_run(cfg: DictConfig, schema: type = RunConfig) -> None:
    """The keys every loop shares (RunConfig, or `schema`): their declared ranges and choices."""
    check_fields(cfg, schema)
    lora = cfg.policy.lora
    if lora.rank > 0 and not lora.target_modules:
        raise ConfigError(
            "bad config value: policy.lora.target_modules=[] with policy.lora.rank > 0: name the modules "
            "that get adapters, e.g. [q_proj,v_proj] or [all-linear]"
        )


def validate_components(cfg: DictConfig, supplied: dict[str, set[str]] | None = None) -> None:
    """Every `_target_` exists and its keyword arguments fit its signature."""
    from train.components import ComponentError, check

    try:
        check(OmegaConf.to_container(cfg, resolve=True), supplied)
    except ComponentError as exc:
        raise ConfigError(str(exc)) from None


def _engine_supplied() -> dict[str, set[str]]:
    """The arguments the trainer gives every rollout engine (the config need not)."""
    from train.rollout.base import ENGINE_ARGS

    return {"rollout.engine": set(ENGINE_ARGS)}


ENGINE_SUPPLIED = _engine_supplied()


def validate_engine(cfg: DictConfig) -> None:
    """`rollout.engine`: the trainer gives it the weights, and the engine's own checks pass (its class's
    `check_settings`, with its constructor's arguments as configured or defaulted)."""
    import inspect

    from train.components import HYDRA_KEYS, ComponentError, load_target

    node = OmegaConf.to_container(cfg.rollout.engine, resolve=True)
    if "model_path" in node:
        raise ConfigError(
            "rollout.engine.model_path: the trainer gives the engine the policy's weights; set model.path"
        )
    try:
        engine = load_target("rollout.engine", node["_target_"])
    except ComponentError as exc:
        raise ConfigError(str(exc)) from None
    check = getattr(engine, "check_settings", None)
    if check is None:
        return
    bound = inspect.signature(engine).bind_partial(**{k: v for k, v in node.items() if k not in HYDRA_KEYS})
    bound.apply_defaults()
    try:
        check(world_size=cfg.world_size, **bound.arguments)
    except ValueError as exc:
        raise ConfigError(f"bad config value: {exc}") from None


def validate(cfg: DictConfig) -> None:
    """Everything about a GRPO config that can be known before a model loads; one line per error."""
    validate_run(cfg, TrainConfig)
    validate_components(cfg, ENGINE_SUPPLIED)
    checks = [
        (
            cfg.data.prompts_per_step % cfg.world_size == 0,
            "data.prompts_per_step must be divisible by world_size",
        ),
    ]
    checks += _cs336_checks(cfg)
    mini = cfg.algorithm.ppo_mini_batch_size
    if mini is not None:
        checks.append(
            (
                mini > 0 and cfg.data.prompts_per_step % mini == 0,
                "algorithm.ppo_mini_batch_size must divide data.prompts_per_step",
            )
        )
    _fail_first(checks)
    validate_env(cfg)
    validate_engine(cfg)
    validate_algorithm(cfg.algorithm, cfg.reward._target_, cfg)


def validate_env(cfg: DictConfig) -> None:
    """`env.*` (multi-turn rollouts): the tools and the interaction resolve, and the trajectories fit."""
    from train.env import registry

    if not registry.enabled(cfg.get("env")):
        return
    from train.components import check

    env = OmegaConf.to_container(cfg.env, resolve=True)
    try:  # short names resolved, then every component checked where it sits
        entries = registry.tool_entries(env["tools"])
        tools = [registry.spec_of(e, registry.TOOLS, f"env.tools[{i}]") for i, e in enumerate(entries)]
        interaction = env["interaction"]
        if interaction is not None:
            interaction = registry.spec_of(interaction, registry.INTERACTIONS, "env.interaction")
        check({"env": {"tools": tools, "interaction": interaction}})
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    for i, spec in enumerate(tools):  # the sandbox's own kill must come first, so the model reads why
        own = spec.get("timeout_s")
        if (
            spec["_target_"] == registry.TOOLS["python"]
            and own is not None
            and own + 0.5 > env["tool_timeout_s"]
        ):
            raise ConfigError(
                f"env.tools[{i}].timeout_s={own} must be at least 0.5 s below env.tool_timeout_s={env['tool_timeout_s']}"
                " (the sandbox's kill message would never reach the model): raise env.tool_timeout_s"
            )
    if cfg.data.prompt_template is not None:
        raise ConfigError(
            f"env.tools / env.interaction need the chat template: data.prompt_template={cfg.data.prompt_template} "
            "is plain text; set data.prompt_template=null"
        )
    budget = env["max_total_tokens"] or env["max_turns"] * cfg.rollout.max_new_tokens
    max_len = cfg.rollout.engine.get("max_model_len")
    if max_len is not None and cfg.data.max_prompt_tokens + budget > max_len:
        raise ConfigError(
            f"env: data.max_prompt_tokens={cfg.data.max_prompt_tokens} + a trajectory's {budget} response tokens "
            f"(env.max_total_tokens, or env.max_turns x rollout.max_new_tokens) exceed rollout.engine.max_model_len="
            f"{max_len}; raise max_model_len or lower env.max_total_tokens"
        )


def _validate_critic(cfg: DictConfig, has_critic: bool) -> None:
    """The critic's warm-up against the run; a critic exists where the estimator needs `values` (GAE)."""
    crit = cfg.critic
    _fail_first(
        [
            (
                crit.warmup_steps < cfg.total_steps or not has_critic,
                f"critic.warmup_steps={crit.warmup_steps} leaves no actor step in total_steps={cfg.total_steps}",
            ),
            (
                crit.warmup_steps == 0 or has_critic,
                "critic.warmup_steps needs a critic: use an estimator that needs values, e.g. "
                "algorithm.adv_estimator=gae (or critic.warmup_steps=0)",
            ),
        ]
    )


def _cs336_checks(cfg: DictConfig) -> list[tuple[bool, str]]:
    """The prompt template's, the trainer's and expert iteration's keys."""
    from data_prep.prompt_templates import TEMPLATES
    from train.components import class_constant

    ei, template = cfg.ei, cfg.data.prompt_template
    provides = class_constant(cfg.reward._target_, "provides_signals") or ()
    return [
        (
            template is None or template in TEMPLATES,
            f"data.prompt_template={template!r} is not one of {sorted(TEMPLATES)} (or null: the chat template)",
        ),
        (cfg.trainer in TRAINERS, f"trainer={cfg.trainer!r} is not one of {list(TRAINERS)}"),
        (ei.sft_epochs >= 1, "ei.sft_epochs must be >= 1"),
        (
            ei.batch_size >= 1 and ei.batch_size % cfg.world_size == 0,
            "ei.batch_size must be >= 1 and divisible by world_size",
        ),
        (
            ei.loss_normalization in ("token_mean", "sequence_constant"),
            "ei.loss_normalization must be token_mean or sequence_constant",
        ),
        (ei.normalize_constant > 0, "ei.normalize_constant must be > 0"),
        (
            cfg.trainer != "expert_iteration" or cfg.optim.schedule == "constant",
            "trainer=expert_iteration takes optim.schedule=constant (its optimizer steps per round vary)",
        ),
        (
            not (cfg.trainer == "expert_iteration" and ei.require_format) or "format" in provides,
            f"ei.require_format=true needs a reward that reports the format ({cfg.reward._target_} does not): "
            "use reward._target_=train.rewards.r1_zero_reward.R1ZeroReward",
        ),
    ]


def validate_algorithm(
    algo: DictConfig, reward_target: str | None = None, run: DictConfig | None = None
) -> None:
    """Mode names against the method table, knob values, the enabled step plug-ins' checks (with the run
    config `run`), and what the estimator needs from the reward: the one check of an estimator's needs."""
    from train.algorithms import registry
    from train.algorithms.aggregation import LOSS_AGG_MODES
    from train.algorithms.kl import KL_PENALTIES

    try:
        estimator = registry.adv_estimator(algo.adv_estimator)
        registry.policy_loss(algo.policy_loss_mode)
    except ValueError as exc:
        raise ConfigError(f"bad config value: {exc}") from None
    for key, value, allowed in (
        ("loss_agg_mode", algo.loss_agg_mode, LOSS_AGG_MODES),
        ("kl_loss_type", algo.kl_loss_type, (*KL_PENALTIES, *(f"{k}+" for k in KL_PENALTIES))),
    ):
        if value not in allowed:
            raise ConfigError(f"bad config value: algorithm.{key}={value!r} (known: {', '.join(allowed)})")
    for name, knob in registry.knobs().items():
        problem = knob.problem(algo[name])
        if problem:
            raise ConfigError(f"bad config value: algorithm.{name}={algo[name]!r} {problem} ({knob.doc})")
    if algo.rollout_rs is not None:  # the thresholds' shape depends on the criteria
        from train.algorithms.rollout_correction import parse_rejection

        try:
            parse_rejection(
                algo.rollout_rs, algo.rollout_rs_threshold, algo.rollout_rs_lower, algo.rollout_rs_upper
            )
        except ValueError as exc:
            raise ConfigError(f"bad config value: {exc}") from None
    if algo.filter_groups_metric == "seq_final_reward" and algo.use_kl_in_reward:
        raise ConfigError(
            "bad config value: algorithm.filter_groups_metric=seq_final_reward with use_kl_in_reward=true is "
            "not supported (the in-reward KL is computed after dynamic sampling); use seq_reward"
        )
    if run is not None:
        for plugin in registry.step_plugins(algo):
            problem = plugin.check(algo, run) if plugin.check else None
            if problem:
                raise ConfigError(f"bad config value: {problem}")
        _validate_critic(run, "values" in estimator.needs)
    from train.components import class_constant

    provided = set(class_constant(reward_target, "provides_signals") if reward_target else ())
    provided |= {f"{n.removesuffix('_spans')}_token_mask" for n in provided if n.endswith("_spans")}
    hint = f": use {estimator.hint}" if estimator.hint else ""
    for need in estimator.needs:
        if (
            registry.input_row(need) == registry.SIGNALS
            and need.removeprefix(registry.SIGNALS) not in provided
        ):
            name = (reward_target or "the reward").rpartition(".")[2]
            raise ConfigError(
                f"algorithm.adv_estimator={estimator.name} needs the reward signal "
                f"{need.removeprefix(registry.SIGNALS)}, which {name} does not provide{hint}"
            )
