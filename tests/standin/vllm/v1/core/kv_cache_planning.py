"""KV-cache planning with the hybrid KV cache manager off, as vLLM 0.33.0 plans it (the project's notes:
docs/evidence/hybrid-off.md): each sliding-window spec is promoted to a full-attention one at the full-attention
block size, passing on every field but the one it drops, ``bounded_replay`` included, which the full-attention
spec lacks. So the promotion of a DeepSeek-V4 sliding-window spec raises ``TypeError``."""

from __future__ import annotations

from vllm.v1.kv_cache_interface import MLAAttentionSpec, SlidingWindowMLASpec, replace_as


def _promote_local_kv_cache_specs(kv_cache_spec):
    sizes = {spec.block_size for spec in kv_cache_spec.values() if not isinstance(spec, SlidingWindowMLASpec)}
    promoted = dict(kv_cache_spec)
    for name, spec in kv_cache_spec.items():
        if isinstance(spec, SlidingWindowMLASpec):
            block_size = next(iter(sizes)) if len(sizes) == 1 else spec.block_size
            promoted[name] = replace_as(spec, MLAAttentionSpec, drop=("extra_retained_tokens",),
                                        block_size=block_size, page_size_padded=None)
    return promoted
