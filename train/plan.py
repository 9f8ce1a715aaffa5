"""`python -m train.plan experiment=X [preset=paper] [world_size=N] [gpu=h100|h200|a100-80g] [mfu=0.4]
[decode_bw=0.6] [gpus_per_node=8] [key=value ...]`

Per-GPU memory and step time of a training config, before a GPU is ever asked for. Refuses (exit status 1)
a config that cannot fit and names what to change. Formulas (bytes per GPU; P parameters, W ranks):

- policy state, FSDP2 full sharding with fp32 master weights and AdamW: weights 4P/W + gradients 4P/W +
  AdamW moments 8P/W = 16P/W during the update (the "16 bytes per parameter" of mixed-precision Adam in ZeRO,
  Rajbhandari et al. 2020, sec. 3.1; tests/test_plan.py reproduces their Figure 1: 7.5 B parameters, 120 GB
  on one GPU, 1.9 GB each over 64); the gradients are freed after the optimizer step, so the rollout and the
  log-prob passes hold 12P/W; `policy.cpu_offload` moves all of it to host memory.
- unsharded layers during compute: two decoder layers at the compute dtype (the one running and the one
  FSDP2 prefetches).
- activations of one micro-batch of T = policy.micro_batch_tokens tokens through a Llama/Qwen block,
  elements saved for backward per token per layer: 4h (residual, two norms' inputs/outputs) + 4·H·d
  (q, rotated q, attention output, o_proj input) + 4·K·d (k, v, rotated k, cache) + 4·I (gate, up,
  SiLU(gate), product), times the compute dtype's bytes; SDPA/flash attention keeps no s x s scores
  (the 5·a·s/h term of Korthikanti et al. 2022, "Reducing Activation Recomputation", eq. 2, is absent).
  With `policy.gradient_checkpointing` only each layer's input (h per token) is kept, plus one
  layer's full activations while it is recomputed.
- logits: T x vocab at the compute dtype, twice (the logits and their gradient; log-probs are computed on
  the micro-batch's packed tokens, so this is bounded by micro_batch_tokens whatever the rows' lengths).
- attention: no T x T tensor on a GPU (variable-length flash / flex attention); `dense_attention` adds the
  (1, 1, T, T) boolean mask of the CPU path.
- old / reference log-prob passes (no grad): one layer's activations, the hidden states and the logits of
  one micro-batch; the frozen reference (KL) adds its fp32 weights, sharded (4P/W).
- micro-batches are built and moved to the device one at a time: one micro-batch's tensors are live.
- vLLM during the rollout: `rollout.engine.gpu_memory_utilization` x GPU memory (weights 2P/TP in bf16, its activations, the
  rest KV cache at 2·layers·K·d·bytes per token / TP); from the end of generation (before the log-prob
  passes) to the next rollout, with `rollout.engine.sleep_level` 1 or 2, only a residual (CUDA graph pool, ~1 GiB) stays.
  verl's performance-tuning guide (docs/perf/perf_tuning.rst): since vLLM 0.7 an instance uses
  gpu_memory_utilization of the TOTAL memory, which is how it is counted here.

Update time: 2·N per generated or prefilled token, 6·N per trained token (Kaplan et al. 2020), N =
non-embedding parameters plus the LM head, and causal attention terms (train/flops.py), plus one forward
per old/reference log-prob pass and, with gradient checkpointing, the recomputed forward (8·N per trained
token in all); over W GPUs at a stated MFU (`mfu=`, default 0.4).

Generation time (`generation_time`): decode is bound by memory bandwidth and KV capacity, not FLOPs. Each
decode step streams the weights and the KV cache in use from HBM (datasheet bandwidth x `decode_bw=`, default
0.6, an assumption) and emits one token per sequence in flight; the sequences in flight are those the KV
cache holds at the mean context (prompt + response/2). E.g. Qwen3-4B at gpu_memory_utilization=0.5 on an
H100: 31 GiB of KV = 228k tokens = ~50 sequences of 4.6k mean context against 256 requests per rank, so a
rank decodes ~5 waves of 8192 steps. Prefill is compute-bound at `mfu`. How close: not yet checked
against a measurement or a published figure at this shape (none was found; bench/gpu_check.py on a GPU is
where to check it); `decode_bw` is the knob to calibrate.

`startup_problems`: what fits but would not start (a judge server on the loopback of a node whose GPUs all
train; a classifier judge without a tokenizer folder), each refused with its fix.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

GIB = 2**30

# usable memory as the driver reports it (nvidia-smi MiB), dense bf16 tensor-core peak and HBM bandwidth
# (NVIDIA datasheets, SXM: H100 3.35 TB/s HBM3, H200 4.8 TB/s HBM3e, A100 80GB 2.039 TB/s HBM2e)
# and the links a weight sync crosses, one direction: NVLink (H100/H200 SXM 900 GB/s, A100 600 GB/s, both
# ways) and the host's PCIe x16 (Gen5 128 GB/s, Gen4 64 GB/s, both ways)
GPUS = {
    "h100": {"memory_gib": 81559 / 1024, "bf16_tflops": 989.4, "fp32_tflops": 66.9, "hbm_tbps": 3.35,
             "nvlink_gbps": 450.0, "pcie_gbps": 64.0},
    "h200": {"memory_gib": 143771 / 1024, "bf16_tflops": 989.4, "fp32_tflops": 66.9, "hbm_tbps": 4.8,
             "nvlink_gbps": 450.0, "pcie_gbps": 64.0},
    "a100-80g": {"memory_gib": 81920 / 1024, "bf16_tflops": 312.0, "fp32_tflops": 19.5, "hbm_tbps": 2.039,
                 "nvlink_gbps": 300.0, "pcie_gbps": 32.0},
}  # fmt: skip
# Share of the HBM bandwidth a decode step streams at (weights + the KV cache it reads). An assumption, not a
# measurement: memory-bound kernels reach ~60-80% of peak; `decode_bw=` overrides it.
DECODE_BW_EFFICIENCY = 0.6
CONTEXT_GIB = 1.0  # CUDA context, NCCL buffers, allocator fragmentation: kept free
VLLM_ASLEEP_GIB = 1.0  # what a sleeping vLLM engine keeps (CUDA graph pool)

# Published configs of models the presets name, for planning without the weights at hand
# (Qwen3-4B-Base: huggingface.co/Qwen/Qwen3-4B-Base config.json; card: 4.0B parameters, 3.6B non-embedding).
KNOWN_MODELS: dict[str, dict] = {
    "Qwen3-4B-Base": {
        "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": True,
    },
    # Qwen3-4B (the instruct model, tool_math_grpo's paper preset) has Qwen3-4B-Base's shapes (its config.json)
    # Llama-3.1-8B-Instruct and Qwen3-0.6B: their config.json on huggingface.co (meta-llama/..., Qwen/...)
    "Llama-3.1-8B-Instruct": {
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "tie_word_embeddings": False,
    },
    "Qwen3-0.6B": {
        "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": True,
    },
    "SmolLM2-135M-Instruct": {
        "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152, "tie_word_embeddings": True,
    },
}  # fmt: skip


@dataclass(frozen=True)
class Arch:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool

    @classmethod
    def from_config(cls, c: dict) -> Arch:
        heads = c["num_attention_heads"]
        return cls(
            hidden=c["hidden_size"],
            intermediate=c["intermediate_size"],
            layers=c["num_hidden_layers"],
            heads=heads,
            kv_heads=c.get("num_key_value_heads") or heads,
            head_dim=c.get("head_dim") or c["hidden_size"] // heads,
            vocab=c["vocab_size"],
            tied=bool(c.get("tie_word_embeddings", False)),
        )

    def layer_params(self) -> int:
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return h * q + 2 * h * kv + q * h + 3 * h * self.intermediate + 2 * h

    def lora_params(self, rank: int, targets) -> int:
        """Adapter parameters of rank r on the named linear layers: r x (in + out) each, every layer."""
        h, q, kv, i = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.intermediate,
        )
        shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                  "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}  # fmt: skip
        names = set(shapes) if "all-linear" in targets else set(targets) & set(shapes)
        return self.layers * sum(rank * (a + b) for n, (a, b) in shapes.items() if n in names)

    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def params(self) -> int:
        """All parameters, tied embeddings counted once."""
        head = 0 if self.tied else self.embedding_params()
        return self.layers * self.layer_params() + self.embedding_params() + head + self.hidden

    def non_embedding_params(self) -> int:
        return self.layers * self.layer_params() + self.hidden


@dataclass(frozen=True)
class Workload:
    world_size: int
    samples_per_step: int  # prompts x n
    n: int
    prompt_tokens: int  # per prompt (planning figure)
    response_tokens: int  # per sample (planning figure: the max_new_tokens bound)
    micro_batch_tokens: int
    updates_per_step: int  # ppo_epochs x mini-batches (optimizer steps)
    epochs: int  # passes over the step's samples (ppo_epochs)
    old_logprob_pass: bool  # an extra forward for the old log-probs
    ref_pass: bool  # the frozen reference's forward (KL)
    shared_prompts: bool
    compute_bytes: int  # 2 (bf16) or 4 (fp32)
    gradient_checkpointing: bool
    cpu_offload: bool
    gpu_memory_utilization: float
    tensor_parallel_size: int
    sleep_level: int
    max_model_len: int
    engine: str = "vllm"  # vllm | hf_generate (HF generate keeps a bf16 copy of the model and no sleep mode)
    lora_rank: int = 0  # policy.lora.rank: > 0 = the base frozen at the compute dtype, adapters train
    lora_targets: tuple[str, ...] = ()
    dense_attention: bool = False  # a (T, T) mask per micro-batch (SDPA with a mask: the CPU path); False on
    # GPU, where attention is variable-length (flash / flex) and keeps no T x T tensor


def memory(arch: Arch, w: Workload, gpu_gib: float) -> dict[str, float]:
    """Bytes per GPU of each component (see the module docstring), in GiB."""
    out = _state_bytes(arch, w) | _micro_batch_bytes(arch, w) | _engine_bytes(arch, w, gpu_gib)
    state = out["base_frozen"] + out["params_fp32"] + out["grads_fp32"] + out["adamw_fp32"]
    activations = out["activations_ckpt"] if w.gradient_checkpointing else out["activations_no_ckpt"]
    # the engine sleeps from the end of generation (before any log-prob pass) until the next rollout;
    # micro-batches go to the device one at a time, so only one micro-batch's tensors are live
    resident = state + out["ref_params_fp32"] + out["unsharded_layers"] + out["unsharded_root"]
    resident += out["vllm_asleep"] + CONTEXT_GIB * GIB
    out["update_growth"] = (  # what one micro-batch's forward + backward allocates above `resident`
        out["root_gradient"]
        + activations
        + out["logits"]
        + out["logprob_temporaries"]
        + out["attention_mask"]
    )
    out["peak_update"] = resident + out["update_growth"]
    # gradients live from the update's first backward to its optimizer step (Policy.train_step frees them),
    # so the log-prob passes and the rollout hold the weights and AdamW state only
    out["peak_logprobs"] = (
        resident - out["grads_fp32"] + out["logprob_pass"] if (w.old_logprob_pass or w.ref_pass) else 0.0
    )
    out["peak_rollout"] = (
        state - out["grads_fp32"] + out["ref_params_fp32"] + out["vllm_rollout"] + CONTEXT_GIB * GIB
    )
    return {k: v / GIB for k, v in out.items()}


def _state_bytes(arch: Arch, w: Workload) -> dict[str, float]:
    """The weights, gradients and AdamW state each GPU holds, the unsharded layers, and the weight sync."""
    P, W, b = arch.params(), w.world_size, w.compute_bytes
    # under LoRA the trained parameters are the adapters' A; the base (P) is frozen at the compute dtype, sharded,
    # with no gradient and no AdamW state, and it is the KL reference too (adapters disabled: no second copy)
    A = arch.lora_params(w.lora_rank, w.lora_targets) if w.lora_rank else 0
    trained = A if w.lora_rank else P
    offload = 0.0 if w.cpu_offload else 1.0
    return {
        "base_frozen": offload * b * P / W if w.lora_rank else 0.0,
        "params_fp32": offload * 4.0 * trained / W,
        "grads_fp32": offload * 4.0 * trained / W,
        "adamw_fp32": offload * 8.0 * trained / W,
        "unsharded_layers": 2.0 * (arch.layer_params() + A / max(arch.layers, 1)) * b,
        # the root FSDP group (token embedding, LM head when untied, final norm): all-gathered at the compute
        # dtype through the forward and backward, and its unsharded gradient before the fp32 reduce-scatter
        # (frozen under LoRA: no gradient)
        "unsharded_root": (P - arch.layers * arch.layer_params()) * b,
        "root_gradient": 0.0 if w.lora_rank else (P - arch.layers * arch.layer_params()) * 4.0,
        # bytes each step's weight sync hands the engine: the fp32 adapter, or every weight in bf16
        "weight_sync": 4.0 * A if w.lora_rank else 2.0 * P,
    }


def _micro_batch_bytes(arch: Arch, w: Workload) -> dict[str, float]:
    """What one micro-batch's forward and backward allocate, the reference policy, and a no-grad log-prob pass."""
    P, W, b = arch.params(), w.world_size, w.compute_bytes
    h, q, kv, i = arch.hidden, arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim, arch.intermediate
    per_token_layer = (4 * h + 4 * q + 4 * kv + 4 * i) * b
    T = w.micro_batch_tokens
    out = {
        "activations_no_ckpt": T * arch.layers * per_token_layer,
        "activations_ckpt": T * arch.layers * h * b + T * per_token_layer,
        "logits": 2.0 * T * arch.vocab * b,
        # the log-prob kernel's fp32 maths, a chunk of positions at a time: one fp32 chunk in the forward, one in
        # the backward (-softmax x g is formed in place on it; train/policy/packed_logprobs.py)
        "logprob_temporaries": 1.0 * min(T, logprob_chunk_rows(arch.vocab)) * arch.vocab * 4,
        "attention_mask": float(T * T) if w.dense_attention else 0.0,  # bool (1, 1, T, T)
        # the frozen reference policy (KL): fp32 weights, sharded, no gradients or optimizer
        "ref_params_fp32": 4.0 * P / W if (w.ref_pass and not w.cpu_offload and not w.lora_rank) else 0.0,
    }
    # a no-grad forward (old / reference log-probs): one layer's activations live at a time, the hidden
    # states between layers, and the micro-batch's logits (log-probs computed on the packed tokens)
    out["logprob_pass"] = (
        T * per_token_layer
        + 2.0 * T * h * b
        + T * arch.vocab * b
        + out["logprob_temporaries"]
        + out["attention_mask"]
    )
    return out


