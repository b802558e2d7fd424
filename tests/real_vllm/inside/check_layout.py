"""The shared ``fp8_ds_mla`` layout (``dspark_hotfix.patches.fp8_ds_mla``) on a real vLLM release's
specs.

Run beside ``check_real_vllm.py`` by ``tests/real_vllm/runs.py`` (``released``) with the venv's own
pytest. vLLM's own spec methods answer for the grid's layers (``grid.py``, the instrument); the
layout's correction must pass every real answer through as the same object, turn a spec as the
reported build made it into exactly the released fix, and, where the release's V2 runner still views
NONE-mode specs as 'auto', widen its view from 512 to 584 bytes/token. Set ``KV_VIEWS_OUT`` to
record those views.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from dspark_hotfix.patches.fp8_ds_mla import fp8_ds_mla_spec, runner_bytes_per_token

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grid
from vllm.v1.kv_cache_interface import KVQuantMode, get_kv_quant_mode

FP8 = get_kv_quant_mode("fp8_ds_mla")


@pytest.mark.parametrize("dtype", grid.DTYPES)
@pytest.mark.parametrize("block", grid.BLOCKS)
def test_correction_passes_every_real_result_through_as_the_same_object(dtype, block):
    for spec in grid.specs(block, dtype):
        assert fp8_ds_mla_spec(spec, dtype, FP8) is spec


def fixed_specs() -> dict[str, Any]:
    return grid.fp8_specs()


def pre_fix(spec: Any, variant: str) -> Any:
    """The spec the reported build produced: no kv_quant_mode (FACTS.md)."""
    if variant == "no_quant_mode":
        return dataclasses.replace(spec, kv_quant_mode=KVQuantMode.NONE)
    # The report's own diagnosis of the attention spec: no alignment either, and
    # the cache dtype string degraded to "auto".
    return dataclasses.replace(
        spec,
        kv_quant_mode=KVQuantMode.NONE,
        alignment=None,
        cache_dtype_str="auto",
        page_size_padded=None,
    )


@pytest.mark.parametrize("variant", ["no_quant_mode", "no_quant_mode_no_alignment_auto"])
@pytest.mark.parametrize("kind", ["attention", "swa"])
def test_differential_oracle_correction_of_prefix_spec_equals_real_fix(kind, variant):
    fixed = fixed_specs()[kind]
    before = pre_fix(fixed, variant)
    assert runner_bytes_per_token(before) == 512
    after = fp8_ds_mla_spec(before, "fp8_ds_mla", FP8)
    for field in dataclasses.fields(fixed):
        assert getattr(after, field.name) == getattr(fixed, field.name), field.name
    assert after == fixed
    assert after.page_size_bytes == fixed.page_size_bytes == 37440
    assert runner_bytes_per_token(after) == 584


def _reshape_kv_cache():
    from vllm.v1.worker.gpu import attn_utils

    fn = getattr(attn_utils, "_reshape_kv_cache", None)
    if fn is None or "auto" not in inspect.getsource(fn):
        pytest.skip(
            "this release's V2 runner no longer views NONE-mode specs as 'auto' (gone in 0.29.0)"
        )
    return fn


def test_v2_runner_reshape_gives_512_before_and_584_after_the_correction():
    reshape = _reshape_kv_cache()
    num_blocks = 4
    views = {}
    for kind, fixed in fixed_specs().items():
        before = pre_fix(fixed, "no_quant_mode")
        for label, spec in (
            ("pre_fix", before),
            ("corrected", fp8_ds_mla_spec(before, "fp8_ds_mla", FP8)),
        ):
            views[f"{kind}_{label}"] = grid.runner_view(reshape, kind, spec, num_blocks)
    assert views["swa_pre_fix"]["shape"] == [num_blocks, 64, 512]
    assert views["swa_corrected"]["shape"] == [num_blocks, 64, 584]
    assert views["swa_pre_fix"]["stride"] == [37440, 512, 1]  # silently strided over padded pages
    assert views["swa_corrected"]["stride"] == [37440, 584, 1]
    assert views["attention_corrected"] == views["swa_corrected"]
    out = os.environ.get("KV_VIEWS_OUT")
    if out:
        import vllm

        Path(out).write_text(
            json.dumps(
                {
                    "source": (
                        "vLLM's own V2 runner reshape (vllm/v1/worker/gpu/attn_utils.py"
                        " _reshape_kv_cache) on CPU"
                    ),
                    "vllm": vllm.__version__,
                    "torch": torch.__version__,
                    "views": views,
                },
                indent=2,
            )
            + "\n"
        )
