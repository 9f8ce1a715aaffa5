"""The value model of PPO with a critic (`algorithm.adv_estimator=gae`): a separate HF model with a scalar
value head, sharded with FSDP2 exactly like the policy (it is a `Policy` with another head).

The trunk is loaded from `critic.model_path` (default: the policy's starting model) as
`AutoModelForTokenClassification` with one label, verl's choice: the causal LM's weights fill the trunk,
the value head (`score`, hidden -> 1) starts fresh. `values[:, t]` is the head read at the position that
predicts response token t (the state before it), the convention of `train.algorithms.gae`. Micro-batching
(plain or shared-prompt layout), the optimizer step, full state dicts and their restore are the policy's.
"""

from __future__ import annotations

import torch
from transformers import AutoModelForTokenClassification

from train.policy.batching import MicroBatch
from train.policy.fsdp import Policy


class Critic(Policy):
    """FSDP2 value model: `compute_values` (no grad) and `train_step(loss_fn(mb, values, None))`."""

    metric_prefix = "critic"

    def _model_from_config(self, config) -> torch.nn.Module:
        config.num_labels = 1
        return AutoModelForTokenClassification.from_config(
            config, dtype=torch.float32, attn_implementation=self.attn_implementation
        )

    def _forward(
        self, mb: MicroBatch, with_entropy: bool = False, entropy_grad: bool = False
    ) -> tuple[torch.Tensor, None]:
        """(values (b, R) of the response tokens' predicting positions, None)."""
        out = self.model(
            input_ids=mb.input_ids,
            attention_mask=mb.attention_mask,
            position_ids=mb.position_ids,
            use_cache=False,
            **mb.attention_kwargs,
        )
        values = out.logits[..., 0].float()  # (b or U, P + R): one value per position
        if mb.keep is not None:
            values = values[:, mb.keep]
        if mb.gather_unit is not None:  # shared-prompt layout: each response's columns of its unit
            values = values[mb.gather_unit, mb.gather_col]
        return values, None

    @torch.no_grad()
    def compute_values(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> torch.Tensor:
        """(N, R_max) values of each response token's state (zeros past the end)."""
        return self.compute_log_probs(prompt_ids, response_ids)[0]
