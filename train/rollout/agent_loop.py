"""Multi-turn rollouts: the model calls tools and talks to an environment, token in, token out.

A trajectory is one sample: its prompt, then model turns and environment turns back to back as one
response. The engine's sampled tokens are appended as sampled (never decoded and re-encoded); an
environment turn (tool results, a user's reply) is rendered by the chat template and appended as tokens
(train/env/tool_format.py). `token_mask` marks model tokens 1 and environment tokens 0, and the trainer
makes it the response mask, so the loss, entropy, KL, rollout correction and every per-token figure see
model tokens only; the engine's log-probs are kept for model tokens (0.0 under environment tokens).

Scheduling (`schedule`): `async` keeps the engine busy: each trajectory's next turn is queued as soon as
its tools or its environment have answered, and the engine steps over whatever is queued while other
trajectories wait (continuous batching over vLLM's request queue; tools and environments run in a thread
pool, train/env/calls.py). `sync` is turn-synchronous batching (every waiting trajectory's turn generated as
one batch, then every tool call, then the next turn), kept for the comparison in bench/agent_rollout.py. Prefix caching
(on by default in the vLLM engine) reuses each trajectory's earlier turns.

Stops: `max_turns` model turns, `max_total_tokens` response tokens (model and environment), the
environment's `done`, or a model turn without a tool call when there is no environment. Bad turns never
stop a step: a malformed call, an unknown tool, a tool that raises or times out, an over-long observation
each become an error observation the model reads (counted); an environment that raises ends its
trajectory (`failed`, reward 0 by the trainer) with one warning line.

Robustness: tools and environments are user code, so every call into them (the environment's
construction and `reset`, `step`, `close`, each tool call) runs on the bounded pool of train/env/calls.py,
never in this thread: whatever it raises (SystemExit and KeyboardInterrupt included), a wrong type, a
non-finite reward (train/env/base.py's checks) or no answer within `tool_timeout_s` is that trajectory's
failure alone (`failed_kind`, counted as `env/env_errors_<kind>`), and a hung call's thread is replaced, not
waited for. Text from user code is cut to `max_observation_tokens * CHARS_PER_TOKEN` characters before it
is tokenized, so a 10 MB answer costs what a short one does.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from train.batch import Batch
from train.env.base import EnvStep, ToolResult, checked_observation, checked_step, finite_or_zero
from train.env.calls import CallFailed, CallPool, describe
from train.env.tool_format import ChatFormat, ParsedTurn, parse_tool_calls
from train.rollout.base import SamplingConfig, TurnOutput

SCHEDULES = ("async", "sync")
ERROR_KINDS = (
    "malformed",
    "unknown_tool",
    "tool_error",
    "timeout",
    "too_long",
    "too_many_calls",
)  # tool calls, observations
ENV_ERROR_KINDS = ("raised", "bad_type", "non_finite_reward", "timeout")  # why an environment failed
CHARS_PER_TOKEN = 8  # observations are cut to max_observation_tokens x this many characters, then tokenized


@dataclass
class Trajectory:
    """One sample's conversation as tokens, with what the metrics and the samples viewer need."""

    index: int
    prompt_ids: list[int]
    row: dict
    seed: int
    env: Any = None
    token_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)  # 1: sampled by the model, 0: written by the environment
    logprobs: list[float] = field(default_factory=list)
    segments: list[dict] = field(default_factory=list)  # {"role": "model" | "env", "start", "end", "text"}
    turns: int = 0
    tool_calls: int = 0
    calls: list[dict] = field(default_factory=list)  # {"name", "arguments", "result"} in the order made
    errors: dict[str, int] = field(default_factory=dict)
    tool_latency_s: list[float] = field(default_factory=list)
    env_reward: float = 0.0
    final_text: str = ""
    open_turn: bool = False  # the last model turn was cut before its end-of-turn token
    stop: str = ""  # answered | done | max_turns | max_total_tokens | turn_length | env_error
    failed: str | None = None
    failed_kind: str | None = None  # one of ENV_ERROR_KINDS when failed
    drifted: int = 0  # model turns whose text would not re-encode to the sampled ids (retokenization_drift)

    @property
    def truncated(self) -> bool:
        return self.stop in ("max_turns", "max_total_tokens", "turn_length")

    def add(self, ids: list[int], role: str, text: str, logprobs: list[float] | None = None) -> None:
        start = len(self.token_ids)
        self.token_ids += ids
        self.mask += [1 if role == "model" else 0] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.segments.append({"role": role, "start": start, "end": len(self.token_ids), "text": text})

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def summary(self) -> dict:
        """What the batch keeps of the trajectory (metrics, samples viewer)."""
        return {
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "calls": [dict(c) for c in self.calls],
            "errors": dict(self.errors),
            "tool_latency_s": list(self.tool_latency_s),
            "env_reward": self.env_reward,
            "stop": self.stop,
            "truncated": self.truncated,
            "failed": self.failed,
            "failed_kind": self.failed_kind,
            "segments": [dict(s) for s in self.segments],
            "env_tokens": len(self.mask) - sum(self.mask),
            "drifted_turns": self.drifted,
        }


