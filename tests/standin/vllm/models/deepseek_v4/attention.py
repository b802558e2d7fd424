"""The DeepSeek-V4 attention layer, as in the reported build."""

from __future__ import annotations

from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache
from vllm.v1.kv_cache_interface import MLAAttentionSpec, uint8


class DeepseekV4Attention:
    def __init__(self, compress_ratio: int, kv_cache_dtype: str = "fp8_ds_mla", head_dim: int = 512):
        self.compress_ratio = compress_ratio
        self.kv_cache_dtype = kv_cache_dtype
        self.head_dim = head_dim
        self.swa_cache = DeepseekV4SWACache(head_dim, cache_dtype=kv_cache_dtype)

    def get_kv_cache_spec(self, vllm_config):
        if self.compress_ratio <= 1:  # sliding-window only: DeepseekV4SWACache's spec
            return None
        # The defect (vllm-project/vllm#47648): no kv_quant_mode, no alignment.
        return MLAAttentionSpec(
            block_size=vllm_config.cache_config.block_size,
            num_kv_heads=1,
            head_size=self.head_dim,
            dtype=uint8,
            compress_ratio=self.compress_ratio,
            cache_dtype_str=self.kv_cache_dtype,
            model_version="deepseek_v4",
        )


class DeepseekV4FlashMLABackend:
    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        if cache_dtype_str == "fp8_ds_mla":
            return (num_blocks, block_size, 584)
        return (num_blocks, block_size, head_size)
