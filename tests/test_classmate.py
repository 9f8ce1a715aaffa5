"""Classmate CoT: reward combination, CoT-token mask and estimators on hand-computed tensors; the reward's
CoT split, truncation and remove_wo_cot; a real vLLM classmate engine beside the policy's."""

from __future__ import annotations

import math

import pytest
import torch

from tests.judge_servers import free_port, vllm_server
from train.algorithms.classmate import (
    char_span_to_token_span,
    combine_classmate_reward,
    compute_classmate_advantage,
    cot_token_mask,
    group_advantage_population_std,
    whiten_batch,
)
from train.rewards.classmate_reward import ClassmateReward, split_cot

# Two groups of two. base = main-answer scores, cl = mean classmate scores.
BASE = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64)
CL = torch.tensor([1.0, 0.5, 0.0, 1.0], dtype=torch.float64)
GROUPS = torch.tensor([0, 0, 1, 1])
RESPONSE_MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float64)
TOKEN_SPANS = [(0, 2), (1, 3), (0, 0), (0, 4)]


def test_combine_classmate_reward_modes():
    got = {
        cond: combine_classmate_reward(BASE, CL, 2.0, cond).tolist()
        for cond in (
            "always",
            "no_classmate",
            "no_classmate_when_main_incorrect",
            "neg_classmate_when_main_incorrect",
        )
    }
    assert got["always"] == [2.0, 1.0, 0.0, 2.0]
    assert got["no_classmate"] == [0.0, 0.0, 0.0, 0.0]
    assert got["no_classmate_when_main_incorrect"] == [2.0, 0.0, 0.0, 2.0]  # response 1: base 0
    assert got["neg_classmate_when_main_incorrect"] == [2.0, -1.0, 0.0, 2.0]
    with pytest.raises(ValueError, match="use_classmate_main_cond"):
        combine_classmate_reward(BASE, CL, 1.0, "sometimes")


def test_cot_token_mask_from_spans():
    assert cot_token_mask(TOKEN_SPANS, RESPONSE_MASK).tolist() == [
        [1, 1, 0, 0],
        [0, 1, 1, 0],
        [0, 0, 0, 0],
        [1, 1, 1, 1],
    ]
    # a span running past the response's last valid token stops at the mask
    assert cot_token_mask([(1, 4)], torch.tensor([[1.0, 1.0, 1.0, 0.0]])).tolist() == [[0, 1, 1, 0]]


def test_char_span_to_token_span():
    pieces = ["ab", "<t", "hink>", "x", "y", "</think>", "42"]  # "ab<think>xy</think>42"
    ends = [0]
    for p in pieces:
        ends.append(ends[-1] + len(p))

    def prefix(k):
        return ends[k]

    assert char_span_to_token_span(prefix, 7, (9, 11)) == (3, 5)  # "xy"
    assert char_span_to_token_span(prefix, 7, (3, 10)) == (1, 4)  # partial tokens at both ends count
    assert char_span_to_token_span(prefix, 7, (19, 21)) == (6, 7)
    assert char_span_to_token_span(prefix, 7, (5, 5)) == (0, 0)
    assert char_span_to_token_span(prefix, 0, (0, 3)) == (0, 0)


# w with no_classmate_when_main_incorrect, weight 1: [1, 0, 0, 1]
W = combine_classmate_reward(BASE, CL, 1.0, "no_classmate_when_main_incorrect")
COT = cot_token_mask(TOKEN_SPANS, RESPONSE_MASK)


def _adv(estimator, mode="classmate_partial", norm=False):
    return compute_classmate_advantage(
        BASE, W, GROUPS, RESPONSE_MASK, COT, estimator, mode, norm_adv_by_std_in_grpo=norm
    )


def test_estimators_mean_centred_by_hand():
    # m = base - group mean = [.5, -.5, 0, 0]; c = w - group mean = [.5, -.5, -.5, .5]; m + c = [1, -1, -.5, .5]
    sep = [[1, 1, 0.5, 0], [-0.5, -1, -1, -0.5], [0, 0, 0, 0], [0.5, 0.5, 0.5, 0.5]]
    for name in (
        "gdpo_wo_bn",
        "grpo_main_classmate_separated",
        "grpo_w_classmate",
    ):  # linear when not std-normed
        assert torch.allclose(_adv(name), torch.tensor(sep, dtype=torch.float64)), name
    # gdpo: z = whiten(m + c); std (Bessel) of [1, -1, -.5, .5] = sqrt(2.5 / 3)
    s = math.sqrt(2.5 / 3) + 1e-6
    z = [1 / s, -1 / s, -0.5 / s, 0.5 / s]
    gdpo = [[z[0], z[0], 0.5, 0], [-0.5, z[1], z[1], -0.5], [0, 0, 0, 0], [z[3]] * 4]
    assert torch.allclose(_adv("gdpo"), torch.tensor(gdpo, dtype=torch.float64))
    # "all": the CoT value on every valid token
    every = [[z[0]] * 3 + [0], [z[1]] * 4, [z[2]] * 2 + [0, 0], [z[3]] * 4]
    assert torch.allclose(_adv("gdpo", "all"), torch.tensor(every, dtype=torch.float64))
    sep_all = [[1, 1, 1, 0], [-1] * 4, [-0.5, -0.5, 0, 0], [0.5] * 4]
    assert torch.allclose(_adv("gdpo_wo_bn", "all"), torch.tensor(sep_all, dtype=torch.float64))


