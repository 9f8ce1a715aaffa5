"""The tool_math task and its SFT warm-up: exact golds, a fixed split, traces that train the model's turns only
and lay out tokens exactly as a multi-turn rollout of the same conversation does."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from data_prep.schema import extra_info_of, validate_row
from data_prep.tool_math import FAMILIES, price_of, prompt_rows, sft_rows, trace
from tests.scripted_model import ScriptedModel
from train.env.registry import build_tools
from train.env.tool_format import ChatFormat, trace_ids
from train.rollout.agent_loop import AgentRollout
from train.rollout.base import SamplingConfig


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


def test_golds_are_exact_and_splits_disjoint():
    train = prompt_rows(60, seed=3, split="train", families=FAMILIES)
    test = prompt_rows(60, seed=3, split="test", families=FAMILIES)
    for row in train + test:
        validate_row(row, "row")
        info = extra_info_of(row)
        if info["family"] == "chain":
            assert int(row["ground_truth"]) == price_of(info["item"]) * info["numbers"][0]
        elif info["family"] == "product":
            a, b = info["numbers"]
            assert 100 <= a <= 999 and 1000 <= b <= 9999 and int(row["ground_truth"]) == a * b
        elif info["family"] == "small":
            a, b = info["numbers"]
            want = a + b if "+" in info["expression"] else a * b
            assert max(a, b) <= 20 and int(row["ground_truth"]) == want
        else:
            assert len(info["numbers"]) in (4, 5) and int(row["ground_truth"]) == sum(info["numbers"])

    def key(r):
        info = extra_info_of(r)
        return json.dumps([info["family"], info["numbers"], info.get("item")])

    assert not {key(r) for r in train} & {key(r) for r in test}
    assert {extra_info_of(r)["family"] for r in train} == set(FAMILIES)


def test_sft_rows_mix_traces_and_direct_answers():
    rows = sft_rows(10, seed=0)
    tools = [extra_info_of(r)["tools"] for r in rows]
    assert tools[1::2] == [[]] * 5 and all(t for t in tools[::2])
    assert all(len(r["prompt"]) > 2 for r in rows[::2])  # with the tools described, every one a trace


def test_the_mixed_warm_up_calls_in_a_share_of_the_problems_asked_with_tools():
    rows = sft_rows(800, seed=0, call_share=0.25)
    with_tools = [r for r in rows if extra_info_of(r)["tools"]]
    calls = [r for r in with_tools if any("<tool_call>" in m["content"] for m in r["prompt"])]
    assert len(with_tools) == 400 and 0.18 < len(calls) / len(with_tools) < 0.32
    direct = [r for r in with_tools if r not in calls]  # asked with tools, answered without: RL's other path
    assert all(r["prompt"][-1]["content"] == f"The answer is {r['ground_truth']}." for r in direct)
    families = {extra_info_of(r)["family"] for r in calls}
    assert families == set(FAMILIES)  # whichever the problem: the warm-up does not say when calling pays
    chain = next(r for r in prompt_rows(3, 0, families=("chain",)))
    roles = [m["role"] for m in trace(chain)]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]  # two calls in sequence


def test_trace_results_are_what_the_tools_answer():
    import re

    tools = build_tools(["catalog", "calculator"])
    for row in prompt_rows(30, seed=5, families=FAMILIES):
        messages = trace(row)
        for call_msg, result in zip(messages[1::2], messages[2::2]):
            if result["role"] != "tool":
                continue
            body = json.loads(re.search(r"<tool_call>(.*)</tool_call>", call_msg["content"]).group(1))
            assert tools[body["name"]](**body["arguments"]) == result["content"]


def test_a_trace_trains_the_model_turns_and_matches_a_rollout_token_for_token(tokenizer):
    row = prompt_rows(3, 0, families=("chain",))[0]
    messages = trace(row)
    tools = build_tools(["catalog", "calculator"])
    fmt = ChatFormat(tokenizer, [t.schema() for t in tools.values()])
    prompt, response, mask = trace_ids(fmt, messages)
    turns = [m["content"] for m in messages if m["role"] == "assistant"]
    trained = [t for t, m in zip(response, mask) if m]
    want = [
        i
        for turn in turns
        for i in tokenizer(turn, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    ]
    assert trained == want
    assert "catalog" in tokenizer.decode(prompt) and tokenizer.decode(prompt).endswith(
        "<|im_start|>assistant\n"
    )
    # a stand-in model replaying the same turns through the agent loop, with the real tools
    model = ScriptedModel(tokenizer, lambda text, k: turns[k])
    agent = AgentRollout(model, tokenizer, tools)
    batch = agent.generate(agent.encode([row]), [row], SamplingConfig(n=1, max_new_tokens=64))
    assert batch.prompt_ids[0] == prompt
    assert batch.response_ids[0] == response and batch.token_mask[0] == mask
    assert batch.episodes[0]["turns"] == 3 and batch.episodes[0]["tool_calls"] == 2


def test_sft_examples_carry_their_masks(tokenizer):
    from train.stages.sft import encode_examples, token_masks_of

    rows = sft_rows(4, seed=0)
    prompts, responses, golds, dropped, masks = encode_examples(tokenizer, rows, max_tokens=1024)
    assert dropped == 0 and len(masks) == 4
    assert 0 in masks[0] and all(m == 1 for m in masks[1])  # a trace; a direct answer (no tools described)
    assert "tool_call" not in tokenizer.decode(prompts[1])
    mask = token_masks_of(responses, masks)
    assert mask.shape == (4, max(map(len, responses))) and mask[0].sum() == sum(masks[0])
