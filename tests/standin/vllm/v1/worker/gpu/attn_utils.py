"""The V2 GPU model runner's KV view rule (vllm-project/vllm PR #42890)."""

from __future__ import annotations

from vllm.v1.kv_cache_interface import KVQuantMode


def kv_view_layout(spec, backend, num_blocks: int, cache_dtype: str):
    """Shape and strides (in bytes) of a layer's KV view over padded pages."""
    # A spec without a quantization mode is viewed as unquantized: "auto".
    layer_cache_dtype = "auto" if spec.kv_quant_mode == KVQuantMode.NONE else cache_dtype
    shape = backend.get_kv_cache_shape(
        num_blocks, spec.storage_block_size, spec.num_kv_heads, spec.head_size,
        cache_dtype_str=layer_cache_dtype,
    )
    item = spec.dtype.itemsize
    # as_strided over the page pool: the block stride is the (padded) page,
    # whatever the view's row width; nothing checks that the two agree.
    stride = (spec.page_size_bytes // item, shape[2], 1)
    return tuple(shape), stride
