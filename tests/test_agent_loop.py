"""Multi-turn rollouts (train/rollout/agent_loop.py) over a scripted stand-in model with the real tokenizer:
token in / token out, the model-token mask, error observations, stops, and asynchronous scheduling."""

from __future__ import annotations

import json
import re
import time

import pytest
import torch
from transformers import AutoTokenizer

from tests.scripted_model import ScriptedModel
from train.batch import Batch
from train.env.base import EnvStep
from train.env.tool_format import ChatFormat, parse_tool_calls
from train.rewards.base import RewardResult
from train.rewards.trajectory import score_rollout
from train.rollout.agent_loop import AgentRollout, env_metrics
from train.rollout.base import SamplingConfig

ROW = {"prompt": [{"role": "user", "content": "What is 123 * 4567?"}], "ground_truth": "561741"}


class Echo:
    name = "echo"

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s, self.calls = delay_s, []

    def schema(self):
        params = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
        return {
            "type": "function",
            "function": {"name": self.name, "description": "echo", "parameters": params},
        }

    def __call__(self, text: str) -> str:
        self.calls.append((text, time.perf_counter()))
        if self.delay_s:
            time.sleep(self.delay_s)
        return f"echo:{text}"


class Boom(Echo):
    name = "boom"

    def __call__(self, text: str) -> str:
        raise RuntimeError("disk on fire")


class Slow(Echo):
    name = "slow"

    def __call__(self, text: str) -> str:
        time.sleep(3.0)
        return "too late"


class Long(Echo):
    name = "long"

    def __call__(self, text: str) -> str:
        return "word " * 500


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


def rollout(
    tokenizer, script, tools=(), n=1, rows=(ROW,), max_new=64, **kw
) -> tuple[AgentRollout, Batch, ScriptedModel]:
    model = ScriptedModel(
        tokenizer, script, cut_at=kw.pop("cut_at", None), latency_s=kw.pop("latency_s", 0.0)
    )
    agent = AgentRollout(model, tokenizer, {t.name: t for t in tools}, **kw)
    rows = list(rows)
    batch = agent.generate(agent.encode(rows), rows, SamplingConfig(n=n, max_new_tokens=max_new, seed=1))
    return agent, batch, model


