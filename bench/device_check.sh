#!/usr/bin/env bash
# The GPU checks on a lent device machine (torch and transformers preinstalled, no registry, no vLLM).
#   CARRY=.devcarry bench/device_check.sh lease   # one lease: the memory probe, then stage `random` (below);
#                                                 # bench/devcarry.sh builds .devcarry here first
#   bench/device_check.sh probe    # bench/memory_probe.py at the paper preset's shapes (Qwen3-4B-shaped, 6 layers)
#   bench/device_check.sh random   # a random-init SmolLM2-135M (real config): 2 GRPO steps with the HF engine
#                                  # (MFU, peak vs the planner), 1 step with policy.cpu_offload=true, DCP round trip
#   bench/device_check.sh real     # the same on the embedded GGUF joined from two pieces (/root/gguf.a + gguf.b:
#                                  # two calls on one warm machine, bench/devcarry.sh says how)
#   bench/device_check.sh kernels  # bench/logprob_kernels.py (eager vs compiled log-prob kernels: error, time, a
#                                  # paper micro-batch), the shared-layout probe with compiled then eager kernels,
#                                  # then stage `random`'s two default GRPO steps
#   bench/device_check.sh flex     # bench/flex_probe.py (FlexAttention alone, stage by stage), then the memory
#                                  # probe's shared layout at 2K and paper lengths and its unshared layout
# Python packages the image lacks (hydra, omegaconf, antlr4, gguf: pure Python) travel as a site folder, $CARRY/site,
# or as wheels in $WHL; the tokenizer and config in $CARRY/tok. Results go to $OUT; each check has its own
# time limit and a failed one is reported and the next still runs.
# bench/gpu_check.py, bench/dcp_check.py and bench/memory_probe.py run on the CPU in the test suite
# (tests/test_bench_checks.py, tests/test_memory_probe.py), so an API change that breaks them fails there first.
set -uo pipefail
stage=$1
export PYTHONPATH=$PWD:${CARRY:-.}/site:/tmp/site PYTHONUNBUFFERED=1 RLPOST_CACHE=/root/rlpost-cache
export TOKENIZERS_PARALLELISM=false
if [ -n "${WHL:-}" ] && [ ! -d /tmp/site/omegaconf ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHL"/*.whl
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
mkdir -p /root/models "$OUT"
# the planner's GPU kind (train/plan.py GPUS): the card this runs on
GPU_KIND=${GPU_KIND:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200 && echo h200 || echo h100)}

check() {  # check SECONDS NAME COMMAND...: run it under a limit; a failure is reported, not fatal
  local limit=$1 name=$2; shift 2
  local t0=$SECONDS
  # USR1 first: bench/memory_probe.py dumps every thread's Python stack on it (where a stall sits), then TERM
  timeout -s USR1 -k 20 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  grep -v "it/s]" "$OUT/$name.log" | tail -6
  echo "== $name: rc=$rc in $((SECONDS - t0))s (limit ${limit}s)"
}

probe() {
  TORCH_LOGS=${TORCH_LOGS:-recompiles} check "${PROBE_S:-240}" probe python3 -m bench.memory_probe --gpu "${GPU_KIND:-h100}" --out "$OUT/probe.json" ${PROBE_ARGS:-}
}

flex() {  # where the shared-prompt layout stalls: FlexAttention alone, then the policy at growing lengths
  check "${FLEX_S:-170}" flex python3 -m bench.flex_probe --stage-s 45 --out "$OUT/flex.json" \
    --cases shared:1x4096,shared:1x16384,shared:2x16384,packed:1x32768
  check 110 probe-shared-2k python3 -m bench.memory_probe --gpu "$GPU_KIND" --layouts shared --max-response 2048 \
    --out "$OUT/probe-shared-2k.json"
  check 100 probe-shared python3 -m bench.memory_probe --gpu "$GPU_KIND" --layouts shared --out "$OUT/probe-shared.json"
  check 110 probe-unshared python3 -m bench.memory_probe --gpu "$GPU_KIND" --layouts unshared \
    --out "$OUT/probe-unshared.json"
}

train_checks() {
  local stage=$1 model
  if [ "$stage" = random ]; then
    model=/root/models/smollm2-random
    python3 - "$CARRY/tok" "$model" <<'PY'
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
config = AutoConfig.from_pretrained(sys.argv[1])
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(config)
model.save_pretrained(sys.argv[2]); AutoTokenizer.from_pretrained(sys.argv[1]).save_pretrained(sys.argv[2])
print("random-init model with the real config:", sum(p.numel() for p in model.parameters()), "parameters")
PY
  else
    model=/root/models/SmolLM2-135M-Instruct
    cat /root/gguf.a "$CARRY/gguf.b" > /root/SmolLM2-135M-Instruct.Q4_1.gguf
    python3 -c "
from pathlib import Path; from infra.models import convert_gguf
print(convert_gguf(Path('/root/SmolLM2-135M-Instruct.Q4_1.gguf'), Path('$model')))"
  fi
  local kind="--gpu ${GPU_KIND:-h100}"
  check "${STEP_S:-120}" "$stage-default" python3 -m bench.gpu_check --model "$model" $kind --steps 2 \
    --out "$OUT/$stage-default.json"
  [ -n "${DEFAULT_ONLY:-}" ] && return
  check "${STEP_S:-120}" "$stage-offload" python3 -m bench.gpu_check --model "$model" $kind --steps 1 \
    --out "$OUT/$stage-offload.json" policy.cpu_offload=true
  if [ "$stage" = real ]; then
    check "${STEP_S:-120}" "$stage-fp32" python3 -m bench.gpu_check --model "$model" $kind --steps 2 \
      --out "$OUT/$stage-fp32.json" policy.precision=fp32
  fi
  check "${DCP_S:-90}" "$stage-dcp" python3 -m bench.dcp_check "$model"
}

kernels() {  # policy.torch_compile on this device: the kernels alone, then the policy at paper shapes, A/B
  check "${KERNELS_S:-150}" logprob-kernels python3 -m bench.logprob_kernels --chunk-scales 1,8 \
    --out "$OUT/logprob-kernels.json"
  for compiled in true false; do
    check "${PROBE_S:-130}" "probe-shared-compiled-$compiled" python3 -m bench.memory_probe --gpu "$GPU_KIND" \
      --layouts shared --torch-compile "$compiled" --out "$OUT/probe-shared-compiled-$compiled.json"
  done
  DEFAULT_ONLY=1 train_checks random
}

case "$stage" in
  probe) probe ;;
  random | real) train_checks "$stage" ;;
  lease) probe; train_checks random ;;
  flex) flex ;;
  kernels) kernels ;;
  *) echo "usage: bench/device_check.sh lease|probe|random|real|flex|kernels" >&2; exit 2 ;;
esac
