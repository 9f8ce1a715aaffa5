from infra.redact import MASK, redact
from infra.tracking import Tracker, flatten


def test_flatten_and_redact_mask_secrets_and_keep_token_counts():
    params = flatten(
        {
            "judge": {"api_key": "x", "model": "m", "base_url": "u"},
            "hf_token": "t",
            "note": "sk-" + "a" * 30,
            "rollout": {"max_new_tokens": 64},
        }  # fmt: skip
    )
    clean = redact(params)
    assert clean == {"judge.api_key": MASK, "judge.model": "m", "judge.base_url": "u", "hf_token": MASK,
                     "note": MASK, "rollout.max_new_tokens": 64}  # fmt: skip


def test_tracker_round_trip_and_no_duplicate_steps_on_resume(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    t = Tracker()
    run_id = t.start("exp", "run", tags={"a": "b"})
    t.log_params({"optim.lr": 1e-6, "judge.api_key": "secret"})
    for step in (1, 2, 3):
        t.log_metrics({"train/reward_mean": float(step)}, step)
    # a resumed job re-runs step 3 (after a checkpoint at 2): step 3 must not be logged twice
    t2 = Tracker()
    t2.start("exp", "run", run_id=run_id)
    for step in (3, 4):
        t2.log_metrics({"train/reward_mean": float(step) + 10}, step)
    t2.finish()
    history = t2.client.get_metric_history(run_id, "train/reward_mean")
    assert sorted((m.step, m.value) for m in history) == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 14.0)]
    run = t2.client.get_run(run_id)
    assert run.data.params["judge.api_key"] == MASK and run.data.params["optim.lr"] == "1e-06"
    assert run.info.status == "FINISHED"
