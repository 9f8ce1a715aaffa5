"""Secrets: one redaction (infra/redact.py) for everything written, configs holding a key refused where
they are parsed, and a key sent only to a server the user named it for (or the provider's own API).
The sending tests use a loopback server that records every header it receives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.llm.client import LLMClient
from infra.models import PROJECT_ROOT
from infra.redact import MASK, is_secret_name, redact, redact_text, secrets_in
from tests.recording_server import RecordingServer

KEY = "sk-proj-Zq81xvT0aB7"  # short, like a test key: the old check wanted 16+ characters after sk-


# ---------------------------------------------------------------- the redaction itself


def test_secret_names():
    secret = ["api_key", "judge.api_key", "hf_token", "HF_TOKEN", "access_token", "client_secret", "password",
              "db_passwd", "authorization", "Authorization", "apiKey", "openaiApiKey", "key", "private_key",
              "auth", "credentials", "token"]  # fmt: skip
    plain = ["api_key_env", "judge_api_key_env", "max_tokens", "max_new_tokens", "max_prompt_tokens",
             "micro_batch_tokens", "pad_token", "eos_token", "token_level_classmate_reward_mode", "tokenizer",
             "sort_key", "monkey", "author", "keep_last", "base_url", "model"]  # fmt: skip
    assert [n for n in secret if not is_secret_name(n)] == []
    assert [n for n in plain if is_secret_name(n)] == []


def test_secret_values_are_masked_wherever_they_appear():
    cases = {
        "sk-abc": MASK,
        f"key is {KEY}.": f"key is {MASK}.",
        "sk-ant-api03-abcdefgh": MASK,
        "Authorization: Bearer abc.def-123": f"Authorization: Bearer {MASK}",
        "AIzaSyA1b2C3d4": MASK,
        "https://user:hunter2@host.example/v1": f"https://user:{MASK}@host.example/v1",
        "https://host.example/v1?key=AB12&x=1": f"https://host.example/v1?key={MASK}&x=1",
        "http://h/v1?api_key=s3cr3t": f"http://h/v1?api_key={MASK}",
        "hf_" + "a1B2" * 9: MASK,
        "ghp_" + "x9" * 18: MASK,
        "xoxb-1234-5678-abcd": MASK,
        "AKIAIOSFODNN7EXAMPLE": MASK,
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.dozjgNryP4J3jVmNHl0w5N": MASK,
    }
    assert {text: redact_text(text) for text in cases} == cases
    unchanged = ["train.rollout.hf_engine.HFEngine", "risk-averse task-sk-1 ask-me", "outputs/darling-sk-run",
                 "http://127.0.0.1:8000/v1", "https://api.openai.com/v1", "sk-", "Bearer", "scikit-learn"]  # fmt: skip
    assert [t for t in unchanged if redact_text(t) != t] == []


def test_redact_and_secrets_in_agree_on_configs():
    cfg = {
        "reward": {
            "quality": {"api_key": "anything", "api_key_env": "MY_KEY", "base_url": "http://h/?token=t1"}
        },
        "rollout": {"max_new_tokens": 64},
        "tags": {"note": f"uses {KEY}"},
        "list": ["ok", "Bearer zzzz9"],
        "judge": {"password": None, "token": ""},
    }
    assert redact(cfg) == {
        "reward": {
            "quality": {"api_key": MASK, "api_key_env": "MY_KEY", "base_url": f"http://h/?token={MASK}"}
        },
        "rollout": {"max_new_tokens": 64},
        "tags": {"note": f"uses {MASK}"},
        "list": ["ok", f"Bearer {MASK}"],
        "judge": {"password": None, "token": ""},
    }
    assert secrets_in(cfg) == ["reward.quality.api_key", "reward.quality.base_url", "tags.note", "list[1]"]
    flat = {"judge.api_key": "x", "rollout.max_new_tokens": 64, "note": KEY}
    assert redact(flat) == {"judge.api_key": MASK, "rollout.max_new_tokens": 64, "note": MASK}
    assert secrets_in(redact(cfg)) == []


# ---------------------------------------------------------------- configs: refused where parsed


def _run(args: list[str], tmp_path: Path, **env) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "OMP_NUM_THREADS": "1",
                "RLPOST_OUTPUTS": str(tmp_path / "outputs"),
                "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", **env}  # fmt: skip
    return subprocess.run([sys.executable, *args], cwd=PROJECT_ROOT, env=full_env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


@pytest.mark.parametrize(
    "override",
    [
        f"reward.quality.api_key={KEY}",
        "reward.quality.password=hunter2",
        "reward.judge.base_url=https://judge.example/v1?key=AIzaSyTEST1234",
        "reward.quality.auth_header=Bearer abcdef12",
    ],
)
def test_a_sweep_with_a_secret_is_refused_before_anything_is_written(tmp_path, override):
    proc = _run(["-m", "orchestration.sweep", "darling_wildchat", override], tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "environment" in lines[0], proc.stderr
    secret = override.split("=", 1)[1].split("=")[-1].split()[-1]
    assert secret not in proc.stdout + proc.stderr  # the message names the key, never the value
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "mlflow.db").exists()


def test_train_with_a_secret_is_refused(tmp_path):
    proc = _run(["-m", "train", "experiment=darling_wildchat", f"reward.quality.api_key={KEY}"], tmp_path)
    assert proc.returncode == 2 and "reward.quality.api_key" in proc.stderr and KEY not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_mlflow_params_and_tags_are_redacted(tmp_path, monkeypatch):
    import mlflow

    from infra.tracking import Tracker, flatten

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    t = Tracker()
    run_id = t.start("exp", "run")
    t.log_params(flatten({"judge": {"api_key": "x", "base_url": "https://u:pw@h/v1"}, "rollout": {"max_new_tokens": 8},
                          "sweep": {"overrides": f"seed=1 note={KEY}"}}))  # fmt: skip
    t.finish("FAILED", error=f"Traceback ...\nopenai.AuthenticationError: bad key {KEY}")
    run = mlflow.MlflowClient().get_run(run_id)
    assert run.data.params == {
        "judge.api_key": MASK,
        "judge.base_url": f"https://u:{MASK}@h/v1",
        "rollout.max_new_tokens": "8",
        "sweep.overrides": f"seed=1 note={MASK}",
    }
    assert KEY not in json.dumps([run.data.params, run.data.tags]) and MASK in run.data.tags["rlpost.error"]


# ---------------------------------------------------------------- keys sent only where named


def _eval_env(tmp_path: Path, **extra) -> dict:
    return {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "OMP_NUM_THREADS": "1", **extra}


def _eval(server, tmp_path: Path, *args: str, **env) -> subprocess.CompletedProcess:
    data = tmp_path / "data" / "gsm8k"
    data.mkdir(parents=True, exist_ok=True)
    (data / "test.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "#### 2", "idx": 0}) + "\n")
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    cmd = [sys.executable, "-m", "evals.math", "--ckpt", str(model), "--server", server.base_url, "--data-dir",
           str(tmp_path / "data"), "--datasets", "gsm8k", "--results-dir", str(tmp_path / "res"), "--no-mlflow",
           *args]  # fmt: skip
    return subprocess.run(cmd, cwd=PROJECT_ROOT, env=_eval_env(tmp_path, **env), capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def test_eval_server_gets_no_key_unless_named(tmp_path):
    with RecordingServer() as server:
        proc = _eval(server, tmp_path, OPENAI_API_KEY=KEY)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert server.requests and not any(KEY in v for v in server.auth_headers())
    with RecordingServer() as server:
        proc = _eval(server, tmp_path, "--server-api-key-env", "MY_SERVER_KEY", "--results-dir",
                     str(tmp_path / "res2"), OPENAI_API_KEY=KEY, MY_SERVER_KEY="sk-for-this-server")  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert server.auth_headers() == {"Bearer sk-for-this-server"}
    with RecordingServer() as server:  # named but unset: one line, nothing sent
        proc = _eval(server, tmp_path, "--server-api-key-env", "UNSET_KEY_VAR", OPENAI_API_KEY=KEY)
        assert proc.returncode == 1 and "UNSET_KEY_VAR" in proc.stderr and not server.requests


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_llm_client_sends_a_key_only_where_named(tmp_path, monkeypatch, provider):
    env = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}[provider]
    monkeypatch.setenv(env, KEY)
    monkeypatch.setenv("JUDGE_KEY", "sk-judge-only")
    with RecordingServer(reply="ok") as server:
        LLMClient(f"{provider}/m", base_url=server.base_url, cache=False).base_url  # noqa: B018
        assert LLMClient(f"{provider}/m", base_url=server.base_url, cache=False)._api_key != KEY
        named = LLMClient(f"{provider}/m", base_url=server.base_url, api_key_env="JUDGE_KEY", cache=False)
        assert named._api_key == "sk-judge-only"
    # The provider's own API (no base_url, or its URL) gets the default variable's key.
    assert LLMClient(f"{provider}/m", cache=False)._api_key == KEY
    host = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com"}[provider]
    assert LLMClient(f"{provider}/m", base_url=host, cache=False)._api_key == KEY


def test_llm_client_request_to_an_unnamed_server_carries_no_key(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with RecordingServer(reply="hello") as server:
        client = LLMClient("openai/m", base_url=server.base_url, cache=False, max_retries=0)
        assert client.complete([{"role": "user", "content": "hi"}]) == "hello"
        assert server.auth_headers() and not any(KEY in v for v in server.auth_headers())
        named = LLMClient("openai/m", base_url=server.base_url, api_key_env="OPENAI_API_KEY", cache=False)
        named.complete([{"role": "user", "content": "hi again"}])
        assert f"Bearer {KEY}" in server.auth_headers()
