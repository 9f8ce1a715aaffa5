"""One client for every LLM call the project makes (judges, raters, classmates served by URL).

`LLMClient("openai/gpt-4o-mini")` or `LLMClient("anthropic/claude-...", base_url=...)`: the provider prefix
picks the SDK (openai for any OpenAI-compatible server such as `vllm serve`, anthropic for the Messages
API). What it adds over a bare SDK call:

- retries with exponential backoff and jitter on 429, 5xx, connection errors and time-outs (the SDKs' own
  retries are turned off, so the counts in `stats` are the only retries that happen);
- a reply cache on disk keyed by a hash of the request, so a rerun of an eval makes no request;
- `complete_many` runs requests concurrently; a failure of some leaves the others' replies cached;
- the API key comes only from the environment and never reaches logs, errors, cache files or pickles;
  it is sent only where the user named it: `api_key_env=VAR` (any server), or the provider's default
  variable (OPENAI_API_KEY, ANTHROPIC_API_KEY) to the provider's own API (no base_url, or its host).
  Any other server gets a placeholder, so `OPENAI_API_KEY` never leaks to a URL typed on a command line.

Base URLs: give the server root or its `/v1`; the client adds or drops `/v1` as each SDK expects.
Caching is by request: two identical requests at temperature > 0 get the same (first) reply.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from infra.llm.cache import ReplyCache, request_key
from infra.redact import redact_text

logger = logging.getLogger(__name__)

PROVIDERS = ("openai", "anthropic")
DEFAULT_KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
PROVIDER_HOSTS = {"openai": "api.openai.com", "anthropic": "api.anthropic.com"}
NO_KEY = "no-key-sent"  # what a server gets when no key is named for it (the SDKs need some string)
RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})


class LLMClientError(RuntimeError):
    """A one-line, key-free description of what failed and what to do about it."""


def parse_model(model: str) -> tuple[str, str]:
    """'openai/gpt-4o-mini' -> ('openai', 'gpt-4o-mini'); the model name may itself contain '/'."""
    provider, sep, name = model.partition("/")
    if not sep or not name:
        raise LLMClientError(
            f"model={model!r} has no provider prefix: write it as openai/<model> or anthropic/<model>"
        )
    if provider not in PROVIDERS:
        raise LLMClientError(
            f"unknown LLM provider {provider!r} in model={model!r}: use one of "
            + ", ".join(f"{p}/<model>" for p in PROVIDERS)
        )
    return provider, name


def is_provider_url(provider: str, base_url: str | None) -> bool:
    """No base_url (the SDK's default) or one on the provider's own API host."""
    return not base_url or urlsplit(base_url).hostname == PROVIDER_HOSTS[provider]


def api_key_for(provider: str, base_url: str | None, api_key_env: str | None) -> str | None:
    """The key to send, or None to send none.

    From `api_key_env` when the caller named a variable (which must then be set); else from the
    provider's default variable, but only to the provider's own API. A server at any other URL gets no
    key unless named: `evals --server URL` sent $OPENAI_API_KEY to whatever server the URL pointed at.
    """
    if not api_key_env and not is_provider_url(provider, base_url):
        return None
    env = api_key_env or DEFAULT_KEY_ENV[provider]
    key = os.environ.get(env, "")
    if not key:
        where = redact_text(base_url) if base_url else f"the public {provider} API"
        raise LLMClientError(f"no API key for {where}: set the environment variable {env}")
    return key


def normalize_base_url(provider: str, base_url: str | None) -> str | None:
    """openai SDK wants the URL that ends in /v1; anthropic's appends /v1/messages itself."""
    if not base_url:
        return None
    parts = urlsplit(base_url.rstrip("/"))
    path = parts.path
    if provider == "openai" and path == "":
        path = "/v1"
    elif provider == "anthropic" and path.endswith("/v1"):
        path = path[: -len("/v1")]
    return urlunsplit(parts._replace(path=path))


def default_cache_dir() -> Path:
    from infra.models import cache_dir

    return cache_dir() / "llm_replies"


class LLMClient:
    """Chat completions through the openai or anthropic SDK, with retries, a reply cache and concurrency.

    Args:
        model: "provider/model-name", provider in {openai, anthropic}.
        base_url: server root or its /v1 (None: $OPENAI_BASE_URL / $ANTHROPIC_BASE_URL, else the
            provider's public API).
        api_key_env: env var holding the key, sent to whatever base_url is. Unnamed: the provider's
            default variable (OPENAI_API_KEY / ANTHROPIC_API_KEY), sent only to the provider's own
            API; any other server gets no key (`api_key_for`).
        timeout_s: per-request time-out; a time-out is retried like a 5xx.
        max_retries: retries after the first attempt (so max_retries + 1 attempts in all).
        cache_dir: reply cache folder (None: `$RLPOST_CACHE/llm_replies`); `cache=False` turns it off.
        backoff_s, backoff_max_s: the n-th retry waits min(backoff_max_s, backoff_s * 2**n) * U(0.5, 1),
            or the server's Retry-After when that is longer (still capped).
    """

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key_env: str | None = None,
        timeout_s: float = 60,
        max_retries: int = 5,
        cache_dir: str | None = None,
        *,
        cache: bool = True,
        backoff_s: float = 1.0,
        backoff_max_s: float = 30.0,
    ) -> None:
        self.provider, self.model_name = parse_model(model)
        self.model = model
        # The SDKs read <PROVIDER>_BASE_URL when no base_url is given; resolve it here so the cache key
        # and the loopback check see the URL actually used.
        env_url = os.environ.get(f"{self.provider.upper()}_BASE_URL") or None
        self.base_url = normalize_base_url(self.provider, base_url or env_url)
        self.named_key_env = api_key_env
        # The variable whose key is sent (None: no key for this server).
        sends_default = is_provider_url(self.provider, self.base_url)
        self.api_key_env = api_key_env or (DEFAULT_KEY_ENV[self.provider] if sends_default else None)
        if timeout_s <= 0 or max_retries < 0 or backoff_s < 0:
            raise LLMClientError(
                f"LLMClient({model}): need timeout_s > 0, max_retries >= 0 and backoff_s >= 0 "
                f"(got {timeout_s}, {max_retries}, {backoff_s})"
            )
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.backoff_max_s = float(backoff_max_s)
        self.cache = ReplyCache(cache_dir or default_cache_dir()) if cache else None
        self.stats = {"requests": 0, "retries": 0, "cache_hits": 0, "replies": 0}
        self._api_key = self._resolve_key()
        self._init_runtime()

    # -- construction ------------------------------------------------------------------------------
    def _init_runtime(self) -> None:
        self._sdk = None
        self._lock = threading.Lock()

    def _resolve_key(self) -> str:
        try:
            key = api_key_for(self.provider, self.base_url, self.named_key_env)
        except LLMClientError as exc:
            raise LLMClientError(f"{self.model}: {exc} (or pass api_key_env=<VAR>)") from None
        return key or NO_KEY

    def _client(self):
        with self._lock:
            if self._sdk is None:
                self._sdk = self._build_sdk()
            return self._sdk

    def _build_sdk(self):
        if self.provider == "openai":
            import openai

            return openai.OpenAI(
                api_key=self._api_key, base_url=self.base_url, timeout=self.timeout_s, max_retries=0
            )
        import anthropic

        # anthropic 2.x sends the key as a Bearer token; servers speaking the Messages API (the real one
        # and llm-katan) read x-api-key, so send both.
        return anthropic.Anthropic(
            api_key=self._api_key,
            base_url=self.base_url,
            timeout=self.timeout_s,
            max_retries=0,
            default_headers={"x-api-key": self._api_key},
        )

    def __repr__(self) -> str:
        url = redact_text(self.base_url) if self.base_url else None
        return f"LLMClient(model={self.model!r}, base_url={url!r}, api_key_env={self.api_key_env!r})"

    def __getstate__(self) -> dict:
        """Pickles (submitit jobs) carry no key and no SDK client; the key is re-read from the env."""
        state = dict(self.__dict__)
        for name in ("_api_key", "_sdk", "_lock"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._api_key = self._resolve_key()
        self._init_runtime()

    # -- public API --------------------------------------------------------------------------------
    def complete(
        self,
        messages: list[dict],
        *,
        system: str | None = None,
        temperature: float | None = 0.0,
        max_tokens: int = 1000,
    ) -> str:
        """The reply text to one chat conversation (from the cache when this exact request was made).

        `temperature=None` sends no temperature (for models that accept only their default).
        """
        _check_messages(messages)
        request = {
            "provider": self.provider,
            "model": self.model_name,
            "base_url": self.base_url or "",
            "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
            "system": system,
            "temperature": None if temperature is None else float(temperature),
            "max_tokens": int(max_tokens),
        }
        key = request_key(request)
        if self.cache is not None:
            cached = self.cache.get(key)
            if cached is not None:
                self._count("cache_hits")
                return cached
        reply = self._with_retries(request)
        if self.cache is not None:
            self.cache.put(key, reply, request)
        self._count("replies")
        return reply

    def complete_many(
        self,
        list_of_messages: list[list[dict]],
        *,
        system: str | None = None,
        temperature: float | None = 0.0,
        max_tokens: int = 1000,
        max_concurrency: int = 8,
    ) -> list[str]:
        """Replies in input order, `max_concurrency` requests in flight.

        Every request runs to the end even when some fail; then one error names how many failed,
        and the replies that arrived are already in the cache, so a rerun asks only for the rest.
        """
        for messages in list_of_messages:
            _check_messages(messages)

        def one(messages: list[dict]) -> str:
            return self.complete(messages, system=system, temperature=temperature, max_tokens=max_tokens)

        workers = max(1, min(int(max_concurrency), len(list_of_messages)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="llm") as pool:
            futures = [pool.submit(one, m) for m in list_of_messages]
            errors = [f.exception() for f in futures]
        failed = [e for e in errors if e is not None]
        if failed:
            first = failed[0]
            if not isinstance(first, LLMClientError):
                first = LLMClientError(self._scrub(f"{type(first).__name__}: {first}"))
            kept = "cached" if self.cache is not None else "not cached (cache=False)"
            raise LLMClientError(
                f"{len(failed)} of {len(futures)} requests failed ({len(futures) - len(failed)} replies "
                f"{kept}; rerun to retry the rest); first error: {first}"
            ) from None
        return [f.result() for f in futures]

    # -- retries -----------------------------------------------------------------------------------
    def _with_retries(self, request: dict) -> str:
        for attempt in range(self.max_retries + 1):
            self._count("requests")
            try:
                return self._call(request)
            except Exception as exc:  # noqa: BLE001 - classified below, re-raised as LLMClientError
                retryable, reason, retry_after = self._classify(exc)
            where = f"{self.model} at {redact_text(self.base_url or 'the public API')}"
            if not retryable:
                raise LLMClientError(f"LLM request to {where} failed: {reason}") from None
            if attempt == self.max_retries:
                raise LLMClientError(
                    f"LLM request to {where} failed after {attempt + 1} attempts; last error: {reason} "
                    "(check the server, or raise max_retries/timeout_s)"
                ) from None
            delay = backoff_delay(attempt, self.backoff_s, self.backoff_max_s, retry_after, random.random())
            self._count("retries")
            logger.warning(
                "%s: %s; retry %d/%d in %.2fs", self.model, reason, attempt + 1, self.max_retries, delay
            )
            time.sleep(delay)
        raise AssertionError("unreachable")

    def _call(self, request: dict) -> str:
        sdk = self._client()
        messages = request["messages"]
        if self.provider == "openai":
            if request["system"] is not None:
                messages = [{"role": "system", "content": request["system"]}, *messages]
            sampling = {} if request["temperature"] is None else {"temperature": request["temperature"]}
            resp = sdk.chat.completions.create(
                model=self.model_name, messages=messages, max_tokens=request["max_tokens"], **sampling
            )
            if not resp.choices:
                return ""
            return resp.choices[0].message.content or ""
        # The Messages API takes the system prompt apart from the turns.
        system_parts = [m["content"] for m in messages if m["role"] == "system"]
        if request["system"] is not None:
            system_parts.insert(0, request["system"])
        kwargs = {"system": "\n\n".join(system_parts)} if system_parts else {}
        # anthropic >= 1.0 dropped `temperature` from the signature, not from the API: send it in the body.
        if request["temperature"] is not None:
            kwargs["extra_body"] = {"temperature": request["temperature"]}
        resp = sdk.messages.create(
            model=self.model_name,
            messages=[m for m in messages if m["role"] != "system"],
            max_tokens=request["max_tokens"],
            **kwargs,
        )
        return "".join(getattr(block, "text", "") for block in resp.content or [])

    def _classify(self, exc: Exception) -> tuple[bool, str, float | None]:
        """(retry?, one-line key-free reason, server's Retry-After seconds or None)."""
        status = getattr(exc, "status_code", None)
        if isinstance(status, int):
            if status in (401, 403):  # auth error bodies may quote the key sent: never repeat them
                fix = (
                    f"check the key in ${self.api_key_env}"
                    if self.api_key_env
                    else "no key is sent to a server it was not named for: pass api_key_env=<VAR>"
                )
                return False, f"HTTP {status} authentication failed ({fix})", None
            reason = self._scrub(f"HTTP {status} {getattr(exc, 'message', '') or ''}")
            return status in RETRYABLE_STATUS or status >= 500, reason, _retry_after(exc)
        name = type(exc).__name__
        if "Timeout" in name:
            return True, f"no reply within timeout_s={self.timeout_s:g}", None
        if "Connection" in name:
            return True, self._scrub(f"connection failed ({name}: {exc})"), None
        return False, self._scrub(f"{name}: {exc}"), None

    def _scrub(self, text: str) -> str:
        """One line, at most 300 characters, with the key (if any) masked."""
        key = getattr(self, "_api_key", "")
        if key and len(key) >= 4:
            text = text.replace(key, "***")
        text = redact_text(" ".join(str(text).split()))
        return text if len(text) <= 300 else text[:297] + "..."

    def _count(self, name: str) -> None:
        with self._lock:
            self.stats[name] += 1


def backoff_delay(
    attempt: int, base_s: float, max_s: float, retry_after: float | None = None, u: float = 1.0
) -> float:
    """Seconds to wait before retry number `attempt + 1` (attempt counts from 0).

    Exponential with "equal jitter": min(max_s, base_s * 2**attempt) scaled by (0.5 + u / 2), u in [0, 1),
    so concurrent clients spread out; a longer Retry-After from the server wins, still capped at max_s.
    """
    delay = min(max_s, base_s * 2**attempt) * (0.5 + 0.5 * u)
    if retry_after is not None:
        delay = min(max_s, max(delay, retry_after))
    return delay


def _retry_after(exc: Exception) -> float | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    value = headers.get("retry-after") if headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _check_messages(messages: list[dict]) -> None:
    ok = (
        isinstance(messages, list)
        and messages
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        )
    )
    if not ok:
        raise LLMClientError(
            "messages must be a non-empty list of {'role': str, 'content': str} dicts, e.g. "
            "[{'role': 'user', 'content': 'Hi'}]"
        )
