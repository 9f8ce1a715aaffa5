"""A compiled CPU rollout engine (`rollout.engine.enforce_eager=false`): its second start loads the model the
first one compiled (vLLM's AOT cache, see `reuse_cpu_compile_cache`) and it follows weight syncs exactly."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.heavy]  # make test-all (docs/commands.md, Tests)

# One engine start in a fresh process (vLLM and inductor keep compiled state per process): greedy samples,
# how many AOT artifacts it loaded, and how far its log-probs are from the trainer's after a sync of weights
# the trainer moved (the compiled model must read the synced weights, not constants baked in at compile time).
START = r"""
import json, sys, torch
from vllm.compilation.counter import compilation_counter
from train.policy.distributed import init_distributed
from train.policy.fsdp import Policy
from train.rollout.base import SamplingConfig
from train.rollout.vllm_engine import VLLMEngine

init_distributed()
model = sys.argv[1]
engine = VLLMEngine(model, dtype="float32", max_model_len=256, seed=0, enforce_eager=False, sleep_level=0)
loaded = compilation_counter.num_aot_artifacts_loaded
greedy = engine.generate([[1, 504, 3458, 314]], SamplingConfig(n=1, max_new_tokens=6, temperature=0.0))
policy = Policy(model, lr=5e-3, grad_clip=100.0, pad_id=0)
prompts, responses = [[1, 504, 3458], [1, 253]], [[907, 33, 12, 5], [44, 1290]]
for _ in range(3):  # move the weights away from what the engine holds
    policy.train_step(prompts, responses, lambda mb, lp, ent: (-(lp * mb.response_mask).sum(), {}), with_entropy=False)
engine.update_weights(policy.full_weights())
theirs = engine.sequence_logprobs(prompts, responses)
ours, _ = policy.compute_log_probs(prompts, responses)
gap = max(abs(x - float(ours[i, k])) for i, row in enumerate(theirs) for k, x in enumerate(row))
print("RESULT " + json.dumps({"loaded": loaded, "greedy": greedy.response_ids, "gap": gap}))
"""


def _start(model, env) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", START, str(model)], env=env, capture_output=True, text=True, timeout=600
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def test_a_compiled_cpu_engine_reuses_its_compiled_model_and_follows_syncs(tiny_model, tmp_path):
    env = {**os.environ, "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")}  # cold at the first start
    first, second = _start(tiny_model, env), _start(tiny_model, env)
    assert first["loaded"] == 0, "the first start had nothing to load"
    # without reuse_cpu_compile_cache vLLM 0.32 fails to load its own CPU artifact and compiles again (0 here)
    assert second["loaded"] == 1, "the second start compiled again instead of loading the first's model"
    assert second["greedy"] == first["greedy"]
    # fp32 both sides; vLLM's CPU attention vs torch SDPA: not bit-equal (same tolerance as test_rollout_sync)
    assert first["gap"] < 2e-3 and second["gap"] < 2e-3, (first["gap"], second["gap"])
