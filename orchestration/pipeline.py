"""Chained training stages (sft -> grpo, dpo -> darling): `python -m orchestration.pipeline EXP [stage.key=value ...]`.

An experiment file declares its stages, run in file order, each its own MLflow run and run folder:

    stages:
      sft:
        _target_: train.stages.sft.SFTStage      # what trains it (`schema`, `validate`, `run`)
        config: {total_steps: 30, data: {...}}     # layered on the stage schema's defaults
      grpo:
        _target_: train.stages.grpo.GRPOStage
        base: grpo_math                            # optional: experiments/grpo_math.yaml's `config:` first
        model_from: sft                            # model.path <- stage sft's final checkpoint
        config: {total_steps: 20}

Command-line overrides name the stage: `sft.optim.lr=2e-5 grpo.seed=3`; `--dry-run` prints the plan
(keys, folders, done or not), `--until sft` stops after that stage.

Reuse. A stage's result is keyed by a hash of its resolved config (without where and how it is tracked:
run names, folders, tags, resume) and of the key of the stage it starts from. Its run folder is
`<output_dir>/stages/<name>-<key>/`; a finished stage leaves `stage_result.json` there (final checkpoint,
MLflow run id, final metrics), and every later pipeline that needs the same key reuses it: a rerun, or a
sweep over a later stage, trains the earlier stage once. An exclusive lock (`<folder>.lock`, flock) makes
a concurrent job wait for the one training it; an interrupted stage resumes from its latest checkpoint
in the same MLflow run. The key covers the config, not the code: delete the folder to retrain.

Each stage runs in its own process (torchrun when its world_size > 1), so one stage's memory and rollout
engine are gone before the next starts; `isolate=False` runs them in this process (tests).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from infra.checkpoint import layout as ckpt
from infra.redact import redacted_yaml
from train.config import (
    ENGINE_SUPPLIED,
    PROJECT_ROOT,
    ConfigError,
    check_resolves,
    load_experiment,
    merge_layers,
    override_layers,
    reported,
    validate_components,
)

RESULT_FILE = "stage_result.json"
STAGE_CONFIG = "stage_config.yaml"
# Where and how a run is tracked, not what it trains: left out of the stage key.
PLACEMENT_KEYS = (
    "experiment",
    "run_name",
    "output_dir",
    "run_dir",
    "resume",
    "track",
    "parent_run_id",
    "tags",
    "log_every",
)
SPEC_KEYS = {"_target_", "config", "base", "model_from"}


class PipelineError(RuntimeError):
    pass


@dataclass
class PlannedStage:
    name: str
    target: str
    stage: object
    cfg: DictConfig  # resolved; model.path is filled from the upstream result when the stage starts
    key: str
    model_from: str | None

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.run_dir)


# ---- planning -----------------------------------------------------------------------------------
def stage_key(target: str, cfg: DictConfig, upstream_key: str | None) -> str:
    """12 hex digits of sha256 over the stage's target, its config minus placement, and its upstream key."""
    body = OmegaConf.to_container(cfg, resolve=True)
    for k in PLACEMENT_KEYS:
        body.pop(k, None)
    if upstream_key is not None:
        body["model"] = {**body.get("model", {}), "path": f"stage:{upstream_key}"}
    text = json.dumps({"target": target, "config": body}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _split_overrides(overrides: list[str], names: list[str]) -> dict[str, list[str]]:
    by_stage: dict[str, list[str]] = {n: [] for n in names}
    for item in overrides:
        head = item.split("=", 1)[0].split(".", 1)[0]
        if "=" not in item or head not in by_stage or "." not in item.split("=", 1)[0]:
            raise ConfigError(
                f"bad override {item!r}: pipeline overrides are <stage>.<key>=<value> with a stage among "
                f"{names} (e.g. {names[-1]}.seed=2)"
            )
        by_stage[head].append(item.split(".", 1)[1])
    return by_stage


def _stage_object(name: str, target: str):
    from hydra.utils import get_class

    try:
        return get_class(target)()
    except Exception as exc:
        raise ConfigError(
            f"stages.{name}._target_={target!r} cannot be loaded ({str(exc).splitlines()[0]}); "
            "use e.g. train.stages.sft.SFTStage, train.stages.dpo.DPOStage, train.stages.grpo.GRPOStage"
        ) from None


def _stage_spec(specs: DictConfig, name: str) -> DictConfig:
    """One `stages.<name>` entry with its keys checked and read: `_target_`, `base` and `model_from` names
    (resolved), `config` a mapping; a ConfigError naming the key otherwise."""
    with reported():
        spec = specs[name]
        if not isinstance(spec, DictConfig):
            raise ConfigError(
                f"stages.{name} is {str(spec)[:40]!r}, not a mapping of _target_, config, base, model_from"
            )
        unknown = sorted(set(spec) - SPEC_KEYS, key=str)
        if unknown:
            raise ConfigError(f"stages.{name}: unknown key(s) {unknown} (allowed: {sorted(SPEC_KEYS)})")
        if "_target_" not in spec:
            raise ConfigError(f"stages.{name}: `_target_` missing (e.g. train.stages.sft.SFTStage)")
        for key in ("_target_", "base", "model_from"):
            value = spec.get(key)
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"stages.{name}.{key}={str(value)[:40]!r}: expected a name")
        if spec.get("config") is not None and not isinstance(spec.get("config"), DictConfig):
            raise ConfigError(f"stages.{name}.config is {str(spec.config)[:40]!r}, not a mapping of keys")
    return spec


