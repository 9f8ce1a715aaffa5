"""LLMClient against real servers: llm-katan on loopback (OpenAI + Anthropic APIs) and a fault proxy in front.

The fast tests need no server (provider parsing, keys, URLs, cache keys, an unreachable port). The slow
ones use the session `judge_server` and show: both SDKs get replies; 429 / 5xx / stalls / dropped
connections are retried and every reply arrives unchanged; a rerun is served from the cache with zero
requests; a partial failure keeps the replies that arrived; the key is in no log, error or cache file.
"""

from __future__ import annotations

import logging
import pickle

import pytest

from infra.llm import LLMClient, LLMClientError, parse_model
from infra.llm.cache import ReplyCache, request_key
from infra.llm.client import backoff_delay, normalize_base_url
from tests.judge_servers import FaultProxy, free_port

KEY_ENV = "RLPOST_TEST_JUDGE_KEY"
PROMPTS = [[{"role": "user", "content": f"Question {i}: what is {i} + {i}?"}] for i in range(5)]


def one_line(err: Exception) -> str:
    msg = str(err)
    assert "\n" not in msg and 0 < len(msg) < 600, msg
    return msg


# -- no server ----------------------------------------------------------------------------------------
def test_parse_model_and_unknown_provider() -> None:
    assert parse_model("openai/gpt-4o-mini") == ("openai", "gpt-4o-mini")
    assert parse_model("anthropic/org/claude-x") == ("anthropic", "org/claude-x")
    with pytest.raises(LLMClientError) as e:
        LLMClient("mistral/large", base_url="http://127.0.0.1:9")
    assert "unknown LLM provider 'mistral'" in one_line(e.value) and "openai/<model>" in str(e.value)
    with pytest.raises(LLMClientError, match="no provider prefix"):
        LLMClient("gpt-4o")


