"""What `train.checkpoint.save_checkpoint` reads from a policy, over a plain (unsharded) HF model: real
checkpoints of a tiny model without building an FSDP2 policy (tests/conftest.py, tests/ckpt_kill_worker.py)."""

from __future__ import annotations

import torch


class StandInPolicy:
    optimizer = None  # the step's state/ holds the model shards only

    def __init__(self, model):
        self.model, self.config = model, model.config
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)

    def full_weights(self, dtype=None):
        return ((n, p if dtype is None else p.to(dtype)) for n, p in self.model.named_parameters())
