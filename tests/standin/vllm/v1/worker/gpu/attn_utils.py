"""The V2 GPU model runner's KV view rule (vllm-project/vllm PR #42890)."""

from __future__ import annotations

from typing import NamedTuple

from vllm.v1.kv_cache_interface import KVQuantMode


class View(NamedTuple):
    """A strided view over the page pool: shape, and strides in elements."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]


def _reshape_kv_cache(
    attn_groups, kv_cache_raw_tensors, cache_dtype, kernel_block_sizes, shared_kv_cache_layers, kv_cache_config=None
):
    """One view per layer; a raw tensor here is its size in bytes."""
    views = {}
    for group in attn_groups:
        spec = group.kv_cache_spec
        # A spec without a quantization mode is viewed as unquantized: "auto".
        layer_cache_dtype = "auto" if spec.kv_quant_mode == KVQuantMode.NONE else cache_dtype
        for layer in group.layer_names:
            num_blocks = kv_cache_raw_tensors[layer] // spec.page_size_bytes
            shape = group.backend.get_kv_cache_shape(
                num_blocks, spec.storage_block_size, spec.num_kv_heads, spec.head_size,
                cache_dtype_str=layer_cache_dtype,
            )
            # as_strided over the page pool: the block stride is the (padded)
            # page, whatever the view's row width; nothing checks the two agree.
            item = spec.dtype.itemsize
            views[layer] = View(tuple(shape), (spec.page_size_bytes // item, shape[2], 1))
    return views
