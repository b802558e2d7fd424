"""The fault driver: vLLM's imports and calls, run against each fault of tests/cases.py (``FAULTS``: the
stand-in with one edit).

The fault tests (tests/patches/test_faults.py) and the strict-mode tests (tests/switches/test_strict.py)
run ``driver`` against each: shim on, shim off and strict. Each patch's row in ``CASES`` says which of its
outputs must match vLLM as shipped.
"""

from __future__ import annotations

import pytest

from tests.cases import ATTENTION, CASES, FAULTS, REMAP, SWA, method
from tests.conftest import edited_standin

# What the driver calls for each patch: the outputs that must match vLLM as shipped.
OUTPUTS = {name: case.outputs for name, case in CASES.items() if case.outputs is not None}

# vLLM's classes and methods the driver calls, as the stand-in names them.
NAMES = {
    "swa_cls": SWA.qualname.split(".")[0], "swa_meth": method(SWA),
    "attn_cls": ATTENTION.qualname.split(".")[0], "attn_meth": method(ATTENTION),
    "draft_cls": REMAP.qualname.split(".")[0], "remap_meth": method(REMAP),
}


CHECKPOINT = ["mtp.0.attn.wkv.weight", "mtp.1.ffn.gate.weight", "mtp.2.norm.weight", "layers.0.attn.wkv.weight"]


def driver(names: dict[str, str], draft: bool = True) -> str:
    """vLLM's import and calls, each call twice (a failure must be reported once), then status."""
    n = {**NAMES, **names}
    lines = [
        "import json",
        "from types import SimpleNamespace",
        "config = SimpleNamespace(cache_config=SimpleNamespace(block_size=256, cache_dtype='fp8_ds_mla'))",
        "out = {}",
        f"from {SWA.module} import {n['swa_cls']} as S",
        f"from {ATTENTION.module} import {n['attn_cls']} as A",
        f"out['swa'] = [repr(S().{n['swa_meth']}(config)) for _ in range(2)]",
        f"out['attention'] = [repr(A(compress_ratio=4).{n['attn_meth']}(config)) for _ in range(2)]",
    ]
    if draft:
        lines += [
            f"from {REMAP.module} import {n['draft_cls']} as D",
            f"out['remap'] = [D().{n['remap_meth']}(name) for name in {CHECKPOINT!r} * 2]",
            f"out['load'] = sorted(D().load_weights((name, None) for name in {CHECKPOINT!r}))",
        ]
    lines += ["import dspark_hotfix", "out['status'] = {r['name']: r for r in dspark_hotfix.status()['patches']}",
              "print(json.dumps(out))"]
    return "\n".join(lines) + "\n"


@pytest.fixture(params=sorted(FAULTS), ids=lambda k: k.replace(" ", "-"))
def fault(request, tmp_path):
    spec = FAULTS[request.param]
    return spec, edited_standin(tmp_path / "standin", spec.edits, spec.remove)
