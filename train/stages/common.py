"""What the offline stages (SFT, DPO) share: run-level config, chat tokenization of prompt/response
pairs, and the loop around a stage's own `step`/`validate` (resume, greedy accuracy, checkpoints, MLflow).

The loop mirrors the GRPO trainer's (train/trainer.py) so a stage's run folder, checkpoints and MLflow
run look the same: `<run_dir>/checkpoints/step_NNNNNN/{hf,trainer_state.pt,meta.json}`, one MLflow run,
`rlpost.checkpoint.<step>` tags, resume from the latest checkpoint in the same MLflow run.
"""

from __future__ import annotations

import resource
import statistics
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from train.config import ConfigError, ModelConfig, OptimConfig, PolicyConfig, RolloutConfig
from train.policy.distributed import all_gather_objects, barrier
from train.progress import write_progress
from train.rollout.base import SamplingConfig
from train.run_setup import (
    build_policy,
    open_run,
    restore_training_state,
    resume_state,
    save_step,
    start_tracking,
)
from train.trainer import encode_prompts


@dataclass
class StageRunConfig:
    """Run-level knobs shared by the offline stages (same names and meaning as in train/config.py)."""

    experiment: str = "adhoc"  # MLflow experiment name
    run_name: str | None = None  # default: <experiment>-<stage>-s<seed>-<time>
    output_dir: str = "outputs"  # run folders go to <output_dir>/<experiment>/<run_name>
    run_dir: str | None = None  # explicit run folder (overrides output_dir/experiment/run_name)
    seed: int = 1
    total_steps: int = 20  # optimizer steps
    save_every: int = 10  # checkpoint every N steps (and at the end); 0 = only at the end
    keep_last: int | None = 2  # checkpoints kept (None = all)
    resume: bool = False  # continue from <run_dir>/checkpoints/latest in the same MLflow run
    val_every: int = 0  # held-out validation every N steps, before training and at the end (0 = off)
    val_accuracy: bool = False  # also greedy math accuracy (val/accuracy) of the held-out prompts
    log_every: int = 1
    world_size: int = 1  # ranks (torchrun is used when > 1)
    track: bool = True  # log to MLflow (MLFLOW_TRACKING_URI, else ./mlflow.db)
    parent_run_id: str | None = None  # set by sweeps: the sweep's MLflow run
    tags: dict[str, str] = field(default_factory=dict)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    # The engine of the greedy accuracy check (only engine, max_new_tokens, max_model_len, dtype are used).
    rollout: RolloutConfig = field(default_factory=RolloutConfig)


