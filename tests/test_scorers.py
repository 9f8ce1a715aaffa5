"""Quality scorers: a tiny random reward model (scores checked against an independent forward pass) and
the LLM judge (rating parser on hand-written replies; the fallback path against the real judge_server,
whose random model never writes a rating)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from train.rewards.scorers import LLMJudgeScorer, RewardModelScorer, parse_rating

PROMPTS = [
    [{"role": "user", "content": "Write a haiku about rain."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime number."}],
    "Tell me a joke.",  # a bare string is one user turn
    [{"role": "user", "content": "Explain photosynthesis in two sentences for a child, please."}],
    [{"role": "user", "content": "hi"}],
]
RESPONSES = [
    "Soft rain on the roof / the garden drinks in silence / puddles hold the sky",
    "7",
    "Why did the scarecrow win an award? Because he was outstanding in his field.",
    "Plants use sunlight to turn water and air into food. They breathe out the oxygen we need.",
    "Hello! How can I help you today?",
]


@pytest.fixture(scope="module")
def reward_model(tiny_model, tmp_path_factory) -> Path:
    """A random 2-layer LlamaForSequenceClassification with one output and the real tokenizer."""
    from transformers import AutoTokenizer, LlamaForSequenceClassification

    from infra.models import tiny_llama_config

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    config = tiny_llama_config(tokenizer, hidden_size=64, num_labels=1)
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(config)
    torch.nn.init.normal_(model.score.weight, std=1.0)  # spread the scores
    out = tmp_path_factory.mktemp("rm") / "reward_model"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def reference_score(reward_model):
    """Independent of the scorer: the score head on the last hidden state of the unpadded sequence."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(reward_model)
    model = AutoModelForSequenceClassification.from_pretrained(reward_model).eval()

    def score(text: str, max_length: int | None = None) -> float:
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        if max_length is not None:
            ids = ids[:, -max_length:]
        with torch.no_grad():
            hidden = model.model(input_ids=ids).last_hidden_state  # (1, T, H)
            return float(model.score(hidden[0, -1]).item())

    return score


def test_reward_model_scores_equal_unpadded_forward(reward_model, reference_score) -> None:
    from transformers import AutoTokenizer

    scorer = RewardModelScorer(str(reward_model), batch_size=2)
    scores = scorer.score(PROMPTS, RESPONSES)
    tokenizer = AutoTokenizer.from_pretrained(reward_model)
    for prompt, response, got in zip(PROMPTS, RESPONSES, scores):
        messages = [prompt] if isinstance(prompt, list) else [[{"role": "user", "content": prompt}]]
        text = tokenizer.apply_chat_template(
            [*messages[0], {"role": "assistant", "content": response}], tokenize=False
        )
        assert (
            f"<|im_start|>assistant\n{response}<|im_end|>" in text and scorer.render(prompt, response) == text
        )
        assert got == pytest.approx(reference_score(text), abs=1e-4)
    assert max(scores) - min(scores) > 1e-3  # the scores depend on the text
    assert RewardModelScorer(str(reward_model), batch_size=5).score(PROMPTS, RESPONSES) == pytest.approx(
        scores, abs=1e-4
    )


def test_reward_model_truncates_from_the_left(reward_model, reference_score) -> None:
    scorer = RewardModelScorer(str(reward_model), max_length=12)
    [got] = scorer.score(PROMPTS[3:4], RESPONSES[3:4])
    text = scorer.render(PROMPTS[3], RESPONSES[3])
    assert got == pytest.approx(reference_score(text, max_length=12), abs=1e-4)


def test_reward_model_built_from_config(reward_model) -> None:
    from hydra.utils import instantiate

    scorer = instantiate(
        {"_target_": "train.rewards.scorers.RewardModelScorer", "model_path": str(reward_model)}
    )
    assert isinstance(scorer, RewardModelScorer) and len(scorer.score(PROMPTS[:2], RESPONSES[:2])) == 2