def test_missing_key_names_the_variable(monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("MY_JUDGE_KEY", raising=False)
    with pytest.raises(LLMClientError) as e:
        LLMClient("openai/gpt-4o-mini")
    assert "OPENAI_API_KEY" in one_line(e.value)
    with pytest.raises(LLMClientError) as e:
        LLMClient("anthropic/claude", base_url="https://api.example.com", api_key_env="MY_JUDGE_KEY")
    assert "MY_JUDGE_KEY" in one_line(e.value) and "https://api.example.com" in str(e.value)
    # a loopback server needs no key variable
    assert LLMClient("openai/x", base_url="http://localhost:8000", cache=False).base_url.endswith(":8000/v1")


def test_base_url_normalised_per_sdk() -> None:
    assert normalize_base_url("openai", "http://127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert normalize_base_url("openai", "http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000/v1"
    assert normalize_base_url("openai", "https://h.example/api/v2") == "https://h.example/api/v2"
    assert normalize_base_url("anthropic", "http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000"
    assert normalize_base_url("anthropic", "http://127.0.0.1:8000/") == "http://127.0.0.1:8000"
    assert normalize_base_url("openai", None) is None


def test_backoff_delay_hand_computed() -> None:
    assert [backoff_delay(a, 1.0, 30.0) for a in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert backoff_delay(2, 0.5, 30.0, u=0.0) == 1.0  # 0.5 * 2**2 * 0.5
    assert backoff_delay(1, 1.0, 30.0, u=0.5) == 1.5  # 2 * 0.75
    assert backoff_delay(0, 1.0, 30.0, retry_after=7.0) == 7.0  # the server asks for longer
    assert backoff_delay(3, 1.0, 30.0, retry_after=0.0) == 8.0  # ... or shorter: ours wins
    assert backoff_delay(0, 1.0, 30.0, retry_after=120.0) == 30.0  # capped


def test_request_key_covers_every_field(tmp_path) -> None:
    base = {
        "provider": "openai",
        "model": "m",
        "base_url": "u",
        "messages": [{"role": "user", "content": "hi"}],
        "system": None,
        "temperature": 0.0,
        "max_tokens": 10,
    }
    assert request_key(base) == request_key(dict(reversed(list(base.items()))))
    changed = [
        {"provider": "anthropic"},
        {"model": "m2"},
        {"base_url": "u2"},
        {"messages": [{"role": "user", "content": "hi!"}]},
        {"system": "s"},
        {"temperature": 0.5},
        {"max_tokens": 11},
    ]
    keys = {request_key({**base, **c}) for c in changed} | {request_key(base)}
    assert len(keys) == len(changed) + 1
    cache = ReplyCache(tmp_path / "c")
    key = request_key(base)
    assert cache.get(key) is None
    cache.put(key, "reply", base)
    assert cache.get(key) == "reply" and len(cache) == 1
    (tmp_path / "c" / key[:2] / f"{key}.json").write_text("{truncated")
    assert cache.get(key) is None  # a corrupt entry is a miss, not a crash


def test_unreachable_server_is_retried_then_one_line_error(tmp_path) -> None:
    client = LLMClient(
        "openai/judge",
        base_url=f"http://127.0.0.1:{free_port()}",
        max_retries=2,
        backoff_s=0.01,
        timeout_s=5,
        cache_dir=str(tmp_path),
    )
    with pytest.raises(LLMClientError) as e:
        client.complete(PROMPTS[0])
    msg = one_line(e.value)
    assert "connection failed" in msg and "after 3 attempts" in msg
    assert client.stats["requests"] == 3 and client.stats["retries"] == 2
    assert len(ReplyCache(tmp_path)) == 0


def test_bad_messages_and_settings() -> None:
    client = LLMClient("openai/x", base_url="http://127.0.0.1:9", cache=False)
    for bad in ([], [{"role": "user"}], "hello", [{"role": "user", "content": 3}]):
        with pytest.raises(LLMClientError, match="messages must be"):
            client.complete(bad)
    with pytest.raises(LLMClientError, match="timeout_s > 0"):
        LLMClient("openai/x", base_url="http://127.0.0.1:9", timeout_s=0)


def test_pickle_carries_no_key(monkeypatch) -> None:
    secret = "sk-pickle-secret-0123456789abcdef"
    monkeypatch.setenv(KEY_ENV, secret)
    client = LLMClient("anthropic/x", base_url="http://127.0.0.1:9", api_key_env=KEY_ENV, cache=False)
    blob = pickle.dumps(client)
    assert secret.encode() not in blob and secret not in repr(client)
    assert pickle.loads(blob)._api_key == secret  # re-read from the environment


# -- real servers -------------------------------------------------------------------------------------
@pytest.fixture
def judge_env(judge_server, monkeypatch):
    monkeypatch.setenv(KEY_ENV, judge_server.api_key)
    return judge_server


def make_client(server, base_url: str, provider: str, tmp_path, **kw) -> LLMClient:
    kw.setdefault("cache_dir", str(tmp_path / "cache"))
    return LLMClient(f"{provider}/{server.model}", base_url=base_url, api_key_env=KEY_ENV, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_both_sdks_reply_from_real_server(judge_env, provider, tmp_path) -> None:
    client = make_client(judge_env, judge_env.base_url, provider, tmp_path, cache=False)
    replies = client.complete_many(PROMPTS[:3], system="You are a judge.", max_tokens=8, max_concurrency=2)
    assert len(replies) == 3 and all(isinstance(r, str) and r.strip() for r in replies)
    assert replies == [client.complete(p, system="You are a judge.", max_tokens=8) for p in PROMPTS[:3]]
    assert client.stats["requests"] == 6 and client.stats["retries"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_faults_are_retried_nothing_lost_and_rerun_is_free(
    judge_env, provider, tmp_path, caplog, capfd
) -> None:
    caplog.set_level(logging.DEBUG)
    reference = make_client(judge_env, judge_env.base_url, provider, tmp_path, cache=False)
    expected = [reference.complete(p, max_tokens=8) for p in PROMPTS]

    faults = ["429", "500", "stall", "503", "drop", "429"]
    with FaultProxy(judge_env.base_url, schedule=faults, stall_s=60) as proxy:
        kw = {"timeout_s": 4, "max_retries": len(faults), "backoff_s": 0.05}  # one request may get all
        client = make_client(judge_env, proxy.base_url, provider, tmp_path, **kw)
        assert client.complete_many(PROMPTS, max_tokens=8, max_concurrency=2) == expected
        counts = proxy.counts
        assert counts["received"] == len(PROMPTS) + len(faults)
        assert counts["forwarded"] == len(PROMPTS)
        assert [counts[f] for f in ("429", "500", "503", "stall", "drop")] == [2, 1, 1, 1, 1]
        assert client.stats["retries"] == len(faults) and client.stats["replies"] == len(PROMPTS)

        rerun = make_client(judge_env, proxy.base_url, provider, tmp_path, **kw)
        assert rerun.complete_many(PROMPTS, max_tokens=8) == expected
        assert proxy.counts["received"] == counts["received"]  # zero requests: all from the cache
        assert rerun.stats["cache_hits"] == len(PROMPTS) and rerun.stats["requests"] == 0

    retry_logs = [r.getMessage() for r in caplog.records if r.name == "infra.llm.client"]
    assert len(retry_logs) == len(faults)
    out, err = capfd.readouterr()
    everything = caplog.text + out + err + "".join(r.getMessage() for r in caplog.records)
    cached = "".join(p.read_text() for p in (tmp_path / "cache").rglob("*") if p.is_file())
    assert judge_env.api_key not in everything and judge_env.api_key not in cached
    assert len(list((tmp_path / "cache").rglob("*.json"))) == len(PROMPTS)


@pytest.mark.slow
def test_partial_failure_keeps_the_replies_that_arrived(judge_env, tmp_path) -> None:
    with FaultProxy(judge_env.base_url, schedule=["500"]) as proxy:
        client = make_client(judge_env, proxy.base_url, "openai", tmp_path, max_retries=0)
        with pytest.raises(LLMClientError) as e:
            client.complete_many(PROMPTS[:3], max_tokens=8, max_concurrency=1)
        msg = one_line(e.value)
        assert "1 of 3 requests failed" in msg and "HTTP 500" in msg and "cached" in msg
        assert proxy.counts["forwarded"] == 2
        replies = make_client(judge_env, proxy.base_url, "openai", tmp_path).complete_many(
            PROMPTS[:3], max_tokens=8
        )
        assert len(replies) == 3 and proxy.counts["forwarded"] == 3  # only the failed one was asked again


@pytest.mark.slow
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_wrong_key_is_one_line_error_without_the_key(judge_server, provider, tmp_path, monkeypatch) -> None:
    wrong = "sk-wrong-key-5f2d9c1e8a7b6c5d"
    monkeypatch.setenv(KEY_ENV, wrong)
    client = make_client(judge_server, judge_server.base_url, provider, tmp_path, backoff_s=0.01)
    with pytest.raises(LLMClientError) as e:
        client.complete(PROMPTS[0], max_tokens=4)
    msg = one_line(e.value)
    assert "HTTP 401" in msg and KEY_ENV in msg
    assert wrong not in msg and judge_server.api_key not in msg
    assert client.stats["requests"] == 1  # an auth error is not retried
