"""The trained policy (and the frozen reference): an HF causal LM sharded with FSDP2 `fully_shard`.

Owns the parameters, the optimizer and everything that touches them: teacher-forced log-probs in
token-budget micro-batches, one optimizer step from a loss callback, full weights for the rollout
engine, and HF-format saving. The algorithm (what the loss is) stays outside, in `train.algorithms`.

Each rank computes on its own GPU when there is one (NCCL), else on the CPU (gloo). Master weights,
gradients and the AdamW state are fp32 and sharded over the ranks; under `precision=bf16` FSDP2's
`MixedPrecisionPolicy` all-gathers the parameters in bf16 for the forward/backward and reduce-scatters
the gradients in fp32 (`precision=auto` decides by measuring, see precision.py). `cpu_offload` keeps the
shards, their gradients and the optimizer step on the CPU (FSDP2 `CPUOffloadPolicy`) for models whose
state does not fit beside the activations and the rollout engine.

With `lora` (policy.lora.rank > 0) the HF model is wrapped by PEFT on the meta device before sharding
(train/policy/lora.py): the base parameters are frozen (stored in bf16 under bf16 precision: no fp32 master,
gradient or AdamW state), only the adapters are in the optimizer, `frozen_base()` is the reference (the
adapters disabled, no second copy), `full_weights()` yields merged weights and `adapter_weights()` the
adapters alone (what an engine that takes adapters receives, train/rollout/weight_sync.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from transformers import AutoConfig, AutoModelForCausalLM

from train.policy.attention import (
    ATTENTION,
    SPLIT_SDPA,
    pick_attention,
    shared_prompt_block_mask,
    shared_prompt_split,
)
from train.policy.batching import MicroBatch, empty_micro_batch, plan_layout
from train.policy.cpu_matmul import route_linears
from train.policy.distributed import all_reduce_max, device
from train.policy.lora import (
    ADAPTER_NAME,
    LoraSettings,
    adapter_key,
    decoder_layers,
    freeze_base_in,
    fresh_adapter,
    hf_name,
    is_adapter,
    merge_into,
)
from train.policy.lora import wrap as lora_wrap
from train.policy.meta_init import build_on_meta, fresh_parameters, materialize, weight_files
from train.policy.packed_logprobs import (
    RowKernels,
    kept_entropy,
    kept_log_probs,
    kept_log_probs_and_entropy,
    row_kernels,
    warm_up,
)
from train.policy.precision import PRECISIONS, resolve_precision
from train.policy.segments import for_training

# loss_fn(micro_batch, log_probs (b, R), entropy (b, R) | None) -> (loss scalar, metrics)
LossFn = Callable[[MicroBatch, torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, dict[str, float]]]


def _check_names(precision: str, lr_schedule: str, attn_implementation: str) -> None:
    """The policy's named choices, each refused in one line naming the key."""
    if precision not in PRECISIONS:
        raise ValueError(f"policy.precision={precision!r}: expected one of {PRECISIONS}")
    if lr_schedule not in ("constant", "cosine"):
        raise ValueError(f"optim.schedule={lr_schedule!r}: expected 'constant' or 'cosine'")
    if attn_implementation not in ATTENTION:
        raise ValueError(f"policy.attn_implementation={attn_implementation!r}: expected one of {ATTENTION}")


