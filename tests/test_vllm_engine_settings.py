"""The vLLM engine's device settings, weight-sync bucketing and TP groups (the CPU-testable parts)."""

import os
import weakref

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from train.config import build_config
from train.loop import engine_spec
from train.rollout import vllm_engine as vllm_engine_module
from train.rollout.vllm_engine import (
    VLLMEngine,
    _share_in_group,
    bucketed,
    claim_sleep_mode,
    engine_kwargs,
    release_sleep_mode,
    tp_groups,
)


def test_device_settings_follow_where_the_engine_runs():
    cpu = engine_kwargs("cpu", "float32", seed=1, max_model_len=512, world_size=1, gpu_memory_utilization=0.3)
    assert cpu["enforce_eager"] is True and cpu["enable_chunked_prefill"] is False
    assert cpu["block_size"] == 32  # prefix caching shares a group's prompt in whole blocks
    assert engine_kwargs("cpu", "float32", 1, 512, 1, block_size=64)["block_size"] == 64
    assert "gpu_memory_utilization" not in cpu and "enable_sleep_mode" not in cpu
    assert "distributed_executor_backend" not in cpu and "tensor_parallel_size" not in cpu
    gpu = engine_kwargs(
        "cuda", "bfloat16", 1, 512, world_size=4, gpu_memory_utilization=0.3, tensor_parallel_size=2
    )
    assert gpu["enforce_eager"] is False  # CUDA graphs on by default on GPU
    assert gpu["gpu_memory_utilization"] == 0.3 and gpu["enable_sleep_mode"] is True
    assert gpu["tensor_parallel_size"] == 2 and gpu["distributed_executor_backend"] == "external_launcher"
    assert "enable_chunked_prefill" not in gpu and gpu["dtype"] == "bfloat16"
    assert "block_size" not in gpu  # vLLM's own on a GPU
    eager = engine_kwargs("cuda", "bfloat16", 1, 512, 1, sleep_level=0, enforce_eager=True)
    assert eager["enforce_eager"] is True and eager["enable_sleep_mode"] is False


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="rollout.engine.tensor_parallel_size=3 must divide world_size=4"):
        engine_kwargs("cuda", "bfloat16", 1, 512, world_size=4, tensor_parallel_size=3)
    with pytest.raises(ValueError, match="rollout.engine.gpu_memory_utilization"):
        engine_kwargs("cuda", "bfloat16", 1, 512, 1, gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="rollout.engine.sleep_level"):
        engine_kwargs("cuda", "bfloat16", 1, 512, 1, sleep_level=3)
    for bad in (0, -32, 32.5, True):
        with pytest.raises(ValueError, match="rollout.engine.block_size=.*positive number of tokens"):
            engine_kwargs("cuda", "bfloat16", 1, 512, 1, block_size=bad)
    # vLLM's CPU attention runs 32-token multiples; 16 fell to a kernel that failed (measured with vLLM 0.32)
    with pytest.raises(ValueError, match="rollout.engine.block_size=16: .*multiple of 32"):
        engine_kwargs("cpu", "float32", 1, 512, 1, block_size=16)
    assert engine_kwargs("cuda", "bfloat16", 1, 512, 1, block_size=16)["block_size"] == 16  # GPUs take it