def test_estimators_std_normalised_by_hand():
    r = 1 / math.sqrt(2)  # a two-sample group with scores {a, b}: (a - mean) / std = +-1/sqrt(2)
    e = 1e-6
    m = [0.5 / (math.sqrt(0.5) + e), -0.5 / (math.sqrt(0.5) + e), 0.0, 0.0]  # group 1's base is constant
    c = [0.5 / (math.sqrt(0.5) + e), -0.5 / (math.sqrt(0.5) + e), -0.5 / (math.sqrt(0.5) + e)]
    c.append(-c[2])
    # grpo_w_classmate: GRPO of base + w = [2, 0, 1, 2] -> [r, -r, -r, r] (up to eps)
    g = [1 / (math.sqrt(2) + e), -1 / (math.sqrt(2) + e), -0.5 / (math.sqrt(0.5) + e)]
    g.append(-g[2])
    assert abs(g[0] - r) < 1e-5
    want = [[g[0], g[0], m[0], 0], [m[1], g[1], g[1], m[1]], [m[2], m[2], 0, 0], [g[3]] * 4]
    assert torch.allclose(_adv("grpo_w_classmate", norm=True), torch.tensor(want, dtype=torch.float64))
    mc = [a + b for a, b in zip(m, c)]
    want = [[mc[0], mc[0], m[0], 0], [m[1], mc[1], mc[1], m[1]], [m[2], m[2], 0, 0], [mc[3]] * 4]
    assert torch.allclose(_adv("gdpo_wo_bn", norm=True), torch.tensor(want, dtype=torch.float64))
    z = whiten_batch(torch.tensor(mc, dtype=torch.float64))
    assert abs(float(z.mean())) < 1e-9 and abs(float(z.std()) - 1) < 1e-5
    # grpo_main_classmate_separated: the fork's population std. A two-sample group {a, b} has population
    # std |a - b| / 2, so (a - mean) / std = +-1: m = [1, -1, 0, 0] (group 1's base is constant: 0/eps),
    # c = [1, -1, -1, 1] (up to eps): the sample-std values times sqrt(2) = sqrt(n / (n - 1)).
    p = 0.5 / (0.5 + e)
    m_pop, c_pop = [p, -p, 0.0, 0.0], [p, -p, -p, p]
    mc = [a + b for a, b in zip(m_pop, c_pop)]
    want = [[mc[0], mc[0], m_pop[0], 0], [m_pop[1], mc[1], mc[1], m_pop[1]], [0, 0, 0, 0], [mc[3]] * 4]
    got = _adv("grpo_main_classmate_separated", norm=True)
    assert torch.allclose(got, torch.tensor(want, dtype=torch.float64))
    assert got[0, 0].item() == pytest.approx(math.sqrt(2) * _adv("gdpo_wo_bn", norm=True)[0, 0].item())
    assert torch.allclose(_adv("gdpo", norm=True)[3], z[3].expand(4))


def test_population_std_group_advantage_by_hand():
    # group 0 = [0, 1, 2]: mean 1, population var (1 + 0 + 1) / 3 = 2/3, std 0.8164966 -> [-1.2247431, 0,
    # 1.2247431] (1 / 0.8164976); group 1 = [5] alone: 0 (it is its own mean)
    s, g = torch.tensor([0.0, 1.0, 2.0, 5.0], dtype=torch.float64), torch.tensor([0, 0, 0, 1])
    got = group_advantage_population_std(s, g)
    assert got.tolist() == pytest.approx([-1.2247431, 0.0, 1.2247431, 0.0], abs=1e-6)
    assert group_advantage_population_std(s, g, norm_adv_by_std_in_grpo=False).tolist() == [-1, 0, 1, 0]


def test_estimator_errors_name_the_value():
    with pytest.raises(ValueError, match="classmate estimator 'gdpoo'"):
        _adv("gdpoo")
    with pytest.raises(ValueError, match="token_level_classmate_reward_mode 'some'"):
        _adv("gdpo", "some")


