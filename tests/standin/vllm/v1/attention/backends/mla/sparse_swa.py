"""The DeepSeek-V4 sliding-window cache layer, as in the reported build."""

from __future__ import annotations

from types import SimpleNamespace

from vllm.v1.kv_cache_interface import SlidingWindowMLASpec, uint8


class DeepseekV4SWACache:
    def __init__(self, head_dim: int = 512, window_size: int = 128, cache_dtype: str = "fp8_ds_mla"):
        self.head_dim = head_dim
        self.window_size = window_size
        self.dtype = uint8
        # Shares its physical pages with the 4x-compressed cache: 256 // 4 slots.
        self.block_size = 64
        self.cache_config = SimpleNamespace(cache_dtype=cache_dtype, block_size=256)

    def get_kv_cache_spec(self, vllm_config):
        # The defect (vllm-project/vllm#47648): no kv_quant_mode.
        uses_fp8_ds_mla = self.cache_config.cache_dtype == "fp8_ds_mla"
        return SlidingWindowMLASpec(
            block_size=self.block_size,
            num_kv_heads=1,
            head_size=self.head_dim,
            dtype=self.dtype,
            sliding_window=self.window_size,
            cache_dtype_str=self.cache_config.cache_dtype,
            alignment=576 if uses_fp8_ds_mla else 512,
            model_version="deepseek_v4",
        )


class DeepseekSparseSWABackend:
    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        if cache_dtype_str == "fp8_ds_mla":
            return (num_blocks, block_size, 584)
        return (num_blocks, block_size, head_size)