def _stage_layers(experiment: str, spec: DictConfig) -> list:
    """The config layers of one (checked) stage spec: experiment name, `base:`'s config, `config:`."""
    layers = [OmegaConf.create({"experiment": experiment})]
    if spec.get("base"):
        layers.append(load_experiment(spec.base).get("config") or OmegaConf.create())
    layers.append(spec.get("config") or OmegaConf.create())
    return layers


def plan(
    experiment: str, overrides: list[str] | None = None, final: dict | None = None
) -> list[PlannedStage]:
    """Resolve and validate every stage's config and key (nothing runs). `final` places the last stage
    (sweeps: run_dir, run_name, parent_run_id, tags) instead of the content-addressed stage folder."""
    exp = load_experiment(experiment)
    specs = exp.get("stages")
    if not specs:
        raise ConfigError(
            f"experiment {experiment!r} has no `stages:` block (single-stage runs: python -m train)"
        )
    names = list(specs)
    by_stage = _split_overrides(list(overrides or []), names)
    checked = {name: _stage_spec(specs, name) for name in names}
    stage_layers = {}
    for name in names:  # every stage's components first, untyped: no stage or schema module imported yet
        try:
            stage_layers[name] = _stage_layers(experiment, checked[name]) + override_layers(by_stage[name])
            untyped = merge_layers(OmegaConf.create(), stage_layers[name], resolve=False)
            try:
                check_resolves(untyped)
            except ConfigError:
                continue  # a ${...} may name a default of the stage's schema: the typed merge below checks it
            validate_components(untyped, ENGINE_SUPPLIED)
        except ConfigError as exc:
            raise ConfigError(f"stage {name}: {exc}") from None
    planned: dict[str, PlannedStage] = {}
    for i, name in enumerate(names):
        spec = checked[name]
        stage = _stage_object(name, spec._target_)
        try:
            cfg = merge_layers(OmegaConf.structured(stage.schema), stage_layers[name])
            stage.validate(cfg)
        except ConfigError as exc:
            raise ConfigError(f"stage {name}: {exc}") from None
        upstream = spec.get("model_from")
        if upstream is not None and upstream not in planned:
            raise ConfigError(
                f"stages.{name}.model_from={upstream!r}: must name an earlier stage ({names[:i]})"
            )
        key = stage_key(spec._target_, cfg, planned[upstream].key if upstream else None)
        last = i == len(names) - 1
        _place_stage(cfg, experiment, name, key, final if last else None, final or {})
        if upstream is not None:
            cfg.model.path = _upstream_model(name, planned[upstream])
        planned[name] = PlannedStage(name, spec._target_, stage, cfg, key, upstream)
    return list(planned.values())


def _place_stage(cfg, experiment: str, name: str, key: str, final: dict | None, sweep: dict) -> None:
    """Where a stage runs and what it is tagged with: the sweep's point (`final`, the last stage of a sweep
    point) or its content-addressed folder under output_dir/stages (every other stage: reused by key)."""
    tags = {"rlpost.pipeline": experiment, "rlpost.stage": name, "rlpost.stage_key": key}
    if final is not None and final.get("run_dir"):
        place = {k: final[k] for k in ("run_dir", "run_name", "parent_run_id") if final.get(k) is not None}
        tags = {**tags, **dict(final.get("tags") or {})}
    else:
        shared = {k: v for k, v in dict(sweep.get("tags") or {}).items() if k in ("rlpost.sweep",)}
        tags = {**tags, **shared, "rlpost.kind": "stage"}
        folder = Path(cfg.output_dir).resolve() / "stages" / f"{name}-{key}"
        place = {
            "run_dir": cfg.run_dir or str(folder),
            "run_name": cfg.run_name or f"{experiment}-{name}-{key[:8]}",
            "parent_run_id": sweep.get("parent_run_id") or cfg.parent_run_id,
        }
    for k, v in place.items():
        cfg[k] = v
    cfg.resume = True  # an interrupted stage continues from its latest checkpoint
    cfg.tags = {**dict(cfg.tags), **tags}


