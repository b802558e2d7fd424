"""swa_kv_cache_spec: the sliding-window (SWA) KV-cache spec of DeepSeek-V4.

Symptom: with ``--spec-method dspark`` the engine dies during the draft's
KV-cache warm-up: ``RuntimeError: kv must have shape (num_blocks,
page_block_size, h_kv, bytes_per_token)`` from FlashMLA's sparse decode. This
is the tensor FlashMLA rejects: DSpark draft layers are sliding-window only
(compress ratio 1), so their only KV cache is this one.

Cause: ``DeepseekV4SWACache.get_kv_cache_spec`` returns a
``SlidingWindowMLASpec`` without ``kv_quant_mode``; the V2 model runner that
DSpark forces views it with cache dtype ``"auto"``: a ``(num_blocks, 64, 512)``
view over 37440-byte pages instead of ``(num_blocks, 64, 584)``.

Upstream: vllm-project/vllm#47648 (a follow-up there found that fixing
only the attention spec still crashed); fixed by PR #47716; regression from
PR #42890.

Decision: at import, vLLM's method is called with a stand-in ``fp8_ds_mla``
SWA layer; the patch is applied only if the spec it returns lacks the layout.
Other layouts (``auto``, ``bfloat16``, ``nvfp4_ds_mla``) are never touched.

Removal: once the fleet runs a vLLM that carries PR #47716 (any release from
0.25.0 on); ``dspark-hotfix status`` then reports ``not_needed``.
"""

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from dspark_hotfix.patches.base import Need, Patch
from dspark_hotfix.patches.fp8_ds_mla import (
    BYTES_PER_TOKEN,
    CACHE_DTYPE,
    PAGE_ALIGNMENT,
    fp8_ds_mla_spec,
    probe_spec,
    quant_mode,
    uint8_dtype,
)


def correction(spec: Any, /, self: Any, vllm_config: Any) -> Any:
    """What ``DeepseekV4SWACache.get_kv_cache_spec`` answered, corrected."""
    return fp8_ds_mla_spec(spec, self.cache_config.cache_dtype, quant_mode())


def probe(vllm_get_kv_cache_spec: Callable[..., Any]) -> Need:
    layer = SimpleNamespace(
        block_size=64,
        head_dim=512,
        window_size=128,
        dtype=uint8_dtype(),
        cache_config=SimpleNamespace(block_size=256, cache_dtype=CACHE_DTYPE),
        # Read by vLLM >= 0.33 (packed layouts, DeepSeek-V4.1 replay).
        bounded_replay=False,
        packed_bytes_per_token=BYTES_PER_TOKEN,
        packed_page_alignment=PAGE_ALIGNMENT,
        packed_block_stride_alignment=None,
    )
    return probe_spec(vllm_get_kv_cache_spec, layer)


PATCH = Patch(
    name="swa_kv_cache_spec",
    module="vllm.v1.attention.backends.mla.sparse_swa",
    qualname="DeepseekV4SWACache.get_kv_cache_spec",
    parameters=("self", "vllm_config"),
    correction=correction,
    probe=probe,
)
