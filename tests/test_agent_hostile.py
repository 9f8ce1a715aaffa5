"""Hostile tools and environments (issue 52): whatever user code raises, returns or hangs on is that
trajectory's failure alone; the step, the other trajectories, later rollouts and the process's exit are not
touched (train/rollout/agent_loop.py over train/env/calls.py)."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from tests.scripted_model import ScriptedModel
from tests.test_agent_loop import ROW, Echo, call, rollout
from train.env.base import EnvStep
from train.rollout.agent_loop import env_metrics
from train.rollout.base import SamplingConfig

PROJECT_ROOT = Path(__file__).resolve().parents[1]
TEN_MB = 10_000_000
RELEASE = threading.Event()  # what every hung call below waits for; set when its test ends


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(autouse=True)
def release_hung_calls():
    """Hung calls end with their test (the old loop would otherwise block for good: a timer unblocks it
    after a minute so it fails on its assertions instead)."""
    RELEASE.clear()
    valve = threading.Timer(60.0, RELEASE.set)
    valve.daemon = True
    valve.start()
    yield
    valve.cancel()
    RELEASE.set()


class Raises(Echo):
    def __init__(self, name: str, exc: BaseException) -> None:
        super().__init__()
        self.name, self.exc = name, exc

    def __call__(self, text: str) -> str:
        raise self.exc


class Huge(Echo):
    name = "huge"

    def __call__(self, text: str) -> str:
        return "word " * (TEN_MB // 5)


class Hangs(Echo):
    name = "hang"

    def __call__(self, text: str) -> str:
        RELEASE.wait()
        return "released"


class Hostile:
    """An environment that misbehaves as its row's `kind` says (good rows: reward 1 at the first answer)."""

    STEPS = {
        "step_exit": lambda: sys.exit(3),
        "step_none": lambda: None,
        "step_dict": lambda: {"observation": None, "reward": 1.0, "done": True},
        "reward_high": lambda: EnvStep(None, "high", True),
        "reward_nan": lambda: EnvStep(None, float("nan"), True),
    }

    def reset(self, task):
        self.kind = task["kind"]
        if self.kind == "reset_hang":
            RELEASE.wait()
        return "x " * (TEN_MB // 2) if self.kind == "reset_huge" else None

    def step(self, turn):
        return self.STEPS.get(self.kind, lambda: EnvStep(None, 1.0, True))()

    def close(self):
        if self.kind == "close_hang":
            RELEASE.wait()


class CountingTokenizer:
    """The real tokenizer, noting the longest text it was asked to tokenize."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.longest = tokenizer, 0

    def __call__(self, text, **kwargs):
        self.longest = max(self.longest, len(text))
        return self.tokenizer(text, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


# kind -> (the first model turn, failed_kind)
CASES = {
    "step_exit": ("", "raised"),
    "step_none": ("", "bad_type"),
    "step_dict": ("", "bad_type"),
    "reward_high": ("", "bad_type"),
    "reward_nan": ("", "non_finite_reward"),
    "reset_hang": ("", "timeout"),
    "close_hang": ("", "timeout"),
    "reset_huge": ("", None),
    "tool_exit": (call("exit", text="x") + call("interrupt", text="x"), None),
    "tool_huge": (call("huge", text="x"), None),
    "good_a": (call("echo", text="a"), None),
    "good_b": (call("echo", text="b"), None),
}


def row(kind: str) -> dict:
    return {"prompt": [{"role": "user", "content": f"task={kind};"}], "ground_truth": "1", "kind": kind}


def script(text: str, turn: int) -> str:
    kind = re.search(r"task=(\w+);", text).group(1)
    return (CASES[kind][0] if turn == 0 else "") or "The answer is \\boxed{1}."


def _timeless(episode: dict) -> dict:
    return {**episode, "tool_latency_s": None}


def test_twelve_trajectories_four_kinds_of_hostile_each_fail_alone(tokenizer):
    tools = [Echo(), Raises("exit", SystemExit(3)), Raises("interrupt", KeyboardInterrupt()), Huge()]
    said: list[str] = []
    counting = CountingTokenizer(tokenizer)
    kw = dict(
        interaction=Hostile, max_turns=4, tool_timeout_s=1.0, max_observation_tokens=64, say=said.append
    )
    agent, batch, _ = rollout(counting, script, tools, rows=[row(k) for k in CASES], **kw)
    episodes = dict(zip(CASES, batch.episodes))
    prompts = dict(zip(CASES, batch.prompt_ids))
    assert {k: e["failed_kind"] for k, e in episodes.items()} == {k: v[1] for k, v in CASES.items()}
    for kind, (_, failed) in CASES.items():
        assert episodes[kind]["stop"] == ("env_error" if failed else "done"), kind
        assert episodes[kind]["env_reward"] == (0.0 if failed else 1.0), kind
    assert len(said) == 7 and all(line.startswith("warning: environment failed") for line in said)
    assert "step: SystemExit" in episodes["step_exit"]["failed"]
    assert "expected EnvStep" in episodes["step_none"]["failed"]
    assert "reward is str" in episodes["reward_high"]["failed"]
    # the good trajectories are the same as in a rollout of them alone
    _, alone, _ = rollout(tokenizer, script, tools, rows=[row("good_a"), row("good_b")], **kw)
    for k, kind in enumerate(["good_a", "good_b"]):
        i = list(CASES).index(kind)
        assert batch.response_ids[i] == alone.response_ids[k] and batch.token_mask[i] == alone.token_mask[k]
        assert _timeless(batch.episodes[i]) == _timeless(alone.episodes[k])
    # a tool's SystemExit and KeyboardInterrupt are error observations; 10 MB answers are cut before
    # they are tokenized (the prompt of the 10 MB reset observation stays short)
    observation = next(s["text"] for s in episodes["tool_exit"]["segments"] if s["role"] == "env")
    assert "error: SystemExit: 3" in observation and "error: KeyboardInterrupt" in observation
    huge = next(s for s in episodes["tool_huge"]["segments"] if s["role"] == "env")
    assert (
        "more characters over env.max_observation_tokens" in huge["text"]
        and huge["end"] - huge["start"] < 64 + 60
    )
    assert len(prompts["reset_huge"]) < len(prompts["good_a"]) + 64 + 60
    assert counting.longest < TEN_MB // 100
    m = env_metrics(batch.episodes, agent.last_stats)
    assert m["env/env_errors_raised"] == 1 and m["env/env_errors_bad_type"] == 3
    assert m["env/env_errors_non_finite_reward"] == 1 and m["env/env_errors_timeout"] == 2
    assert (
        m["env/failed_rate"] == 7 / 12
        and m["env/reward_mean"] == 5 / 12
        and math.isfinite(m["env/reward_mean"])
    )
    assert m["env/errors_tool_error"] == 2 and m["env/errors_too_long"] == 2
    assert m["env/hung_calls"] == 2  # the hung reset and close, still waiting in their threads
    agent.close()


def test_an_environment_that_hangs_or_exits_while_being_made_fails_alone(tokenizer):
    def hangs():
        RELEASE.wait()

    def exits():
        raise SystemExit("constructor")

    for factory, kind, limit in [(exits, "raised", 60.0), (hangs, "timeout", 0.3)]:  # raising: never late
        _, batch, _ = rollout(
            tokenizer,
            lambda t, k: "x",
            [],
            n=2,
            interaction=factory,
            tool_timeout_s=limit,
            say=lambda _: None,
        )
        assert [e["failed_kind"] for e in batch.episodes] == [kind, kind]
        assert [e["turns"] for e in batch.episodes] == [0, 0]


def test_hung_calls_do_not_take_workers_from_the_next_rollout(tokenizer):
    hang = lambda t, k: call("hang", text="x") if k == 0 else "done"  # noqa: E731
    said: list[str] = []
    agent, first, _ = rollout(
        tokenizer, hang, [Hangs(), Echo()], n=10, tool_timeout_s=0.3, tool_workers=8, say=said.append
    )
    assert [e["errors"] for e in first.episodes] == [{"timeout": 1}] * 10
    # the next rollout on the same agent: every good call is answered (a limit no echo nears on a loaded machine)
    agent.pool.timeout_s = agent.tool_timeout_s = 60.0
    agent.attach(ScriptedModel(tokenizer, lambda t, k: call("echo", text="y") if k == 0 else "done"))
    second = agent.generate(agent.encode([ROW]), [ROW], SamplingConfig(n=8, max_new_tokens=64, seed=2))
    assert [e["errors"] for e in second.episodes] == [{}] * 8
    assert all("echo:y" in tokenizer.decode(ids) for ids in second.response_ids)
    assert agent.last_stats["hung_calls"] == 10 and "10 tool or environment calls still running" in said[-1]
    assert all(thread.daemon for thread in agent.pool.threads)  # none is joined at the process's exit
    # released, the abandoned threads end; closed, the pool's other threads do too
    RELEASE.set()
    agent.close()
    for thread in agent.pool.threads:
        thread.join(timeout=10)
    assert agent.pool.abandoned == 0 and not [t for t in agent.pool.threads if t.is_alive()]


def test_a_main_thread_interrupt_still_stops_the_rollout(tokenizer):
    """Ctrl-C of the trainer is not user code: it leaves `generate` as ever."""
    import _thread

    class Interrupts(Echo):
        name = "ctrl_c"

        def __call__(self, text: str) -> str:
            _thread.interrupt_main()  # as SIGINT to the main thread, while it waits for this call
            time.sleep(0.5)
            return "ok"

    import signal

    # Python's own SIGINT handler, whatever an earlier test in this process (a training run's preemption
    # handlers) left installed: what is tested is the agent loop letting the interrupt through
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            rollout(tokenizer, lambda t, k: call("ctrl_c", text="x") if k == 0 else "done", [Interrupts()])
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_process_whose_tool_hung_for_good_exits_at_its_end(tiny_model, tmp_path):
    program = textwrap.dedent(
        f"""
        import threading
        from transformers import AutoTokenizer
        from tests.scripted_model import ScriptedModel
        from tests.test_agent_loop import ROW, call
        from tests.test_agent_loop import Echo
        from train.rollout.agent_loop import AgentRollout
        from train.rollout.base import SamplingConfig

        class Hangs(Echo):
            name = "hang"

            def __call__(self, text):
                threading.Event().wait()  # never set: hung for good

        tok = AutoTokenizer.from_pretrained({str(tiny_model)!r})
        model = ScriptedModel(tok, lambda t, k: call("hang", text="x") if k == 0 else "done")
        agent = AgentRollout(
            model, tok, {{"hang": Hangs()}}, tool_timeout_s=0.3, tool_workers=2, say=lambda line: None
        )
        batch = agent.generate(agent.encode([ROW]), [ROW], SamplingConfig(n=4, max_new_tokens=32))
        assert [e["errors"] for e in batch.episodes] == [{{"timeout": 1}}] * 4
        print("end", flush=True)
        """
    )
    with open(tmp_path / "stderr", "w+") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", program],
            cwd=PROJECT_ROOT,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        try:
            line = proc.stdout.readline()  # once the rollout is over (EOF if it failed)
            rc = proc.wait(
                timeout=300
            )  # teardown only (minutes on a loaded machine); a joined hung thread: never
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        stderr.seek(0)
        assert line.startswith("end") and rc == 0, stderr.read()[-2000:]
