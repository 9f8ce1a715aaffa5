"""HF `generate` rollout backend: slower than vLLM, but needs nothing beyond transformers.

It keeps its own unsharded copy of the policy (on this rank's GPU when there is one);
`update_weights` copies new values into it one tensor at a time.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from train.batch import Batch
from train.rollout.base import SamplingConfig, expand_groups


class HFEngine:
    def __init__(self, model_path: str | Path, dtype: str = "float32", batch_size: int = 64) -> None:
        self.dtype = getattr(torch, dtype)
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
        self.device = self.device or torch.device("cpu")
        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=self.dtype)
        self.model = model.to(self.device).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.eos_ids = set(_eos_ids(self.model, self.tokenizer))
        self.batch_size = batch_size

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig) -> Batch:
        rows, groups = expand_groups(prompt_ids, sampling.n)
        response_ids: list[list[int]] = []
        logprobs: list[list[float]] = []
        finish: list[str] = []
        for start in range(0, len(rows), self.batch_size):
            chunk = rows[start : start + self.batch_size]
            torch.manual_seed(sampling.seed + start)
            ids, mask = _left_pad(chunk, self.pad_id)
            ids, mask = ids.to(self.device), mask.to(self.device)
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=sampling.temperature > 0,
                temperature=sampling.temperature if sampling.temperature > 0 else None,
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k > 0 else None,
                max_new_tokens=sampling.max_new_tokens,
                pad_token_id=self.pad_id,
                output_logits=True,
                return_dict_in_generate=True,
            )
            new = out.sequences[:, ids.shape[1] :]
            raw = torch.stack(out.logits, dim=1).float().log_softmax(-1)  # raw logits, as vLLM reports
            token_lp = raw.gather(-1, new.unsqueeze(-1)).squeeze(-1)
            for b in range(new.shape[0]):
                seq = new[b].tolist()
                end = next((k + 1 for k, t in enumerate(seq) if t in self.eos_ids), None)
                finish.append("stop" if end is not None else "length")
                end = end if end is not None else len(seq)
                response_ids.append(seq[:end])
                logprobs.append(token_lp[b, :end].tolist())
        texts = self.tokenizer.batch_decode(response_ids, skip_special_tokens=True)
        return Batch(rows, response_ids, logprobs, texts, finish, groups)

    @torch.no_grad()
    def sequence_logprobs(
        self, prompt_ids: list[list[int]], response_ids: list[list[int]]
    ) -> list[list[float]]:
        result = []
        for p, r in zip(prompt_ids, response_ids):
            ids = torch.tensor([p + r], device=self.device)
            logits = self.model(input_ids=ids).logits[0, len(p) - 1 : -1].float()
            targets = torch.tensor(r, device=self.device).unsqueeze(-1)
            result.append(logits.log_softmax(-1).gather(-1, targets).squeeze(-1).tolist())
        return result

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.model.named_parameters())
        for name, tensor in named_tensors:
            if name in params:
                params[name].copy_(tensor.to(params[name].dtype))

    def sleep(self) -> None:
        """Nothing to release: generation keeps no cache between calls."""

    def close(self) -> None:
        del self.model


def _eos_ids(model, tokenizer) -> list[int]:
    eos = model.generation_config.eos_token_id
    ids = eos if isinstance(eos, list) else [eos]
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return [i for i in ids if i is not None]


def _left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    return ids, mask