def test_engine_keys_reach_the_engine_arguments_and_are_checked_before_a_model_loads():
    """Issue 23: each engine setting is one key, rollout.engine.<argument>; the trainer's own arguments
    (weights, dtype, seed) fill in only what the config leaves out, so no configured value is overwritten."""
    cfg = build_config(
        overrides=[
            "world_size=4", "data.prompts_per_step=8", "rollout.engine.gpu_memory_utilization=0.35",
            "rollout.engine.tensor_parallel_size=2", "rollout.engine.sleep_level=1",
            "rollout.engine.enforce_eager=true", "rollout.engine.max_model_len=512",
            "rollout.engine.dtype=bfloat16", "rollout.engine.seed=11", "seed=3",
        ]
    )  # fmt: skip
    spec = engine_spec(cfg, "/weights", "fp32")
    assert spec["gpu_memory_utilization"] == 0.35 and spec["tensor_parallel_size"] == 2
    assert spec["max_model_len"] == 512 and spec["dtype"] == "bfloat16" and spec["seed"] == 11
    assert spec["model_path"] == "/weights"
    llm = engine_kwargs("cuda", spec["dtype"], spec["seed"], spec["max_model_len"], world_size=4,
                        **{k: spec[k] for k in ("gpu_memory_utilization", "tensor_parallel_size", "sleep_level", "enforce_eager")})  # fmt: skip
    assert llm["gpu_memory_utilization"] == 0.35 and llm["tensor_parallel_size"] == 2
    assert llm["enable_sleep_mode"] is True and llm["enforce_eager"] is True and llm["max_model_len"] == 512
    default = engine_spec(build_config(overrides=["seed=3"]), "/weights", "bf16")
    assert default["dtype"] == "bfloat16" and default["seed"] == 3  # the policy's precision, the run's seed
    assert "max_model_len" not in default  # the engine's own default (VLLMEngine: 1024) applies
    hf = engine_spec(
        build_config(overrides=["rollout.engine._target_=train.rollout.hf_engine.HFEngine"]), "/w", "fp32"
    )
    assert "seed" not in hf and hf["dtype"] == "float32"  # HFEngine takes no seed: none is given to it
    with pytest.raises(Exception, match="rollout.engine.tensor_parallel_size=4 must divide world_size=2"):
        build_config(
            overrides=["world_size=2", "data.prompts_per_step=8", "rollout.engine.tensor_parallel_size=4"]
        )
    with pytest.raises(Exception, match="rollout.engine.model_path: the trainer gives the engine"):
        build_config(overrides=["rollout.engine.model_path=/elsewhere"])
    for old in ("rollout.gpu_memory_utilization=0.5", "rollout.max_model_len=512", "rollout.dtype=float32"):
        with pytest.raises(Exception, match=old.split("=")[0].split(".")[1]):  # one key per setting
            build_config(overrides=[old])


def test_tp_groups_are_consecutive_ranks():
    assert tp_groups(8, 2) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert tp_groups(4, 4) == [[0, 1, 2, 3]] and tp_groups(3, 1) == [[0], [1], [2]]
    with pytest.raises(ValueError):
        tp_groups(6, 4)


def test_bucketing_streams_without_holding_the_whole_model():
    alive = weakref.WeakSet()
    taken = []

    def parameters():  # like Policy.full_weights: one gathered fp32 tensor at a time
        for i in range(10):
            t = torch.full((256,), float(i))  # 1 KiB in fp32, 512 B in bf16
            alive.add(t)
            taken.append(i)
            yield f"p{i}", t

    seen = []
    for bucket in bucketed(parameters(), max_bytes=1536, dtype=torch.bfloat16):
        assert sum(t.numel() * t.element_size() for _, t in bucket) <= 1536
        assert all(t.dtype == torch.bfloat16 for _, t in bucket)
        # the source has been read only up to this bucket (plus the one tensor that did not fit)
        assert len(taken) <= len(seen) + len(bucket) + 1
        assert len(alive) <= 1  # the fp32 originals are dropped as soon as they are cast
        seen += [name for name, _ in bucket]
        del bucket
    assert seen == [f"p{i}" for i in range(10)]
    big = list(bucketed([("a", torch.zeros(1000)), ("b", torch.zeros(10))], max_bytes=100))
    assert [[n for n, _ in b] for b in big] == [["a"], ["b"]]  # a tensor over the bucket size goes alone


class _RecordingLLM:
    """Stands in for vllm.LLM's sleep-mode calls, which exist on CUDA only: records their order."""

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def wake_up(self, tags=None):
        self.calls.append(f"wake_up:{','.join(tags or ['all'])}")

    def collective_rpc(self, fn, args=(), kwargs=None):
        self.calls.append("load_weights")

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")

    def sleep(self, level):
        self.calls.append(f"sleep:{level}")


def _gpu_engine_asleep(calls: list, level: int) -> VLLMEngine:
    """A VLLMEngine as it stands on a GPU after `sleep()` (the CUDA-only vLLM calls recorded)."""
    engine = object.__new__(VLLMEngine)
    engine.device_type, engine.sleep_level, engine.asleep = "cuda", level, True
    engine.weight_dtype, engine.bucket_bytes, engine.tp_group = torch.bfloat16, 2**20, None
    engine.llm = _RecordingLLM(calls)
    return engine


