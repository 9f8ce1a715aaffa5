#!/usr/bin/env bash
# The issue-14 GPU check on a lent device machine (torch and transformers preinstalled, no registry).
#   bench/device_check.sh random  # stage 1: wheels installed, a random-init SmolLM2-135M (real config) trained
#   bench/device_check.sh real    # stage 2: the embedded GGUF joined from two pieces, converted, trained
# Run from an unpacked copy of the project; wheels in $WHL, carried files in $CARRY; results go to $OUT.
# Status: written for issue 14's GPU check, whose task was lent no GPU in the end: it has not run on a GPU yet
# (bench/gpu_check.py and bench/dcp_check.py, which it calls, run on the CPU in tests/test_bench_checks.py, so a
# change of the trainer or policy API that breaks them fails the suite; dcp_check exits 1 when its round trip differs).
set -euo pipefail
stage=$1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 RLPOST_CACHE=/root/rlpost-cache TOKENIZERS_PARALLELISM=false
[ -d /tmp/site/omegaconf ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHL"/*.whl
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
mkdir -p /root/models
if [ "$stage" = random ]; then
  model=/root/models/smollm2-random
  python3 - "$CARRY/tok" "$model" <<'EOF'
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
config = AutoConfig.from_pretrained(sys.argv[1])
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(config)
model.save_pretrained(sys.argv[2]); AutoTokenizer.from_pretrained(sys.argv[1]).save_pretrained(sys.argv[2])
print("random-init model with the real config:", sum(p.numel() for p in model.parameters()), "parameters")
EOF
else
  model=/root/models/SmolLM2-135M-Instruct
  cat /root/gguf.a "$CARRY/gguf.b" > /root/SmolLM2-135M-Instruct.Q4_1.gguf
  python3 -c "
from pathlib import Path; from infra.models import convert_gguf
print(convert_gguf(Path('/root/SmolLM2-135M-Instruct.Q4_1.gguf'), Path('$model')))"
fi
python3 -m bench.gpu_check --model "$model" --steps 2 --out "$OUT/$stage-default.json" 2>&1 | grep -v "it/s]" | tail -8
python3 -m bench.gpu_check --model "$model" --steps 2 --out "$OUT/$stage-ckpt-packed.json" \
  policy.gradient_checkpointing=true policy.pack_sequences=true 2>&1 | grep -v "it/s]" | tail -4
if [ "$stage" = real ]; then
  python3 -m bench.gpu_check --model "$model" --steps 2 --out "$OUT/$stage-fp32.json" policy.precision=fp32 \
    2>&1 | grep -v "it/s]" | tail -4
  python3 -m bench.dcp_check "$model" 2>&1 | tail -4
fi