@dataclass
class _Pending:
    """The tool calls (or environment step) a trajectory waits for after a model turn."""

    trajectory: Trajectory
    futures: list[Future]
    names: list[str]  # the tools called ("" for a malformed call)
    env_step: bool = False


class BatchedTurns:
    """The turn-level API over an engine that has only `generate`: everything queued is generated as one
    batch when stepped (the HF engine in tests; no overlap with tools)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.queued: list[tuple[str, list[int], SamplingConfig, int]] = []
        self.ids = itertools.count()

    def submit(self, prompt_ids: list[int], sampling: SamplingConfig, seed: int) -> str:
        rid = f"turn-{next(self.ids)}"
        self.queued.append((rid, prompt_ids, sampling, seed))
        return rid

    def pending(self) -> int:
        return len(self.queued)

    def step(self) -> list[TurnOutput]:
        queued, self.queued = self.queued, []
        out: list[TurnOutput] = []
        for max_new in sorted({s.max_new_tokens for _, _, s, _ in queued}):
            part = [q for q in queued if q[2].max_new_tokens == max_new]
            sampling = replace(part[0][2], n=1, seed=part[0][3])
            batch = self.engine.generate([p for _, p, _, _ in part], sampling)
            for (rid, *_), ids, lps, text, fin in zip(
                part, batch.response_ids, batch.response_logprobs, batch.texts, batch.finish_reasons
            ):
                out.append(TurnOutput(rid, ids, lps, text, fin))
        return out


class AgentRollout:
    """Generates multi-turn trajectories with `tools` (name -> Tool) and an environment factory.

    `interaction`: a callable returning a new Environment per trajectory (None: tools only, the
    trajectory ends at the first model turn without a tool call)."""

    def __init__(
        self,
        engine,
        tokenizer,
        tools: dict[str, Any],
        interaction=None,
        max_turns: int = 4,
        max_total_tokens: int | None = None,
        max_observation_tokens: int = 256,
        max_calls_per_turn: int = 4,
        tool_timeout_s: float = 10.0,
        tool_workers: int = 8,
        schedule: str = "async",
        tool_format: str = "auto",
        say=print,
    ) -> None:
        if schedule not in SCHEDULES:
            raise ValueError(f"env.schedule={schedule!r}: expected one of {', '.join(SCHEDULES)}")
        self.attach(engine)
        self.tokenizer = tokenizer
        self.tools = tools
        self.interaction = interaction
        self.max_turns = max_turns
        self.max_total_tokens = max_total_tokens
        self.max_observation_tokens = max_observation_tokens
        self.max_calls_per_turn = max_calls_per_turn
        self.tool_timeout_s = tool_timeout_s
        self.schedule = schedule
        native = {"auto": None, "native": True, "fallback": False}[tool_format]
        self.format = ChatFormat(tokenizer, [t.schema() for t in tools.values()], native=native)
        self.pool = CallPool(tool_workers, tool_timeout_s, name="env")
        self.say = say
        self.last_stats: dict[str, float] = {}
        self._hung_said = 0  # abandoned calls at the last warning

    def attach(self, engine) -> None:
        """The engine to generate with (the trainer builds it after the prompts are encoded)."""
        self.engine = engine
        self.turns_api = engine if engine is None or hasattr(engine, "submit") else BatchedTurns(engine)

    # ---- prompts ------------------------------------------------------------------------------
    def encode(self, rows: list[dict]) -> list[list[int]]:
        """Each row's chat prompt with the tools described (native template or the fallback system text)."""
        return [self.format.prompt_ids(r["prompt"]) for r in rows]

    # ---- the rollout --------------------------------------------------------------------------
    def generate(self, prompt_ids: list[list[int]], rows: list[dict], sampling: SamplingConfig) -> Batch:
        """n trajectories per prompt, prompt-major like every engine's `generate` (row p * n + j)."""
        trajs = []
        for p, (ids, row) in enumerate(zip(prompt_ids, rows)):
            for j in range(sampling.n):
                i = p * sampling.n + j
                trajs.append(Trajectory(i, list(ids), row, sampling.seed + i))
        budget = self.max_total_tokens or sampling.max_new_tokens * self.max_turns
        started = time.perf_counter()
        busy = self._run(self._open_envs(trajs), sampling, budget)
        self._close_envs(trajs)
        wall = time.perf_counter() - started
        self.last_stats = {
            "engine_busy_share": busy / wall if wall > 0 else 0.0,
            "rollout_s": wall,
            "hung_calls": float(self.pool.abandoned),
        }
        self._warn_hung()
        for t in trajs:
            t.drifted = retokenization_drift(self.tokenizer, t)
        return Batch(
            prompt_ids=[t.prompt_ids for t in trajs],
            response_ids=[t.token_ids for t in trajs],
            response_logprobs=[t.logprobs for t in trajs],
            texts=[t.final_text for t in trajs],
            finish_reasons=["length" if t.truncated else "stop" for t in trajs],
            group_index=[t.index // sampling.n for t in trajs],
            token_mask=[t.mask for t in trajs],
            episodes=[t.summary() for t in trajs],
        )

    def _run(self, trajs: list[Trajectory], sampling: SamplingConfig, budget: int) -> float:
        """Drive every trajectory to its end; the seconds spent inside engine steps."""
        ready: deque[Trajectory] = deque(trajs)
        running: dict[str, Trajectory] = {}
        waiting: list[_Pending] = []
        busy = 0.0
        max_len = getattr(self.engine, "max_model_len", None)
        while ready or running or waiting:
            hold = self.schedule == "sync" and (running or waiting)  # a turn-synchronous batch is in flight
            while ready and not hold:
                t = ready.popleft()
                room = budget - len(t.token_ids)
                if max_len is not None:  # the engine's context: prompt, earlier turns and this one
                    room = min(room, max_len - len(t.prompt_ids) - len(t.token_ids))
                if room <= 0:
                    self._finish(t, "max_total_tokens")
                    continue
                turn = replace(sampling, n=1, max_new_tokens=min(sampling.max_new_tokens, room))
                rid = self.turns_api.submit(t.prompt_ids + t.token_ids, turn, t.seed + (t.turns << 32))
                running[rid] = t
            if running:
                tick = time.perf_counter()
                outs = self.turns_api.step()
                busy += time.perf_counter() - tick
                for out in outs:
                    self._model_turn(running.pop(out.request_id), out, waiting, ready)
            elif waiting:  # nothing to generate: wait for the first call to answer or run out of time
                self.pool.wait([f for p in waiting for f in p.futures])
            self.pool.reap()  # calls past env.tool_timeout_s are failed (and their threads replaced)
            for p in list(waiting):
                if all(f.done() for f in p.futures):
                    waiting.remove(p)
                    self._answer(p, budget, ready)
        return busy

    def _model_turn(self, t: Trajectory, out: TurnOutput, waiting: list, ready: deque) -> None:
        logprobs = out.logprobs if len(out.logprobs) == len(out.token_ids) else [0.0] * len(out.token_ids)
        t.add(out.token_ids, "model", out.text, logprobs)
        t.turns += 1
        t.final_text = out.text
        # a turn cut at rollout.max_new_tokens is still acted on (its calls, or the environment's verdict);
        # the end-of-turn token the model did not write is then the environment's (train/env/tool_format.py)
        t.open_turn = out.finish_reason == "length"
        parsed: ParsedTurn = parse_tool_calls(out.text) if self.tools else ParsedTurn()
        if parsed.wants_tools:
            if t.turns >= self.max_turns:
                return self._finish(t, "max_turns")
            futures, names = [], []
            for message in parsed.errors:
                t.error("malformed")
                futures.append(_done(f"error: {message}"))
                names.append("")
            for call in parsed.calls[: self.max_calls_per_turn]:
                t.tool_calls += 1
                t.calls.append({"name": call.name, "arguments": call.arguments, "result": None})
                futures.append(self.pool.submit(self._call_tool, call.name, call.arguments))
                names.append(call.name)
            for _ in parsed.calls[self.max_calls_per_turn :]:  # not made: the model reads why, after the rest
                t.error("too_many_calls")
                futures.append(
                    _done(f"error: not called: at most {self.max_calls_per_turn} tool calls a turn")
                )
                names.append("")
            waiting.append(_Pending(t, futures, names))
        elif t.env is not None:
            if t.turns >= self.max_turns:
                return self._finish(t, "max_turns")
            waiting.append(_Pending(t, [self.pool.submit(_step_env, t.env, out.text)], ["step"], True))
        else:
            self._finish(t, "turn_length" if t.open_turn else "answered")

    def _open_envs(self, trajs: list[Trajectory]) -> list[Trajectory]:
        """Make and reset every trajectory's environment (on the pool, together, each bounded in time); the
        trajectories that start, in order, their reset observation part of their prompt."""
        if self.interaction is None:
            return trajs
        opening = [(t, self.pool.submit(self._open_env, t)) for t in trajs]
        self.pool.settle([f for _, f in opening])  # all at once: the first turns are one batch, as ever
        started = []
        for t, future in opening:
            try:
                first = future.result()
            except CallFailed as exc:
                self._env_failed(t, "reset", exc)
                continue
            if first:  # shown before the first model turn: part of the prompt
                messages = [*t.row["prompt"], {"role": "user", "content": self._cut(t, first)}]
                t.prompt_ids = self.format.prompt_ids(messages)
            started.append(t)
        return started

    # ---- calls into user code: run on the pool's threads ------------------------------------------
    def _open_env(self, t: Trajectory) -> str | None:
        """Make the trajectory's environment and reset it; its first observation (checked)."""
        t.env = self.interaction()  # set from the pool's thread: read once the call is settled
        return checked_observation(t.env.reset(t.row), "reset's observation")

    def _call_tool(self, name: str, arguments: dict) -> tuple[str, str | None, float, float]:
        """(result text, error kind or None, seconds, the call's reward) of one call."""
        tick = time.perf_counter()
        tool = self.tools.get(name)
        if tool is None:
            known = ", ".join(sorted(self.tools))
            return f"error: unknown tool {name!r} (available: {known})", "unknown_tool", 0.0, 0.0
        reward = 0.0
        try:
            out = tool(**arguments)
            if isinstance(out, ToolResult):
                out, reward = out.text, finite_or_zero(out.reward)
            result, kind = str(out), None
        except BaseException as exc:  # noqa: BLE001 -- SystemExit too: a tool's failure is the model's observation
            message = describe(exc, self._max_chars(), with_type=not isinstance(exc, Exception))
            result, kind = (message if message.startswith("error") else f"error: {message}"), "tool_error"
        return result, kind, time.perf_counter() - tick, reward

    # ---- answers ----------------------------------------------------------------------------------
    def _answer(self, p: _Pending, budget: int, ready: deque) -> None:
        """Turn the answers of tools or the environment into the next observation, or end the trajectory."""
        t = p.trajectory
        if p.env_step:
            return self._env_answer(t, p.futures[0], budget, ready)
        results = []
        made = iter(t.calls[len(t.calls) - sum(1 for n in p.names if n) :])  # this turn's calls, in order
        for future, name in zip(p.futures, p.names):
            try:
                text, kind, seconds, reward = future.result()
            except CallFailed as exc:
                if exc.kind == "timeout":
                    t.error("timeout")
                    text = f"error: tool {name!r} timed out after {self.tool_timeout_s:g} s"
                    results.append(text)
                    if name:
                        next(made)["result"] = text
                    continue
                text, kind, seconds, reward = f"error: {exc.message}", "tool_error", 0.0, 0.0
            if name:
                t.tool_latency_s.append(seconds)
                t.env_reward += reward
            if kind:
                t.error(kind)
            results.append(self._cut(t, text))
            if name:
                next(made)["result"] = results[-1]
        self._observe(t, self.format.as_messages(results, "tool"), budget, ready)

    def _env_answer(self, t: Trajectory, future: Future, budget: int, ready: deque) -> None:
        try:
            step: EnvStep = future.result()
        except CallFailed as exc:
            self._env_failed(t, "step", exc)
            return
        t.env_reward += step.reward
        if step.done or not step.observation:
            return self._finish(t, "done")
        self._observe(t, self.format.as_messages([self._cut(t, step.observation)], "user"), budget, ready)

    def _observe(self, t: Trajectory, messages: list[dict], budget: int, ready: deque) -> None:
        ids = self.format.observation_ids(messages, after_end_of_turn=not t.open_turn)
        if len(t.token_ids) + len(ids) >= budget:  # no room left for the observation and a reply
            return self._finish(t, "max_total_tokens")
        t.add(ids, "env", "\n".join(m["content"] for m in messages))
        ready.append(t)

    def _max_chars(self) -> int:
        return self.max_observation_tokens * CHARS_PER_TOKEN

    def _cut(self, t: Trajectory, text: str) -> str:
        """An observation of at most `max_observation_tokens` tokens (longer ones cut, counted as errors).

        Characters are cut first (a token is rarely over CHARS_PER_TOKEN of them), so what is tokenized
        is bounded whatever the tool or environment returned."""
        head = text[: self._max_chars()]
        ids = self.tokenizer(head, add_special_tokens=False)["input_ids"]
        if len(head) == len(text) and len(ids) <= self.max_observation_tokens:
            return text
        t.error("too_long")
        kept = self.tokenizer.decode(ids[: self.max_observation_tokens])
        more = max(0, len(text) - len(kept))
        return f"{kept}\n[cut: {more} more characters over env.max_observation_tokens]"

    def _env_failed(self, t: Trajectory, where: str, exc: CallFailed) -> Trajectory:
        """End `t` with reward 0: its environment's `where` call failed (the first failure is the one told)."""
        if t.failed is None:
            t.failed, t.failed_kind, t.env_reward = f"{where}: {exc.message}"[:300], exc.kind, 0.0
            self.say(
                f"warning: environment failed on sample {t.index} ({exc.kind}), trajectory ended with "
                f"reward 0 ({t.failed})"
            )
        return self._finish(t, "env_error")

    def _finish(self, t: Trajectory, why: str) -> Trajectory:
        t.stop = why
        return t

    def _close_envs(self, trajs: list[Trajectory]) -> None:
        """Every environment's `close`, all at once on the pool, each bounded like any other call."""
        closing = [(t, self.pool.submit(_close_env, t.env)) for t in trajs if t.env is not None]
        self.pool.settle([f for _, f in closing])
        for t, future in closing:
            failure = future.exception()
            if isinstance(failure, CallFailed):
                self._env_failed(t, "close", failure)

    def _warn_hung(self) -> None:
        hung = self.pool.abandoned
        if hung >= max(self.pool.workers, 2 * self._hung_said):
            self._hung_said = hung
            self.say(
                f"warning: {hung} tool or environment calls still running past env.tool_timeout_s="
                f"{self.tool_timeout_s:g} (each holds an abandoned thread until it returns; fresh threads "
                "serve the next calls)"
            )

    def close(self) -> None:
        self.pool.close()


def _step_env(env: Any, text: str) -> EnvStep:
    return checked_step(env.step(text))


def _close_env(env: Any) -> None:
    close = getattr(env, "close", None)
    if close is not None:
        close()


def _done(value: Any) -> Future:
    f: Future = Future()
    f.set_result((value, None, 0.0, 0.0))
    return f


def retokenization_drift(tokenizer, t: Trajectory) -> int:
    """How many of `t`'s model turns would come back as other ids if their text were decoded and encoded
    again: what a loop that re-renders the conversation from text (instead of keeping the sampled ids, as
    this one does) would train on that the model never sampled (`env/retokenization_drift_rate`)."""
    drifted = 0
    for segment in t.segments:
        if segment["role"] != "model":
            continue
        ids = t.token_ids[segment["start"] : segment["end"]]
        again = tokenizer(tokenizer.decode(ids), add_special_tokens=False)["input_ids"]
        drifted += again != ids
    return drifted


def env_metrics(episodes: list[dict], stats: dict[str, float] | None = None) -> dict[str, float]:
    """The `env/*` figures of a batch of trajectories (Trajectory.summary dicts)."""
    if not episodes:
        return {}
    n = len(episodes)
    calls = sum(e["tool_calls"] for e in episodes)
    errors = {k: sum(e["errors"].get(k, 0) for e in episodes) for k in ERROR_KINDS}
    attempts = calls + errors["malformed"] + errors["too_many_calls"]
    tokens = sum(s["end"] - s["start"] for e in episodes for s in e["segments"])
    latencies = [x for e in episodes for x in e["tool_latency_s"]]
    model_turns = sum(s["role"] == "model" for e in episodes for s in e["segments"])
    out = {
        "env/turns_mean": sum(e["turns"] for e in episodes) / n,
        "env/tool_calls_mean": calls / n,
        "env/tool_error_rate": sum(errors.values()) / attempts if attempts else 0.0,
        "env/truncated_rate": sum(e["truncated"] for e in episodes) / n,
        "env/failed_rate": sum(e["failed"] is not None for e in episodes) / n,
        "env/observation_token_share": sum(e["env_tokens"] for e in episodes) / tokens if tokens else 0.0,
        "env/reward_mean": sum(e["env_reward"] for e in episodes) / n,
        "env/tool_latency_mean_s": sum(latencies) / len(latencies) if latencies else 0.0,
        "env/tool_latency_max_s": max(latencies, default=0.0),
        "env/used_tools_rate": sum(e["tool_calls"] > 0 for e in episodes) / n,
        "env/retokenization_drift_rate": sum(e.get("drifted_turns", 0) for e in episodes) / model_turns
        if model_turns
        else 0.0,
    }
    out.update({f"env/errors_{k}": float(v) for k, v in errors.items()})
    for kind in ENV_ERROR_KINDS:  # trajectories whose environment failed, by why
        out[f"env/env_errors_{kind}"] = float(sum(e.get("failed_kind") == kind for e in episodes))
    for k, v in (stats or {}).items():
        out[f"env/{k}"] = v
    return out