def _upstream_model(name: str, up: PlannedStage) -> str:
    """The HF folder of the upstream stage's final step (refused when it holds LoRA adapters alone)."""
    if up.cfg.policy.lora.rank > 0 and not up.cfg.save_hf_merged:  # its hf/ is an adapter folder
        raise ConfigError(
            f"stages.{name}.model_from={up.name}: stage {up.name} trains LoRA adapters "
            f"(policy.lora.rank={up.cfg.policy.lora.rank}) and exports them alone; pass "
            f"{up.name}.save_hf_merged=true so that {name} starts from merged weights"
        )
    return str(ckpt.hf_dir(ckpt.step_dir(up.cfg.run_dir, up.cfg.total_steps)))


# ---- running ------------------------------------------------------------------------------------
def read_result(run_dir: Path) -> dict | None:
    path = Path(run_dir) / RESULT_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@contextmanager
def stage_lock(run_dir: Path, name: str):
    """Exclusive lock of one stage folder: a second job waits here while the first trains it."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(run_dir.parent / f"{run_dir.name}.lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"[pipeline] stage {name}: another job is training {run_dir}; waiting for it", flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def run_plan(stages: list[PlannedStage], isolate: bool = True) -> dict[str, float]:
    """Run (or reuse) every stage in order; returns the last stage's final metrics."""
    results: dict[str, dict] = {}
    metrics: dict[str, float] = {}
    for st in stages:
        if st.model_from is not None:
            up = results[st.model_from]
            st.cfg.model.path = up["checkpoint"]
            if up.get("run_id"):
                st.cfg.tags = {**dict(st.cfg.tags), f"rlpost.upstream.{st.model_from}": up["run_id"]}
        with stage_lock(st.run_dir, st.name):
            done = read_result(st.run_dir)
            if done is not None and done.get("key") != st.key:
                raise PipelineError(
                    f"stage {st.name}: {st.run_dir} holds the result of another config (key {done.get('key')}, "
                    f"this one {st.key}); give the stage another run_dir or delete that folder"
                )
            if done is None:
                print(f"[pipeline] stage {st.name} (key {st.key}): training in {st.run_dir}", flush=True)
                done = _run_stage(st, isolate)
            else:
                print(f"[pipeline] stage {st.name} (key {st.key}): reusing {done['checkpoint']}", flush=True)
        results[st.name] = done
        metrics = done.get("metrics", {})
    return metrics


def _run_stage(st: PlannedStage, isolate: bool) -> dict:
    from infra.tracking import recorded_run_id

    st.run_dir.mkdir(parents=True, exist_ok=True)
    (st.run_dir / STAGE_CONFIG).write_text(redacted_yaml(st.cfg))
    if isolate or st.cfg.world_size > 1:
        metrics = _run_in_subprocess(st)
    else:
        metrics = st.stage.run(st.cfg)
    latest = ckpt.latest_checkpoint(st.run_dir)
    if latest is None or ckpt.step_of(latest) != st.cfg.total_steps:
        raise PipelineError(f"stage {st.name} ended without its final checkpoint in {st.run_dir}/checkpoints")
    result = {
        "stage": st.name,
        "key": st.key,
        "target": st.target,
        "checkpoint": str(ckpt.hf_dir(latest).resolve()),
        "run_id": recorded_run_id(st.run_dir),
        "metrics": {k: float(v) for k, v in (metrics or {}).items()},
        "finished": time.time(),
    }
    tmp = st.run_dir / f".{RESULT_FILE}.tmp"
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(st.run_dir / RESULT_FILE)
    return result


def _run_in_subprocess(st: PlannedStage) -> dict[str, float]:
    out = st.run_dir / ".stage_metrics.json"
    out.unlink(missing_ok=True)
    entry = [
        "-m",
        "orchestration.pipeline",
        "--run-stage",
        st.target,
        str(st.run_dir / STAGE_CONFIG),
        "--metrics-out",
        str(out),
    ]
    if st.cfg.world_size > 1:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={st.cfg.world_size}",
            *entry,
        ]
    else:
        cmd = [sys.executable, *entry]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])),
    }
    if st.cfg.world_size > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    code = subprocess.call(cmd, env=env)
    if code != 0:
        raise PipelineError(
            f"stage {st.name} failed (exit code {code}; its output is above); rerun the same command to resume it "
            f"from its latest checkpoint in {st.run_dir}"
        )
    return json.loads(out.read_text()) if out.is_file() else {}


