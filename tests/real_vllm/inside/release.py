"""One vLLM release judged, as one JSON object: what the shim says of it, and what vLLM's own code
does with DeepSeek-V4's KV caches with the hybrid KV cache manager on and off.

Run by ``tests/real_vllm/test_releases.py`` as ``<venv python> release.py``, the repository on
``PYTHONPATH``: once as an operator activates the shim, and once with ``DSPARK_HOTFIX=0``, where
every patch is judged and none applied (vLLM as shipped). ``dspark_hotfix.doctor.report`` imports
vLLM and every place of every patch's target, as ``dspark-hotfix doctor`` does; then vLLM's own
``get_kv_cache_groups`` groups the representative model's specs and the V2 runner views them, as in
``hybrid_off.py``, whose code this reuses. CPU only, no GPU, no model weights. Anything that fails
unexpectedly is named under ``"errors"``.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import hybrid_off as inside

# A DeepSeek-V4 checkpoint's config.json with DSpark layers and ``quant_method: fp8``, as the
# reported model's: the e2e model's (harness/e2e).
CONFIG = Path(__file__).resolve().parents[3] / "harness" / "e2e" / "config.json"


def draft_quantization() -> dict[str, str | None]:
    """The quantization vLLM's own ``SpeculativeConfig`` gives the DSpark draft of that checkpoint
    (its config.json is all there is: nothing is loaded), the draft named explicitly
    (``--speculative-config.model``) and omitted, beside the target's; and what ``dspark-hotfix
    doctor --model`` says of it there (``doctor``)."""
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig

    from dspark_hotfix import doctor

    with tempfile.TemporaryDirectory() as model:
        shutil.copy(CONFIG, Path(model) / "config.json")
        said = doctor.drafted(doctor.draft(model)).replace(model, "MODEL")
        target = ModelConfig(model=model, tokenizer=model, skip_tokenizer_init=True)
        out = {"target": target.quantization}
        for how, named in (("named", {"model": model}), ("omitted", {})):
            spec = SpeculativeConfig(
                target_model_config=target,
                target_parallel_config=ParallelConfig(),
                method="dspark",
                num_speculative_tokens=3,
                **named,
            )
            out[how] = spec.draft_model_config.quantization
    return {**out, "doctor": said}


def main() -> dict:
    import torch

    from dspark_hotfix import doctor

    report = doctor.report("release.py")
    out = {
        "vllm": report["vllm"],
        "verdict": report["verdict"],
        "problems": report["problems"],
        "patches": {
            row["name"]: {key: row[key] for key in ("state", "needed", "target", "detail")}
            for row in report["patches"]
        },
    }
    model = inside.attempt("model", lambda: inside.Model(torch))
    get_groups, _ = inside.attempt(
        "get_kv_cache_groups",
        lambda: inside.first_attr(inside.GROUPING_MODULES, "get_kv_cache_groups"),
        (None, None),
    )
    if model is not None and get_groups is not None:
        for disable, key in ((False, "hybrid_on"), (True, "hybrid_off")):
            out[key] = inside.attempt(
                key, functools.partial(inside.grouping, model, get_groups, disable)
            )
    out["draft_quantization"] = inside.attempt("draft_quantization", draft_quantization)
    out["errors"] = inside.ERRORS
    return out


if __name__ == "__main__":
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    # vLLM logs to stdout: keep it for the one JSON object.
    stdout, sys.stdout = sys.stdout, sys.stderr
    result = main()
    stdout.write(json.dumps(result, indent=1) + "\n")
    stdout.flush()
