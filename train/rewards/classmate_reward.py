"""Classmate CoT reward: how well "classmate" models answer from the main model's chain of thought.

Each response is split at configurable think markers into a CoT and an answer (:func:`split_cot`):

- start and end marker: CoT between the first start marker and the last end marker (ignoring trailing
  whitespace, so `think_end="\n"` means "every line but the last is the CoT"), answer after it;
- end marker only (templates that put the start marker in the prompt): CoT from the response start;
- start marker only (an unfinished thought, e.g. cut at max_new_tokens): CoT to the end, answer "";
- no marker: no CoT; the whole response is the answer. Such a response gets classmate score 0 and no
  classmate call (it gave the classmates nothing), and no CoT tokens; `reward/cot_fraction` counts them.

The main score `base` grades the answer with the project's math grader against `ground_truth`. The
classmate input is the chat template of the row's prompt with the generation prompt, then
`think_start + kept CoT + think_end`; each classmate samples one answer (T=1, top_p=1), graded the same way.
`classmate_reward_type`: `vanilla_reward` keeps the first floor(len * main_cot_keep_rate) CoT tokens;
`random_truncate` keeps floor(len * u), u ~ U(random_truncate_min, random_truncate_max), seeded by
(seed, prompt, response) so a resumed run draws the same u; `remove_wo_cot` scores
score(with CoT) - score(empty CoT), the latter once per prompt. CoT tokens are counted with the first
classmate's tokenizer. The trainer gets `scores` = base and the signals `classmate_scores` = w
(weighted and conditioned, train/algorithms/classmate.py) and `cot_spans` = the characters of the CoT the
classmates saw.

Classmates are `_target_` dicts: :class:`EngineClassmate` (its own in-process vLLM engine beside the
policy's) or :class:`ServedClassmate` (an OpenAI-compatible `/v1/completions` endpoint, e.g. `vllm serve`).
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import statistics
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import torch

from math_grader import grade_batch, start_workers
from train.algorithms.classmate import MAIN_CONDITIONS, combine_classmate_reward
from train.rewards.base import RewardResult

REWARD_TYPES = ("vanilla_reward", "random_truncate", "remove_wo_cot")


def stable_seed(*parts: object) -> int:
    """A 31-bit seed from the parts' text (Python's hash() is salted per process)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


@dataclass(frozen=True)
class CotSplit:
    cot: tuple[int, int]  # character span [start, end) of the CoT in the response
    answer: str  # the text graded as the main answer
    has_cot: bool  # a think marker was found


def split_cot(text: str, think_start: str | None, think_end: str) -> CotSplit:
    """Split a response into CoT span and answer by the rules in the module docstring."""
    s = text.find(think_start) if think_start else -1
    cot_from = s + len(think_start) if s >= 0 else 0
    e = text.rfind(think_end, cot_from, len(text.rstrip())) if think_end else -1
    if e >= 0:
        return CotSplit((cot_from, e), text[e + len(think_end) :], True)
    if s >= 0:
        return CotSplit((cot_from, len(text)), "", True)
    return CotSplit((0, 0), text, False)


class Classmate(Protocol):
    """A model that continues a text prompt; `tokenizer` builds its chat template and counts CoT tokens."""

    tokenizer: object

    def complete(self, prompts: list[str], max_new_tokens: int, seed: int) -> list[str]: ...


def _load_tokenizer(name_or_path: str):
    from transformers import AutoTokenizer

    from infra.models import resolve_model_path

    try:
        return AutoTokenizer.from_pretrained(resolve_model_path(name_or_path))
    except Exception as exc:  # noqa: BLE001 - one line naming the thing and the fix
        raise ValueError(
            f"classmate tokenizer {name_or_path!r} could not be loaded ({str(exc).splitlines()[0]}); "
            "give a local HF folder or `default`"
        ) from None


class EngineClassmate:
    """A classmate with its own in-process vLLM engine (a second engine lives beside the policy's).

    vLLM's sleep mode is one engine per process and belongs to the policy's rollout engine, so this one
    never sleeps: on a GPU it holds `gpu_memory_utilization` of each GPU (weights + KV cache) for the whole
    run, beside the policy engine's `rollout.engine.gpu_memory_utilization` (which only holds while awake). Size
    it to the classmate model (weights + a KV cache for `max_model_len`); the planner counts it. A classmate
    bigger than that belongs on its own GPU as a `ServedClassmate`.
    """

    def __init__(
        self,
        model_path: str = "default",
        dtype: str = "float32",
        max_model_len: int = 2048,
        kv_cache_gb: float = 1.0,
        seed: int = 0,
        gpu_memory_utilization: float = 0.1,
    ) -> None:
        from infra.models import resolve_model_path
        from train.rollout.vllm_engine import VLLMEngine

        self.model_path = str(resolve_model_path(model_path))
        self.gpu_memory_utilization = gpu_memory_utilization
        self.engine = VLLMEngine(
            self.model_path,
            dtype=dtype,
            max_model_len=max_model_len,
            kv_cache_gb=kv_cache_gb,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            sleep_level=0,
        )
        self.tokenizer = _load_tokenizer(self.model_path)
        self.max_model_len = max_model_len

    def complete(self, prompts: list[str], max_new_tokens: int, seed: int) -> list[str]:
        from train.rollout.base import SamplingConfig

        ids = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        room = self.max_model_len - max_new_tokens
        ids = [x[-room:] if len(x) > room else x for x in ids]  # keep the CoT's end if it is too long
        sampling = SamplingConfig(n=1, temperature=1.0, top_p=1.0, max_new_tokens=max_new_tokens, seed=seed)
        return self.engine.generate(ids, sampling).texts

    def close(self) -> None:
        self.engine.close()


