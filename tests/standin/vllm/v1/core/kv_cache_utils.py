"""KV-cache grouping, and what it does to DeepSeek-V4 specs with the hybrid KV
cache manager off, as vLLM 0.25.0 does (docs/evidence/hybrid-off.md): one spec
type for every layer, full attention at the full-attention block size, and the
quantization mode not carried over."""

from __future__ import annotations

from dataclasses import dataclass

from vllm.v1.kv_cache_interface import MLAAttentionSpec, SlidingWindowMLASpec


@dataclass
class KVCacheGroupSpec:
    layer_names: list[str]
    kv_cache_spec: object


def get_kv_cache_groups(vllm_config, kv_cache_spec):
    if vllm_config.scheduler_config.disable_hybrid_kv_cache_manager:
        full = next(s for s in kv_cache_spec.values() if not isinstance(s, SlidingWindowMLASpec))
        for name, spec in kv_cache_spec.items():
            if isinstance(spec, SlidingWindowMLASpec):
                kv_cache_spec[name] = MLAAttentionSpec(
                    block_size=full.block_size, num_kv_heads=spec.num_kv_heads, head_size=spec.head_size,
                    dtype=spec.dtype, cache_dtype_str=spec.cache_dtype_str, alignment=spec.alignment,
                    compress_ratio=spec.compress_ratio, model_version=spec.model_version,
                )
    return [KVCacheGroupSpec([name], spec) for name, spec in kv_cache_spec.items()]