class Policy:
    """FSDP2-sharded causal LM. `trainable=False` builds a frozen reference model (no optimizer)."""

    def __init__(
        self,
        model_path: str | Path,
        precision: str = "fp32",  # the run config's default is auto (train/config/schema.py)
        trainable: bool = True,
        lr: float = 1e-6,
        weight_decay: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.999),
        grad_clip: float = 1.0,
        gradient_checkpointing: bool = False,
        micro_batch_tokens: int = 2048,
        warmup_steps: int = 0,
        lr_schedule: str = "constant",
        total_steps: int = 1,
        pad_id: int = 0,
        share_prompts: bool = True,
        pack_sequences: bool = False,
        attn_implementation: str = "auto",
        cpu_offload: bool = False,
        lora: LoraSettings | dict | None = None,
        fp32_matmul: str = "auto",
        torch_compile: bool = True,
    ) -> None:
        _check_names(precision, lr_schedule, attn_implementation)
        self.device = device()
        self.precision_choice = resolve_precision(precision, self.device, fp32_matmul)
        self.precision = self.precision_choice.precision  # fp32 | bf16, never auto
        self.grad_clip = grad_clip
        self.micro_batch_tokens = micro_batch_tokens
        self.pad_id = pad_id
        self.share_prompts = share_prompts  # rows with one prompt: the prompt runs once (batching.py)
        self.pack_sequences = pack_sequences  # padding-free rows (wins over share_prompts), batching.py
        self.attn_requested = attn_implementation  # what a companion model asks for (companion_kwargs)
        self.attn_implementation = pick_attention(
            attn_implementation, self.device, trainable, shared=self.layout == "shared"
        )
        if self.attn_implementation == "flash_attention_2" and share_prompts and not pack_sequences:
            raise ValueError(
                "policy.attn_implementation=flash_attention_2 cannot run the shared-prompt layout's 4-D mask:"
                " set policy.pack_sequences=true (padding-free rows) or policy.share_prompts=false"
            )
        # parameters on the meta device, sharded, then each rank reads its own rows (meta_init.py)
        self.lora = LoraSettings.of(lora)
        self.model_path = Path(model_path)
        config = AutoConfig.from_pretrained(str(model_path))
        files = weight_files(model_path)
        model, adapter_init = self._meta_model(config, gradient_checkpointing and trainable, torch_compile)
        fresh = fresh_parameters(model, files, known=adapter_init)
        self._shard(model, cpu_offload)
        # the shards' storage on the device (the host when offloaded; buffers stay on the device), then the rows
        materialize(
            model, files, fresh, torch.device("cpu") if self.cpu_offload else self.device, self.device
        )
        self.model = model
        if self.lora.enabled:
            # FSDP2 fixes each unit's gradient reduce dtype at its first forward from the parameters that
            # require grad then; PEFT's disable_adapter() (the reference pass) turns that off on the adapters,
            # so the first forward runs here, adapters on (a one-token batch; collective on every rank)
            # (the allocator's segments untouched: the engine may not have started yet, segments.py)
            self._log_probs([[self.pad_id]], [[self.pad_id]])
        if trainable:
            model.train()
            self.optimizer, self.scheduler = self._optimizer(
                lr, weight_decay, betas, lr_schedule, warmup_steps, total_steps
            )
        else:
            model.eval()
            model.requires_grad_(False)
            self.optimizer = None
            self.scheduler = None

    def _optimizer(
        self,
        lr: float,
        weight_decay: float,
        betas: tuple[float, float],
        lr_schedule: str,
        warmup_steps: int,
        total_steps: int,
    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
        """AdamW over the trainable parameters and its learning-rate schedule."""
        # fused: one kernel over all parameters; torch's default on CPU is a per-tensor Python loop
        # (measured 7x slower on a 135M model: 1.9 s -> 0.26 s per step, 2 cores)
        optimizer = torch.optim.AdamW(
            self.trainable_parameters(), lr=lr, weight_decay=weight_decay, betas=betas, fused=True
        )
        return optimizer, torch.optim.lr_scheduler.LambdaLR(
            optimizer, _lr_lambda(lr_schedule, warmup_steps, total_steps)
        )

    def _meta_model(self, config, checkpointing: bool, torch_compile: bool) -> tuple[torch.nn.Module, dict]:
        """The model on the meta device with its fp32 kernel, activation checkpointing and the vocabulary
        kernels set, and under LoRA its adapters (with their fresh values; the base frozen)."""
        model = build_on_meta(lambda: self._model_from_config(config))
        if self.precision_choice.onednn_linears:  # fp32 products in oneDNN where faster (cpu_matmul.py)
            route_linears(model)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        self.config = model.config
        self.torch_compile = torch_compile
        self.vocab_kernels = vocab_kernels(
            torch_compile,
            model.config.vocab_size,
            torch.bfloat16 if self.precision == "bf16" else torch.float32,
        )
        adapter_init: dict[str, torch.Tensor] = {}
        if self.lora.enabled:  # PEFT adapters on the meta model; the base frozen (in bf16 under bf16)
            model = lora_wrap(model, self.lora)
            adapter_init = fresh_adapter(model)
            if self.precision == "bf16":  # FSDP2 casts every parameter to bf16 for compute anyway
                freeze_base_in(model, torch.bfloat16)
        return model, adapter_init

    def _shard(self, model: torch.nn.Module, cpu_offload: bool) -> None:
        """FSDP2 over every rank: each decoder layer a unit, the rest the root; bf16 compute with fp32 gradient
        reduce under bf16; the shards on the host under `cpu_offload` (GPU only)."""
        self.world_size = dist.get_world_size()
        kwargs: dict = {"mesh": init_device_mesh(self.device.type, (self.world_size,))}
        if self.precision == "bf16":
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        self.cpu_offload = cpu_offload and self.device.type == "cuda"  # on a CPU-only rank it is a no-op
        if self.cpu_offload:
            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
        for layer in decoder_layers(model):
            fully_shard(layer, **kwargs)
        fully_shard(model, **kwargs)

    def companion_kwargs(self) -> dict:
        """The settings a reference model or critic built beside this policy takes from it, so that it computes
        the same way: the resolved precision and fp32 kernel, the micro-batch layout and the attention."""
        return {
            "precision": self.precision,
            "fp32_matmul": self.precision_choice.fp32_kernel,
            "micro_batch_tokens": self.micro_batch_tokens,
            "share_prompts": self.share_prompts,
            "pack_sequences": self.pack_sequences,
            "attn_implementation": self.attn_requested,
            "pad_id": self.pad_id,
            "torch_compile": self.torch_compile,
        }

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """What the optimizer updates: every parameter, or under LoRA the adapters alone."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def frozen_base(self) -> FrozenBase:
        """The frozen reference under LoRA: this model with its adapters disabled (no second copy)."""
        if not self.lora.enabled:
            raise ValueError("frozen_base needs policy.lora.rank > 0 (else build a trainable=False Policy)")
        return FrozenBase(self)

    metric_prefix = "actor"  # train_step's grad_norm / micro_batches metrics: <prefix>/...

    def _model_from_config(self, config) -> torch.nn.Module:
        """The HF model to shard, built from its config (a subclass puts another head on the same trunk:
        critic.py); called under `build_on_meta`, the weights come from the files after sharding."""
        return AutoModelForCausalLM.from_config(
            config, dtype=torch.float32, attn_implementation=self.attn_implementation
        )

    # ---- forward -------------------------------------------------------------------------------
    def _forward(
        self, mb: MicroBatch, with_entropy: bool, entropy_grad: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = self.model(
            input_ids=mb.input_ids,
            attention_mask=mb.attention_mask,
            position_ids=mb.position_ids,
            logits_to_keep=mb.keep,
            use_cache=False,
            **mb.attention_kwargs,
        )
        # (U, K, V) logits of the kept positions only (bf16 under bf16 precision): at most the micro-batch's
        # token budget x V. Log-probs and entropy are computed there and padded per token to (b, R).
        logits = out.logits
        index = mb.kept_index(logits.shape[1])
        if with_entropy and not (entropy_grad and torch.is_grad_enabled()):
            # the entropy metric (reported every step, not in the loss): from the log-probs' own pass
            return kept_log_probs_and_entropy(logits, index, mb.response_ids, kernels=self.vocab_kernels)
        log_probs = kept_log_probs(logits, index, mb.response_ids, kernels=self.vocab_kernels)
        if with_entropy:  # in the loss
            return log_probs, kept_entropy(logits, index, with_grad=True, kernels=self.vocab_kernels)
        return log_probs, None

    @property
    def layout(self) -> str:
        """The micro-batch layout (batching.py): packed rows win over shared prompts."""
        if self.pack_sequences:
            return "packed"
        return "shared" if self.share_prompts else "plain"

    def micro_batches(
        self, prompt_ids: list[list[int]], response_ids: list[list[int]]
    ) -> Iterator[MicroBatch]:
        """Token-budget micro-batches, built and moved to the device one at a time, padded with empty ones
        to the same count on every rank.

        Only the plan (row indices) exists for the whole batch; each micro-batch's tensors are made when the
        loop reaches it and dropped after its forward/backward, so the device holds one micro-batch's inputs
        at a time. FSDP's forward/backward are collectives: a rank that ran fewer micro-batches would hang
        the others, so the count is agreed before the first one and ranks with less data run masked-out
        one-token batches in the same layout and attention path (zero loss, zero gradient).
        """
        dense = self.attn_implementation not in ("flex_attention", SPLIT_SDPA)
        builders = plan_layout(
            self.layout, prompt_ids, response_ids, self.micro_batch_tokens, self.pad_id, dense_mask=dense
        )
        target = all_reduce_max(len(builders))
        for build in builders:
            yield self._on_device(build())  # no reference kept here while the caller runs it
        for _ in range(target - len(builders)):
            yield self._on_device(empty_micro_batch(self.pad_id, self.layout, dense_mask=dense))

    def _on_device(self, mb: MicroBatch) -> MicroBatch:
        mb = mb.to(self.device)
        if mb.segments is None:
            return mb
        if self.attn_implementation == "flex_attention":  # shared-prompt units: the block mask, on the device
            mb.attention_mask = shared_prompt_block_mask(mb.segments)
        elif self.attn_implementation == SPLIT_SDPA:  # ... or the split's index maps
            mb.attention_kwargs = {"shared_prompt_split": shared_prompt_split(mb.segments)}
        return mb

    @torch.no_grad()
    def compute_log_probs(
        self, prompt_ids: list[list[int]], response_ids: list[list[int]], with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Teacher-forced log-probs (N, R_max) of each response token (zeros past the end)."""
        for_training()  # expandable segments (segments.py): the engine sleeps from here to the weight sync
        return self._log_probs(prompt_ids, response_ids, with_entropy)

    @torch.no_grad()
    def _log_probs(
        self, prompt_ids: list[list[int]], response_ids: list[list[int]], with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        n, width = len(response_ids), max(max(len(r) for r in response_ids), 1)
        log_probs = torch.zeros(n, width)
        entropy = torch.zeros(n, width) if with_entropy else None
        for mb in self.micro_batches(prompt_ids, response_ids):
            lp, ent = self._forward(mb, with_entropy)
            if mb.rows.numel() == 0:  # padding micro-batch (see micro_batches)
                continue
            R = lp.shape[1]
            log_probs[mb.rows, :R] = (lp * mb.response_mask).float().cpu()
            if entropy is not None:
                entropy[mb.rows, :R] = (ent * mb.response_mask).float().cpu()
            del mb, lp, ent  # nothing of this micro-batch outlives its turn
        return log_probs, entropy

    # ---- update --------------------------------------------------------------------------------
    def train_step(
        self,
        prompt_ids: list[list[int]],
        response_ids: list[list[int]],
        loss_fn: LossFn,
        with_entropy: bool = True,
        entropy_grad: bool = False,
    ) -> dict[str, float]:
        """One optimizer step over these rows: forward/backward per micro-batch, clip, step.

        `loss_fn` must already divide by the global (all micro-batches, all ranks) normaliser and
        multiply by the world size, since FSDP averages gradients over ranks.
        """
        assert self.optimizer is not None, "reference policy is frozen"
        for_training()
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        count = 0
        for mb in self.micro_batches(prompt_ids, response_ids):
            count += 1
            log_probs, entropy = self._forward(mb, with_entropy, entropy_grad)
            if mb.rows.numel() == 0:  # padding micro-batch: zero gradient, same collectives
                (log_probs.sum() * 0.0).backward()
                continue
            loss, metrics = loss_fn(mb, log_probs, entropy)
            loss.backward()
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v
            del mb, loss, log_probs, entropy  # nothing of this micro-batch outlives its turn
        grad_norm = torch.nn.utils.clip_grad_norm_(self.trainable_parameters(), self.grad_clip)
        if isinstance(grad_norm, DTensor):
            grad_norm = grad_norm.full_tensor()
        grad_norm = float(grad_norm)
        if math.isfinite(grad_norm):
            self.optimizer.step()
        self.scheduler.step()
        # applied, so freed: otherwise 4 bytes x trained parameters / world stay on each GPU through the next
        # rollout and log-prob passes, beside the engine's KV cache (verl's update_policy ends the same way)
        self.optimizer.zero_grad(set_to_none=True)
        sums[f"{self.metric_prefix}/grad_norm"] = grad_norm
        sums[f"{self.metric_prefix}/micro_batches"] = float(count)
        return sums

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"] if self.optimizer else 0.0

    # ---- weights out / in ----------------------------------------------------------------------
    def full_weights(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Unsharded parameters one at a time (every rank gets each tensor), HF names, tied ones once.
        Under LoRA: the base model's weights with the adapters merged in (W + alpha/r * B A, in fp32).

        `dtype` (the engine's, e.g. bf16): each rank casts its shard on its compute device, then the ranks
        gather that, so a sync moves and holds one parameter in the engine's dtype at a time. Under
        `cpu_offload` the shards live on the host: gathering them there in fp32 sent 4 bytes a weight
        through gloo (~16 GB a sync for a 4B model); each shard now goes to the GPU in `dtype` and is gathered
        by NCCL. None: the stored dtype, where the shards are (checkpoints, exact comparisons)."""
        seen: set[int] = set()
        adapted = dict(self._adapted_modules()) if self.lora.enabled else {}
        where = self.device if dtype is not None else None
        for name, param in self.model.named_parameters():
            if id(param) in seen or is_adapter(name):
                continue
            seen.add(id(param))
            owner = name.rsplit(".", 2)[0] if name.endswith(".base_layer.weight") else None
            if owner in adapted:  # merged in fp32 (the adapters' dtype), then cast
                module = adapted[owner]
                a = _full(module.lora_A[ADAPTER_NAME].weight, where=where)
                b = _full(module.lora_B[ADAPTER_NAME].weight, where=where)
                tensor = merge_into(_full(param, where=where), a, b, self.lora.scaling)
                tensor = tensor if dtype is None else tensor.to(dtype)
            else:
                tensor = _full(param, dtype, where)
            yield hf_name(name), tensor.detach()

    def _adapted_modules(self) -> Iterator[tuple[str, torch.nn.Module]]:
        """(name, module) of every LoRA-wrapped layer."""
        for name, module in self.model.named_modules():
            if hasattr(module, "lora_A") and ADAPTER_NAME in getattr(module, "lora_A", {}):
                yield name, module

    def adapter_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Under LoRA: the adapter tensors, unsharded (every rank), with the keys of PEFT's adapter file."""
        for name, param in self.model.named_parameters():
            if is_adapter(name):
                yield adapter_key(name), _full(param).detach()

    def adapter_bytes(self) -> int:
        """Bytes of the adapter tensors (fp32): what an adapter sync moves."""
        return sum(p.numel() * p.element_size() for n, p in self.model.named_parameters() if is_adapter(n))

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model on rank 0 (CPU), empty elsewhere; for checkpoints."""
        return get_model_state_dict(
            self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )

    def optimizer_state(self) -> dict:
        return get_optimizer_state_dict(
            self.model, self.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )

    def load_model_state(self, state: dict) -> None:
        """Full (unsharded) weights from rank 0's `state` (empty on other ranks), e.g. a resumed critic."""
        set_model_state_dict(
            self.model, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        )

    def load_optimizer_state(self, state: dict, scheduler_state: dict) -> None:
        set_optimizer_state_dict(
            self.model,
            self.optimizer,
            state,
            options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
        )
        self.scheduler.load_state_dict(scheduler_state)


def _full(
    param: torch.Tensor, dtype: torch.dtype | None = None, where: torch.device | None = None
) -> torch.Tensor:
    """The whole of a (sharded) parameter on every rank: each rank's shard first moved to `where` and cast
    to `dtype` (both: as stored when None), so the gather moves those bytes over that device's backend."""
    if not isinstance(param, DTensor):
        return param.to(device=where or param.device, dtype=dtype or param.dtype)
    if dtype is None and where is None:
        return param.full_tensor()
    local = param.to_local()
    local = local.to(device=where or local.device, dtype=dtype or local.dtype)
    shard = DTensor.from_local(
        local, param.device_mesh, param.placements, run_check=False, shape=param.shape, stride=param.stride()
    )
    return shard.full_tensor()


class FrozenBase:
    """A LoRA policy seen with its adapters disabled (PEFT's `disable_adapter()`): the frozen reference
    of the KL loss and of DPO, sharing the base weights, never a second copy."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def compute_log_probs(self, prompt_ids, response_ids, with_entropy: bool = False):
        with self.policy.model.disable_adapter():
            return self.policy.compute_log_probs(prompt_ids, response_ids, with_entropy)


def vocab_kernels(compiled: bool, vocab: int, dtype: torch.dtype) -> RowKernels:
    """The log-prob and entropy kernels over the vocabulary (packed_logprobs.py), compiled when `compiled`
    (policy.torch_compile): then compiled at start-up on a small chunk, so a toolchain that cannot compile fails
    here in one line, before any rollout."""
    kernels = row_kernels(compiled)
    if not compiled:
        return kernels
    try:
        warm_up(kernels, vocab, dtype, device())
    except Exception as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise RuntimeError(
            f"policy.torch_compile=true: torch.compile of the log-prob kernels failed ({type(err).__name__}:"
            f" {first[:200]}); install what it names (a C++ compiler on CPU, Triton on GPU) or set"
            " policy.torch_compile=false"
        ) from None
    return kernels


def _lr_lambda(schedule: str, warmup: int, total: int) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        if schedule == "cosine":
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0

    return factor
