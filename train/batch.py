"""One step's samples as one object: the rollout's rows, the reward's outputs and named tensors.

In the spirit of verl's ``DataProto``, with only what this project needs. The rollout engines return a
:class:`Batch` (rows only); the trainer adds the reward's outputs and, as the step goes, named tensors
(``response_mask``, ``old_log_probs``, ``advantages``, ...) under ``batch[name]``; the policy update takes
it. Selecting rows, concatenating batches and cutting one into mini-batches is written once, here, so a
new per-sample field is one line of this file (and the engine that fills it).

Rows are prompt-major: sample j of prompt p is row p * n + j, and ``group_index`` says which prompt (group)
each row answers. Group indices are 0.. within a batch; :meth:`Batch.concat` offsets them so the groups of
different batches stay distinct, and :meth:`Batch.select` renumbers them in order of first appearance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

# The per-sample lists: one entry per row, selected and concatenated together.
ROW_FIELDS = (
    "prompt_ids", "response_ids", "response_logprobs", "texts", "finish_reasons", "rows", "scores",
    "token_mask", "episodes",
)  # fmt: skip


@dataclass
class Batch:
    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    response_logprobs: list[list[float]]  # log-probs of the sampled tokens under the engine's weights
    texts: list[str]
    finish_reasons: list[str]  # "stop" (EOS or stop string) or "length" (hit max_new_tokens)
    group_index: list[int]  # index of the prompt (group) each row was sampled for
    rows: list[dict] = field(default_factory=list)  # the data row of each sample (set by the trainer)
    # the reward's outputs (train/rewards/base.py RewardResult), one entry per sample
    scores: list[float] = field(default_factory=list)
    correct: list[float] | None = None
    signals: dict[str, list] = field(default_factory=dict)
    reward_metrics: dict[str, float] = field(default_factory=dict)  # per-batch figures, logged as reward/*
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)  # named (B, ...) tensors: batch[name]
    # multi-turn rollouts (train/rollout/agent_loop.py): per response token 1 = sampled by the model,
    # 0 = written by the environment; and each trajectory's turns, tool calls and stop reason
    token_mask: list[list[int]] = field(default_factory=list)
    episodes: list[dict] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.response_ids)

    @property
    def num_response_tokens(self) -> int:
        return sum(len(r) for r in self.response_ids)

    def model_token_mask(self) -> list[list[float]]:
        """Per row, 1.0 on the tokens the model sampled (every response token of a single-turn rollout)."""
        if self.token_mask:
            return [[float(m) for m in row] for row in self.token_mask]
        return [[1.0] * len(r) for r in self.response_ids]

    @property
    def num_groups(self) -> int:
        return max(self.group_index, default=-1) + 1

    # ---- named tensors ---------------------------------------------------------------------------
    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.tensors:
            raise KeyError(f"the batch has no tensor {name!r} (it has: {', '.join(sorted(self.tensors))})")
        return self.tensors[name]

    def __setitem__(self, name: str, value: torch.Tensor) -> None:
        if value.shape[0] != len(self):
            raise ValueError(f"batch[{name!r}]: {value.shape[0]} rows, the batch has {len(self)}")
        self.tensors[name] = value

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def get(self, name: str, default: Any = None) -> Any:
        return self.tensors.get(name, default)

    def signal(self, name: str) -> list:
        """The reward's per-sample signal `name`, or a KeyError naming the ones it gave."""
        if name not in self.signals:
            raise KeyError(
                f"the reward gave no signal {name!r} (it gave: {', '.join(sorted(self.signals)) or 'none'})"
            )
        return self.signals[name]

    def add_reward(self, result) -> None:
        """Store a reward's RewardResult (scores, correct, metrics, signals) on these rows."""
        self.scores, self.correct = list(result.scores), result.correct
        self.reward_metrics, self.signals = dict(result.metrics), dict(result.signals)

    # ---- rows --------------------------------------------------------------------------------------
    def select(self, idx: list[int]) -> Batch:
        """Rows `idx` (in that order), groups renumbered 0.. in order of first appearance."""
        renumber: dict[int, int] = {}
        for i in idx:
            renumber.setdefault(self.group_index[i], len(renumber))
        index = torch.tensor(idx, dtype=torch.long)
        return Batch(
            **{name: _take(getattr(self, name), idx) for name in ROW_FIELDS},
            group_index=[renumber[self.group_index[i]] for i in idx],
            correct=None if self.correct is None else _take(self.correct, idx),
            signals={k: _take(v, idx) for k, v in self.signals.items()},
            reward_metrics=dict(self.reward_metrics),
            tensors={k: v[index] for k, v in self.tensors.items()},
        )

    def chunk(self, rows: int) -> list[Batch]:
        """Consecutive parts of `rows` rows (the last may be shorter): the mini-batches of an update."""
        return [self.select(list(range(s, min(s + rows, len(self))))) for s in range(0, len(self), rows)]

    @staticmethod
    def concat(parts: list[Batch]) -> Batch:
        """Batches back to back, group indices offset so they stay distinct; reward figures averaged.

        Named tensors are concatenated when every part has them (padded to the widest on dim 1)."""
        out = Batch([], [], [], [], [], [])
        offset = 0
        masked = any(p.token_mask for p in parts)  # a single-turn part's mask is all ones
        for part in parts:
            for name in ROW_FIELDS:
                getattr(out, name).extend(getattr(part, name))
            if masked and not part.token_mask:
                out.token_mask.extend([1] * len(r) for r in part.response_ids)
            out.group_index += [g + offset for g in part.group_index]
            offset += part.num_groups
            for k, v in part.signals.items():
                out.signals.setdefault(k, []).extend(v)
            for k, v in part.reward_metrics.items():
                out.reward_metrics[k] = out.reward_metrics.get(k, 0.0) + v / len(parts)
        out.correct = None if any(p.correct is None for p in parts) else [c for p in parts for c in p.correct]
        shared = set.intersection(*(set(p.tensors) for p in parts)) if parts else set()
        for name in shared:
            out.tensors[name] = _cat([p.tensors[name] for p in parts])
        return out

    def padded(self, values: list[list[float]], width: int | None = None) -> torch.Tensor:
        """Per-row lists as a zero-padded (B, width) float tensor (width: the longest response)."""
        width = width or self.width
        out = torch.zeros(len(values), width)
        for i, r in enumerate(values):
            out[i, : len(r)] = torch.tensor(r[:width], dtype=torch.float32)
        return out

    @property
    def width(self) -> int:
        """The padded response length T of this batch's (B, T) tensors."""
        return max(max((len(r) for r in self.response_ids), default=0), 1)


def _take(values: list, idx: list[int]) -> list:
    return [values[i] for i in idx] if values else []


def _cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    if tensors[0].dim() < 2:
        return torch.cat(tensors)
    width = max(t.shape[1] for t in tensors)
    return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in tensors])
