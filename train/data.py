"""Training prompts: chat-template encoding and deterministic batches by step (datasets: data_prep/datasets.py).

The batch of step s depends only on (seed, s), so a resumed run sees exactly the prompts an
uninterrupted run would have seen; the data position saved in checkpoints is step x batch size.
"""

from __future__ import annotations

import torch


def encode_prompts(tokenizer, rows: list[dict], template: str | None = None) -> list[list[int]]:
    """The token ids the rollout engine is given: each row's chat `prompt` with the generation prompt, or,
    with a `template` (data_prep/prompt_templates.py, e.g. r1_zero), its question in that plain text."""
    if template is not None:
        from data_prep.prompt_templates import render

        texts = [render(template, r) for r in rows]
    else:
        texts = [
            tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
            for r in rows
        ]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


class PromptSampler:
    """Epoch-wise shuffled order; step s (1-based) takes the next `batch_size` prompts."""

    def __init__(self, num_rows: int, batch_size: int, seed: int, shuffle: bool = True) -> None:
        if num_rows == 0:
            raise ValueError("the training dataset is empty")
        self.num_rows, self.batch_size, self.seed, self.shuffle = num_rows, batch_size, seed, shuffle
        self._perms: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._perms:
            if self.shuffle:
                g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
                self._perms[epoch] = torch.randperm(self.num_rows, generator=g).tolist()
            else:
                self._perms[epoch] = list(range(self.num_rows))
        return self._perms[epoch]

    def batch(self, step: int) -> list[int]:
        start = (step - 1) * self.batch_size
        return [
            self._order(pos // self.num_rows)[pos % self.num_rows]
            for pos in range(start, start + self.batch_size)
        ]
