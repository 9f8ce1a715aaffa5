"""LoRA adapters (PEFT) on the policy: wrapping, parameter names, fresh adapter values, merging, the adapter folder.

Why: with `policy.lora.rank > 0` only the low-rank adapters train. The base weights are frozen (stored in
bf16 where the policy computes in bf16), carry no gradient and no AdamW state, the frozen reference is the
same model with its adapters disabled (no second copy), and the rollout engine is refreshed with the
adapter tensors alone where it takes adapters (vLLM), else with merged weights (W + alpha/r * B A).

PEFT (the maintained library TRL and verl use) owns the adapter layers and the adapter folder's format
(`adapter_config.json` + `adapter_model.safetensors`, read by `PeftModel.from_pretrained` and by vLLM's
`--lora-modules` / `LoRARequest`). This module maps PEFT's parameter names to the base model's HF names
(the safetensors files the policy is built from, the merged export) and back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

PEFT_PREFIX = "base_model.model."  # PeftModel -> LoraModel -> the HF model
BASE_LAYER = ".base_layer"  # a LoRA-wrapped module keeps the original under this name
ADAPTER_NAME = "default"
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraError(ValueError):
    """A LoRA setting that cannot apply to this model (one line naming the key and the fix)."""


@dataclass(frozen=True)
class LoraSettings:
    """`policy.lora`: rank 0 = off (every weight trains)."""

    rank: int = 0
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = DEFAULT_TARGETS

    @classmethod
    def of(cls, node) -> LoraSettings:
        """From a config node / dict (None: off)."""
        if node is None:
            return cls()
        if isinstance(node, LoraSettings):
            return node
        get = node.get
        targets = get("target_modules", DEFAULT_TARGETS)
        targets = (targets,) if isinstance(targets, str) else tuple(targets)
        return cls(int(get("rank", 0)), float(get("alpha", 32.0)), float(get("dropout", 0.0)), targets)

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def peft_config(self):
        from peft import LoraConfig

        targets = self.target_modules
        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=targets[0] if targets == ("all-linear",) else list(targets),
            task_type="CAUSAL_LM",
        )


def wrap(model: nn.Module, lora: LoraSettings) -> nn.Module:
    """The HF model with PEFT LoRA layers on `target_modules` (on the meta device when the model is):
    a PeftModel whose base parameters are frozen and whose adapter parameters train."""
    from peft import get_peft_model

    try:
        return get_peft_model(model, lora.peft_config())
    except ValueError as exc:  # peft's NoMatchingPeftModuleError is a ValueError
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
        raise LoraError(
            f"policy.lora.target_modules={list(lora.target_modules)} match no module of this model "
            f"({str(exc).splitlines()[0]}); its linear layers are named {linear}"
        ) from None


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name or ".lora_embedding_" in name


def hf_name(name: str) -> str | None:
    """The base model's HF name of a (PEFT or plain) parameter name; None for an adapter parameter."""
    if is_adapter(name):
        return None
    return name.removeprefix(PEFT_PREFIX).replace(BASE_LAYER, "")


def adapter_key(name: str) -> str:
    """The key PEFT's adapter file uses for an adapter parameter (the adapter's name left out)."""
    return name.replace(f".{ADAPTER_NAME}.", ".")


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The transformer blocks (each its own FSDP2 unit), inside a PeftModel or not."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inner.model.layers


@torch.no_grad()
def fresh_adapter(model: nn.Module, seed: int = 0) -> dict[str, torch.Tensor]:
    """Full starting values of every adapter parameter, identical on every rank: PEFT's default init
    (lora_A Kaiming-uniform with a = sqrt(5), lora_B zeros), so the adapted model starts as the base."""
    out: dict[str, torch.Tensor] = {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for name, param in model.named_parameters():
            if ".lora_A." in name:
                value = torch.empty(param.shape, dtype=torch.float32)
                nn.init.kaiming_uniform_(value, a=math.sqrt(5))
                out[name] = value
            elif ".lora_B." in name:
                out[name] = torch.zeros(param.shape, dtype=torch.float32)
    return out


def freeze_base_in(model: nn.Module, dtype: torch.dtype) -> None:
    """Store the frozen (base) parameters in `dtype` (still on the meta device: no memory is touched)."""
    for param in model.parameters():
        if not param.requires_grad and param.is_floating_point():
            param.data = param.data.to(dtype)


def merge_into(
    base: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float
) -> torch.Tensor:
    """W + scaling * B A in fp32 (the merged weight vLLM or an HF export receives)."""
    return base.float() + scaling * (lora_b.float() @ lora_a.float())