def _engine_bytes(arch: Arch, w: Workload, gpu_gib: float) -> dict[str, float]:
    """The rollout engine's weights and KV cache while it generates, and what it keeps while it sleeps."""
    weights = 2.0 * arch.params() / w.tensor_parallel_size
    if w.engine == "hf_generate":  # its own model copy, and the batch's KV cache while it generates
        per_rank = w.samples_per_step // w.world_size
        kv = per_rank * (w.prompt_tokens + w.response_tokens) * kv_bytes_per_token(arch, 1)
        return {
            "vllm_weights": weights,
            "vllm_rollout": weights + kv,
            "vllm_kv_cache": kv,
            "vllm_asleep": weights,
        }
    rollout = w.gpu_memory_utilization * gpu_gib * GIB
    return {
        "vllm_weights": weights,
        "vllm_rollout": rollout,
        "vllm_kv_cache": max(0.0, rollout - weights - 1.0 * GIB),
        "vllm_asleep": VLLM_ASLEEP_GIB * GIB if w.sleep_level else rollout,
    }


LOGPROB_CHUNK_ELEMENTS = (
    2**25
)  # fp32 values per chunk of the log-prob kernel (train/policy/packed_logprobs.py)


def logprob_chunk_rows(vocab: int) -> int:
    """Positions per chunk of the log-prob kernel's fp32 maths (about LOGPROB_CHUNK_ELEMENTS values)."""
    return max(1, LOGPROB_CHUNK_ELEMENTS // max(vocab, 1))


def kv_bytes_per_token(arch: Arch, tp: int) -> float:
    """K and V of every layer for one token, bf16, on one GPU of a TP group."""
    return 2.0 * arch.layers * arch.kv_heads * arch.head_dim * 2 / tp


def step_flops(arch: Arch, w: Workload) -> dict[str, float]:
    """Generation and update FLOPs of one whole step (all ranks), with bench/train_step.py's counts."""
    from train.flops import ModelDims, StepWork, generation_flops, training_flops

    body = arch.non_embedding_params()
    dims = ModelDims(body, arch.hidden, arch.vocab, arch.layers, arch.heads * arch.head_dim)
    prompts = w.samples_per_step // w.n
    work = StepWork([w.prompt_tokens] * prompts, [w.response_tokens] * w.samples_per_step, w.n)
    train = training_flops(dims, work, w.shared_prompts)
    forward_only = train / 3.0 * (int(w.old_logprob_pass) + int(w.ref_pass))
    # gradient checkpointing runs every layer's forward again in the backward: 4 forwards' worth, not 3
    recompute = train / 3.0 * w.epochs if w.gradient_checkpointing else 0.0
    if w.lora_rank:  # no weight gradients of the frozen base: forward + input gradients, 4N per token of 6N
        train *= 2.0 / 3.0
    return {
        "generation": generation_flops(dims, work),
        "update": train * w.epochs + forward_only + recompute,
        "recompute": recompute,
        "logprob_passes": forward_only,
    }


def generation_time(
    arch: Arch, w: Workload, mem: dict[str, float], spec: dict, bw_eff: float, mfu: float
) -> dict:
    """Seconds of one step's generation on each engine, decode priced by memory traffic and KV capacity.

    Each engine (a TP group) serves samples_per_step x TP / world requests. With continuous batching the
    sequences in flight are limited by the KV cache: at a mean context of prompt + response/2 tokens it holds
    `concurrency` of them. Every decode step streams the weights (2P/TP bytes) and the KV cache in use
    (concurrency x mean context x KV bytes per token) from HBM at `bw_eff` of its bandwidth, and emits one
    token per sequence in flight; requests x response / concurrency steps finish the batch. Prefill is
    compute-bound (2N FLOPs per prompt token, prefix-cached once per group) at `mfu` of the dense peak.
    """
    tp = w.tensor_parallel_size
    requests = w.samples_per_step * tp / w.world_size
    per_token = kv_bytes_per_token(arch, tp)
    kv_tokens = mem["vllm_kv_cache"] * GIB / per_token if mem["vllm_kv_cache"] > 0 else 0.0
    mean_context = w.prompt_tokens + w.response_tokens / 2.0
    concurrency = max(1.0, min(requests, kv_tokens / mean_context)) if kv_tokens else 1.0
    step_bytes = 2.0 * arch.params() / tp + concurrency * mean_context * per_token
    step_s = step_bytes / (spec["hbm_tbps"] * 1e12 * bw_eff)
    # the step's matmuls at the dense peak: decode stays bandwidth-bound while this is the smaller
    step_compute_s = (
        2.0
        * (arch.non_embedding_params() + arch.embedding_params())
        / tp
        * concurrency
        / (spec["bf16_tflops"] * 1e12 * mfu)
    )
    steps = requests * w.response_tokens / concurrency
    prefill_s = (
        2.0
        * arch.non_embedding_params()
        * (requests / w.n)
        * w.prompt_tokens
        / tp
        / (spec["bf16_tflops"] * 1e12 * mfu)
    )
    decode_s = steps * max(step_s, step_compute_s)
    return {
        "requests": requests, "kv_tokens": kv_tokens, "concurrency": concurrency, "step_ms": 1e3 * step_s,
        "tokens_per_s": concurrency / max(step_s, step_compute_s), "decode_s": decode_s,
        "prefill_s": prefill_s, "total_s": decode_s + prefill_s,
    }  # fmt: skip


def response_budget(cfg) -> int:
    """Response tokens per sample: rollout.max_new_tokens, or with tools / an environment (env.*) the whole
    multi-turn trajectory's budget, model and environment turns together (what the update trains on)."""
    from train.env.registry import enabled

    env = cfg.get("env")
    if not enabled(env):
        return int(cfg.rollout.max_new_tokens)
    return int(env.get("max_total_tokens") or env.get("max_turns", 4) * cfg.rollout.max_new_tokens)


def workload_from_config(cfg, plan_prompt_tokens: int | None = None) -> Workload:
    from train.rollout.vllm_engine import sleep_level_under_lora

    algo, pol, r = cfg.algorithm, cfg.policy, cfg.rollout
    mini = algo.ppo_mini_batch_size or cfg.data.prompts_per_step
    updates = algo.ppo_epochs * (cfg.data.prompts_per_step // mini)
    precision = "bf16" if pol.precision in ("bf16", "auto") else "fp32"  # auto picks bf16 on GPUs
    engine = vllm_settings(r.engine)
    return Workload(
        world_size=cfg.world_size,
        samples_per_step=cfg.data.prompts_per_step * r.n,
        n=r.n,
        prompt_tokens=plan_prompt_tokens or max(1, cfg.data.max_prompt_tokens // 2),
        response_tokens=response_budget(cfg),
        micro_batch_tokens=pol.micro_batch_tokens,
        updates_per_step=updates,
        epochs=algo.ppo_epochs,
        old_logprob_pass=updates > 1,
        ref_pass=bool(algo.use_kl_loss or algo.use_kl_in_reward),
        shared_prompts=bool(pol.share_prompts and not pol.pack_sequences),
        compute_bytes=2 if precision == "bf16" else 4,
        gradient_checkpointing=bool(pol.gradient_checkpointing),
        cpu_offload=bool(pol.cpu_offload),
        gpu_memory_utilization=engine["gpu_memory_utilization"],
        tensor_parallel_size=engine["tensor_parallel_size"],
        sleep_level=sleep_level_under_lora(engine["sleep_level"], pol.lora.rank),
        max_model_len=engine["max_model_len"],
        engine="hf_generate" if str(r.engine.get("_target_", "")).endswith("HFEngine") else "vllm",
        lora_rank=int(pol.lora.rank),
        lora_targets=tuple(pol.lora.target_modules),
    )


def vllm_settings(engine_cfg) -> dict:
    """The vLLM engine's settings the plan reads: `rollout.engine.<key>` as configured, else the
    VLLMEngine constructor's defaults (an HF engine plans as `hf_generate` and ignores them)."""
    import inspect

    from train.rollout.vllm_engine import VLLMEngine

    defaults = {k: p.default for k, p in inspect.signature(VLLMEngine).parameters.items()}
    return {k: engine_cfg.get(k, defaults[k]) for k in defaults if k != "model_path"}


def arch_of(model_path: str) -> tuple[Arch, str]:
    """The architecture from the model folder's config.json, else from KNOWN_MODELS by name."""
    from infra.models import ModelNotFoundError, resolve_model_path

    try:
        folder = resolve_model_path(model_path)
        return Arch.from_config(json.loads((Path(folder) / "config.json").read_text())), str(folder)
    except (ModelNotFoundError, FileNotFoundError):
        name = Path(model_path).name
        if name in KNOWN_MODELS:
            return Arch.from_config(KNOWN_MODELS[name]), f"{name} (published config; folder not here)"
        raise SystemExit(
            f"error: model.path={model_path!r}: no config.json there and not a known model "
            f"({', '.join(KNOWN_MODELS)}): pass model.path=<HF folder>"
        ) from None


def problems(arch: Arch, w: Workload, mem: dict[str, float], gpu_gib: float) -> list[str]:
    """Why the config cannot run, each with what to change (empty when it fits)."""
    out = []
    usable = gpu_gib
    if mem["peak_rollout"] > usable:
        room = usable - mem["peak_rollout"] + w.gpu_memory_utilization * gpu_gib
        out.append(
            f"rollout needs {mem['peak_rollout']:.1f} GiB > {usable:.1f} GiB: lower rollout.engine.gpu_memory_utilization"
            f" to <= {max(room, 0) / gpu_gib:.2f}, set policy.cpu_offload=true, or raise world_size"
        )
    if mem["peak_update"] > usable:
        over = mem["peak_update"] - usable
        fixes = []
        if not w.gradient_checkpointing:
            fixes.append(
                f"policy.gradient_checkpointing=true (-{mem['activations_no_ckpt'] - mem['activations_ckpt']:.1f} GiB)"
            )
        per_token = (
            mem["activations_ckpt" if w.gradient_checkpointing else "activations_no_ckpt"] + mem["logits"]
        )
        per_token /= w.micro_batch_tokens
        fit = int((per_token * w.micro_batch_tokens - over) / per_token) if per_token else 0
        if fit > 0:
            fixes.append(f"policy.micro_batch_tokens<={fit}")
        if not w.cpu_offload:
            fixes.append("policy.cpu_offload=true")
        if not w.sleep_level:
            fixes.append("rollout.engine.sleep_level=2")
        fixes.append("a larger world_size")
        out.append(f"update needs {mem['peak_update']:.1f} GiB > {usable:.1f} GiB: " + ", or ".join(fixes))
    if mem["vllm_kv_cache"] <= 0:
        out.append(
            f"vLLM gets no KV cache: its {mem['vllm_rollout']:.1f} GiB do not cover the weights "
            f"({mem['vllm_weights']:.1f} GiB): raise rollout.engine.gpu_memory_utilization or rollout.engine.tensor_parallel_size"
        )
    else:
        seq = w.max_model_len * kv_bytes_per_token(arch, w.tensor_parallel_size) / GIB
        if seq > mem["vllm_kv_cache"]:
            out.append(
                f"vLLM's KV cache ({mem['vllm_kv_cache']:.1f} GiB) holds less than one sequence of "
                f"rollout.engine.max_model_len={w.max_model_len} ({seq:.1f} GiB): raise rollout.engine.gpu_memory_utilization "
                "or rollout.engine.tensor_parallel_size"
            )
    return out


LOOPBACK = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def _servers(node, path: str = "reward") -> list[tuple[str, dict]]:
    """(config path, node) of every component under `reward` that talks to a server (`base_url`)."""
    from omegaconf import DictConfig, ListConfig

    found = []
    if isinstance(node, DictConfig):
        if "base_url" in node:
            found.append((path, node))
        for key in node:
            found += _servers(node[key], f"{path}.{key}")
    elif isinstance(node, ListConfig):
        for i, item in enumerate(node):
            found += _servers(item, f"{path}.{i}")
    return found


def startup_problems(cfg, gpus_per_node: int = 8) -> list[str]:
    """What would stop the run at start although it fits, each with the fix: a judge server on this node's
    loopback when every GPU of the node trains (the server has no GPU to run on), a classifier judge with
    only a served model name for its tokenizer (the pair text needs the checkpoint's [CLS]/[SEP])."""
    from urllib.parse import urlparse

    out = []
    for path, node in _servers(cfg.get("reward")):
        target = str(node.get("_target_", ""))
        host = urlparse(str(node.base_url)).hostname or ""
        if host in LOOPBACK and cfg.world_size >= gpus_per_node:
            out.append(
                f"{path}.base_url={node.base_url} is this node, whose {gpus_per_node} GPUs all train "
                f"(world_size={cfg.world_size}): serve the judge on another node (`vllm serve CKPT --runner "
                f"pooling --port PORT`) and pass {path}.base_url=http://HOST:PORT"
            )
        if target.endswith("VLLMClassifyJudge") and not node.get("tokenizer"):
            model = str(node.get("model", ""))
            if not (Path(model).is_absolute() or model.startswith(".")):
                out.append(
                    f"{path}.model={model!r} is a served name, not a checkpoint folder, and {path}.tokenizer "
                    f"is unset: pass {path}.tokenizer=<local folder of the classifier checkpoint>"
                )
    return out


def report(
    cfg, gpu: str, mfu: float, decode_bw: float, prompt_tokens: int | None = None, gpus_per_node: int = 8
) -> tuple[str, bool]:
    """The printed plan and whether the config fits (and can start)."""
    spec = GPUS[gpu]
    arch, where = arch_of(cfg.model.path)
    w = workload_from_config(cfg, prompt_tokens)
    mem = memory(arch, w, spec["memory_gib"])
    gen = generation_time(arch, w, mem, spec, decode_bw, mfu)
    lines = [
        *_header_lines(cfg, gpu, spec, arch, where, w),
        "",
        *_memory_rows(arch, w, mem, gen["kv_tokens"]),
        "",
        *_time_lines(cfg, spec, arch, w, mem, gen, mfu, decode_bw),
    ]
    bad = problems(arch, w, mem, spec["memory_gib"])
    blocked = startup_problems(cfg, gpus_per_node)
    lines.append("")
    lines += [f"DOES NOT FIT: {p}" for p in bad] if bad else ["fits"]
    lines += [f"CANNOT START: {p}" for p in blocked]
    return "\n".join(lines), not bad and not blocked


def _header_lines(cfg, gpu: str, spec: dict, arch: Arch, where: str, w: Workload) -> list[str]:
    """The run, the model and the step planned."""
    return [
        f"plan: {cfg.experiment} on {w.world_size} x {gpu} ({spec['memory_gib']:.1f} GiB, "
        f"{spec['bf16_tflops']:.0f} TFLOP/s bf16 dense each)",
        f"model: {where}: {arch.params() / 1e9:.3f} B parameters ({arch.non_embedding_params() / 1e9:.3f} B "
        f"non-embedding), {arch.layers} layers, hidden {arch.hidden}, vocab {arch.vocab}",
        f"step: {w.samples_per_step} samples ({w.samples_per_step // w.n} prompts x {w.n}), planned at "
        f"{w.prompt_tokens} prompt + {w.response_tokens} response tokens; {w.updates_per_step} update(s); "
        f"{'bf16' if w.compute_bytes == 2 else 'fp32'} compute; micro-batch {w.micro_batch_tokens} tokens",
    ]


def _memory_rows(arch: Arch, w: Workload, mem: dict[str, float], kv_tokens: float) -> list[str]:
    """Memory per GPU, one row a component, then the engine's rows and the peaks."""
    return [
        "memory per GPU (GiB): allocated (live tensors, what torch.cuda.max_memory_allocated reports); the "
        "allocator reserves more (fixed segments: reserved / planned 1.09-1.20 measured at 6 layers, README), "
        "less with the expandable segments the policy trains in (train/policy/segments.py)",
        *(
            [
                row(
                    f"LoRA: frozen base, {'bf16' if w.compute_bytes == 2 else 'fp32'} (sharded)",
                    mem["base_frozen"],
                    f"rank {w.lora_rank}: {arch.lora_params(w.lora_rank, w.lora_targets) / 1e6:,.1f} M adapter parameters",
                )
            ]
            if w.lora_rank
            else []
        ),
        row(
            f"{'adapter ' if w.lora_rank else ''}parameters fp32 (sharded 1/{w.world_size})",
            mem["params_fp32"],
            "cpu_offload: on the host" if w.cpu_offload else "",
        ),
        row("gradients fp32 (sharded)", mem["grads_fp32"]),
        row("AdamW moments fp32 (sharded)", mem["adamw_fp32"]),
        row("unsharded layers (2, compute dtype)", mem["unsharded_layers"]),
        row("unsharded embedding/head (+ fp32 gradient)", mem["unsharded_root"] + mem["root_gradient"]),
        row(
            "activations, no checkpointing",
            mem["activations_no_ckpt"],
            "" if w.gradient_checkpointing else "<- used",
        ),
        row(
            "activations, with checkpointing",
            mem["activations_ckpt"],
            "<- used" if w.gradient_checkpointing else "",
        ),
        row("logits + their gradient (one micro-batch)", mem["logits"]),
        row("log-prob kernel's fp32 chunk (forward or backward)", mem["logprob_temporaries"]),
        row(
            "attention mask (dense only)", mem["attention_mask"], "" if w.dense_attention else "varlen: none"
        ),
        row(
            "reference policy fp32 (sharded)",
            mem["ref_params_fp32"],
            "LoRA: the base, adapters off" if w.lora_rank else ("" if w.ref_pass else "no KL: none"),
        ),
        row("old/ref log-prob pass (one micro-batch)", mem["logprob_pass"]),
        *_engine_rows(w, mem, kv_tokens),
    ]


def _engine_rows(w: Workload, mem: dict[str, float], kv_tokens: float) -> list[str]:
    """The engine while it generates and while the policy updates, then the peaks of the rollout, log-prob
    passes and update."""
    act = (
        "activations with checkpointing" if w.gradient_checkpointing else "activations without checkpointing"
    )
    engine_label = (
        f"vLLM at gpu_memory_utilization={w.gpu_memory_utilization:.2f}"
        if w.engine == "vllm"
        else "HF engine"
    )
    return [
        row(
            engine_label,
            mem["vllm_rollout"],
            f"weights {mem['vllm_weights']:.2f}, KV cache {mem['vllm_kv_cache']:.2f}"
            + (
                f" = {kv_tokens:,.0f} tokens = {kv_tokens / max(w.max_model_len, 1):.1f} sequences of {w.max_model_len}"
                if w.engine == "vllm"
                else ""
            ),
        ),
        row(
            f"engine in the update{'' if w.engine == 'hf_generate' else f' (sleep_level={w.sleep_level})'}",
            mem["vllm_asleep"],
        ),
        row("peak in the rollout", mem["peak_rollout"]),
        row("peak in the log-prob passes (engine asleep)", mem["peak_logprobs"]),
        row("peak in the update", mem["peak_update"], act),
    ]


def _time_lines(
    cfg, spec: dict, arch: Arch, w: Workload, mem: dict[str, float], gen: dict, mfu: float, decode_bw: float
) -> list[str]:
    """FLOPs, generation and update time per step, the weight sync, and the work at risk between saves."""
    flops = step_flops(arch, w)
    peak = (spec["bf16_tflops"] if w.compute_bytes == 2 else spec["fp32_tflops"]) * 1e12
    t_update = flops["update"] / (w.world_size * peak * mfu)
    t_gen = gen["total_s"]
    sync = sync_seconds(w, mem["weight_sync"] * GIB, spec)
    kv_tokens = gen["kv_tokens"]
    return [
        f"FLOPs per step: generation {flops['generation'] / 1e12:,.1f} TFLOP, update {flops['update'] / 1e12:,.1f} "
        f"TFLOP (of which checkpointing's recompute {flops['recompute'] / 1e12:,.1f}, old/ref log-prob passes "
        f"{flops['logprob_passes'] / 1e12:,.1f})",
        f"generation per engine: {gen['requests']:.0f} requests, {gen['concurrency']:.1f} in flight (KV cache "
        f"{kv_tokens:,.0f} tokens / {w.prompt_tokens + w.response_tokens / 2:,.0f} mean context), decode step "
        f"{gen['step_ms']:.1f} ms at {decode_bw:.2f} x {spec['hbm_tbps']} TB/s = {gen['tokens_per_s']:,.0f} tokens/s; "
        f"decode {gen['decode_s']:.3g} s + prefill {gen['prefill_s']:.3g} s",
        f"time per step: update {t_update:.3g} s at MFU {mfu:.2f} + generation {t_gen:.3g} s (bandwidth- and "
        f"KV-bound) = {t_update + t_gen:.3g} s ({(t_update + t_gen) * cfg.total_steps / 3600:.3g} h for "
        f"{cfg.total_steps} steps)",
        f"weight sync per step: {mem['weight_sync'] * GIB / 1e6:,.1f} MB "
        + ("(the LoRA adapter, fp32)" if w.lora_rank else "(every weight, bf16)")
        + f", {sync['total_s']:.2g} s at datasheet rates (all-gather over NVLink {sync['gather_s']:.2g} s"
        + (f", host->GPU over PCIe {sync['host_s']:.2g} s under cpu_offload" if sync["host_s"] else "")
        + f", engine copy {sync['engine_s']:.2g} s; not in the step time above)",
        at_risk_line(cfg.get("save_every", 0), t_update + t_gen, cfg.total_steps),
    ]


def sync_seconds(w: Workload, sync_bytes: float, spec: dict) -> dict[str, float]:
    """Seconds of one weight sync at the datasheet link rates (a floor: no launch or engine overheads).

    Each parameter is gathered in the engine's dtype by NCCL (Policy.full_weights): a ring all-gather
    brings every rank the (W-1)/W of the bytes it lacks over NVLink; under `policy.cpu_offload` each rank
    first copies its 1/W share of the shards from the host over PCIe; the engine then copies the bytes
    into its own weights in HBM (read and write)."""
    W = w.world_size
    offloaded = w.cpu_offload and not w.lora_rank
    out = {
        "gather_s": (W - 1) / W * sync_bytes / (spec["nvlink_gbps"] * 1e9),
        "host_s": sync_bytes / W / (spec["pcie_gbps"] * 1e9) if offloaded else 0.0,
        "engine_s": 2 * sync_bytes / (spec["hbm_tbps"] * 1e12),
    }
    out["total_s"] = sum(out.values())
    return out


def at_risk_line(save_every: int, step_s: float, total_steps: int) -> str:
    """How much work a kill (preemption, node failure, time limit) loses at most: the steps since the last
    checkpoint. `save_every` of the paper presets is set from this (about 2 h at most)."""
    every = save_every if save_every and save_every > 0 else total_steps
    return f"checkpoints: every {every} steps = {every * step_s / 3600:.2g} h of work at risk between saves"


def row(label: str, gib: float, note: str = "") -> str:
    return f"  {label:<44}{gib:9.2f}" + (f"   {note}" if note else "")


PLAN_KEYS = {
    "gpu": "h100",
    "mfu": "0.4",
    "decode_bw": str(DECODE_BW_EFFICIENCY),
    "prompt_tokens": "",
    "gpus_per_node": "8",
}
KNOWN_MODELS["Qwen3-4B"] = KNOWN_MODELS["Qwen3-4B-Base"]


def main(argv: list[str] | None = None) -> int:
    from train.config import ConfigError, build_config, split_cli

    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    own = {k: v for k, v in PLAN_KEYS.items()}
    rest = []
    for arg in argv:
        key = arg.split("=", 1)[0]
        if key in own and "=" in arg:
            own[key] = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    if own["gpu"] not in GPUS:
        print(f"error: gpu={own['gpu']!r}: expected one of {', '.join(GPUS)}", file=sys.stderr)
        return 2
    experiment, preset, overrides = split_cli(rest)
    try:
        cfg = build_config(experiment, overrides, preset)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text, fits = report(
        cfg, own["gpu"], float(own["mfu"]), float(own["decode_bw"]), int(own["prompt_tokens"] or 0) or None,
        int(own["gpus_per_node"]),
    )  # fmt: skip
    print(text)
    return 0 if fits else 1


if __name__ == "__main__":
    sys.exit(main())
