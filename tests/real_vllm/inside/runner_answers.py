"""vLLM's own answers on the DSpark crash path, as one JSON line.

The V2 runner's KV views (``_reshape_kv_cache``) of the ``fp8_ds_mla`` specs
that vLLM's spec methods return, and its DSpark remap for every name of
``grid.NAMES`` (a draft of 3 layers over 43 target layers). Nothing of the shim
is imported here: whatever the environment activated is what answers, so the
same script runs with the shim, without it, and with ``DSPARK_HOTFIX=0``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grid

TARGET_LAYERS, DRAFT_LAYERS = 43, 3


def answers() -> dict[str, Any]:
    import vllm
    from vllm.v1.worker.gpu import attn_utils

    specs = grid.fp8_specs()
    views = {
        kind: grid.runner_view(attn_utils._reshape_kv_cache, kind, spec)
        for kind, spec in specs.items()
    }
    draft = grid.draft(TARGET_LAYERS, DRAFT_LAYERS)
    remap: dict[str, str | None] = {}
    for name in grid.NAMES:
        try:
            remap[name] = grid.remap(draft, name)
        except Exception as exc:  # recorded, compared across runs
            remap[name] = f"raised {type(exc).__name__}"
    functions = grid.crash_path()
    return {
        "vllm_file": vllm.__file__,
        "vllm": vllm.__version__,
        "wrapped": {name: hasattr(fn, "__wrapped__") for name, fn in functions.items()},
        "kv_quant_mode": {
            kind: str(getattr(spec.kv_quant_mode, "name", spec.kv_quant_mode))
            for kind, spec in specs.items()
        },
        "views": views,
        "remap": remap,
    }


if __name__ == "__main__":
    print(json.dumps(answers()))