@pytest.mark.parametrize(
    ("text", "start", "end", "cot", "answer", "has"),
    [
        ("<think>2+3=5</think> 5", "<think>", "</think>", "2+3=5", " 5", True),
        ("2+3=5</think>5", "<think>", "</think>", "2+3=5", "5", True),  # start marker in the prompt
        ("<think>2+3 is", "<think>", "</think>", "2+3 is", "", True),  # unfinished thought: no answer
        ("The answer is 5", "<think>", "</think>", "", "The answer is 5", False),
        ("2+3=5</think>5", None, "</think>", "2+3=5", "5", True),
        ("<think>5</think>\n", "<think>", "</think>", "5", "\n", True),
        # the CPU default: every line but the last is the CoT (trailing blank lines ignored)
        ("So 2 + 3 = 5.\nAnswer: 5\n\n", None, "\n", "So 2 + 3 = 5.", "Answer: 5\n\n", True),
        ("Answer: 5\n", None, "\n", "", "Answer: 5\n", False),
    ],
)
def test_split_cot(text, start, end, cot, answer, has):
    s = split_cot(text, start, end)
    assert (text[s.cot[0] : s.cot[1]], s.answer, s.has_cot) == (cot, answer, has)


class LastNumberClassmate:
    """A rule-based classmate: answers the last number of its input (the CoT's, else the question's).

    Real tokenizer for the chat template and CoT token counts; records the prompts it was given.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.prompts: list[str] = []

    def complete(self, prompts, max_new_tokens, seed):
        import re

        self.prompts += prompts
        out = []
        for p in prompts:
            nums = re.findall(r"\d+", p)
            out.append(nums[-1] if nums else "no idea")
        return out


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


ROWS = [{"prompt": [{"role": "user", "content": "What is 2 + 3? I think it is 6."}], "ground_truth": "5"}] * 2
ROWS += [{"prompt": [{"role": "user", "content": "What is 4 + 4? Surely 8."}], "ground_truth": "8"}] * 2
RESPONSES = [
    "<think>2 + 3 = 5</think> 5",  # right, legible CoT
    "<think>you said 6</think> 6",  # wrong (sycophantic)
    "<think>4 + 4 = 8 so 8</think> 8",
    "8",  # no CoT
]


def test_classmate_reward_vanilla(tokenizer):
    mate = LastNumberClassmate(tokenizer)
    reward = ClassmateReward([mate], use_classmate_main_cond="always")
    out = reward(ROWS, RESPONSES, [0, 0, 1, 1])
    assert out.scores == [1.0, 0.0, 1.0, 1.0]
    assert out.signals["classmate_scores"] == [1.0, 0.0, 1.0, 0.0]  # no CoT: no call, 0
    assert [RESPONSES[i][a:b] for i, (a, b) in enumerate(out.signals["cot_spans"])] == [
        "2 + 3 = 5",
        "you said 6",
        "4 + 4 = 8 so 8",
        "",
    ]
    assert len(mate.prompts) == 3
    assert mate.prompts[0].startswith(
        tokenizer.apply_chat_template(ROWS[0]["prompt"], tokenize=False, add_generation_prompt=True)
    )
    assert mate.prompts[0].endswith("<think>2 + 3 = 5</think>")
    assert out.metrics["cot_fraction"] == 0.75 and out.metrics["classmate_mean"] == 0.5
    # the default condition drops the classmate reward where the main answer is wrong; no_classmate skips calls
    assert ClassmateReward([mate], classmate_reward_weight=0.5)(ROWS, RESPONSES, [0, 0, 1, 1]).signals[
        "classmate_scores"
    ] == [0.5, 0.0, 0.5, 0.0]
    calls = len(mate.prompts)
    out = ClassmateReward([mate], use_classmate_main_cond="no_classmate")(ROWS, RESPONSES, [0, 0, 1, 1])
    assert out.signals["classmate_scores"] == [0.0] * 4 and len(mate.prompts) == calls


def test_classmate_reward_truncation_and_remove_wo_cot(tokenizer):
    mate = LastNumberClassmate(tokenizer)
    # keep rate 0: the classmate sees an empty CoT and answers the question's last number (6, then 8)
    out = ClassmateReward([mate], main_cot_keep_rate=0.0, use_classmate_main_cond="always")(
        ROWS, RESPONSES, [0, 0, 1, 1]
    )
    assert out.signals["classmate_scores"] == [0.0, 0.0, 1.0, 0.0] and all(
        a == b for a, b in out.signals["cot_spans"]
    )
    # random_truncate keeps a seeded prefix of 10..90% of the CoT's tokens: the same on every call
    long = ["<think>" + " ".join(str(i) for i in range(40)) + "</think> 5"]
    r = ClassmateReward([mate], classmate_reward_type="random_truncate", seed=3)
    spans = [r(ROWS[:1], long, [0]).signals["cot_spans"][0] for _ in range(2)]
    assert spans[0] == spans[1]
    n_tokens = len(tokenizer(long[0][7 : long[0].index("</think>")], add_special_tokens=False)["input_ids"])
    kept = len(tokenizer(long[0][spans[0][0] : spans[0][1]], add_special_tokens=False)["input_ids"])
    assert 0.1 * n_tokens - 1 <= kept <= 0.9 * n_tokens and spans[0][0] == 7
    other = ClassmateReward([mate], classmate_reward_type="random_truncate", seed=4)(ROWS[:1], long, [0])
    assert other.signals["cot_spans"][0] != spans[0]
    # remove_wo_cot: score with the CoT minus score without, the latter once per prompt (2 prompts here)
    mate.prompts.clear()
    out = ClassmateReward([mate], classmate_reward_type="remove_wo_cot", use_classmate_main_cond="always")(
        ROWS, RESPONSES, [0, 0, 1, 1]
    )
    assert len(mate.prompts) == 3 + 2
    assert sum(p.endswith("<think></think>") for p in mate.prompts) == 2
    # without a CoT the classmate answers 6 (wrong) for prompt 0 and 8 (right) for prompt 1
    assert out.signals["classmate_scores"] == [1.0 - 0.0, 0.0 - 0.0, 1.0 - 1.0, 0.0]


def test_classmate_reward_bad_config_is_one_line(tokenizer):
    mate = LastNumberClassmate(tokenizer)
    for kwargs, key in [
        ({"classmate_reward_type": "vanila"}, "classmate_reward_type"),
        ({"use_classmate_main_cond": "x"}, "use_classmate_main_cond"),
        ({"main_cot_keep_rate": 1.5}, "main_cot_keep_rate"),
        ({"think_end": ""}, "think_end"),
    ]:
        with pytest.raises(ValueError, match=key) as err:
            ClassmateReward([mate], **kwargs)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="classmates is empty"):
        ClassmateReward([])


def test_unreachable_served_classmate_is_one_line(tiny_model):
    from train.rewards.classmate_reward import ServedClassmate

    url = f"http://127.0.0.1:{free_port()}/v1"
    mate = ServedClassmate(url, "tiny", tokenizer=str(tiny_model), max_retries=0, timeout_s=5)
    with pytest.raises(RuntimeError, match="classmate endpoint .* failed") as err:
        mate.complete(["hello"], 4, seed=0)
    assert url in str(err.value) and "\n" not in str(err.value)


@pytest.fixture(scope="module")
def completions_server(tiny_model, tmp_path_factory):
    """`python -m vllm.entrypoints.openai.api_server` of the tiny model on loopback (what `vllm serve` runs)."""
    import sys

    port = free_port()
    log = tmp_path_factory.mktemp("vllm-classmate") / "server.log"
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model)]
    cmd += ["--served-model-name", "tiny", "--port", str(port), "--host", "127.0.0.1", "--dtype", "float32"]
    cmd += ["--max-model-len", "512", "--enforce-eager"]
    with vllm_server(cmd, f"http://127.0.0.1:{port}/health", log):
        yield f"http://127.0.0.1:{port}/v1"


@pytest.mark.slow
@pytest.mark.heavy  # make test-all: a long integration run (docs/commands.md, Tests)
def test_served_classmate_reward(completions_server, tiny_model):
    from hydra.utils import instantiate

    reward = instantiate(
        {
            "_target_": "train.rewards.classmate_reward.ClassmateReward",
            "use_classmate_main_cond": "always",
            "max_new_tokens": 8,
            "classmates": [
                {
                    "_target_": "train.rewards.classmate_reward.ServedClassmate",
                    "base_url": completions_server,
                    "model": "tiny",
                    "tokenizer": str(tiny_model),
                }
            ],
        }
    )
    mate = reward.classmates[0]
    prompts = ["<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n<think>2+3=5</think>"] * 2
    first = mate.complete(prompts, 8, seed=11)
    assert all(isinstance(t, str) and t for t in first)
    assert mate.complete(prompts, 8, seed=11) == first  # seeded: a resumed run gets the same samples
    out = reward(ROWS, RESPONSES, [0, 0, 1, 1])
    assert (
        len(out.signals["classmate_scores"]) == 4 and out.signals["classmate_scores"][3] == 0.0
    )  # the CoT-less response
    assert out.metrics["cot_fraction"] == 0.75