class ServedClassmate:
    """A classmate served by an OpenAI-compatible completions endpoint (`vllm serve MODEL`), given by URL.

    `tokenizer` (default: `model`) is a local HF folder whose chat template matches the served model;
    the API key, if any, is read from the environment variable `api_key_env`.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer: str | None = None,
        api_key_env: str | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 5,
        max_concurrency: int = 8,
    ) -> None:
        from openai import OpenAI

        self.base_url, self.model, self.max_concurrency = base_url, model, max_concurrency
        key = os.environ.get(api_key_env, "") if api_key_env else ""
        if api_key_env and not key:
            raise ValueError(f"classmate endpoint {base_url}: environment variable {api_key_env} is not set")
        self.client = OpenAI(
            base_url=base_url, api_key=key or "EMPTY", timeout=timeout_s, max_retries=max_retries
        )
        self.tokenizer = _load_tokenizer(tokenizer or model)

    def _one(self, prompt: str, max_new_tokens: int, seed: int) -> str:
        try:
            out = self.client.completions.create(
                model=self.model,
                prompt=prompt,
                max_tokens=max_new_tokens,
                temperature=1.0,
                top_p=1.0,
                n=1,
                seed=seed,
            )
        except Exception as exc:  # noqa: BLE001 - the openai client already retried 429/5xx/time-outs
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise RuntimeError(
                f"classmate endpoint {self.base_url} (model {self.model}) failed: {first}; "
                "check the server is up and serves /v1/completions"
            ) from None
        return out.choices[0].text

    def complete(self, prompts: list[str], max_new_tokens: int, seed: int) -> list[str]:
        with ThreadPoolExecutor(max_workers=max(1, self.max_concurrency)) as pool:
            return list(
                pool.map(lambda ip: self._one(ip[1], max_new_tokens, seed + ip[0]), enumerate(prompts))
            )


class ClassmateReward:
    """RewardFn for Classmate-CoT training (`reward._target_: train.rewards.classmate_reward.ClassmateReward`)."""

    provides_signals = ("classmate_scores", "cot_spans")

    def __init__(
        self,
        classmates: list,
        think_start: str | None = "<think>",
        think_end: str = "</think>",
        classmate_reward_type: str = "vanilla_reward",
        main_cot_keep_rate: float = 1.0,
        random_truncate_min: float = 0.1,
        random_truncate_max: float = 0.9,
        classmate_reward_weight: float = 1.0,
        use_classmate_main_cond: str = "no_classmate_when_main_incorrect",
        max_new_tokens: int = 64,
        seed: int = 0,
        timeout_s: float = 3.0,
        num_workers: int | None = None,
    ) -> None:
        self.classmates = list(classmates)
        if not self.classmates:
            raise ValueError(
                "reward.classmates is empty: give at least one EngineClassmate or ServedClassmate"
            )
        if not think_end:
            raise ValueError("reward.think_end must be a non-empty marker (e.g. '</think>')")
        if classmate_reward_type not in REWARD_TYPES:
            raise ValueError(
                f"reward.classmate_reward_type={classmate_reward_type!r}; valid: {list(REWARD_TYPES)}"
            )
        if use_classmate_main_cond not in MAIN_CONDITIONS:
            raise ValueError(
                f"reward.use_classmate_main_cond={use_classmate_main_cond!r}; valid: {list(MAIN_CONDITIONS)}"
            )
        if not 0.0 <= main_cot_keep_rate <= 1.0:
            raise ValueError(f"reward.main_cot_keep_rate={main_cot_keep_rate} must be in [0, 1]")
        if not 0.0 <= random_truncate_min <= random_truncate_max <= 1.0:
            raise ValueError("reward.random_truncate_min <= random_truncate_max must both be in [0, 1]")
        self.think_start, self.think_end = think_start or None, think_end
        self.reward_type = classmate_reward_type
        self.keep_rate = main_cot_keep_rate
        self.truncate_range = (random_truncate_min, random_truncate_max)
        self.weight, self.cond = classmate_reward_weight, use_classmate_main_cond
        self.max_new_tokens, self.seed = max_new_tokens, seed
        self.timeout_s, self.num_workers = timeout_s, num_workers
        start_workers(num_workers)  # the grader's sympy workers start while rollouts are generated

    # ------------------------------------------------------------------------------------------
    def _grade(self, texts: list[str], golds: list[str]) -> list[float]:
        return grade_batch(texts, golds, timeout_s=self.timeout_s, num_workers=self.num_workers)

    def _keep_fraction(self, row: dict, response: str) -> float:
        if self.reward_type == "random_truncate":
            lo, hi = self.truncate_range
            return random.Random(stable_seed(self.seed, row["prompt"], response)).uniform(lo, hi)
        return self.keep_rate if self.reward_type == "vanilla_reward" else 1.0

    def _kept_end(self, cot_text: str, fraction: float) -> int:
        """Characters of the CoT covered by its first floor(len * fraction) tokens."""
        if fraction >= 1.0:
            return len(cot_text)
        enc = self.classmates[0].tokenizer(cot_text, add_special_tokens=False, return_offsets_mapping=True)
        keep = math.floor(len(enc["input_ids"]) * fraction)
        return enc["offset_mapping"][keep - 1][1] if keep > 0 else 0

    def _classmate_input(self, classmate, row: dict, cot: str) -> str:
        prompt = classmate.tokenizer.apply_chat_template(
            row["prompt"], tokenize=False, add_generation_prompt=True
        )
        return f"{prompt}{self.think_start or ''}{cot}{self.think_end}"

    def _classmate_scores(self, rows: list[dict], cots: list[str]) -> list[list[float]]:
        """Score of one sample per classmate for each (row, CoT): [classmate][item]."""
        golds = [str(r.get("ground_truth", "")) for r in rows]
        out = []
        for k, classmate in enumerate(self.classmates):
            prompts = [self._classmate_input(classmate, r, c) for r, c in zip(rows, cots)]
            seed = stable_seed(self.seed, k, *prompts)  # same batch -> same samples (resume)
            out.append(self._grade(classmate.complete(prompts, self.max_new_tokens, seed), golds))
        return out

    def __call__(self, rows: list[dict], responses: list[str], group_index: list[int]) -> RewardResult:
        golds = [str(r.get("ground_truth", "")) for r in rows]
        splits = [split_cot(t, self.think_start, self.think_end) for t in responses]
        base = self._grade([s.answer for s in splits], golds)
        spans = [(s.cot[0], s.cot[0]) for s in splits]
        cl = [0.0] * len(responses)
        per_classmate = [[0.0] * len(responses) for _ in self.classmates]
        with_cot = [i for i, s in enumerate(splits) if s.has_cot]
        if with_cot and self.cond != "no_classmate" and self.weight != 0:
            for i in with_cot:
                a, b = splits[i].cot
                spans[i] = (
                    a,
                    a + self._kept_end(responses[i][a:b], self._keep_fraction(rows[i], responses[i])),
                )
            kept_cots = [responses[i][spans[i][0] : spans[i][1]] for i in with_cot]
            scores = self._classmate_scores([rows[i] for i in with_cot], kept_cots)
            if self.reward_type == "remove_wo_cot":  # minus the score without a CoT, once per prompt
                groups = sorted({group_index[i] for i in with_cot})
                first = {g: next(i for i in with_cot if group_index[i] == g) for g in groups}
                without = self._classmate_scores([rows[first[g]] for g in groups], [""] * len(groups))
                baseline = [{g: w[j] for j, g in enumerate(groups)} for w in without]
                scores = [
                    [s - baseline[k][group_index[i]] for s, i in zip(scores[k], with_cot)]
                    for k in range(len(scores))
                ]
            for k, ks in enumerate(scores):
                for s, i in zip(ks, with_cot):
                    per_classmate[k][i] = s
            for j, i in enumerate(with_cot):
                cl[i] = statistics.fmean(ks[j] for ks in scores)
        w = combine_classmate_reward(
            torch.tensor(base, dtype=torch.float64),
            torch.tensor(cl, dtype=torch.float64),
            self.weight,
            self.cond,
        ).tolist()
        metrics = {
            "main_mean": statistics.fmean(base),
            "classmate_mean": statistics.fmean(cl),
            "classmate_weighted_mean": statistics.fmean(w),
            "cot_fraction": len(with_cot) / len(responses),
            "cot_chars_mean": statistics.fmean(b - a for a, b in spans),
        }
        if len(self.classmates) > 1:
            metrics.update({f"classmate_{k}_mean": statistics.fmean(v) for k, v in enumerate(per_classmate)})
        signals = {"classmate_scores": w, "cot_spans": spans}
        return RewardResult(scores=base, correct=base, metrics=metrics, signals=signals)

    def close(self) -> None:
        for classmate in self.classmates:
            if hasattr(classmate, "close"):
                classmate.close()
