#!/usr/bin/env bash
# Builds .devcarry/ for a lent GPU run (bench/device_check.sh): the pure-Python packages its image lacks, copied
# from this checkout's .venv (hydra, omegaconf, antlr4), and the embedded model's tokenizer and config (stage
# `random` builds a random-initialised model from them there). Ignored by git through .git/info/exclude; ~6 MB.
#   bench/devcarry.sh && device run: CARRY=.devcarry bash bench/device_check.sh lease   (carry: [".devcarry"])
set -euo pipefail
cd "$(dirname "$0")/.."
site=$(.venv/bin/python -c "import omegaconf, pathlib; print(pathlib.Path(omegaconf.__file__).parents[1])")
model=$(.venv/bin/python -m infra.models 2>/dev/null | tail -1)
[ -f "$model/tokenizer.json" ] || model=.cache/models/SmolLM2-135M-Instruct
[ -f "$model/tokenizer.json" ] || { echo "bench/devcarry.sh: no converted model: run python -m infra.models" >&2; exit 1; }
rm -rf .devcarry && mkdir -p .devcarry/site .devcarry/tok
cp -r "$site"/{hydra,omegaconf,antlr4} .devcarry/site/
find .devcarry/site -name __pycache__ -prune -exec rm -rf {} +
for f in config.json generation_config.json tokenizer.json tokenizer_config.json chat_template.jinja; do
  [ -f "$model/$f" ] && cp "$model/$f" .devcarry/tok/
done
grep -qx "/.devcarry/" .git/info/exclude 2>/dev/null || echo "/.devcarry/" >> .git/info/exclude
du -sh .devcarry
