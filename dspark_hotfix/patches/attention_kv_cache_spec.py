"""attention_kv_cache_spec: the compressed-attention KV-cache spec of DeepSeek-V4.

Symptom: with ``--spec-method dspark`` the engine dies during KV-cache warm-up:
``RuntimeError: kv must have shape (num_blocks, page_block_size, h_kv,
bytes_per_token)`` from FlashMLA's sparse decode.

Cause: ``DeepseekV4Attention.get_kv_cache_spec`` returns an ``MLAAttentionSpec``
without ``kv_quant_mode`` (and without the 576-byte alignment). DSpark forces
vLLM's V2 model runner, which views a spec whose ``kv_quant_mode`` is ``NONE``
with cache dtype ``"auto"``: 512 bytes per token instead of 584.

Upstream: vllm-project/vllm#47648; fixed by PR #47716, which sets
``kv_quant_mode`` on both DeepSeek-V4 specs; regression from PR #42890.

Decision: at import, vLLM's method is called with a stand-in ``fp8_ds_mla``
layer; the patch is applied only if the spec it returns lacks the layout
(see ``fp8_ds_mla.py``). Released vLLM (>= 0.25.0) is left untouched.

Removal: once the fleet runs a vLLM that carries PR #47716 (any release from
0.25.0 on); ``dspark-hotfix status`` then reports ``not_needed``.
"""

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from dspark_hotfix.patches.base import Need, Patch
from dspark_hotfix.patches.fp8_ds_mla import (
    CACHE_DTYPE,
    fp8_ds_mla_spec,
    probe_spec,
    quant_mode,
    uint8_dtype,
)


def correction(spec: Any, /, self: Any, vllm_config: Any) -> Any:
    """What ``DeepseekV4Attention.get_kv_cache_spec`` answered, corrected."""
    return fp8_ds_mla_spec(spec, self.kv_cache_dtype, quant_mode())


def probe(vllm_get_kv_cache_spec: Callable[..., Any]) -> Need:
    layer = SimpleNamespace(
        compress_ratio=4,
        kv_cache_dtype=CACHE_DTYPE,
        head_dim=512,
        kv_cache_torch_dtype=uint8_dtype(),
    )
    return probe_spec(vllm_get_kv_cache_spec, layer)


PATCH = Patch(
    name="attention_kv_cache_spec",
    module="vllm.models.deepseek_v4.attention",
    qualname="DeepseekV4Attention.get_kv_cache_spec",
    parameters=("self", "vllm_config"),
    correction=correction,
    probe=probe,
)
