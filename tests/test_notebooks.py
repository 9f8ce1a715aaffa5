"""The analysis notebooks run top to bottom (nbclient) on a store made by a real tiny training run."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from infra.models import PROJECT_ROOT
from train.config import build_config
from train.stages.grpo import GRPOTrainer

pytestmark = pytest.mark.slow

NOTEBOOKS = sorted((PROJECT_ROOT / "analysis" / "notebooks").glob("*.ipynb"))


@pytest.fixture(scope="module")
def tiny_store(tiny_model, vllm_engine, tmp_path_factory):
    """Two seeds of a 2-step tiny GRPO run, with eval metrics logged at each checkpoint step."""
    import mlflow

    tmp = tmp_path_factory.mktemp("nbstore")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    mp = pytest.MonkeyPatch()
    mp.setenv("MLFLOW_TRACKING_URI", uri)
    mp.setenv("RLPOST_EXPERIMENT", "nb_tiny")
    for seed in (1, 2):
        cfg = build_config(
            overrides=[
                f"model.path={tiny_model}", f"run_dir={tmp / f'run{seed}'}", "total_steps=2", "save_every=1",
                "reward._target_=tests.rewards_for_tests.VowelShareReward", "data.prompts_per_step=2",
                "rollout.n=2", "rollout.max_new_tokens=8", "data.builtin_size=16", f"seed={seed}",
                "experiment=nb_tiny",
            ]
        )  # fmt: skip
        cfg.run_name = f"nb_tiny-s{seed}"
        cfg.tags = {"rlpost.grid_point": f'{{"seed": {seed}}}'}
        trainer = GRPOTrainer(cfg, engine=vllm_engine)
        trainer.train()
        client = mlflow.MlflowClient()
        for step in (1, 2):
            client.log_metric(trainer.run_id, "eval/math/acc", 0.1 * step + 0.01 * seed, step=step)
            client.log_metric(trainer.run_id, "eval/novelty/distinct", 2 + step, step=step)
            client.log_metric(trainer.run_id, "eval/novelty/distinct/creativity", 3 + step, step=step)
    yield uri
    mp.undo()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path: Path, tiny_store, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tiny_store)
    monkeypatch.setenv("RLPOST_EXPERIMENT", "nb_tiny")
    nb = nbformat.read(path, as_version=4)
    NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(PROJECT_ROOT)}}
    ).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("2 runs in 'nb_tiny'" in o.get("text", "") for o in outputs)
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, f"{path.name} drew no figure"