def validate_run_config(cfg: DictConfig, batch_size: int) -> None:
    """Checks omegaconf's types cannot express; each error names the key."""
    checks = [
        (cfg.total_steps >= 1, "total_steps must be >= 1"),
        (cfg.world_size >= 1, "world_size must be >= 1"),
        (batch_size >= 1, "data.batch_size must be >= 1"),
        (batch_size % cfg.world_size == 0, "data.batch_size must be divisible by world_size"),
        (cfg.optim.lr > 0, "optim.lr must be > 0"),
        (cfg.optim.schedule in ("constant", "cosine"), "optim.schedule must be constant or cosine"),
        (cfg.policy.precision in ("auto", "fp32", "bf16"), "policy.precision must be auto, fp32 or bf16"),
        (cfg.val_every >= 0, "val_every must be >= 0"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(f"bad config value: {message}")


def encode_chat(tokenizer, prompt: list[dict], response: str) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) exactly as the chat template lays out the assistant turn.

    The prompt ids are what the rollout engine is given (train.trainer.encode_prompts), the response ids
    the template's assistant content up to and including its end-of-turn token, so the model learns to
    stop where the rollout engine stops.
    """
    prompt_ids = encode_prompts(tokenizer, [{"prompt": prompt}])[0]
    prefix = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(
        [*prompt, {"role": "assistant", "content": response}], tokenize=False
    )
    if not full.startswith(prefix):
        raise ValueError("the chat template writes the assistant turn differently from its generation prompt")
    suffix = full[len(prefix) :]
    eos = tokenizer.eos_token
    if eos and eos in suffix:
        suffix = suffix[: suffix.rindex(eos) + len(eos)]
    return prompt_ids, tokenizer(suffix, add_special_tokens=False)["input_ids"]


def peak_memory_gb() -> float:
    """Peak memory of this process: CUDA allocations on GPU, else the peak resident set (CPU)."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # Linux: kilobytes


def shard(items: list, rank: int, world: int) -> list:
    """This rank's contiguous share of a step's batch (the batch size is divisible by the world size)."""
    per = len(items) // world
    return items[rank * per : (rank + 1) * per]


class StageTrainer:
    """The loop shared by the offline stages; subclasses set `kind` and `progress_metric` and define
    `step(step) -> metrics`, `validate(step) -> metrics` and (for val/accuracy) `accuracy_items`."""

    kind = "stage"
    progress_metric = "stage/loss"  # logged every step: says which steps a resumed run already logged

    def __init__(self, cfg: DictConfig, engine=None) -> None:
        self.cfg = cfg
        self.rank, self.world, self.run_dir, self.model_path, self.tokenizer, self.pad_id = open_run(cfg)
        self.start_step, self.state, latest = resume_state(cfg, self.run_dir, self._print)
        self.weights = latest / "hf" if latest is not None else self.model_path
        self.policy = build_policy(cfg, self.weights, self.pad_id)
        restore_training_state(self.policy, self.state, self.rank)
        self.engine, self.owns_engine = engine, engine is None
        self.accuracy_items: list[tuple[list[int], str]] = []  # (prompt ids, gold) of this rank

        self.tracker, self.run_id = start_tracking(
            cfg, self.run_dir, self.state, self.rank, {"rlpost.stage_kind": self.kind}, self.progress_metric
        )

    def _print(self, msg: str) -> None:
        if self.rank == 0:
            print(f"[{self.kind}] {msg}", flush=True)

    # ---- the loop -------------------------------------------------------------------------------
    def train(self) -> dict[str, float]:
        cfg = self.cfg
        self._print(
            f"run dir {self.run_dir}; MLflow run {self.run_id}; steps {self.start_step + 1}..{cfg.total_steps}"
        )
        last: dict[str, float] = {}
        if cfg.val_every and self.start_step == 0:  # the starting model's figures, at step 0
            self.tracker.log_metrics(self._validate(0), 0)
        for step in range(self.start_step + 1, cfg.total_steps + 1):
            last = self.step(step)
            if cfg.val_every and (step % cfg.val_every == 0 or step == cfg.total_steps):
                last.update(self._validate(step))
            if self.rank == 0 and step % cfg.log_every == 0:
                print(self.one_line(step, last), flush=True)
            self.tracker.log_metrics(last, step)
            if self.rank == 0:
                write_progress(self.run_dir, step, cfg.total_steps, last)
            if (cfg.save_every and step % cfg.save_every == 0) or step == cfg.total_steps:
                self.save(step)
        self.tracker.finish("FINISHED")
        return last

    def step(self, step: int) -> dict[str, float]:
        raise NotImplementedError

    def validate(self, step: int) -> dict[str, float]:
        raise NotImplementedError

    def one_line(self, step: int, m: dict[str, float]) -> str:
        shown = " ".join(
            f"{k.split('/', 1)[1]} {m[k]:.4g}"
            for k in sorted(m)
            if k.startswith(f"{self.kind}/") and "val_" not in k
        )
        return (
            f"[{self.kind}] step {step}/{self.cfg.total_steps} {shown} gnorm {m.get('actor/grad_norm', 0):.3f}"
            f" | {m.get('timing/step_s', 0):.1f}s {m.get('perf/train_tokens_per_s', 0):.0f} tok/s"
            f" peak {m.get('perf/peak_memory_gb', 0):.2f} GB"
        )

    def _validate(self, step: int) -> dict[str, float]:
        out = self.validate(step)
        if self.cfg.val_accuracy:
            out.update(self.greedy_accuracy())
        self._print(f"step {step} validation: " + " ".join(f"{k} {v:.4f}" for k, v in sorted(out.items())))
        return out

    def greedy_accuracy(self) -> dict[str, float]:
        """Greedy answers to the held-out prompts, graded by the training math grader: `val/accuracy`."""
        from math_grader import grade_batch

        if self.engine is None:
            r = self.cfg.rollout
            dtype = r.dtype if r.dtype != "auto" else self.policy.precision_choice.engine_dtype
            self.engine = instantiate(
                OmegaConf.to_container(r.engine, resolve=True),
                model_path=str(self.weights),
                dtype=dtype,
                max_model_len=r.max_model_len,
                seed=self.cfg.seed,
            )
        self.engine.update_weights(self.policy.full_weights())
        correct: list[float] = []
        if self.accuracy_items:
            sampling = SamplingConfig(n=1, temperature=0.0, max_new_tokens=self.cfg.rollout.max_new_tokens)
            rollout = self.engine.generate([p for p, _ in self.accuracy_items], sampling)
            correct = grade_batch(rollout.texts, [g for _, g in self.accuracy_items])
        everyone = [c for part in all_gather_objects(correct) for c in part]
        return {"val/accuracy": statistics.fmean(everyone)} if everyone else {}

    def save(self, step: int) -> None:
        state = {"step": step, "data_position": step, "mlflow_run_id": self.run_id or ""}
        save_step(
            self.cfg, self.run_dir, step, self.policy, self.tokenizer, state, self.model_path, self.tracker,
            self._print,
        )  # fmt: skip

    def close(self) -> None:
        if self.owns_engine and self.engine is not None:
            self.engine.close()


def run_stage_trainer(trainer_cls: type[StageTrainer], cfg: DictConfig, engine=None) -> dict[str, float]:
    """Train with this (validated) config; marks the MLflow run FAILED with the error on a crash."""
    if cfg.run_name is None:
        cfg.run_name = (
            Path(cfg.run_dir).name
            if cfg.run_dir
            else f"{cfg.experiment}-{trainer_cls.kind}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
        )
    trainer = None
    try:
        trainer = trainer_cls(cfg, engine=engine)
        result = trainer.train()
        trainer.close()
        return result
    except BaseException as exc:
        if trainer is not None and trainer.tracker.run_id:
            status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
            trainer.tracker.finish(status, error="".join(traceback.format_exception_only(exc)).strip())
        raise
    finally:
        barrier()
