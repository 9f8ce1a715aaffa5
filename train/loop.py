"""The one training loop every method plugs into (GRPO, SFT, DPO: train/stages/).

A run is a folder (`run_dir`), an MLflow run, a policy and, when resuming, the state of the latest
checkpoint. `TrainingLoop` owns all of it: run setup, resume, the validation schedule (before the first
step, every `val_every` steps and at the end), the one-line log, tracking, progress, checkpoints and the
run wrapper that marks a crashed run FAILED. A method supplies only what differs:

- `load_data()`: its datasets (before any model loads), `setup()`: its other models and components;
- `step(step) -> metrics`: one optimizer step (or several, for PPO epochs);
- `validate(step) -> metrics` and `has_validation()`: its held-out figures;
- `one_line(step, metrics)`, `kind`, `progress_metric`, `examples_per_step`.

Preemption (SIGTERM, SIGUSR2: train/preemption.py): the step running when the signal comes finishes
(or the save running then), a checkpoint is written (`checkpoint_on_preempt`), the MLflow run is marked
KILLED with a note (a requeued or resumed job reopens the same run and continues it) and `Preempted` ends
the run. `preempt_grace_s` bounds the whole exit: the step is abandoned when what is left of it would not
leave the last save's measured time for the save, and a save still running at the end is abandoned too.
"""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from infra.checkpoint import layout as layout
from infra.redact import redacted_yaml
from infra.tracking import RUN_DIR_TAG, RUN_ID_FILE, Tracker, flatten, recorded_run_id
from train import checkpoint as ckpt
from train.policy.distributed import all_gather_objects, barrier
from train.preemption import CONTROL_DIR_ENV, Preempted, PreemptWatch, write_outcome
from train.progress import write_progress


def run_dir_of(cfg: DictConfig) -> Path:
    if cfg.run_dir:
        return Path(cfg.run_dir)
    return Path(cfg.output_dir) / cfg.experiment / cfg.run_name


def engine_dtype(cfg: DictConfig, precision: str) -> str:
    """The rollout engine's dtype: `rollout.engine.dtype`, or (absent or auto) the policy's resolved
    `precision` (fp32 | bf16)."""
    from train.policy.precision import ENGINE_DTYPES

    dtype = cfg.rollout.engine.get("dtype", "auto")
    return ENGINE_DTYPES[precision] if dtype == "auto" else dtype


def engine_spec(cfg: DictConfig, weights: str | Path, precision: str) -> dict:
    """The `rollout.engine` component with what the trainer gives every engine (rollout/base.py
    ENGINE_ARGS) where its constructor takes it and the config does not set it: the weights, the compute
    dtype (`engine_dtype`) and the run's seed. The engine's own settings are its config keys, untouched."""
    from train.components import target_params

    spec = OmegaConf.to_container(cfg.rollout.engine, resolve=True)
    _, params = target_params("rollout.engine", spec["_target_"])
    supplied = {
        "model_path": str(weights),
        "dtype": engine_dtype(cfg, precision),
        "seed": cfg.seed,
        "lora_rank": cfg.policy.lora.rank,
    }
    if spec.get("dtype") == "auto":
        del spec["dtype"]
    for name, value in supplied.items():
        if params is None or any(p.name == name or p.var_keyword for p in params):
            spec.setdefault(name, value)
    return spec


def build_engine(cfg: DictConfig, weights: str | Path, precision: str):
    """The rollout engine of `rollout.engine` (not recursive: a wrapper engine builds its inner one)."""
    from hydra.utils import instantiate

    return instantiate(engine_spec(cfg, weights, precision), _recursive_=False)


