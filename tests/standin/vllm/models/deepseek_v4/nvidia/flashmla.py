"""FlashMLA's sparse decode, reduced to the check that fails in the report."""

from __future__ import annotations


def flash_mla_with_kvcache(kv_shape, extra_kv_shape=None):
    if len(kv_shape) != 3 or kv_shape[-1] != 584:
        raise RuntimeError("kv must have shape (num_blocks, page_block_size, h_kv, bytes_per_token)")
    if extra_kv_shape is not None and (len(extra_kv_shape) != 3 or extra_kv_shape[-1] != 584):
        raise RuntimeError("extra_kv must have shape (num_blocks, page_block_size, h_kv, bytes_per_token)")
