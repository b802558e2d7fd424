# The few commands a newcomer needs. Everything installs from PyPI into .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint unit real-vllm gpu-evidence bench clean

$(VENV)/.ready: requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

demo: $(VENV)/.ready  ## the reported crash and its repair, side by side (stand-in build)
	$(PY) scripts/demo.py

lint: $(VENV)/.ready
	$(PY) -m ruff check dspark_hotfix tests scripts scripts/gpu-evidence bench
	$(PY) -m mypy

test: lint  ## everything CI runs: lint, types, unit, subprocess and real-vLLM tiers
	$(PY) -m pytest

unit: $(VENV)/.ready  ## the fast tiers only
	$(PY) -m pytest -m "not real_vllm"

real-vllm: $(VENV)/.ready  ## only the real-vLLM tier (installs vLLM releases into ~/.cache/dspark-hotfix)
	$(PY) -m pytest -m real_vllm

gpu-evidence:  ## step 1 of 3: fetch FlashMLA from vLLM 0.25.0's wheel into .gpu/ (see docs/evidence/gpu-h200.md)
	$(PYTHON) scripts/gpu-evidence prepare

bench: $(VENV)/.ready  ## A/B costs of the shim (start-up, vLLM import, per call, memory) -> docs/BENCHMARKS.md
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
