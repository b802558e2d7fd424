"""Scrapes vLLM's own ``/metrics`` for the shim's series, in processes arranged as ``vllm serve``
arranges them.

Run by ``tests/real_vllm/test_metrics.py`` with a real vLLM venv's python, the
repository on ``PYTHONPATH`` and ``TARGET_MODULES``; prints one JSON object per line:

- ``api``: an API server's process, importing what ``vllm serve`` imports there: the model's
  modules with vLLM's check of a quantized checkpoint (``ModelConfig`` calls
  ``get_quantization_config`` for each method it knows, which imports ``vllm.models.deepseek_v4``),
  then its engine client (``vllm.v1.engine.async_llm``); vLLM's ``/metrics`` route
  (``attach_router``) on a FastAPI app, scraped over HTTP; which target modules it imported.
- ``engine``: the engine core's and the workers' modules imported; prints its pid.
- ``launcher``: as ``vllm serve --api-server-count 2``: ``setup_multiprocess_prometheus()``
  after ``prometheus_client`` is imported (vLLM's CLI imports it first), then an engine
  process and an API server process started with the environment it set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

# The engine core, the workers' runner, and every patch's target module (TARGET_MODULES, JSON, from
# the test: the model's, the DSpark draft's, the grouping's).
ENGINE = (
    "vllm.v1.engine.core",
    "vllm.v1.worker.gpu.attn_utils",
    *json.loads(os.environ["TARGET_MODULES"]),
)


def samples(text: str) -> list[list]:
    from prometheus_client.parser import text_string_to_metric_families

    return [
        [s.name, s.labels, s.value]
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("dspark_hotfix_")
    ]


def api() -> None:
    from vllm.model_executor.layers.quantization import get_quantization_config

    get_quantization_config(
        "deepseek_v4_fp8"
    )  # as ModelConfig checks a quantized checkpoint: any method imports it

    from importlib.util import find_spec

    import vllm.v1.engine.async_llm  # noqa: F401
    from fastapi import FastAPI
    from prometheus_client import REGISTRY, generate_latest
    from starlette.testclient import TestClient
    from vllm.entrypoints.serve.instrumentator.metrics import attach_router
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    app = FastAPI()
    attach_router(app)
    client = TestClient(app)

    response = client.get("/metrics")
    registry = get_prometheus_registry()
    print(
        json.dumps(
            {
                "pid": os.getpid(),
                "status": response.status_code,
                "default": registry is REGISTRY,
                "served": samples(response.text),
                "direct": samples(generate_latest(registry).decode()),
                "imported": [
                    m for m in json.loads(os.environ["TARGET_MODULES"]) if m in sys.modules
                ],
                "present": [
                    m for m in json.loads(os.environ["TARGET_MODULES"]) if find_spec(m) is not None
                ],
            }
        )
    )


def engine() -> None:
    import importlib
    import importlib.util

    for module in ENGINE:
        if importlib.util.find_spec(module) is not None:  # (a patch's module some releases lack)
            importlib.import_module(module)
    print(json.dumps({"pid": os.getpid()}))


def launcher() -> None:
    from vllm.v1.metrics.prometheus import setup_multiprocess_prometheus

    setup_multiprocess_prometheus()
    print(json.dumps({"pid": os.getpid(), "dir": os.environ["PROMETHEUS_MULTIPROC_DIR"]}))
    sys.stdout.flush()
    for role in ("engine", "api"):
        subprocess.run([sys.executable, __file__, role], check=True)


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "api":
        api()
    elif role == "engine":
        engine()
    else:
        launcher()
