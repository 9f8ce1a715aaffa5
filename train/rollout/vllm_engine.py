"""vLLM rollout backend, in-process and colocated with the trainer.

The engine runs in the trainer's own process (VLLM_ENABLE_V1_MULTIPROCESSING=0) and joins the
trainer's torch.distributed group instead of spawning workers (at world size > 1 through the
`external_launcher` executor): each rank owns one engine and generates its own share of the batch.

Its settings are `rollout.engine.<argument>` keys (this class's constructor; `python -m train --help` lists
them with their defaults), checked before a model loads by `check_settings`. Device settings follow where
it runs (`engine_kwargs`):
- CPU: eager mode, KV cache of `kv_cache_gb` in 32-token blocks (prefix caching then shares a group's prompt
  between its samples), whole-prompt prefill; new weights go in through
  `reload_weights` (the CPU backend prepacks linear layers, so a plain `load_weights` fails).
- GPU (verl's hybrid engine / TRL's colocate mode): CUDA graphs on (`enforce_eager=None` = auto),
  vLLM takes `gpu_memory_utilization` of the GPU, and with `sleep_level=2` (default) it releases ALL of
  its GPU memory (weights and KV cache) before the policy update: the trainer calls `sleep()` after the
  rollout, and `update_weights` wakes the weights, streams the new ones in from the FSDP2 shards in
  buckets of at most `weight_bucket_mb` through the model's `load_weights`, then wakes the KV cache.
  Level 2 rather than 1 because the old weights are replaced anyway: level 1 would first copy them to
  CPU memory and back for nothing (vLLM docs, sleep mode: "level 2 ... update the model, where previous
  model weights are not needed"). Waking the weights before the KV cache keeps the weight update from
  running out of memory. No second full copy of the model exists at any time: one bucket at most.
  Before every wake-up PyTorch's caching allocator hands back what it still reserves from the update
  (`torch.cuda.empty_cache()`): vLLM's sleep allocator maps physical memory itself and cannot use blocks
  PyTorch keeps cached (TRL's GRPOTrainer and verl's rollout mode empty the cache before each wake_up).
- One sleep-mode engine per process: vLLM's sleep allocator (CuMemAllocator) is a process-wide singleton,
  so a second engine with sleep mode would be put to sleep and woken with the first. Only the policy's
  rollout engine sleeps; any other engine in a process (a classmate beside the trainer's engine, evals,
  benches) is built with `sleep_level=0` and a fixed `gpu_memory_utilization` budget, held for its whole
  life (`VLLMEngine.gpu_memory_utilization`; the classmate's is `EngineClassmate(gpu_memory_utilization)`),
  and a second sleep-mode engine is refused at construction with the fix named.
- `tensor_parallel_size=t > 1`: vLLM carves consecutive training ranks into TP groups of t (rank r is in
  group r // t); the ranks of a group must submit identical requests, so each rank's prompts (with their
  own seeds) are all-gathered inside the group, generated together, and each rank keeps its own rows.
"""

from __future__ import annotations

import gc
import itertools
import os
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from train.batch import Batch
from train.rollout.base import SamplingConfig, TurnOutput, expand_groups

SLEEP_LEVELS = (0, 1, 2)  # 0 = never sleep


def sleep_level_under_lora(sleep_level: int, lora_rank: int) -> int:
    """The level a GPU engine sleeps at: under LoRA (`lora_rank > 0`) at most 1, as level 2 discards the
    base weights an adapter sync keeps (the engine and train/plan.py both ask here)."""
    return min(sleep_level, 1) if lora_rank > 0 else sleep_level


def _configure_env(kv_cache_gb: float) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(kv_cache_gb))))
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    # vLLM pins OpenMP threads per rank; let it use the cores this rank was given.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def check_settings(
    world_size: int,
    gpu_memory_utilization: float,
    tensor_parallel_size: int,
    sleep_level: int,
    block_size: int | None = None,
    **_: object,
) -> None:
    """The engine's own range checks (a ValueError naming the key), run by config validation with the
    constructor's arguments as configured and by the constructor itself."""
    if sleep_level not in SLEEP_LEVELS:
        raise ValueError(f"rollout.engine.sleep_level={sleep_level}: expected one of {SLEEP_LEVELS}")
    if tensor_parallel_size < 1 or world_size % tensor_parallel_size:
        raise ValueError(
            f"rollout.engine.tensor_parallel_size={tensor_parallel_size} must divide world_size={world_size}"
        )
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"rollout.engine.gpu_memory_utilization={gpu_memory_utilization}: expected (0, 1]")
    if block_size is not None and (
        isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1
    ):
        raise ValueError(
            f"rollout.engine.block_size={block_size!r}: expected a positive number of tokens (or null)"
        )


