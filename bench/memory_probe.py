"""The policy's update and log-prob pass at the paper preset's shapes, measured against the planner.

    python -m bench.memory_probe [--shape qwen3-4b] [--layers 6] [--layouts shared,packed,unshared] [--out FILE]

A random model of the named shape (real vocabulary and tied embeddings, fewer layers so it fits one GPU
beside nothing else), bf16 with gradient checkpointing, one rank's batch of `--prompts` prompts of
`--prompt-len` tokens x `--group` responses whose lengths are long-tailed up to `--max-response` (one row
always reaches it). For each micro-batch layout (shared-prompt units, packed rows, plain padded rows) it runs
`Policy.compute_log_probs` and `Policy.train_step` twice, interleaved as in training (cold: compilation
included; warm, after an update, so AdamW's state is allocated: the figure) and
records peak allocated and reserved memory beside `train.plan.memory`'s prediction for the same workload,
time per micro-batch, attention time per layer against a causal flash-attention baseline over the same rows
(one call per sequence, the least any layout can do without sharing the prompt), and the device memory free
after the step (would the rollout engine's KV cache fit when it wakes up?). A layout that fails records its
error in one line and the next one still runs. On the CPU the peak is the live-tensor tracker's
(train/policy/memory.py) and the planner is asked for the dense-mask path; tests/test_memory_probe.py runs it so.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import json
import math
import signal
import tempfile
import time
from pathlib import Path

import torch

from infra.process_exit import exit_now
from train.plan import CONTEXT_GIB, GPUS, KNOWN_MODELS, VLLM_ASLEEP_GIB, Arch, Workload, memory

GIB = 2**30
SHAPES = {
    "qwen3-4b": KNOWN_MODELS["Qwen3-4B-Base"],
    "tiny": {  # the CPU test's: Qwen3's vocabulary, everything else small
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 151936, "tie_word_embeddings": True,
    },
}  # fmt: skip
LAYOUTS = {  # name -> (share_prompts, pack_sequences)
    "shared": (True, False),
    "packed": (False, True),
    "unshared": (False, False),
}


def response_lengths(count: int, max_len: int, seed: int = 0) -> list[int]:
    """Long-tailed lengths (log-normal, median max_len/8, sigma 1) clipped to [8, max_len]; the first row
    always reaches `max_len`, the case that decides a micro-batch's size."""
    g = torch.Generator().manual_seed(seed)
    mu = math.log(max(max_len / 8, 1))
    raw = torch.exp(mu + torch.randn(count, generator=g)).round().clamp(8, max_len).long().tolist()
    return [max_len, *raw[1:]]


