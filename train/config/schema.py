"""Every training knob, with its default and meaning (`python -m train --help` prints this list:
train/help.py reads the comment beside each field here). The dataclasses and their defaults only: the
layers are merged in train/config/layers.py and checked in train/config/validate.py.

Experiments (`experiments/<name>.yaml`) override these under `config:`; command-line `key=value`
overrides come last. Components that can be swapped (rollout engine, reward) are Hydra `_target_`
dicts, so a new one is a config change, not an `if` chain.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, make_dataclass
from typing import Any


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
    max_calls_per_turn: int = checked(
        4, ">= 1", lambda n: n >= 1
    )  # calls past this many in one model turn are not made: one error observation each
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
    reward_weight: float = checked(
        0.0, "finite", lambda x: x == x and abs(x) != float("inf")
    )  # training reward += this x the environment's and tools' rewards of a trajectory (0: logged only)


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
