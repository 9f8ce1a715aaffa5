"""A stand-in for a model that has learnt the tool-call format: an engine with the turn-level API
(`submit` / `step` / `pending`, as train/rollout/vllm_engine.py) whose turns come from a script.

`script(conversation_text, turn) -> text` decides each turn from what the trajectory holds so far; the text
is tokenized once with the real tokenizer and "sampled" as those ids plus the end-of-turn token, with
made-up log-probs (-0.1 * position), so tests can check which tokens of a trajectory the model wrote.
`latency_s` makes each step take that long (a busy engine); `steps` counts them.
"""

from __future__ import annotations

import itertools
import time

from train.rollout.base import TurnOutput


class ScriptedModel:
    def __init__(self, tokenizer, script, latency_s: float = 0.0, cut_at: int | None = None) -> None:
        self.tokenizer, self.script, self.latency_s, self.cut_at = tokenizer, script, latency_s, cut_at
        self.queued: list[tuple[str, list[int], int]] = []
        self.ids = itertools.count()
        self.steps = 0
        self.submitted: list[list[int]] = []  # every request's prompt ids, in order
        self.submit_times: list[float] = []  # time.perf_counter() of each submission

    def submit(self, prompt_ids, sampling, seed) -> str:
        rid = f"r{next(self.ids)}"
        self.queued.append((rid, list(prompt_ids), sampling.max_new_tokens))
        self.submitted.append(list(prompt_ids))
        self.submit_times.append(time.perf_counter())
        return rid

    def pending(self) -> int:
        return len(self.queued)

    def step(self) -> list[TurnOutput]:
        self.steps += 1
        if self.latency_s:
            time.sleep(self.latency_s)
        queued, self.queued = self.queued, []
        out = []
        for rid, prompt, max_new in queued:
            text_so_far = self.tokenizer.decode(prompt)
            turn = text_so_far.count("<|im_start|>assistant") - 1
            text = self.script(text_so_far, turn)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            limit = min(max_new, self.cut_at or max_new)
            cut = len(ids) > limit
            ids = ids[:limit]
            shown = self.tokenizer.decode(ids, skip_special_tokens=True)
            out.append(
                TurnOutput(rid, ids, [-0.1 * k for k in range(len(ids))], shown, "length" if cut else "stop")
            )
        return out
