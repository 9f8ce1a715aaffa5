"""The training config, one job a module: schema.py (every knob, its default and meaning), experiments.py
(reading `experiments/<name>.yaml`), layers.py (defaults <- experiment <- preset <- `key=value`),
validate.py (the checks before a model loads; env.py: `env.*`, algorithm.py: the method), errors.py.

Importers use the names below (`from train.config import build_config`); `EXPERIMENTS_DIR` is read here at
call time, so pointing `train.config.EXPERIMENTS_DIR` elsewhere (tests, bench) moves every lookup.
"""

from infra.models import PROJECT_ROOT
from train.config.algorithm import validate_algorithm
from train.config.env import validate_env
from train.config.errors import ConfigError, reported
from train.config.experiments import (
    EXPERIMENT_SECTIONS,
    EXPERIMENTS_DIR,
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    experiment_file,
    load_experiment,
)
from train.config.layers import (
    SWAPPABLE,
    build_config,
    check_resolves,
    merge_layers,
    override_layers,
    parse_override,
    parse_value,
    refuse_secrets,
    split_cli,
)
from train.config.schema import (
    TRAINERS,
    AlgorithmConfig,
    CriticConfig,
    DataConfig,
    EnvConfig,
    ExpertIterationConfig,
    KLCtrlConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    PolicyConfig,
    RolloutConfig,
    RunConfig,
    TrainConfig,
    algorithm_schema,
    checked,
    train_schema,
)
from train.config.validate import (
    ENGINE_SUPPLIED,
    check_fields,
    validate,
    validate_components,
    validate_engine,
    validate_run,
)

__all__ = [
    "ENGINE_SUPPLIED",
    "EXPERIMENTS_DIR",
    "EXPERIMENT_SECTIONS",
    "MAX_YAML_DEPTH",
    "MAX_YAML_NODES",
    "PROJECT_ROOT",
    "SWAPPABLE",
    "TRAINERS",
    "AlgorithmConfig",
    "ConfigError",
    "CriticConfig",
    "DataConfig",
    "EnvConfig",
    "ExpertIterationConfig",
    "KLCtrlConfig",
    "LoraConfig",
    "ModelConfig",
    "OptimConfig",
    "PolicyConfig",
    "RolloutConfig",
    "RunConfig",
    "TrainConfig",
    "algorithm_schema",
    "build_config",
    "check_resolves",
    "check_fields",
    "checked",
    "experiment_file",
    "load_experiment",
    "merge_layers",
    "override_layers",
    "parse_override",
    "parse_value",
    "refuse_secrets",
    "reported",
    "split_cli",
    "train_schema",
    "validate",
    "validate_algorithm",
    "validate_components",
    "validate_engine",
    "validate_env",
    "validate_run",
]
