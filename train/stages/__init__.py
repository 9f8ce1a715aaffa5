"""Offline training stages on the RL training core (same FSDP2 policy, checkpoints, MLflow): SFT and DPO.

A stage is a small object, built from an experiment's `stages:` block by `_target_`
(orchestration/pipeline.py): `schema` (its config dataclass), `validate(cfg)` and `run(cfg) -> metrics`.
"""
