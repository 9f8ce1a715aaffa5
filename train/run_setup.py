"""What every training loop (RL trainer, SFT and DPO stages) sets up the same way, in one place.

A run is a folder (`run_dir`), an MLflow run, a policy and, when resuming, the state of the latest
checkpoint: these helpers build each from the config so the loops only hold their own algorithm.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from train import checkpoint as ckpt
from train.policy.distributed import all_gather_objects
from train.policy.fsdp import Policy
from train.tracking import RUN_DIR_TAG, RUN_ID_FILE, Tracker, flatten, recorded_run_id


def run_dir_of(cfg: DictConfig) -> Path:
    if cfg.run_dir:
        return Path(cfg.run_dir)
    return Path(cfg.output_dir) / cfg.experiment / cfg.run_name


def open_run(cfg: DictConfig) -> tuple[int, int, Path, Path, object, int]:
    """(rank, world, run_dir, model_path, tokenizer, pad_id): join the process group, seed this rank."""
    import torch
    from transformers import AutoTokenizer

    from train.models import resolve_model_path
    from train.policy.distributed import init_distributed

    rank, world = init_distributed()
    if cfg.world_size != world:
        raise RuntimeError(f"world_size={cfg.world_size} but {world} ranks were started")
    torch.manual_seed(cfg.seed + rank)
    model_path = resolve_model_path(cfg.model.path)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return rank, world, run_dir_of(cfg), model_path, tokenizer, pad_id


def resume_state(cfg: DictConfig, run_dir: Path, log: Callable[[str], None]) -> tuple[int, dict, Path | None]:
    """(start step, trainer state, latest checkpoint) when `cfg.resume` finds a checkpoint, else (0, {}, None)."""
    if not cfg.resume:
        return 0, {}, None
    latest = ckpt.latest_checkpoint(run_dir)
    if latest is None:
        log(f"resume=true but no checkpoint in {run_dir}: starting from step 0")
        return 0, {}, None
    state = ckpt.load_trainer_state(latest)
    log(f"resuming from {latest} (step {int(state['step'])})")
    return int(state["step"]), state, latest


def build_policy(cfg: DictConfig, weights: str | Path, pad_id: int) -> Policy:
    """The trainable FSDP2 policy from `cfg.optim` and `cfg.policy`."""
    opt, pol = cfg.optim, cfg.policy
    return Policy(
        weights,
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
        warmup_steps=opt.warmup_steps,
        lr_schedule=opt.schedule,
        total_steps=cfg.total_steps,
        pad_id=pad_id,
    )


def restore_training_state(policy: Policy, state: dict, rank: int) -> None:
    """Optimizer, schedule and this rank's RNG from a checkpoint's trainer state (no-op when empty)."""
    if state:
        policy.load_optimizer_state(state["optimizer"] if rank == 0 else {}, state["scheduler"])
        ckpt.set_rng_state(state["rng"][rank])


def start_tracking(
    cfg: DictConfig,
    run_dir: Path,
    state: dict,
    rank: int,
    tags: dict[str, str] | None = None,
    progress_metric: str = "train/reward_mean",
) -> tuple[Tracker, str | None]:
    """Start (or, resuming, reopen) the run's MLflow run on rank 0; write config.yaml and mlflow_run_id.

    Every rank gets the run id. `progress_metric` is logged every step: it tells a resumed run which
    steps it already logged, so none is logged twice.
    """
    tracker = Tracker(enabled=cfg.track and rank == 0)
    run_id = tracker.start(
        experiment=cfg.experiment,
        run_name=cfg.run_name,
        run_id=state.get("mlflow_run_id") or (recorded_run_id(run_dir) if cfg.resume else None),
        tags={RUN_DIR_TAG: str(run_dir.resolve()), **(tags or {}), **dict(cfg.tags)},
        parent_run_id=cfg.parent_run_id,
        progress_metric=progress_metric,
    )
    run_id = all_gather_objects(run_id)[0]
    tracker.log_params(flatten(OmegaConf.to_container(cfg, resolve=True)))
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
        if run_id:
            (run_dir / RUN_ID_FILE).write_text(run_id)
    return tracker, run_id


def save_step(
    cfg: DictConfig,
    run_dir: Path,
    step: int,
    policy: Policy,
    tokenizer,
    state: dict,
    model_path: Path,
    tracker: Tracker,
    log: Callable[[str], None],
) -> None:
    """Checkpoint `step` (HF weights + trainer `state`) and record it on the MLflow run."""
    path = ckpt.save_checkpoint(
        run_dir, step, policy, tokenizer, state, keep_last=cfg.keep_last, source_model=model_path
    )
    if path is not None:
        tracker.record_checkpoint(step, path.resolve())
        log(f"checkpoint {path}")
