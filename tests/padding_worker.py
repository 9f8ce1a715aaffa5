"""Worker for tests/test_padding_path.py (torchrun, gloo, 2 ranks): rank 0 has six rows, rank 1 two, so
rank 1 pads to rank 0's micro-batch count. Every call into the first layer's attention is recorded on
both ranks: what decides the attention path (the mask given to the model, the attention's extra kwargs).

Args: MODEL OUT. Writes OUT/rank<r>.json: {layout: [{"padding": bool, "path": [...]}, ...]}.
"""

import json
import sys
from pathlib import Path

import torch

from infra.process_exit import exit_now
from train.policy.distributed import init_distributed
from train.policy.fsdp import Policy
from train.policy.lora import decoder_layers

LAYOUTS = {"shared": (True, False), "packed": (False, True), "plain": (False, False)}


def mask_kind(mask) -> list:
    """The attention mask given to the model: its type and rank (a packed row has none)."""
    return [type(mask).__name__, mask.dim() if isinstance(mask, torch.Tensor) else -1]


def attention_kwargs(kwargs: dict) -> list[str]:
    """The extra arguments the attention layer receives (e.g. the split SDPA's index maps). The mask it
    gets is left out: SDPA's is transformers' per-batch choice (none when nothing is padded)."""
    usual = ("hidden_states", "attention_mask", "position_embeddings", "position_ids", "cache_position",
             "past_key_values", "past_key_value")  # fmt: skip
    return sorted(k for k, v in kwargs.items() if v is not None and k not in usual)


def record_calls(policy: Policy) -> list[dict]:
    """Every call into the first layer's attention from now on: padding or not, and its path."""
    calls: list = []
    current: dict = {}
    attention = decoder_layers(policy.model)[0].self_attn
    attention.register_forward_pre_hook(
        lambda _m, _a, kw: calls.append({**current, "path": current["path"] + [attention_kwargs(kw)]}),
        with_kwargs=True,
    )
    forward = policy._forward

    def recorded(mb, *args, **kwargs):
        current["padding"] = mb.rows.numel() == 0
        current["path"] = [mask_kind(mb.attention_mask), sorted(mb.attention_kwargs)]
        return forward(mb, *args, **kwargs)

    policy._forward = recorded
    return calls


def main(model: str, out: str) -> None:
    rank, _ = init_distributed()
    rows = 6 if rank == 0 else 2  # groups of two rows sharing a prompt, as GRPO's whole groups per rank
    prompts = [[11 + i, 12, 13] for i in range(rows // 2) for _ in range(2)]
    responses = [[20 + i, 21, 22, 23][: 1 + i % 4] for i in range(rows)]
    seen: dict[str, list] = {}
    for layout, (share, pack) in LAYOUTS.items():
        policy = Policy(model, micro_batch_tokens=12, share_prompts=share, pack_sequences=pack, pad_id=0,
                        torch_compile=False, trainable=False)  # fmt: skip
        calls = record_calls(policy)
        policy.compute_log_probs(prompts, responses)
        seen[layout] = calls
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    exit_now(0)  # results are on disk: no interpreter teardown (infra/process_exit.py says why)
