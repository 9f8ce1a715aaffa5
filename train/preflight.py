"""What would stop a run after its models load, found before anything loads: `python -m train` refuses it
in one line naming what to start or set (the paper presets' judges and classmates are servers the run does
not start: their addresses must answer, their tokenizers be local folders).

Why: a judge at 127.0.0.1 that nobody started failed only once the policy (and on 8 ranks, 8 policies) had
loaded, with a traceback per rank. The planner (`python -m train.plan`) prints the same problems."""

from __future__ import annotations

import socket
from urllib.parse import urlparse

from omegaconf import DictConfig, ListConfig

LOCAL_FOLDER_KEYS = ("model_path", "tokenizer")  # reward components' keys that name a local HF folder


def unanswered_servers(cfg: DictConfig, timeout_s: float = 2.0) -> list[str]:
    """Every server under `reward` (a `base_url`) at whose address nothing accepts a connection, with the fix."""
    from train.plan import _servers

    out = []
    for path, node in _servers(cfg.get("reward")):
        url = urlparse(str(node.base_url))
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            with socket.create_connection((url.hostname or "", port), timeout=timeout_s):
                pass
        except OSError as err:
            start = (
                "start the classifier (`vllm serve CKPT --runner pooling --port PORT`)"
                if "Judge" in str(node.get("_target_", ""))
                else f"start its server (`vllm serve CKPT --served-model-name {node.get('model', 'NAME')} --port PORT`)"
            )
            out.append(
                f"{path}.base_url={node.base_url}: nothing answers there ({type(err).__name__}); {start} "
                f"and pass {path}.base_url=http://HOST:PORT"
            )
    return out


def missing_folders(cfg: DictConfig) -> list[str]:
    """The run's model and every reward component's `model_path` / `tokenizer` that is not a local HF folder."""
    from infra.models import DEFAULT_MODEL, ModelNotFoundError, resolve_model_path

    named = [("model.path", cfg.model.path)] + _folder_keys(cfg.get("reward"), "reward")
    out = []
    for path, value in named:
        if value in (None, "", DEFAULT_MODEL):
            continue
        try:
            resolve_model_path(str(value))
        except ModelNotFoundError:
            out.append(
                f"{path}={value!r} is not a local HF folder (no config.json): pass {path}=<local folder>"
            )
    return out


def _folder_keys(node, path: str) -> list[tuple[str, object]]:
    if isinstance(node, DictConfig):
        found = [(f"{path}.{k}", node[k]) for k in LOCAL_FOLDER_KEYS if k in node and "_target_" in node]
        for key in node:
            found += _folder_keys(node[key], f"{path}.{key}")
        return found
    if isinstance(node, ListConfig):
        return [f for i, item in enumerate(node) for f in _folder_keys(item, f"{path}.{i}")]
    return []


def start_problems(cfg: DictConfig, gpus_per_node: int | None = None) -> list[str]:
    """Everything found: the planner's start-up checks (a judge on a node whose GPUs all train, a served
    classifier without its tokenizer), the folders, then the servers. `gpus_per_node`: this node's GPUs
    (None: counted; 0 on a CPU machine, where a loopback server takes no GPU)."""
    from train.plan import startup_problems

    if gpus_per_node is None:
        import torch

        gpus_per_node = torch.cuda.device_count()
    planned = startup_problems(cfg, gpus_per_node) if gpus_per_node else startup_problems(cfg, 10**9)
    return planned + missing_folders(cfg) + unanswered_servers(cfg)


def refusal(cfg: DictConfig) -> str | None:
    """One line refusing the run (every problem, `; `-joined), or None when it can start."""
    problems = start_problems(cfg)
    return f"cannot start: {'; '.join(problems)}" if problems else None
