"""Quality scorers: one number per (prompt, response) for prompts that have no ground truth.

DARLING's quality term on open-ended chat and evals.novelty's quality both call
`score(prompts, responses) -> list[float]`, where `prompts[i]` is the chat messages of response i's prompt.
Two implementations, chosen by config (`_target_: train.rewards.scorers.RewardModelScorer` / `LLMJudgeScorer`):

- `RewardModelScorer`: an HF sequence-classification reward model with one output, run in-process in
  batches on the chat-templated conversation; returns the raw scalar (no squashing: callers map it).
- `LLMJudgeScorer`: asks an LLM (any OpenAI-compatible server, or Anthropic) for a 1-10 rating through
  `infra.llm.LLMClient` (retries, reply cache); a reply with no readable rating gets `fallback_score`
  and is counted in `parse_failures` instead of crashing a training step.
- `EmbeddingRelevanceScorer`: the offline CPU proxy (prompt/response cosine under the packaged MiniLM):
  on-topic only, used by `darling_wildchat` because no reward model or capable judge runs offline here.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Protocol

logger = logging.getLogger(__name__)


class QualityScorer(Protocol):
    def score(self, prompts: list[list[dict]], responses: list[str]) -> list[float]: ...


def _as_messages(prompt: list[dict] | str) -> list[dict]:
    """A prompt as chat messages (a bare string is one user turn)."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]


def _check_lengths(scorer: str, prompts: list, responses: list) -> None:
    if len(prompts) != len(responses):
        raise ValueError(
            f"{scorer}.score got {len(prompts)} prompts and {len(responses)} responses: give one prompt per response"
        )


# ---------------------------------------------------------------------------------------------------
# reward model
# ---------------------------------------------------------------------------------------------------
class RewardModelScorer:
    """Raw scalar of an HF `AutoModelForSequenceClassification` reward model (num_labels=1).

    Each (prompt, response) is rendered with the model's chat template as the prompt's turns plus one
    assistant turn. Batches are right-padded (positions of real tokens unchanged, so a batched score equals
    the unbatched one); sequences longer than `max_length` lose tokens from the left (the response's end,
    where the score is read, is kept).
    """

    def __init__(
        self,
        model_path: str,
        batch_size: int = 8,
        max_length: int = 1024,
        device: str | None = None,
        dtype: str = "float32",
    ) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if batch_size < 1 or max_length < 8:
            raise ValueError(f"RewardModelScorer: batch_size={batch_size} must be >= 1, max_length >= 8")
        local = Path(model_path).expanduser()
        if local.exists() and not (local / "config.json").is_file():
            raise FileNotFoundError(
                f"reward model_path={model_path}: no config.json there; give an HF sequence-classification "
                "checkpoint folder (or a hub id)"
            )
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(model_path))
            self.model = AutoModelForSequenceClassification.from_pretrained(
                str(model_path), dtype=getattr(torch, dtype)
            )
        except OSError as e:
            raise FileNotFoundError(
                f"reward model_path={model_path} cannot be loaded ({' '.join(str(e).split())[:200]}); "
                "give an HF sequence-classification checkpoint folder"
            ) from None
        if self.model.config.num_labels != 1:
            raise ValueError(
                f"reward model {model_path} has num_labels={self.model.config.num_labels}; a scalar reward "
                "model needs exactly 1 output"
            )
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if self.model.config.pad_token_id is None:  # the head reads the last non-pad token
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.tokenizer.padding_side = "right"
        self.tokenizer.truncation_side = "left"
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model.to(self.device).eval()
        self.batch_size, self.max_length = int(batch_size), int(max_length)

    def render(self, prompt: list[dict] | str, response: str) -> str:
        """The text the reward model reads: the chat template over prompt turns + the response."""
        messages = [*_as_messages(prompt), {"role": "assistant", "content": response}]
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(messages, tokenize=False)
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages)

    def score(self, prompts: list[list[dict]], responses: list[str]) -> list[float]:
        """Raw reward per response; `prompts[i]`: chat messages of response i's prompt."""
        import torch

        _check_lengths("RewardModelScorer", prompts, responses)
        texts = [self.render(p, r) for p, r in zip(prompts, responses)]
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(
                texts[start : start + self.batch_size],
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=self.max_length,
                add_special_tokens=False,  # the chat template already has them
            ).to(self.device)
            with torch.no_grad():
                logits = self.model(**batch).logits  # (batch, 1)
            scores.extend(logits[:, 0].float().cpu().tolist())
        return scores


# ---------------------------------------------------------------------------------------------------
# LLM judge
# ---------------------------------------------------------------------------------------------------
JUDGE_SYSTEM = "You are an impartial expert judge of AI assistant responses."
JUDGE_TEMPLATE = """Rate the quality of the assistant's response to the conversation below: how helpful, correct, \
relevant, clear and well written it is for what the user asked.

[Conversation]
{conversation}

[Assistant's response]
{response}

Give a short justification, then a final line of exactly this form, with an integer from {min_score} to \
{max_score} ({max_score} is best):
Rating: [[N]]"""

_NUM = r"(-?\d+(?:\.\d+)?)"
_RATING_PATTERNS = (
    re.compile(r"\[\[\s*" + _NUM + r"\s*\]\]"),  # [[7]]
    re.compile(r"(?:rating|score|grade)\s*(?:is|of|:|=)?\s*[*_`\"'\[(]*\s*" + _NUM, re.IGNORECASE),
)
_FRACTION = re.compile(_NUM + r"\s*(?:/|out\s+of)\s*(\d+(?:\.\d+)?)", re.IGNORECASE)  # 7/10, 7 out of 10