def engine_kwargs(
    device_type: str,
    dtype: str,
    seed: int,
    max_model_len: int,
    world_size: int,
    enable_prefix_caching: bool = True,
    gpu_memory_utilization: float = 0.5,
    tensor_parallel_size: int = 1,
    sleep_level: int = 2,
    enforce_eager: bool | None = None,
    lora_rank: int = 0,
    block_size: int | None = None,
) -> dict:
    """The keyword arguments of `vllm.LLM(...)` for an engine colocated on `device_type` (cpu | cuda)."""
    check_settings(world_size, gpu_memory_utilization, tensor_parallel_size, sleep_level, block_size)
    if device_type != "cuda" and block_size and block_size % CPU_BLOCK_SIZE:
        raise ValueError(
            f"rollout.engine.block_size={block_size}: vLLM's CPU attention kernels need a multiple of "
            f"{CPU_BLOCK_SIZE} tokens (other sizes fall to a kernel that fails); use {CPU_BLOCK_SIZE} (the default)"
        )
    kwargs: dict = {
        "dtype": dtype,
        "seed": seed,
        "max_model_len": max_model_len,
        "enable_prefix_caching": enable_prefix_caching,
        "max_num_batched_tokens": max(8192, max_model_len),
    }
    if lora_rank > 0:  # one adapter slot: the policy's current adapter, replaced each step
        kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=lora_slot_rank(lora_rank))
    if world_size > 1:
        kwargs["distributed_executor_backend"] = "external_launcher"
    if tensor_parallel_size > 1:
        kwargs["tensor_parallel_size"] = tensor_parallel_size
    if device_type == "cuda":
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        kwargs["enforce_eager"] = False if enforce_eager is None else enforce_eager  # CUDA graphs
        kwargs["enable_sleep_mode"] = sleep_level > 0
    else:
        kwargs["enforce_eager"] = True if enforce_eager is None else enforce_eager  # no graphs on CPU
        # Per-request seeded sampling cannot rewind a CPU generator after a chunked prefill step
        # ("CPU Generator does not use offset"): prefill whole prompts instead.
        kwargs["enable_chunked_prefill"] = False
        # KV blocks of CPU_BLOCK_SIZE tokens, not vLLM's CPU default of 128: prefix caching reuses whole blocks
        # only, so the n samples of a group shared nothing of a prompt under 128 tokens and prefilled it n times
        kwargs["block_size"] = CPU_BLOCK_SIZE
    if block_size is not None:  # an explicit size wins on either device
        kwargs["block_size"] = block_size
    return kwargs


# the smallest KV block the CPU backend runs at full speed ("prefers block_size is multiples of 32"). 8 prompts
# of ~60 tokens x 4 samples x 64 tokens, bf16, 2 cores: rollout 2.84 -> 2.16 s; 4 x 8 x 6 tokens: 0.94 -> 0.38 s
CPU_BLOCK_SIZE = 32


LORA_SLOT_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's LoRAConfig.max_lora_rank choices