def test_trajectory_is_what_the_model_sampled_and_the_template_wrote(tokenizer):
    sampled: list[list[int]] = []

    def script(text, turn):
        return call("echo", text="hi") if turn == 0 else "The answer is \\boxed{561741}."

    agent, batch, model = rollout(tokenizer, script, [Echo()])
    ids, mask, lps = batch.response_ids[0], batch.token_mask[0], batch.response_logprobs[0]
    segments = batch.episodes[0]["segments"]
    assert [s["role"] for s in segments] == ["model", "env", "model"]
    # each model segment is exactly the tokens the engine returned (text + end-of-turn), never re-encoded
    for s, turn in zip([s for s in segments if s["role"] == "model"], (0, 1)):
        want = tokenizer(script("", turn), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        sampled.append(want)
        assert ids[s["start"] : s["end"]] == want
        assert lps[s["start"] : s["end"]] == pytest.approx([-0.1 * k for k in range(len(want))])
    env = segments[1]
    fmt = ChatFormat(tokenizer, [Echo().schema()])
    assert ids[env["start"] : env["end"]] == fmt.observation_ids(fmt.as_messages(["echo:hi"], "tool"))
    assert ids == sampled[0] + ids[env["start"] : env["end"]] + sampled[1]
    assert mask == [1] * len(sampled[0]) + [0] * (env["end"] - env["start"]) + [1] * len(sampled[1])
    assert all(lp == 0.0 for lp, m in zip(lps, mask) if m == 0)
    # token in: the second request is the prompt plus the first turn and the observation, as tokens
    assert model.submitted[1] == batch.prompt_ids[0] + ids[: env["end"]]
    decoded = tokenizer.decode(ids)
    assert (
        "<tool_response>\necho:hi\n</tool_response>" in decoded
        and decoded.count("<|im_start|>assistant") == 1
    )
    assert batch.texts[0] == "The answer is \\boxed{561741}."  # what the reward grades: the final turn
    assert batch.episodes[0]["stop"] == "answered" and batch.finish_reasons == ["stop"]
    m = env_metrics(batch.episodes)
    assert m["env/turns_mean"] == 2 and m["env/tool_calls_mean"] == 1 and m["env/tool_error_rate"] == 0
    assert m["env/observation_token_share"] == pytest.approx(mask.count(0) / len(mask))


def test_every_bad_call_is_an_error_observation_and_the_step_goes_on(tokenizer):
    bad = [
        "<tool_call>{not json}</tool_call>",
        call("nosuch", text="x"),
        call("boom", text="x"),
        call("slow", text="x"),
        call("long", text="x"),
        "<tool_call>" + json.dumps({"name": "echo", "arguments": [1]}) + "</tool_call>",
    ]

    def script(text, turn):
        return bad[turn] if turn < len(bad) else "done \\boxed{1}"

    tools = [Echo(), Boom(), Slow(), Long()]
    agent, batch, _ = rollout(
        tokenizer,
        script,
        tools,
        max_turns=10,
        max_total_tokens=4000,
        tool_timeout_s=1.0,
        max_observation_tokens=40,
    )
    ep = batch.episodes[0]
    observations = [s["text"] for s in ep["segments"] if s["role"] == "env"]
    assert len(observations) == len(bad) and ep["stop"] == "answered"
    assert "malformed tool call (not JSON" in observations[0]
    assert "unknown tool 'nosuch' (available: boom, echo, long, slow)" in observations[1]
    assert "error: disk on fire" in observations[2]
    assert "timed out after 1 s" in observations[3]
    assert "more characters over env.max_observation_tokens" in observations[4]
    assert "arguments must be a JSON object" in observations[5]
    assert ep["errors"] == {"malformed": 2, "unknown_tool": 1, "tool_error": 1, "timeout": 1, "too_long": 1}
    m = env_metrics(batch.episodes)
    assert m["env/tool_error_rate"] == 1.0 and m["env/errors_timeout"] == 1.0 and m["env/turns_mean"] == 7


class Flaky:
    """Fails on the rows whose ground truth says so; otherwise says "wrong" once, then done."""

    def reset(self, task):
        self.fail, self.seen = task["ground_truth"] == "fail", 0
        return None

    def step(self, turn):
        if self.fail:
            raise ValueError("simulated user crashed")
        self.seen += 1
        return EnvStep("that is wrong, try again", 0.0, False) if self.seen == 1 else EnvStep(None, 1.0, True)


def test_an_environment_that_raises_ends_its_trajectory_alone_with_reward_zero(tokenizer, capsys):
    rows = [ROW, {**ROW, "ground_truth": "fail"}]
    said = []
    agent, batch, _ = rollout(
        tokenizer, lambda t, k: f"guess {k}", rows=rows, n=2, interaction=Flaky, say=said.append
    )
    stops = [e["stop"] for e in batch.episodes]
    assert stops == ["done", "done", "env_error", "env_error"]
    assert [e["turns"] for e in batch.episodes] == [2, 2, 1, 1]
    assert [e["env_reward"] for e in batch.episodes] == [1.0, 1.0, 0.0, 0.0]
    assert len(said) == 2 and all("simulated user crashed" in s and s.startswith("warning:") for s in said)
    assert "that is wrong, try again" in tokenizer.decode(batch.response_ids[0])
    reward = score_rollout(lambda *a: RewardResult([1.0] * 4, [1.0] * 4), rows * 2, batch)
    assert reward.scores == [1.0, 1.0, 0.0, 0.0] and reward.correct == [1.0, 1.0, 0.0, 0.0]
    with_env = score_rollout(lambda *a: RewardResult([0.5] * 4, [1.0] * 4), rows * 2, batch, 1.0)
    assert with_env.scores == [1.5, 1.5, 0.0, 0.0]  # env.reward_weight=1: the environment's reward added


def test_stops_max_turns_total_budget_and_cut_turns(tokenizer):
    loop = lambda t, k: call("echo", text=str(k))  # noqa: E731 -- never answers
    _, batch, _ = rollout(tokenizer, loop, [Echo()], max_turns=3, max_total_tokens=5000)
    assert batch.episodes[0]["stop"] == "max_turns" and batch.episodes[0]["turns"] == 3
    assert batch.finish_reasons == ["length"]  # truncated trajectories count as clipped
    _, batch, _ = rollout(tokenizer, loop, [Echo()], max_turns=50, max_total_tokens=120)
    assert batch.episodes[0]["stop"] == "max_total_tokens" and len(batch.response_ids[0]) <= 120
    # a turn cut at max_new_tokens: the environment writes the end-of-turn token the model did not
    _, batch, _ = rollout(tokenizer, loop, [Echo()], max_turns=2, max_total_tokens=5000, cut_at=5)
    ids, mask = batch.response_ids[0], batch.token_mask[0]
    first_env = mask.index(0)
    assert first_env == 5 and ids[first_env] == tokenizer.eos_token_id


def test_async_generates_for_others_while_a_tool_runs_and_sync_waits(tokenizer):
    class Sleepy(Echo):
        name = "sleepy"

        def __call__(self, text):
            time.sleep(0.6 if text == "slow" else 0.0)
            self.calls.append((text, time.perf_counter()))
            return "ok"

    def script(text, turn):
        return call("sleepy", text="slow" if "123 * 4567" in text else "fast") if turn == 0 else "done"

    rows = [ROW, {"prompt": [{"role": "user", "content": "What is 1+1?"}], "ground_truth": "2"}]

    def run(schedule):
        tool, model = Sleepy(), ScriptedModel(tokenizer, script, latency_s=0.05)
        agent = AgentRollout(model, tokenizer, {"sleepy": tool}, schedule=schedule)
        batch = agent.generate(agent.encode(rows), rows, SamplingConfig(n=1, max_new_tokens=64))
        assert [e["turns"] for e in batch.episodes] == [2, 2]
        slow_done = next(t for x, t in tool.calls if x == "slow")
        fast_second_turn = model.submit_times[2]  # the first second-turn request: the fast trajectory's
        return fast_second_turn - slow_done, agent.last_stats["engine_busy_share"]

    gap_async, busy_async = run("async")
    gap_sync, busy_sync = run("sync")
    assert gap_async < -0.3  # generated for the fast one while the slow tool still ran
    assert gap_sync >= 0.0  # turn-synchronous: every tool answered before the next batch of turns
    assert busy_async > busy_sync


def test_batch_rows_keep_masks_and_episodes():
    b = Batch([[1], [2]], [[5, 6], [7]], [[0.0, 0.0], [0.0]], ["a", "b"], ["stop", "stop"], [0, 1])
    b.token_mask, b.episodes = [[1, 0], [1]], [{"k": 1}, {"k": 2}]
    s = b.select([1])
    assert s.token_mask == [[1]] and s.episodes == [{"k": 2}]
    plain = Batch([[3]], [[8, 9]], [[0.0, 0.0]], ["c"], ["stop"], [0])
    c = Batch.concat([b, plain])
    assert c.model_token_mask() == [[1.0, 0.0], [1.0], [1.0, 1.0]]
    assert plain.model_token_mask() == [[1.0, 1.0]]


def test_no_gradient_reaches_environment_tokens():
    from train.algorithms.actor_loss import actor_loss

    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 1.0, 1.0]])
    log_prob = torch.randn(2, 5, requires_grad=True)
    ref = torch.randn(2, 5)
    loss, _ = actor_loss(
        log_prob.detach() + 0.1, log_prob, torch.randn(2, 5), mask, entropy=torch.rand(2, 5, requires_grad=True),
        entropy_coeff=0.01, ref_log_prob=ref, use_kl_loss=True, kl_loss_coef=0.1,
    )  # fmt: skip
    loss.backward()
    assert torch.all(log_prob.grad[mask == 0] == 0) and torch.all(log_prob.grad[mask == 1] != 0)