class TrainingLoop:
    """`engine` lets a caller (tests, benchmarks) share one already-started rollout engine."""

    kind = "train"  # the log prefix ([train] ...) and the rlpost.stage_kind tag of the offline stages
    run_name_part = ""  # default run names are <experiment>[-<part>]-s<seed>-<time>
    progress_metric = "train/reward_mean"  # logged every step: tells a resumed run which steps it logged

    def __init__(self, cfg: DictConfig, engine=None) -> None:
        import torch
        from transformers import AutoTokenizer

        from infra.models import resolve_model_path
        from train.policy.distributed import DIST_TIMEOUT_S, init_distributed

        self.cfg = cfg
        self.rank, self.world = init_distributed(
            cfg.dist_timeout_s if "dist_timeout_s" in cfg else DIST_TIMEOUT_S
        )
        if cfg.world_size != self.world:
            raise RuntimeError(f"world_size={cfg.world_size} but {self.world} ranks were started")
        torch.manual_seed(cfg.seed + self.rank)
        self.run_dir = run_dir_of(cfg)
        self.model_path = resolve_model_path(cfg.model.path)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

        if self.rank == 0:  # what a killed save or deletion left (temporary and trash folders)
            ckpt.clean_stale(self.run_dir)
        self.start_step, self.state, latest = self._resume_state()
        self.latest_checkpoint = latest
        self.critic = None  # a value model, when the method has one (saved with each checkpoint)
        # under LoRA the policy is the base model plus adapters (restored from state/), whatever hf/ holds
        lora = cfg.policy.lora.rank > 0
        self.weights = layout.hf_dir(latest) if latest is not None and not lora else self.model_path
        self.engine, self.owns_engine = engine, engine is None
        self.load_data()  # before any model loads: a bad dataset path fails at once
        self.policy = self._build_policy()
        self.print(self.policy.precision_choice.describe())
        self.setup()
        if self.state:  # weights, optimizer, schedule (at any world size) and this rank's RNG
            ckpt.restore_policy(latest, self.policy, self.state, self.rank)
            rngs = self.state["rng"]
            if self.rank < len(rngs):
                ckpt.set_rng_state(rngs[self.rank])
            else:  # resumed on more ranks than saved it: the new ranks keep their seeded streams
                self.print(f"rank {self.rank}: no saved RNG state ({len(rngs)} ranks saved); seeded afresh")
            self.restore(self.state)
            if self.policy.lora.enabled and self.engine is not None:  # it was built from the base model
                from train.rollout.weight_sync import sync_weights

                sync_weights(self.policy, self.engine)  # the resumed adapters
        self.tracker, self.run_id = self._start_tracking()

    # ---- what a method supplies -----------------------------------------------------------------
    def load_data(self) -> None:
        """Read and encode the datasets (before the policy is built)."""

    def setup(self) -> None:
        """Build reference models, reward, engine (after the policy, before its optimizer state is restored)."""

    def step(self, step: int) -> dict[str, float]:
        raise NotImplementedError

    def extra_state(self) -> dict:
        """What else resuming needs (e.g. a KL coefficient), saved in the checkpoint's trainer state."""
        return {}

    def restore(self, state: dict) -> None:
        """Resuming: restore what `extra_state` saved (and the critic, from `self.latest_checkpoint`)."""

    def has_validation(self) -> bool:
        return False

    def validate(self, step: int) -> dict[str, float]:
        return {}

    @property
    def examples_per_step(self) -> int:
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

    def tracking_tags(self) -> dict[str, str]:
        return {}

    def close(self) -> None:
        if self.owns_engine and self.engine is not None:
            self.engine.close()

    # ---- the loop -------------------------------------------------------------------------------
    def train(self) -> dict[str, float]:
        cfg = self.cfg
        self.print(
            f"run dir {self.run_dir}; MLflow run {self.run_id}; steps {self.start_step + 1}..{cfg.total_steps}"
        )
        validating = bool(cfg.val_every) and self.has_validation()
        last: dict[str, float] = {}
        grace_s = float(cfg.preempt_grace_s or 0)
        with PreemptWatch(grace_s=grace_s, say=self.print, save_s=self._last_save_s()) as watch:
            watch.step = self.start_step
            warned = watch.budget_warning()
            if warned:
                self.print(warned)
            if validating and self.start_step == 0:  # the starting model's figures, at step 0
                self.tracker.log_metrics(self._validate(0), 0)
            for step in range(self.start_step + 1, cfg.total_steps + 1):
                last = self.step(step)
                watch.step = step
                watch.disarm()  # the step ended in time: nothing is abandoned from here on
                stop = watch.agreed_request()  # collective: every rank stops after the same step
                stop = stop if step < cfg.total_steps else None  # the last step: just finish
                if validating and not stop and (step % cfg.val_every == 0 or step == cfg.total_steps):
                    last.update(self._validate(step))
                if self.rank == 0 and step % cfg.log_every == 0:
                    print(self.one_line(step, last), flush=True)
                self.tracker.log_metrics(last, step)
                if self.rank == 0:
                    write_progress(self.run_dir, step, cfg.total_steps, last)
                saved = None
                if (cfg.save_every and step % cfg.save_every == 0) or step == cfg.total_steps:
                    with watch.saving():
                        saved = self.save(step, required=step == cfg.total_steps or bool(stop))
                    if not stop and step < cfg.total_steps:  # a signal during the save: no further step
                        stop = watch.agreed_request()
                    if not warned and (warned := watch.budget_warning()):
                        self.print(warned)
                if stop:
                    if saved is None and cfg.checkpoint_on_preempt:
                        with watch.saving():
                            saved = self.save(step, required=True)
                    raise Preempted(stop, step, checkpoint=str(saved) if saved else None,
                                    received_at=watch.received_at)  # fmt: skip
        self.tracker.finish("FINISHED")
        return last

    def _validate(self, step: int) -> dict[str, float]:
        out = self.validate(step)
        self.print(f"step {step} validation: " + " ".join(f"{k} {v:.4f}" for k, v in sorted(out.items())))
        return out

    def save(self, step: int, required: bool = True) -> Path | None:
        """Checkpoint `step` (HF weights + what resuming needs) and record it on the MLflow run; the path
        on rank 0. A save that is not `required` (a periodic one) and fails (a full disk) is one line and
        training goes on from the state in memory; the final or preemption save raises CheckpointError."""
        state = {
            "step": step,
            "data_position": step * self.examples_per_step,  # examples consumed (all ranks)
            "mlflow_run_id": self.run_id or "",
            **self.extra_state(),
        }
        try:
            path = ckpt.save_checkpoint(
                self.run_dir, step, self.policy, self.tokenizer, state, keep_last=self.cfg.keep_last,
                source_model=self.model_path, critic=self.critic, hf_dtype=self.cfg.save_hf_dtype,
                hf_merged=self.cfg.save_hf_merged,
            )  # fmt: skip
        except ckpt.CheckpointError as exc:
            if required:
                raise
            self.print(f"warning: {exc}; training goes on (the next save tries again)")
            return None
        if path is not None:
            self.tracker.record_checkpoint(step, path.resolve())
            self.print(f"checkpoint {path}")
        return path

    def _last_save_s(self) -> float:
        """How long the checkpoint resumed from took to save (recorded by the layout; 0 when unknown)."""
        if self.latest_checkpoint is None:
            return 0.0
        try:
            value = layout.read_meta(self.latest_checkpoint).get("save_s", 0.0)
            return float(value) if isinstance(value, (int, float)) else 0.0
        except (OSError, ValueError, AttributeError, RecursionError):
            return 0.0

    def print(self, msg: str) -> None:
        if self.rank == 0:
            print(f"[{self.kind}] {msg}", flush=True)

    # ---- setup helpers --------------------------------------------------------------------------
    def _resume_state(self) -> tuple[int, dict, Path | None]:
        """(start step, trainer state, latest checkpoint) when `resume` finds a checkpoint, else (0, {}, None)."""
        if not self.cfg.resume:
            return 0, {}, None
        found = ckpt.resume_point(self.run_dir, warn=self.print)  # the newest complete one that loads
        if found is None:
            self.print(f"resume=true but no checkpoint in {self.run_dir}: starting from step 0")
            return 0, {}, None
        latest, state = found
        self.print(f"resuming from {latest} (step {int(state['step'])})")
        return int(state["step"]), state, latest

    def _build_policy(self):
        """The trainable FSDP2 policy from `optim` and `policy`."""
        from train.policy.fsdp import Policy

        cfg, opt, pol = self.cfg, self.cfg.optim, self.cfg.policy
        return Policy(
            self.weights,
            precision=pol.precision,
            lr=opt.lr,
            weight_decay=opt.weight_decay,
            betas=(opt.beta1, opt.beta2),
            grad_clip=opt.grad_clip,
            gradient_checkpointing=pol.gradient_checkpointing,
            micro_batch_tokens=pol.micro_batch_tokens,
            share_prompts=pol.share_prompts,
            pack_sequences=pol.pack_sequences,
            attn_implementation=pol.attn_implementation,
            cpu_offload=pol.cpu_offload,
            lora=pol.lora,
            fp32_matmul=pol.fp32_matmul,
            torch_compile=pol.torch_compile,
            warmup_steps=opt.warmup_steps,
            lr_schedule=opt.schedule,
            total_steps=cfg.total_steps,
            pad_id=self.pad_id,
        )

    def _start_tracking(self) -> tuple[Tracker, str | None]:
        """Start (or, resuming, reopen) the MLflow run on rank 0; write config.yaml and mlflow_run_id."""
        cfg = self.cfg
        tracker = Tracker(enabled=cfg.track and self.rank == 0)
        run_id = tracker.start(
            experiment=cfg.experiment,
            run_name=cfg.run_name,
            run_id=self.state.get("mlflow_run_id") or (recorded_run_id(self.run_dir) if cfg.resume else None),
            tags={RUN_DIR_TAG: str(self.run_dir.resolve()), **self.tracking_tags(), **dict(cfg.tags)},
            parent_run_id=cfg.parent_run_id,
            progress_metric=self.progress_metric,
        )
        run_id = all_gather_objects(run_id)[0]
        tracker.log_params(flatten(OmegaConf.to_container(cfg, resolve=True)))
        tracker.log_params(self.policy.precision_choice.as_params())  # what policy.precision=auto chose
        if self.engine is not None:  # LoRA adapters alone, or every weight (train/rollout/weight_sync.py)
            from train.rollout.weight_sync import sync_mode

            tracker.log_params({"rollout/weight_sync": sync_mode(self.policy, self.engine)})
        if self.rank == 0:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.yaml").write_text(redacted_yaml(cfg))
            if run_id:
                (self.run_dir / RUN_ID_FILE).write_text(run_id)
        return tracker, run_id


