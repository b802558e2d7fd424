"""The real-vLLM tier for ``/metrics``: the shim's series as vLLM 0.25.0 serves them, on the CPU.

``inside/scrape_metrics.py`` runs in the cached venv with the repository on
``PYTHONPATH`` (the shim active through ``sitecustomize``) and scrapes vLLM's own
``/metrics`` route (``attach_router``, over HTTP) and ``generate_latest`` of
vLLM's ``get_prometheus_registry()``: with one API server prometheus_client's
default registry, with several vLLM's multiprocess collection, set up by vLLM's
own ``setup_multiprocess_prometheus`` in a launcher process, as ``vllm serve
--api-server-count 2`` does. The API server's process imports what ``vllm serve``
imports there: the model's modules with vLLM's check of a quantized checkpoint
(``get_quantization_config``), then its engine client, which imports KV-cache
grouping's. So it judges every patch, as the H200 servers showed (every patch
``patched`` on ``/metrics``, docs/evidence/serve-h200.json). This tier never skips:
if a venv cannot be built, it fails and says so.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from dspark_hotfix import __version__
from dspark_hotfix.patches import ALL
from scripts.venvs import ensure_venv
from tests.conftest import REPO, clean_env
from tests.real_vllm import runs
from tests.reporting.test_metrics import Scrape

pytestmark = pytest.mark.real_vllm

INSIDE = Path(__file__).resolve().parent / "inside" / "scrape_metrics.py"
VERSION = "0.25.0"
# What 0.25.0 needs, as each patch's test module declares it (RELEASED).
DECIDED = runs.expected(VERSION)
TARGETS = list(dict.fromkeys(p.module for p in ALL))


def run(*args: str) -> list[dict]:
    python, _ = ensure_venv(VERSION)
    env = clean_env(PYTHONPATH=str(REPO), TARGET_MODULES=json.dumps(TARGETS))
    proc = subprocess.run(
        [str(python), str(INSIDE), *args],
        env=env,
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def scraped(row: dict) -> Scrape:
    assert row["status"] == 200
    assert sorted(map(json.dumps, row["served"])) == sorted(
        map(json.dumps, row["direct"])
    )  # the route serves it
    return Scrape(row["served"])


def test_one_api_server_serves_the_states_of_its_own_process_from_the_default_registry():
    (api,) = run("api")
    assert api["default"]
    # By vLLM's own imports, as a server's API server: every patch's module this release has.
    assert api["imported"] == api["present"] and set(api["present"]) <= set(TARGETS), api
    scrape = scraped(api)
    assert scrape.info == {("sitecustomize", __version__, None): 1}
    assert scrape.current() == DECIDED
    assert scrape.needed == {
        (patch, None): int(state == "patched") for patch, state in DECIDED.items()
    }


def test_several_api_servers_serve_every_process_through_vllms_multiprocess_collection():
    launcher, engine, api = run("launcher")
    assert not api["default"]  # vLLM's CollectorRegistry with a MultiProcessCollector
    scrape = scraped(api)
    pids = {str(engine["pid"]), str(api["pid"])}
    # prometheus_client was imported in the launcher before the directory was set: its own series
    # stay in memory.
    assert scrape.info == {("sitecustomize", __version__, pid): 1 for pid in pids}
    assert str(launcher["pid"]) not in pids
    assert scrape.current(str(engine["pid"])) == scrape.current(str(api["pid"])) == DECIDED
    assert set(scrape.needed) == {(patch, pid) for patch in DECIDED for pid in pids}