def lora_slot_rank(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM accepts that holds an adapter of `rank`."""
    for slot in LORA_SLOT_RANKS:
        if rank <= slot:
            return slot
    raise ValueError(f"policy.lora.rank={rank}: vLLM serves LoRA adapters up to rank {LORA_SLOT_RANKS[-1]}")


def bucketed(
    named_tensors: Iterable[tuple[str, torch.Tensor]], max_bytes: int, dtype: torch.dtype | None = None
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive (name, tensor) pairs in lists of at most `max_bytes` (a bigger tensor goes alone),
    each tensor cast to `dtype` as it is taken. The source is read lazily: while a bucket is being
    loaded, at most that bucket's tensors exist, never the whole model."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        if dtype is not None and tensor.dtype != dtype and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > max_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def tp_groups(world_size: int, tp: int) -> list[list[int]]:
    """vLLM's tensor-parallel groups under `external_launcher`: consecutive ranks, t at a time."""
    if tp < 1 or world_size % tp:
        raise ValueError(f"rollout.engine.tensor_parallel_size={tp} must divide world_size={world_size}")
    return [list(range(g * tp, (g + 1) * tp)) for g in range(world_size // tp)]


def _load_weights(worker, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Runs on the vLLM worker (in this process): copy one bucket into the model (GPU path).

    `get_model()` unwraps the CUDA-graph wrapper; the graphs keep pointing at the same parameter storage,
    so they replay with the new values (TRL's colocate mode loads weights the same way)."""
    worker.model_runner.get_model().load_weights(weights=weights)


def _retie_lm_head(worker) -> None:
    """Runs on the vLLM worker after a reload.

    With tied embeddings the reload skips `lm_head` and puts its old tensor back, which unties it
    and leaves the output layer (and on CPU its prepacked GEMM copy) at the old weights.
    """
    model = worker.model_runner.model
    if getattr(model.config, "tie_word_embeddings", False) and hasattr(model, "lm_head"):
        model.lm_head.weight = model.model.embed_tokens.weight
        model.lm_head.quant_method.process_weights_after_loading(model.lm_head)


def freeze_heap_before_start_up() -> None:
    """Take every object alive now out of the garbage collector's scans (`gc.freeze`) before vLLM starts.

    vLLM's start-up runs full collections (after loading the model, after profiling the KV cache, and in its
    own `freeze_gc_heap`, which freezes the whole heap at its end anyway); in a trainer process each one walked
    torch's, transformers' and the policy's objects: 2.1 s of a darling_math job's start (cProfile, 12
    `gc.collect` calls). Frozen first, they walk only what vLLM makes. Measured (SmolLM2-135M bf16, 2 cores,
    vLLM imported): engine construction 3.1 -> 1.6 s, plus 0.35 s for this collection. vLLM's shutdown
    unfreezes the heap (`cleanup_dist_env_and_memory`), as it would after its own freeze."""
    gc.collect()
    gc.freeze()


def reuse_cpu_compile_cache() -> None:
    """Let a compiled CPU engine load its AOT-compiled model instead of compiling it again at every start.

    vLLM 0.32 compiles the CPU model in `DYNAMO_TRACE_ONCE` mode (plain inductor) and saves it as an AOT
    artifact, but loading one calls `finalize_loading`, which only its GPU (piecewise) artifacts have: every
    start logged "Compiling model again due to a load failure ... no attribute 'finalize_loading'"
    (vllm-project/vllm#45447) and spent ~35 s compiling. A plain artifact is complete when loaded, so it gets
    a no-op `finalize_loading`. Measured (SmolLM2-135M bf16, 2 cores, importing vLLM included): engine start
    40-46 s -> 8.7-9.3 s with the cache warm (eager: 4.3 s). Idempotent; a vLLM that fixed the bug is left alone."""
    compiler = torch.compiler
    if getattr(compiler.load_compiled_function, "_rlpost_plain_artifacts", False):
        return
    load = compiler.load_compiled_function

    def load_compiled_function(*args, **kwargs):
        fn = load(*args, **kwargs)
        compiled = getattr(getattr(fn, "_artifacts", None), "compiled_fn", None)
        if compiled is not None and not hasattr(compiled, "finalize_loading"):
            compiled.finalize_loading = lambda vllm_config: None  # nothing left to load
        return fn

    load_compiled_function._rlpost_plain_artifacts = True
    compiler.load_compiled_function = load_compiled_function


_LIVE_ENGINES: set[int] = set()  # ids of this process's open engines (see VLLMEngine.close)
_SLEEP_MODE_OWNER: list[weakref.ref] = []  # the one engine of this process with vLLM sleep mode (if any)


def claim_sleep_mode(engine: object, device_type: str, sleep_level: int) -> None:
    """Register `engine` as this process's sleep-mode engine, or refuse a second one in one line.

    Sleep mode exists on CUDA only (CPU engines never sleep); vLLM's sleep allocator is per process."""
    if device_type != "cuda" or not sleep_level:
        return
    owner = _SLEEP_MODE_OWNER[0]() if _SLEEP_MODE_OWNER else None
    if owner is not None and owner is not engine:
        raise ValueError(
            f"a second vLLM engine with sleep_level={sleep_level} in this process: vLLM's sleep allocator is "
            "per process (it belongs to the policy's rollout engine); build this engine with sleep_level=0 "
            "and a gpu_memory_utilization budget, or run it in its own process"
        )
    _SLEEP_MODE_OWNER[:] = [weakref.ref(engine)]


def release_sleep_mode(engine: object) -> None:
    if _SLEEP_MODE_OWNER and _SLEEP_MODE_OWNER[0]() is engine:
        _SLEEP_MODE_OWNER.clear()


def empty_device_cache() -> None:
    """Hand PyTorch's cached, unused GPU blocks back to the driver (no-op without CUDA)."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class VLLMEngine:
    """Colocated vLLM engine. `dtype` is the engine's compute dtype (float32 or bfloat16; in training,
    unless `rollout.engine.dtype` says otherwise, the policy's resolved precision), `seed` vLLM's (in
    training, the run's `seed`).

    `max_model_len`: longest prompt + response. GPU only (the engine runs on CPU without them):
    `gpu_memory_utilization` (share of each GPU vLLM may take: weights + KV cache), `tensor_parallel_size`
    (ranks per TP group, consecutive; must divide world_size), `sleep_level` (2 = drop weights and KV
    cache for the policy update, 1 = weights to CPU, 0 = never sleep), `enforce_eager` (None = CUDA graphs
    on GPU, eager on CPU), `block_size` (tokens per KV block; None = 32 on CPU, vLLM's own on GPU: prefix
    caching shares whole blocks, so a group's n samples reuse their prompt's KV). `kv_cache_gb` is the CPU
    KV cache (on GPU the cache gets what `gpu_memory_utilization` leaves after the weights and activations). `sleep_level=2` is for the
    policy's rollout engine, the only one that sleeps; every other engine passes `sleep_level=0` and
    holds `gpu_memory_utilization` of each GPU while it lives (see the module docstring).
    """

    check_settings = staticmethod(check_settings)

    def __init__(
        self,
        model_path: str | Path,
        dtype: str = "float32",
        max_model_len: int = 1024,
        kv_cache_gb: float = 1.0,
        seed: int = 0,
        enforce_eager: bool | None = None,
        enable_prefix_caching: bool = True,
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        sleep_level: int = 2,
        weight_bucket_mb: int = 512,
        lora_rank: int = 0,
        block_size: int | None = None,
    ) -> None:
        _configure_env(kv_cache_gb)
        import torch.distributed as dist
        from vllm import LLM

        world = dist.get_world_size() if dist.is_initialized() else 1
        self.device_type = "cuda" if torch.cuda.is_available() else "cpu"
        self.kwargs = engine_kwargs(
            self.device_type,
            dtype,
            seed,
            max_model_len,
            world,
            enable_prefix_caching=enable_prefix_caching,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            sleep_level=sleep_level,
            enforce_eager=enforce_eager,
            lora_rank=lora_rank,
            block_size=block_size,
        )
        self.takes_adapters = lora_rank > 0  # the policy's LoRA adapter is synced alone (weight_sync.py)
        self.lora_request = None  # the current adapter version, sent with every request
        self.adapter_folders = None
        self.sleep_level = sleep_level_under_lora(sleep_level, lora_rank) if self.device_type == "cuda" else 0
        self.gpu_sleep_level = sleep_level  # what it does on a GPU (0: holds its share for its whole life)
        self.gpu_memory_utilization = gpu_memory_utilization  # its share of each GPU (GPU only)
        claim_sleep_mode(self, self.device_type, self.sleep_level)
        self.asleep = False
        self.weight_dtype = getattr(torch, dtype)
        self.bucket_bytes = weight_bucket_mb * 2**20
        self.tp_group = None  # the torch group of this rank's vLLM TP group (prompts are shared in it)
        if tensor_parallel_size > 1:
            self._join_tp_group(world, tensor_parallel_size)
        self.llm = self._start_llm(LLM, model_path)
        self.tokenizer = self.llm.get_tokenizer()
        self._request_ids = itertools.count()
        self.max_model_len = max_model_len  # prompt + response tokens of one request
        _LIVE_ENGINES.add(id(self))

    def _join_tp_group(self, world: int, tensor_parallel_size: int) -> None:
        """Every rank creates every TP group (a collective); this rank keeps its own."""
        import torch.distributed as dist

        rank = dist.get_rank()
        for ranks in tp_groups(world, tensor_parallel_size):
            group = dist.new_group(ranks)
            if rank in ranks:
                self.tp_group, self.tp_ranks = group, ranks

    def _start_llm(self, llm_class: type, model_path: str | Path):
        """vLLM's engine on this rank (the CPU compile cache reused, the heap frozen before start-up); a
        failed start gives the sleep-mode claim and the frozen heap back. (`vllm.LLM`, imported where the
        constructor always imported it.)"""
        if self.device_type != "cuda" and not self.kwargs["enforce_eager"]:
            reuse_cpu_compile_cache()
        freeze_heap_before_start_up()
        try:
            return llm_class(str(model_path), **self.kwargs)
        except BaseException:
            release_sleep_mode(self)
            gc.unfreeze()  # what vLLM's shutdown would have done
            raise

    def _params(self, sampling: SamplingConfig, seed: int):
        from vllm import SamplingParams

        return SamplingParams(
            n=1,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            max_tokens=sampling.max_new_tokens,
            logprobs=0,
            seed=seed,
            stop=list(sampling.stop) or None,
        )

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig) -> Batch:
        self._wake()
        rows, groups = expand_groups(prompt_ids, sampling.n)
        # One request per sample with its own seed, so each sample depends only on (seed, row), not
        # on how the scheduler batches: this is what makes resumed runs reproduce uninterrupted ones.
        params = [self._params(sampling, sampling.seed + i) for i in range(len(rows))]
        requests = [{"prompt_token_ids": ids} for ids in rows]
        mine = slice(0, len(rows))
        if self.tp_group is not None:  # the TP group generates all its ranks' requests together
            requests, params, mine = _share_in_group(requests, params, self.tp_group)
        outs = self.llm.generate(requests, params, use_tqdm=False, lora_request=self.lora_request)[mine]
        turns = [_turn_output(out) for out in outs]
        return Batch(
            rows,
            [t.token_ids for t in turns],
            [t.logprobs for t in turns],
            [t.text for t in turns],
            [t.finish_reason for t in turns],
            groups,
        )

    # ---- turn-level requests (multi-turn rollouts: train/rollout/agent_loop.py) ------------------------
    def submit(self, prompt_ids: list[int], sampling: SamplingConfig, seed: int) -> str:
        """Queue one sample of `prompt_ids` (its own seed) without running it; `step` advances every queued
        request together, so a trajectory's next turn joins the running batch as soon as it is ready."""
        if self.tp_group is not None:
            raise NotImplementedError(
                "multi-turn rollouts with tensor_parallel_size > 1 are not supported yet"
            )
        self._wake()
        request_id = f"turn-{next(self._request_ids)}"  # what its RequestOutput is named by
        self.llm.llm_engine.add_request(
            request_id, {"prompt_token_ids": list(prompt_ids)}, self._params(sampling, seed),
            lora_request=self.lora_request,
        )  # fmt: skip
        return request_id

    def step(self) -> list[TurnOutput]:
        """One engine iteration over every queued request; the requests that finished in it."""
        done = []
        for out in self.llm.llm_engine.step():
            if out.finished:
                done.append(_turn_output(out))
        return done

    def pending(self) -> int:
        return self.llm.llm_engine.get_num_unfinished_requests()

    def sequence_logprobs(
        self, prompt_ids: list[list[int]], response_ids: list[list[int]]
    ) -> list[list[float]]:
        from vllm import SamplingParams

        self._wake()
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        seqs = [{"prompt_token_ids": p + r} for p, r in zip(prompt_ids, response_ids)]
        mine = slice(0, len(seqs))
        if self.tp_group is not None:
            seqs, _, mine = _share_in_group(seqs, [params] * len(seqs), self.tp_group)
        outs = self.llm.generate(seqs, params, use_tqdm=False, lora_request=self.lora_request)[mine]
        result = []
        for out, p, r in zip(outs, prompt_ids, response_ids):
            plp = out.prompt_logprobs
            result.append([plp[len(p) + k][t].logprob for k, t in enumerate(r)])
        return result

    def sleep(self) -> None:
        """Release the engine's GPU memory for the policy update (sleep_level; a no-op on CPU)."""
        if self.sleep_level and not self.asleep:
            self.llm.reset_prefix_cache()
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True

    def _wake(self) -> None:
        """Wake whatever still sleeps (generation without a weight update, e.g. level 1, validation)."""
        if self.asleep:
            if self.sleep_level == 2:
                raise RuntimeError(
                    "the vLLM engine slept at level 2 (weights discarded): update_weights first"
                )
            self._wake_up()
            self.asleep = False

    def _wake_up(self, tags: list[str] | None = None) -> None:
        """vLLM's wake_up after PyTorch gave back its cached blocks (see the module docstring)."""
        empty_device_cache()
        self.llm.wake_up(tags=tags)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        if self.device_type != "cuda":
            dtype = self.weight_dtype  # cast one tensor at a time: never a second full copy
            cast = ((name, t.to(dtype)) for name, t in named_tensors)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": cast})
            self.llm.collective_rpc(_retie_lm_head)
        else:
            if self.asleep:
                self._wake_up(tags=["weights"])  # weights first: the KV cache is not yet back
            for bucket in bucketed(named_tensors, self.bucket_bytes, self.weight_dtype):
                self.llm.collective_rpc(_load_weights, args=(bucket,))
                del bucket
            if self.asleep:
                self._wake_up(tags=["kv_cache"])  # the update's buffers are freed and given back first
                self.asleep = False
        # KV blocks cached under the old weights must not be reused for new prompts.
        self.llm.reset_prefix_cache()

    def load_adapter(self, tensors: dict[str, torch.Tensor], lora, base_model: str | Path) -> None:
        """Serve a new version of the policy's LoRA adapter (PEFT keys, `lora` its LoraSettings): written as
        an adapter folder under a new id, sent with every request from now on; the old version is removed
        from vLLM's cache and its folder deleted. The base weights the engine holds are untouched."""
        from vllm.lora.request import LoRARequest

        from train.rollout.weight_sync import AdapterFolders

        if not self.takes_adapters:
            raise RuntimeError("this vLLM engine was started without lora_rank: sync merged weights instead")
        if self.adapter_folders is None:
            self.adapter_folders = AdapterFolders()
        self._wake()
        version, folder = self.adapter_folders.write(tensors, lora, base_model)
        old = self.lora_request
        self.lora_request = LoRARequest(f"policy-v{version}", version, str(folder))
        self.llm.llm_engine.add_lora(self.lora_request)  # loaded now (not at the next generate)
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            self.adapter_folders.drop(old.lora_int_id)
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Shut this engine down without tearing down what other in-process engines still use.

        vLLM's EngineCore.shutdown destroys the process-wide model-parallel groups and torch's default
        process group (`cleanup_dist_env_and_memory`). With a second engine in the process (a classmate
        beside the policy's, a shared test engine) that breaks the survivor ("pipeline model parallel
        group is not initialized") and the trainer's own gloo group, so only the last engine cleans up.
        """
        import gc

        import vllm.v1.engine.core as core

        _LIVE_ENGINES.discard(id(self))
        release_sleep_mode(self)
        if getattr(self, "adapter_folders", None) is not None:
            self.adapter_folders.close()
        if not hasattr(self, "llm"):
            return
        if _LIVE_ENGINES:
            original = core.cleanup_dist_env_and_memory
            core.cleanup_dist_env_and_memory = lambda *a, **k: gc.collect()
            try:
                self.llm.llm_engine.engine_core.shutdown()
                del self.llm
                gc.collect()
            finally:
                core.cleanup_dist_env_and_memory = original
        else:
            del self.llm


def _turn_output(out) -> TurnOutput:
    """A finished vLLM RequestOutput as the sampled tokens, their log-probs, text and why it stopped."""
    c = out.outputs[0]
    ids = list(c.token_ids)
    logprobs = [lp[t].logprob for lp, t in zip(c.logprobs, ids)] if c.logprobs else []
    return TurnOutput(
        out.request_id, ids, logprobs, c.text, "length" if c.finish_reason == "length" else "stop"
    )


def _share_in_group(requests: list, params: list, group) -> tuple[list, list, slice]:
    """All requests of this rank's TP group, in rank order, and the slice that is this rank's own."""
    import torch.distributed as dist

    parts: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, (requests, params), group=group)
    me = dist.get_rank(group)
    start = sum(len(p[0]) for p in parts[:me])
    return (
        [r for p in parts for r in p[0]],
        [x for p in parts for x in p[1]],
        slice(start, start + len(requests)),
    )
