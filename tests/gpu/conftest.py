"""GPU evidence tier: the real FlashMLA kernel on the layouts the shim produces.

Everything here skips, with the missing piece named, unless the machine has torch
with CUDA on an SM90/SM100 GPU and vLLM 0.25.0's FlashMLA extension
(``python3 -m harness.gpu_evidence prepare`` extracts it into ``.gpu/``). torch is imported
lazily so that the CPU CI machine, which has no torch, still collects this folder.

When ``DSPARK_GPU_EVIDENCE_JSON`` names a file, the measurements the tests record
and every test's outcome are written there at the end of the session;
``python3 -m harness.gpu_evidence collect`` turns that file into docs/evidence/gpu-h200.{json,md}.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
KV_VIEWS_JSON = REPO_ROOT / "docs" / "evidence" / "kv_views.json"
LIBRARY_ENV = "DSPARK_FLASHMLA_LIB"
EVIDENCE_ENV = "DSPARK_GPU_EVIDENCE_JSON"
DEFAULT_LIBRARY = REPO_ROOT / ".gpu" / "_flashmla_C.abi3.so"
NEEDS = "needs an NVIDIA GPU with torch CUDA: "

_evidence: dict[str, Any] = {"environment": {}, "results": {}, "tests": {}}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" or report.outcome != "passed":
        entry: dict[str, Any] = {"outcome": report.outcome}
        if report.skipped and isinstance(report.longrepr, tuple):
            entry["reason"] = report.longrepr[2]
        elif report.failed:
            entry["error"] = report.longreprtext[-4000:]
        _evidence["tests"][report.nodeid] = entry


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get(EVIDENCE_ENV)
    if target:
        Path(target).write_text(json.dumps(_evidence, indent=2, sort_keys=True) + "\n")


@dataclasses.dataclass(frozen=True)
class FlashMLA:
    """vLLM's FlashMLA extension, loaded without importing vLLM."""

    library: Path
    schema: str
    takes_out: bool

    def sparse_decode(
        self,
        q: Any,
        kv: Any,
        indices: Any,
        topk_length: Any,
        sm_scale: float,
        *,
        attn_sink: Any = None,
        extra_kv: Any = None,
        extra_indices: Any = None,
        extra_topk_length: Any = None,
        scheduler: tuple[Any, Any] | None = None,
    ) -> tuple[Any, Any, tuple[Any, Any]]:
        """One sparse decode; returns (out, lse, scheduler metadata for reuse).

        Passing ``scheduler=None`` lets the op plan the split-KV schedule itself,
        which is what vLLM's first layer of each type does in a step.
        """
        import torch

        sched_meta, num_splits = scheduler if scheduler is not None else (None, None)
        args = [
            q, kv, indices, topk_length, attn_sink, sched_meta, num_splits,
            extra_kv, extra_indices, extra_topk_length, 512, sm_scale,
        ]  # fmt: skip
        if self.takes_out:
            args.append(None)
        out, lse, sched_meta, num_splits = torch.ops._flashmla_C.sparse_decode_fwd(*args)
        return out, lse, (sched_meta, num_splits)


def _find_library() -> Path | None:
    if LIBRARY_ENV in os.environ:
        return Path(os.environ[LIBRARY_ENV])
    if DEFAULT_LIBRARY.is_file():
        return DEFAULT_LIBRARY
    spec = find_spec("vllm")  # locate an installed vLLM without importing it
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            candidate = Path(folder) / "_flashmla_C.abi3.so"
            if candidate.is_file():
                return candidate
    return None


@pytest.fixture(scope="session")
def cuda_device() -> Any:
    torch = pytest.importorskip("torch", reason=NEEDS + "torch not installed")
    if not torch.cuda.is_available():
        pytest.skip(NEEDS + f"torch {torch.__version__} sees no CUDA device")
    capability = torch.cuda.get_device_capability()
    if capability[0] not in (9, 10):
        pytest.skip(
            "FlashMLA sparse decode needs SM90 or SM100; this GPU is"
            f" SM{capability[0]}{capability[1]}"
        )
    props = torch.cuda.get_device_properties(0)
    _evidence["environment"].update(
        gpu=props.name,
        capability=f"{capability[0]}.{capability[1]}",
        multiprocessors=props.multi_processor_count,
        gpu_memory_gib=round(props.total_memory / 2**30, 1),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        python=platform.python_version(),
    )
    return torch.device("cuda", 0)


@pytest.fixture(scope="session")
def flashmla(cuda_device: Any) -> FlashMLA:
    import torch

    library = _find_library()
    if library is None or not library.is_file():
        pytest.skip(
            f"FlashMLA library not found ({library or DEFAULT_LIBRARY}): run "
            f"`python3 -m harness.gpu_evidence prepare` or set {LIBRARY_ENV}"
        )
    # A library that is present but does not load is a real failure, not a skip.
    torch.ops.load_library(str(library))
    packet = torch.ops._flashmla_C.sparse_decode_fwd
    schema = packet.default._schema
    _evidence["environment"].update(
        flashmla_library=library.name,
        flashmla_sha256=hashlib.sha256(library.read_bytes()).hexdigest(),
        sparse_decode_fwd_schema=str(schema),
    )
    return FlashMLA(library, str(schema), takes_out=len(schema.arguments) == 13)


@pytest.fixture(scope="session")
def kv_views() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(KV_VIEWS_JSON.read_text())
    _evidence["environment"]["kv_views_source"] = data.get("source")
    return data["views"]


@pytest.fixture(scope="session")
def evidence() -> dict[str, Any]:
    """Where tests put the numbers they measured, keyed by test."""
    results: dict[str, Any] = _evidence["results"]
    return results