def parse_rating(reply: str, min_score: float = 1, max_score: float = 10) -> float | None:
    """The judge's rating in `reply`, or None when there is none in [min_score, max_score].

    Tried in order, the last match of each form winning: "[[N]]", "Rating: N" / "score is N", "N/<max_score>" /
    "N out of <max_score>", and a reply that is only a number. A number outside the range is not a rating.
    """
    text = reply or ""
    for pattern in _RATING_PATTERNS:
        matches = pattern.findall(text)
        if matches:
            value = float(matches[-1])
            return value if min_score <= value <= max_score else None
    fractions = [float(n) for n, d in _FRACTION.findall(text) if float(d) == max_score]
    if fractions:
        return fractions[-1] if min_score <= fractions[-1] <= max_score else None
    bare = re.fullmatch(r"\s*[*_`\[(]*\s*" + _NUM + r"\s*[*_`\])]*\.?\s*", text)
    if bare:
        value = float(bare.group(1))
        return value if min_score <= value <= max_score else None
    return None


def render_conversation(prompt: list[dict] | str) -> str:
    return "\n\n".join(f"{m['role'].capitalize()}: {m['content']}" for m in _as_messages(prompt))


class LLMJudgeScorer:
    """A `min_score`..`max_score` rating per response from an LLM judge (`provider/model`, see LLMClient).

    A reply without a readable rating scores `fallback_score` (default: the middle of the range) and is
    counted: `parse_failures` (all calls) and `last_parse_failures` (the last `score` call).
    """

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key_env: str | None = None,
        min_score: float = 1,
        max_score: float = 10,
        fallback_score: float | None = None,
        temperature: float = 0.0,
        max_tokens: int = 512,
        max_concurrency: int = 8,
        timeout_s: float = 60,
        max_retries: int = 5,
        cache_dir: str | None = None,
        template: str = JUDGE_TEMPLATE,
        system: str = JUDGE_SYSTEM,
    ) -> None:
        from infra.llm import LLMClient

        if not min_score < max_score:
            raise ValueError(f"LLMJudgeScorer: min_score={min_score} must be below max_score={max_score}")
        self.min_score, self.max_score = float(min_score), float(max_score)
        self.fallback_score = (
            (self.min_score + self.max_score) / 2 if fallback_score is None else float(fallback_score)
        )
        self.temperature, self.max_tokens, self.max_concurrency = temperature, max_tokens, max_concurrency
        self.template, self.system = template, system
        self.client = LLMClient(
            model,
            base_url=base_url,
            api_key_env=api_key_env,
            timeout_s=timeout_s,
            max_retries=max_retries,
            cache_dir=cache_dir,
        )
        self.parse_failures = 0
        self.last_parse_failures = 0
        self.last_replies: list[str] = []

    def judge_messages(self, prompt: list[dict] | str, response: str) -> list[dict]:
        text = self.template.format(
            conversation=render_conversation(prompt),
            response=response,
            min_score=_fmt(self.min_score),
            max_score=_fmt(self.max_score),
        )
        return [{"role": "user", "content": text}]

    def score(self, prompts: list[list[dict]], responses: list[str]) -> list[float]:
        """Rating per response (fallback_score where the judge's reply has no readable rating)."""
        _check_lengths("LLMJudgeScorer", prompts, responses)
        replies = self.client.complete_many(
            [self.judge_messages(p, r) for p, r in zip(prompts, responses)],
            system=self.system,
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            max_concurrency=self.max_concurrency,
        )
        ratings = [parse_rating(reply, self.min_score, self.max_score) for reply in replies]
        failures = sum(r is None for r in ratings)
        self.last_parse_failures = failures
        self.parse_failures += failures
        self.last_replies = replies
        if failures:
            logger.warning(
                "LLMJudgeScorer(%s): %d/%d replies had no rating in [%s, %s]; scored %s",
                self.client.model,
                failures,
                len(replies),
                _fmt(self.min_score),
                _fmt(self.max_score),
                _fmt(self.fallback_score),
            )
        return [self.fallback_score if r is None else r for r in ratings]


def _fmt(x: float) -> str:
    return f"{x:g}"


class EmbeddingRelevanceScorer:
    """Offline quality proxy for chat prompts: cosine similarity between the prompt's last user turn and the
    response, embedded by the packaged all-MiniLM-L6-v2 (the `EmbeddingJudge` model, so no download).

    In [-1, 1]; it rewards answering on the request's topic and nothing more (not correctness, not style).
    It is the CPU default of `darling_wildchat` because nothing better runs here: no reward model ships in
    a PyPI package, and the embedded SmolLM2-135M-Instruct as an LLM judge gave no parsable rating (24/24
    replies, any prompt we tried), i.e. a constant quality. Use a real reward model for conclusions.
    """

    def __init__(self, model: str = "packaged-minilm", batch_size: int = 64, device: str = "cpu") -> None:
        from train.diversity.judges import EmbeddingJudge

        self._embed = EmbeddingJudge(model=model, batch_size=batch_size, device=device)

    def score(self, prompts: list[list[dict]], responses: list[str]) -> list[float]:
        _check_lengths("EmbeddingRelevanceScorer", prompts, responses)
        requests = [
            next((m["content"] for m in reversed(_as_messages(p)) if m["role"] == "user"), "")
            for p in prompts
        ]
        return self._embed.probabilities(list(zip(requests, responses)))
