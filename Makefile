# The few commands a newcomer needs. Everything installs from PyPI into .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The same suite on the other wrapt major: wrapt 2.x, newest, where .venv pins the Dockerfile's 1.17.3.
WRAPT2 := .venv-wrapt2
# Laid out by ruff format (pyproject.toml: line length 100), checked by make lint.
PYTHON_SOURCES := dspark_hotfix tests scripts scripts/loc bench harness

.PHONY: demo test lint unit wrapt2 slow sweep lifecycle real-vllm records coexist-test oci-test oci-real ray-test evidence gpu-evidence bench dist clean

$(VENV)/.ready: requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

$(WRAPT2)/.ready: requirements-dev.txt
	$(PYTHON) -m venv $(WRAPT2)
	$(WRAPT2)/bin/python -m pip install -q --upgrade pip
	grep -v '^wrapt==' requirements-dev.txt | $(WRAPT2)/bin/python -m pip install -q -r /dev/stdin 'wrapt>=2,<3'
	touch $@

demo: $(VENV)/.ready  ## the reported crash and its repair, side by side (stand-in build)
	$(PY) scripts/demo.py

lint: $(VENV)/.ready
	$(PY) -m ruff format --check $(PYTHON_SOURCES)
	$(PY) -m ruff check $(PYTHON_SOURCES)
	$(PY) scripts/loc
	$(PY) -m mypy

FAST := not real_vllm and not oci and not ray and not coexist and not sweep and not sweep_long and not lifecycle
SLOW := real_vllm or oci or ray or coexist or sweep

test: lint unit slow wrapt2  ## everything CI runs: lint, types, the fast tiers, then the real-vLLM, OCI, Ray, coexistence and sweep tiers, wrapt 2, and one patch's removal
	LIFECYCLE_ONE=1 $(PY) -m pytest -m lifecycle

unit: $(VENV)/.ready  ## the fast tiers only, in parallel
	$(PY) -m pytest -n 2 --dist loadfile -m "$(FAST)"

wrapt2: $(WRAPT2)/.ready  ## the fast and sweep tiers again with the newest wrapt 2.x (.venv-wrapt2)
	$(WRAPT2)/bin/python -m pytest -n 2 --dist loadfile -m "($(FAST)) or sweep"

slow: $(VENV)/.ready  ## the tiers that install real vLLM, buildah, Ray and tracing tools (cached in ~/.cache/dspark-hotfix), and the sweep tier
	$(PY) -m pytest -n 2 --dist loadfile -m "$(SLOW)"

real-vllm: $(VENV)/.ready  ## only the real-vLLM tier (installs vLLM releases into ~/.cache/dspark-hotfix)
	$(PY) -m pytest -m real_vllm

records: $(VENV)/.ready  ## rewrite the CPU records (docs/evidence: hybrid-off, lines, reverted, kv_views) with the real-vLLM tier, then docs/MATRIX.md from them
	DSPARK_HOTFIX_UPDATE_EVIDENCE=1 $(PY) -m pytest -n 2 --dist loadfile -m real_vllm tests/real_vllm
	$(PY) scripts/matrix.py

coexist-test: $(VENV)/.ready  ## only the coexistence tier: ddtrace and OpenTelemetry beside the shim on real vLLM 0.25.0
	$(PY) -m pytest -m coexist

oci-test: $(VENV)/.ready  ## only the OCI tier: the Dockerfile built and run with buildah (apt-get installs buildah, debootstrap if missing)
	$(PY) -m pytest -m oci

oci-real:  ## the Dockerfile on a base with real vLLM 0.25.0: not automated (see docs/OPERATORS.md, Docker)
	@echo "oci-real: not automated here: vLLM 0.25.0 from PyPI is 9.5 GB with its CUDA torch, and buildah's vfs storage" >&2
	@echo "copies every layer in full for each stage and container; build on your vLLM image instead:" >&2
	@echo "  docker build --build-arg VLLM_IMAGE=vllm/vllm-openai:v0.25.0 ." >&2
	@exit 2

sweep: $(VENV)/.ready  ## every point of every activation path interrupted in turn, on the toys and on the stand-in with the real patches (long)
	$(PY) -m pytest -n 2 --dist loadfile -m "sweep or sweep_long"

lifecycle: $(VENV)/.ready  ## each patch removed in a copy of the repository, then make unit, make evidence and bench/run.py --smoke there (about 5 min a patch; make test removes one, another at each commit)
	$(PY) -m pytest -m lifecycle

ray-test: $(VENV)/.ready  ## only the Ray tier: actors on local Ray clusters (installs ray into ~/.cache/dspark-hotfix)
	$(PY) -m pytest -m ray

evidence: $(VENV)/.ready  ## the committed records (docs/evidence) and docs/MATRIX.md against the harnesses that wrote them
	$(PY) -m pytest harness/tests

gpu-evidence:  ## step 1 of 3: fetch FlashMLA from vLLM 0.25.0's wheel into .gpu/ (see harness/README.md)
	$(PYTHON) -m harness.gpu_evidence prepare

bench: $(VENV)/.ready  ## A/B costs of the shim (start-up, vLLM import, per call, memory) -> docs/BENCHMARKS.md
	$(PY) bench/run.py

dist: $(VENV)/.ready  ## the sdist and wheel of HEAD (uncommitted files never ship; VERSION.postN.dev0+gHASH after a release's commit) and wrapt's pinned wheel, byte for byte the same on every rebuild under any umask, offline once run, and dist/SHA256SUMS
	$(PY) scripts/dist.py dist

clean:
	rm -rf $(VENV) $(WRAPT2) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