def test_the_cache_is_emptied_before_every_wake_up(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(vllm_engine_module, "empty_device_cache", lambda: calls.append("empty_cache"))
    engine = _gpu_engine_asleep(calls, level=2)
    engine.update_weights([("w", torch.zeros(4))])
    assert calls == [
        "empty_cache", "wake_up:weights", "load_weights", "empty_cache", "wake_up:kv_cache", "reset_prefix_cache",
    ]  # fmt: skip
    calls.clear()
    engine = _gpu_engine_asleep(calls, level=1)  # level 1 wakes without an update (e.g. validation)
    engine._wake()
    assert calls == ["empty_cache", "wake_up:all"] and engine.asleep is False


def test_one_sleep_mode_engine_per_process():
    class Engine:  # anything weak-referenceable stands for an engine here
        pass

    policy, classmate, evals = Engine(), Engine(), Engine()
    claim_sleep_mode(policy, "cuda", 2)
    claim_sleep_mode(policy, "cuda", 2)  # the same engine again is fine
    claim_sleep_mode(classmate, "cuda", 0)  # no sleep mode: it holds its own budget
    claim_sleep_mode(evals, "cpu", 2)  # CPU engines never sleep
    with pytest.raises(ValueError, match="second vLLM engine with sleep_level=1 .* sleep_level=0"):
        claim_sleep_mode(classmate, "cuda", 1)
    release_sleep_mode(policy)
    claim_sleep_mode(classmate, "cuda", 1)  # once the first is closed
    release_sleep_mode(classmate)
    del policy
    claim_sleep_mode(evals, "cuda", 2)  # a collected engine holds nothing
    release_sleep_mode(evals)


def _share_worker(rank: int, world: int, init: str, out) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    groups = [dist.new_group(r) for r in tp_groups(world, 2)]
    group = groups[rank // 2]
    requests = [f"r{rank}-{i}" for i in range(rank + 1)]  # ranks hold different numbers of requests
    params = [100 * rank + i for i in range(rank + 1)]
    all_requests, all_params, mine = _share_in_group(requests, params, group)
    out.put((rank, all_requests, all_params, all_requests[mine], all_params[mine]))
    dist.destroy_process_group()


def test_a_tp_group_generates_all_its_ranks_requests_and_each_keeps_its_own(tmp_path):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    init = f"file://{tmp_path / 'rendezvous'}"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    procs = [ctx.Process(target=_share_worker, args=(r, 4, init, out)) for r in range(4)]
    for p in procs:
        p.start()
    results = {r: rest for r, *rest in (out.get(timeout=120) for _ in procs)}
    for p in procs:
        p.join(timeout=60)
    assert results[0][0] == results[1][0] == ["r0-0", "r1-0", "r1-1"]  # group [0, 1], rank order
    assert results[2][0] == ["r2-0", "r2-1", "r2-2", "r3-0", "r3-1", "r3-2", "r3-3"]
    for rank, (_, _, own_requests, own_params) in results.items():
        assert own_requests == [f"r{rank}-{i}" for i in range(rank + 1)]
        assert own_params == [100 * rank + i for i in range(rank + 1)]  # each request keeps its seed


@pytest.mark.slow
def test_a_cpu_engine_starts_with_its_device_settings(vllm_engine):
    assert vllm_engine.device_type == "cpu" and vllm_engine.sleep_level == 0
    config = vllm_engine.llm.llm_engine.vllm_config
    assert config.model_config.enforce_eager is True
    assert config.scheduler_config.enable_chunked_prefill is False
    vllm_engine.sleep()  # a no-op on CPU: generation goes on
    assert vllm_engine.asleep is False


@pytest.mark.slow
def test_vllm_start_up_collections_walk_only_the_objects_it_makes(tiny_model, vllm_engine, monkeypatch):
    """`freeze_heap_before_start_up`: vLLM's start-up runs full garbage collections; the process's own objects
    (torch, transformers, the trainer's) are frozen first, so those collections walk only what vLLM makes."""
    import gc

    gc.unfreeze()  # as before any engine started (the session's engine froze the heap at the end of its start)
    heap = len(gc.get_objects())
    walked = []
    collect = gc.collect

    def counting_collect(*args, **kwargs):
        walked.append(len(gc.get_objects()))  # what a collection walks now: frozen objects are left out
        return collect(*args, **kwargs)

    monkeypatch.setattr(gc, "collect", counting_collect)
    engine = VLLMEngine(tiny_model, dtype="float32", max_model_len=256, seed=0)
    monkeypatch.undo()
    try:
        assert len(walked) >= 2, walked  # ours, then vLLM's own
        assert walked[0] >= 0.9 * heap, (heap, walked)  # ours walks the whole heap, once
        assert max(walked[1:]) < heap / 2, (heap, walked)  # vLLM's walk a fraction of it
    finally:
        engine.close()