def build_model(shape: dict, layers: int, max_len: int, folder: Path, device: torch.device) -> Path:
    """A random-initialised Qwen3 of `shape` with `layers` layers, saved in bf16."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(
        **{**shape, "num_hidden_layers": layers},
        max_position_embeddings=max(max_len, 4096),
        rope_theta=1_000_000.0,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    del model
    return folder


class AttentionTimer:
    """Wraps transformers' attention function of one implementation and sums its time (device events)."""

    def __init__(self, implementation: str, cuda: bool) -> None:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        self.registry, self.name, self.cuda = ALL_ATTENTION_FUNCTIONS, implementation, cuda
        self.inner = ALL_ATTENTION_FUNCTIONS[implementation]
        self.pairs: list = []

    def __enter__(self) -> AttentionTimer:
        def timed(*args, **kwargs):
            start = torch.cuda.Event(enable_timing=True) if self.cuda else time.perf_counter()
            if self.cuda:
                start.record()
            out = self.inner(*args, **kwargs)
            if self.cuda:
                end = torch.cuda.Event(enable_timing=True)
                end.record()
                self.pairs.append((start, end))
            else:
                self.pairs.append(time.perf_counter() - start)
            return out

        self.registry[self.name] = timed  # the instance's local mapping: removed again on exit
        return self

    def __exit__(self, *exc) -> None:
        del self.registry[self.name]

    def seconds(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            return sum(a.elapsed_time(b) for a, b in self.pairs) / 1e3
        return sum(self.pairs)


def causal_baseline_s(shape: dict, lengths: list[int], device: torch.device, dtype: torch.dtype) -> float:
    """One layer's attention over these sequences, each alone with `is_causal` SDPA (flash on a GPU)."""
    H, KV, D = shape["num_attention_heads"], shape["num_key_value_heads"], shape["head_dim"]
    g = torch.Generator(device=device).manual_seed(1)

    def run() -> None:
        for n in lengths:
            q = torch.randn(1, H, n, D, device=device, dtype=dtype, generator=g)
            k, v = (torch.randn(1, KV, n, D, device=device, dtype=dtype, generator=g) for _ in range(2))
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    run()  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    # the random inputs are drawn inside the timed region too: subtract drawing them alone
    t1 = time.perf_counter()
    for n in lengths:
        torch.randn(1, H, n, D, device=device, dtype=dtype, generator=g)
        torch.randn(2, KV, n, D, device=device, dtype=dtype, generator=g)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return max((t1 - t0) - (time.perf_counter() - t1), 0.0)


def _loss(mb, log_probs, entropy):
    return -(log_probs * mb.response_mask).sum() / 1e5, {}


def measure(fn, cuda: bool) -> tuple[object, float, float, float]:
    """(result, seconds, peak allocated GiB, peak reserved GiB) of one call."""
    from train.policy.memory import peak_tensor_bytes

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        s = time.perf_counter() - t0
        return out, s, torch.cuda.max_memory_allocated() / GIB, torch.cuda.max_memory_reserved() / GIB
    t0 = time.perf_counter()
    out, peak = peak_tensor_bytes(fn)
    return out, time.perf_counter() - t0, peak / GIB, float("nan")


def planned(arch: Arch, args, layout: str, cuda: bool) -> dict[str, float]:
    """The planner's peaks for this workload, without the parts the probe does not have (a sleeping engine,
    the CUDA context), so they compare with what the allocator saw."""
    w = Workload(
        world_size=1, samples_per_step=args.prompts * args.group, n=args.group, prompt_tokens=args.prompt_len,
        response_tokens=args.max_response, micro_batch_tokens=args.micro_batch_tokens, updates_per_step=1,
        epochs=1, old_logprob_pass=True, ref_pass=False, shared_prompts=layout == "shared",
        compute_bytes=2 if cuda else 4, gradient_checkpointing=True, cpu_offload=False,
        gpu_memory_utilization=args.gpu_memory_utilization, tensor_parallel_size=1, sleep_level=1,
        max_model_len=args.prompt_len + args.max_response, dense_attention=not cuda,
    )  # fmt: skip
    mem = memory(arch, w, GPUS[args.gpu]["memory_gib"])
    absent = VLLM_ASLEEP_GIB + CONTEXT_GIB
    return {"update_gib": mem["peak_update"] - absent, "logprobs_gib": mem["peak_logprobs"] - absent}


def trace_forwards(policy, layout: str, cuda: bool) -> None:
    """Prints each micro-batch's build time on the device (the shared-prompt block mask is made there) and
    its forward time (compilation shows up here first): where a layout stalls, the last line says which."""
    to_device = policy._on_device

    def traced_build(mb):
        t0 = time.perf_counter()
        out = to_device(mb)
        if cuda:
            torch.cuda.synchronize()
        print(f"  [{layout}] micro-batch {tuple(out.input_ids.shape)}: on the device in "
              f"{time.perf_counter() - t0:.2f}s", flush=True)  # fmt: skip
        return out

    policy._on_device = traced_build
    inner = policy._forward

    def traced(mb, *args, **kwargs):
        t0 = time.perf_counter()
        out = inner(mb, *args, **kwargs)
        if cuda:
            torch.cuda.synchronize()
        shape = tuple(mb.input_ids.shape) if getattr(mb, "input_ids", None) is not None else "?"
        print(f"  [{layout}] micro-batch {shape}: forward {time.perf_counter() - t0:.2f}s", flush=True)
        return out

    policy._forward = traced


def probe_layout(model: Path, layout: str, args, batch, arch: Arch, device: torch.device) -> dict:
    from train.policy.fsdp import Policy

    prompts, responses = batch
    cuda = device.type == "cuda"
    share, pack = LAYOUTS[layout]
    policy = Policy(
        model, precision="bf16" if cuda else "fp32", lr=1e-6, gradient_checkpointing=True,
        micro_batch_tokens=args.micro_batch_tokens, share_prompts=share, pack_sequences=pack, pad_id=0,
        torch_compile=args.torch_compile == "true",
    )  # fmt: skip
    row: dict = {"layout": layout, "attention": policy.attn_implementation}
    if cuda:
        torch.cuda.synchronize()
        row["state_gib"] = torch.cuda.memory_allocated() / GIB
    trace_forwards(policy, layout, cuda)
    lp = lambda: policy.compute_log_probs(prompts, responses, with_entropy=True)  # noqa: E731
    step = lambda: policy.train_step(prompts, responses, _loss, with_entropy=True)  # noqa: E731
    _, row["logprobs_cold_s"], _, _ = measure(lp, cuda)
    print(f"[{layout}] log-prob pass, cold: {row['logprobs_cold_s']:.1f}s", flush=True)
    metrics, row["update_cold_s"], _, _ = measure(step, cuda)
    print(f"[{layout}] update, cold: {row['update_cold_s']:.1f}s", flush=True)
    # the warm log-prob pass after an update, as in training from step 2: AdamW's moments exist, the
    # gradients were freed by the optimizer step
    _, row["logprobs_s"], row["logprobs_peak_gib"], row["logprobs_reserved_gib"] = measure(lp, cuda)
    print(
        f"[{layout}] log-prob pass: {row['logprobs_s']:.1f}s, peak {row['logprobs_peak_gib']:.1f} GiB",
        flush=True,
    )
    metrics, row["update_s"], row["update_peak_gib"], row["update_reserved_gib"] = measure(step, cuda)
    print(f"[{layout}] update: {row['update_s']:.1f}s, peak {row['update_peak_gib']:.1f} GiB", flush=True)
    mbs = int(next(v for k, v in metrics.items() if k.endswith("/micro_batches")))
    row["micro_batches"] = mbs
    row["update_per_micro_batch_s"] = row["update_s"] / max(mbs, 1)
    row["logprobs_per_micro_batch_s"] = row["logprobs_s"] / max(mbs, 1)
    row["grad_norm_finite"] = math.isfinite(next(v for k, v in metrics.items() if k.endswith("/grad_norm")))
    with AttentionTimer(policy.attn_implementation, cuda) as timer:
        lp()
    row["attention_per_layer_s"] = timer.seconds() / arch.layers
    if cuda:
        row["free_after_step_gib"] = torch.cuda.mem_get_info()[0] / GIB  # PyTorch's cache still held
        torch.cuda.empty_cache()  # what the trainer does before the engine wakes (VLLMEngine.wake_up)
        free, total = torch.cuda.mem_get_info()
        row["free_on_wake_gib"] = free / GIB
        row["engine_wants_gib"] = args.gpu_memory_utilization * total / GIB
        row["engine_fits_on_wake"] = free >= args.gpu_memory_utilization * total
    plan = planned(arch, args, layout, cuda)
    row["planned_update_gib"], row["planned_logprobs_gib"] = plan["update_gib"], plan["logprobs_gib"]
    policy = None  # the model and optimizer go before the next layout (the lambdas hold this cell)
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return row


def _parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The options and the layouts asked for (an unknown layout stops here)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="qwen3-4b", choices=sorted(SHAPES))
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--max-response", type=int, default=8192)
    p.add_argument("--micro-batch-tokens", type=int, default=32768)
    p.add_argument("--layouts", default="shared,packed,unshared")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--gpu", default="h100", choices=sorted(GPUS), help="the planner's GPU kind")
    p.add_argument(
        "--torch-compile",
        default="true",
        choices=["true", "false"],
        help="policy.torch_compile: the log-prob kernels",
    )
    p.add_argument("--out")
    args = p.parse_args(argv)
    layouts = args.layouts.split(",")
    unknown = [name for name in layouts if name not in LAYOUTS]
    if unknown:
        raise SystemExit(f"--layouts: unknown {unknown}; expected a comma list of {sorted(LAYOUTS)}")
    return args, layouts