def test_reward_model_bad_inputs(reward_model, tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="no config.json"):
        RewardModelScorer(str(tmp_path))
    from transformers import AutoConfig, AutoTokenizer, LlamaForSequenceClassification

    config = AutoConfig.from_pretrained(reward_model)
    config.num_labels = 2
    LlamaForSequenceClassification(config).save_pretrained(tmp_path / "two")
    AutoTokenizer.from_pretrained(reward_model).save_pretrained(tmp_path / "two")
    with pytest.raises(ValueError, match="num_labels=2"):
        RewardModelScorer(str(tmp_path / "two"))
    with pytest.raises(ValueError, match="2 prompts and 1 responses"):
        RewardModelScorer(str(reward_model)).score(PROMPTS[:2], RESPONSES[:1])


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("The answer is helpful and clear.\nRating: [[8]]", 8.0),
        ("Rating: [[3]] ... on reflection, Rating: [[6]]", 6.0),
        ("Rating: 9", 9.0),
        ("My score is **7**.", 7.0),
        ("Overall I'd give it 8 out of 10.", 8.0),
        ("Add 1/2 cup of sugar. 6/10", 6.0),
        ("Score: 8.5/10", 8.5),
        ("7", 7.0),
        (" **4**. ", 4.0),
        ("Rating: 11", None),  # out of range is not a rating
        ("Rating: [[N]]", None),  # the template echoed back
        ("The response has 3 errors.", None),  # a stray number is not a rating
        ("Add 1/2 cup of sugar.", None),
        ("", None),
        (" locale embody tame Benefit locale braveryvig", None),
    ],
)
def test_parse_rating(reply, expected) -> None:
    assert parse_rating(reply, 1, 10) == expected


def test_parse_rating_other_range() -> None:
    assert parse_rating("Rating: 0", 0, 5) == 0.0
    assert parse_rating("4/5", 0, 5) == 4.0
    assert parse_rating("4/10", 0, 5) is None  # a fraction of another scale


def test_judge_prompt_carries_conversation_response_and_range() -> None:
    judge = LLMJudgeScorer(
        "openai/j", base_url="http://127.0.0.1:9", min_score=1, max_score=10, cache_dir=None
    )
    [message] = judge.judge_messages(PROMPTS[1], RESPONSES[1])
    text = message["content"]
    assert "System: Be brief." in text and "User: Name a prime number." in text
    assert "\n7\n" in text and "from 1 to 10" in text and "Rating: [[N]]" in text
    assert judge.fallback_score == 5.5
    with pytest.raises(ValueError, match="min_score"):
        LLMJudgeScorer("openai/j", base_url="http://127.0.0.1:9", min_score=5, max_score=5)


@pytest.mark.slow
def test_llm_judge_garbage_replies_fall_back_and_are_counted(
    judge_server, tmp_path, monkeypatch, caplog
) -> None:
    monkeypatch.setenv("RLPOST_TEST_JUDGE_KEY", judge_server.api_key)
    judge = LLMJudgeScorer(
        f"openai/{judge_server.model}",
        base_url=judge_server.base_url,
        api_key_env="RLPOST_TEST_JUDGE_KEY",
        max_tokens=16,
        fallback_score=1.0,
        cache_dir=str(tmp_path),
    )
    scores = judge.score(PROMPTS[:3], RESPONSES[:3])
    assert all(r.strip() for r in judge.last_replies)  # the random model answered, without a rating
    assert [parse_rating(r) for r in judge.last_replies] == [None] * 3
    assert scores == [1.0, 1.0, 1.0] and judge.last_parse_failures == 3 and judge.parse_failures == 3
    assert "3/3 replies had no rating in [1, 10]; scored 1" in caplog.text
    assert judge.score(PROMPTS[:3], RESPONSES[:3]) == scores and judge.client.stats["cache_hits"] == 3
    assert judge.parse_failures == 6