def run_loop(loop_cls: type[TrainingLoop], cfg: DictConfig, engine=None) -> dict[str, float]:
    """Train with this (validated) config; marks the MLflow run FAILED (or KILLED) with the error on a crash.
    However the run ends, the deletion of pruned checkpoints has ended when this returns: every entry point
    ends with `os._exit` (infra/process_exit.py), which would cut that thread short."""
    if cfg.run_name is None:
        part = f"-{loop_cls.run_name_part}" if loop_cls.run_name_part else ""
        cfg.run_name = (
            Path(cfg.run_dir).name
            if cfg.run_dir
            else f"{cfg.experiment}{part}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
        )
    loop = None
    agree = True  # the ranks meet at a barrier on the way out (not after an abandoned step)
    try:
        loop = loop_cls(cfg, engine=engine)
        result = loop.train()
        loop.close()
        return result
    except Preempted as stop:
        agree = not stop.abandoned
        if loop is not None:
            _record_preemption(loop, stop)
        write_outcome(stop)
        if os.environ.get(CONTROL_DIR_ENV):  # under our launcher: it reads the outcome and reports
            return {}
        raise
    except BaseException as exc:
        if loop is not None and loop.tracker.run_id:
            status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
            loop.tracker.finish(status, error="".join(traceback.format_exception_only(exc)).strip())
        raise
    finally:
        try:
            if agree:
                barrier()
        finally:  # after the barrier (no rank waits in a collective for it), before any `os._exit` ends
            ckpt.wait_for_pruning()  # the thread deleting the last pruned step: no `.trash-step_*` left


def _record_preemption(loop: TrainingLoop, stop: Preempted) -> None:
    """The MLflow run KILLED with a note saying where it stopped and how it continues (a requeued sweep
    job, or `resume=true`, reopens this same run), and one line on rank 0."""
    secs = time.time() - stop.received_at
    how = f"resume=true run_dir={loop.run_dir}"
    loop.print(f"{stop.describe()}; exiting {secs:.1f} s after the signal (continue: {how})")
    if loop.tracker.run_id:
        loop.tracker.set_tags({"rlpost.status_note": f"preempted, {stop.describe()}; continue with {how}"})
        loop.tracker.finish("KILLED")