def test_tool_call_parsing():
    parsed = parse_tool_calls(
        'x <tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"2*3\\"}"}</tool_call>'
    )
    assert [(c.name, c.arguments) for c in parsed.calls] == [("calculator", {"expression": "2*3"})]
    assert parse_tool_calls("no calls here").wants_tools is False
    assert parse_tool_calls("<tool_call>{}").errors == [
        "malformed tool call: <tool_call> without </tool_call>"
    ]


def test_threads_end_with_the_rollout(tokenizer):
    agent, _, _ = rollout(tokenizer, lambda t, k: call("echo", text="x") if k == 0 else "done", [Echo()])
    threads = list(agent.pool.threads)  # the pool's own workers (other tests' rollouts have theirs)
    assert threads
    agent.close()
    for t in threads:
        t.join(timeout=5)
    assert not [t for t in threads if t.is_alive()]


# A chat template of our own with tools in the Hermes / Qwen style: schemas in the system turn, results as
# <tool_response> blocks in a user turn, and (as Qwen3's) the last assistant turn rendered differently.
NATIVE_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTOOLS:{% for t in tools %}{{ '\\n' + (t | tojson) }}{% endfor %}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{%- elif m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' }}{% if loop.last %}<think></think>{% endif %}"
    "{{ m.content + '<|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endif %}"
    "{%- endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    "{# the model answers with <tool_call> JSON #}"
)


def test_a_template_with_tools_renders_them_itself(tiny_model):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    tok.chat_template = NATIVE_TEMPLATE
    fmt = ChatFormat(tok, [Echo().schema()])
    assert fmt.native and fmt.name == "native"
    prompt = tok.decode(fmt.prompt_ids(ROW["prompt"]))
    assert (
        prompt.startswith('<|im_start|>system\nTOOLS:\n{"type": "function"')
        and "You can call tools" not in prompt
    )
    obs = tok.decode(fmt.observation_ids(fmt.as_messages(["a", "b"], "tool")))
    assert (
        obs
        == "\n<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    fallback = ChatFormat(AutoTokenizer.from_pretrained(tiny_model), [Echo().schema()])
    assert not fallback.native and "You can call tools" in tok.decode(fallback.prompt_ids(ROW["prompt"]))


def test_env_config_names_tools_plans_the_trajectory_and_refuses_bad_entries():
    from train.config import ConfigError, build_config, validate
    from train.env.registry import enabled, tool_entries
    from train.plan import response_budget

    assert tool_entries("calculator, python") == ["calculator", "python"] and tool_entries("none") == []
    cfg = build_config(overrides=["env.tools=[calculator]", "env.max_turns=3", "rollout.max_new_tokens=50"])
    validate(cfg)
    assert enabled(cfg.env) and response_budget(cfg) == 150  # the whole trajectory, not one turn
    assert response_budget(build_config(overrides=["rollout.max_new_tokens=50"])) == 50
    for bad, said in [
        ("env.tools=[abacus]", "env.tools[0]='abacus': unknown name"),
        (
            "env.interaction={_target_: train.env.interactions.answer_check.AnswerCheck, bogus: 1}",
            "takes no argument 'bogus'",
        ),
        ("data.prompt_template=r1_zero", "need the chat template"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(said)):
            validate(build_config(overrides=["env.tools=[calculator]", bad]))


def test_hostile_python_is_one_error_observation_and_spares_the_other_trajectories(tokenizer):
    from train.env.tools.python import PythonTool

    programs = {
        "fork": "import os\nwhile True:\n    os.fork()",
        "loop": "while True:\n    pass",
        "alloc": "x = bytearray(10 * 1024**3)",
        "flood": "print('x' * 100_000_000)",
        "fine": "print(6 * 7)",
    }
    rows = [{"prompt": [{"role": "user", "content": name}], "ground_truth": "42"} for name in programs]

    def script(text, turn):
        name = next(n for n in programs if f"user\n{n}<|im_end|>" in text)
        return call("python", code=programs[name]) if turn == 0 else "done"

    tool = PythonTool(timeout_s=2.0, memory_mb=256, max_output_bytes=4096)
    _, batch, _ = rollout(
        tokenizer, script, [tool], rows=rows, tool_timeout_s=60.0, max_observation_tokens=64
    )
    observations = [next(s["text"] for s in e["segments"] if s["role"] == "env") for e in batch.episodes]
    assert all("<tool_response>\nerror:" in o for o in observations[:4]), observations
    assert observations[4].split() == ["<tool_response>", "42", "</tool_response>"]  # print adds a newline
    assert [e["turns"] for e in batch.episodes] == [2] * 5 and [e["stop"] for e in batch.episodes] == [
        "answered"
    ] * 5
    assert env_metrics(batch.episodes)["env/errors_tool_error"] == 4.0


class Paying(Echo):
    """A tool that pays for being called well: 1.0 for "good", NaN (counted 0) for anything else."""

    name = "pay"

    def __call__(self, text: str):
        from train.env.base import ToolResult

        return ToolResult(f"paid:{text}", 1.0 if text == "good" else float("nan"))


def test_calls_their_results_and_tool_rewards_are_in_the_trajectory(tokenizer):
    def script(text, turn):
        if turn == 0:
            return call("pay", text="good") + call("pay", text="bad")
        return call("echo", text="x") if turn == 1 else "The answer is 561741."

    _, batch, _ = rollout(tokenizer, script, [Paying(), Echo()])
    episode = batch.episodes[0]
    assert episode["calls"] == [
        {"name": "pay", "arguments": {"text": "good"}, "result": "paid:good"},
        {"name": "pay", "arguments": {"text": "bad"}, "result": "paid:bad"},
        {"name": "echo", "arguments": {"text": "x"}, "result": "echo:x"},
    ]
    assert episode["env_reward"] == 1.0  # the NaN reward counts 0; a plain-text tool pays nothing
    reward = score_rollout(lambda *a: RewardResult([0.0]), [ROW], batch, 0.5)
    assert reward.scores == [0.5]  # through env.reward_weight


class Fragmenting(ScriptedModel):
    """Samples its first turn one character at a time: the ids a real sampler may produce, which decode to
    the same text as the tokenizer's own (shorter) encoding."""

    def step(self):
        outs = super().step()
        for out in outs:
            if not out.request_id.endswith("r0"):
                continue
            chars = [self.tokenizer(c, add_special_tokens=False)["input_ids"] for c in out.text]
            out.token_ids = [i for ids in chars for i in ids] + [self.tokenizer.eos_token_id]
            out.logprobs = [0.0] * len(out.token_ids)
        return outs


def test_retokenization_drift_counts_model_turns_that_would_not_re_encode(tokenizer):
    script = lambda text, turn: call("echo", text="hi") if turn == 0 else "The answer is 561741."  # noqa: E731
    model = Fragmenting(tokenizer, script)
    agent = AgentRollout(model, tokenizer, {"echo": Echo()})
    batch = agent.generate(agent.encode([ROW]), [ROW], SamplingConfig(n=1, max_new_tokens=64, seed=1))
    first = batch.episodes[0]["segments"][0]
    kept = batch.response_ids[0][first["start"] : first["end"]]
    assert len(kept) > len(tokenizer(first["text"], add_special_tokens=False)["input_ids"]) + 1  # as sampled
    assert batch.episodes[0]["drifted_turns"] == 1  # the first turn drifts, the canonical second does not
    assert env_metrics(batch.episodes)["env/retokenization_drift_rate"] == 0.5
    _, plain, _ = rollout(tokenizer, script, [Echo()])
    assert env_metrics(plain.episodes)["env/retokenization_drift_rate"] == 0.0


def test_where_a_call_counts_and_how_many_a_turn_makes(tokenizer):
    """Contracts: a call inside a code fence and a call after an answer are calls (vLLM's Hermes parser reads
    `<tool_call>` anywhere; the answer is not final while the model still calls); at most
    env.max_calls_per_turn calls are made a turn, the rest answered with an error each, after the others."""
    fenced = "```\n" + call("echo", text="in a fence") + "\n```"
    after = "The answer is 561741. " + call("echo", text="after")
    five = "".join(call("echo", text=str(k)) for k in range(5))
    turns = {0: fenced, 1: after, 2: five}
    echo = Echo()
    _, batch, _ = rollout(
        tokenizer,
        lambda text, k: turns.get(k, "Done: 561741."),
        [echo],
        max_new=256,
        max_turns=5,
        max_calls_per_turn=3,
    )
    episode = batch.episodes[0]
    assert [c[0] for c in echo.calls] == ["in a fence", "after", "0", "1", "2"]
    assert episode["turns"] == 4 and episode["tool_calls"] == 5 and episode["errors"] == {"too_many_calls": 2}
    third = [s for s in episode["segments"] if s["role"] == "env"][2]["text"]
    assert third.index("echo:2") < third.index("not called: at most 3 tool calls a turn")
    assert env_metrics(batch.episodes)["env/errors_too_many_calls"] == 2.0


def test_an_observation_keeps_its_head(tokenizer):
    """Contract: an over-long observation keeps its first max_observation_tokens tokens and says what was cut."""
    _, batch, _ = rollout(
        tokenizer,
        lambda t, k: call("long", text="x") if k == 0 else "ok",
        [Long()],
        max_observation_tokens=16,
    )
    seen = [s for s in batch.episodes[0]["segments"] if s["role"] == "env"][0]["text"]
    assert seen.count("word") == 16 and "[cut:" in seen