def _random_rows(args, vocab: int, g: torch.Generator) -> tuple[list, list, list[int]]:
    """(prompts, responses, response lengths): `--prompts` random prompts, each repeated for its group,
    with random responses of the probe's lengths."""
    lengths = response_lengths(args.prompts * args.group, args.max_response)
    prompts, responses = [], []
    for i in range(args.prompts):
        prompt = torch.randint(10, vocab, (args.prompt_len,), generator=g).tolist()
        for j in range(args.group):
            prompts.append(prompt)
            responses.append(torch.randint(10, vocab, (lengths[i * args.group + j],), generator=g).tolist())
    return prompts, responses, lengths


def main(argv: list[str] | None = None) -> list[dict]:
    args, layouts = _parse(argv)

    from train.policy.distributed import init_distributed

    init_distributed()
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    shape = SHAPES[args.shape]
    arch = Arch.from_config({**shape, "num_hidden_layers": args.layers})
    g = torch.Generator().manual_seed(0)
    vocab = shape["vocab_size"]
    prompts, responses, lengths = _random_rows(args, vocab, g)
    header = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "shape": args.shape, "layers": args.layers,
        "params": arch.params(), "rows": len(responses), "response_tokens": sum(lengths),
        "max_response": max(lengths), "micro_batch_tokens": args.micro_batch_tokens,
        "torch_compile": args.torch_compile,
    }  # fmt: skip
    print(json.dumps(header), flush=True)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    baseline = causal_baseline_s(shape, [args.prompt_len + n for n in lengths], device, dtype)
    header["causal_baseline_attention_per_layer_s"] = baseline
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="memory-probe-") as tmp:
        model = build_model(shape, args.layers, args.prompt_len + args.max_response, Path(tmp), device)
        for layout in layouts:
            try:
                row = probe_layout(model, layout, args, (prompts, responses), arch, device)
                row["attention_vs_causal"] = row["attention_per_layer_s"] / max(baseline, 1e-9)
            except Exception as e:  # noqa: BLE001 - one layout's failure is a finding, the others still run
                row = {"layout": layout, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.out:
                Path(args.out).write_text(json.dumps({"header": header, "layouts": rows}, indent=1))
    return rows


if __name__ == "__main__":
    # `timeout -s USR1` (bench/device_check.sh): every thread's Python stack, where a stall sits; runs on after
    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    main()
    exit_now(0)