def run_stage_process(target: str, config_path: str, metrics_out: str | None) -> int:
    """One stage in this process (what `_run_in_subprocess` starts; under torchrun, on every rank)."""
    import torch.distributed as dist

    stage = _stage_object("?", target)
    cfg = merge_layers(OmegaConf.structured(stage.schema), [OmegaConf.load(config_path)])
    metrics = stage.run(cfg)
    if metrics_out and (not dist.is_initialized() or dist.get_rank() == 0):
        Path(metrics_out).write_text(json.dumps({k: float(v) for k, v in (metrics or {}).items()}))
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


# ---- sweeps -------------------------------------------------------------------------------------
def point_config(experiment: str, overrides: list[str]) -> DictConfig:
    """A sweep grid point of a pipeline experiment, validated: what orchestration/sweep.py stores and submits.

    The sweep fills run_name, run_dir, resume, parent_run_id and tags as for a single-stage point;
    `run_point` places the last stage there and the earlier ones in their shared stage folders.
    """
    plan(experiment, overrides)
    return OmegaConf.create(
        {
            "pipeline": experiment,
            "overrides": list(overrides),
            "experiment": experiment,
            "run_name": None,
            "run_dir": None,
            "resume": True,
            "parent_run_id": None,
            "tags": {},
            "track": True,
        }
    )


def run_point(cfg: DictConfig) -> dict[str, float]:
    final = {k: cfg.get(k) for k in ("run_dir", "run_name", "parent_run_id")}
    final["tags"] = dict(cfg.get("tags") or {})
    return run_plan(plan(cfg.pipeline, list(cfg.overrides), final=final))


# ---- CLI ----------------------------------------------------------------------------------------
def describe(stages: list[PlannedStage]) -> str:
    lines = []
    for st in stages:
        done = read_result(st.run_dir)
        state = (
            "done" if done and done.get("key") == st.key else ("started" if st.run_dir.is_dir() else "new")
        )
        src = f"stage {st.model_from}" if st.model_from else st.cfg.model.path
        lines.append(
            f"  {st.name:<8} {st.target:<32} key {st.key} [{state}] from {src}\n           -> {st.run_dir}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--run-stage"]:
        p = argparse.ArgumentParser(prog="python -m orchestration.pipeline --run-stage")
        p.add_argument("--run-stage", nargs=2, metavar=("TARGET", "CONFIG"))
        p.add_argument("--metrics-out")
        a = p.parse_args(argv)
        try:
            return run_stage_process(a.run_stage[0], a.run_stage[1], a.metrics_out)
        except BaseException:  # printed here: the caller exits with exit_now
            traceback.print_exc()
            return 1
    p = argparse.ArgumentParser(
        prog="python -m orchestration.pipeline",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("experiment", help="experiments/<EXPERIMENT>.yaml with a `stages:` block")
    p.add_argument("overrides", nargs="*", help="<stage>.<key>=<value>")
    p.add_argument(
        "--dry-run", action="store_true", help="print the plan (stages, keys, folders, state) and stop"
    )
    p.add_argument("--in-process", action="store_true", help="run world-size-1 stages in this process")
    p.add_argument("--until", metavar="STAGE", help="stop after this stage (e.g. measure SFT alone)")
    a = p.parse_intermixed_args(argv)
    try:
        stages = plan(a.experiment, a.overrides)
        if a.until is not None:
            names = [s.name for s in stages]
            if a.until not in names:
                raise ConfigError(f"--until {a.until}: no such stage (stages: {names})")
            stages = stages[: names.index(a.until) + 1]
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"[pipeline] {a.experiment}: {len(stages)} stages\n{describe(stages)}", flush=True)
    if a.dry_run:
        return 0
    try:
        metrics = run_plan(stages, isolate=not a.in_process)
    except (PipelineError, FileNotFoundError, ValueError) as exc:
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    shown = " ".join(
        f"{k} {v:.4g}" for k, v in sorted(metrics.items()) if k.startswith(("val/", "train/acc"))
    )
    print(f"[pipeline] done; last stage {stages[-1].name}: {shown}", flush=True)
    return 0


if __name__ == "__main__":
    from infra import allocator
    from infra.process_exit import exit_now

    allocator.ensure()  # before anything else: may re-exec this process with the allocator preloaded
    exit_now(main())  # no interpreter teardown: vLLM's and gloo's threads outlive it (infra/process_exit.py)
