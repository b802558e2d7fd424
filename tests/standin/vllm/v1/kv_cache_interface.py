"""KV-cache specs with the page-size rule of the DeepSeek-V4 layouts."""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import IntEnum


@dataclass(frozen=True)
class Dtype:
    name: str
    itemsize: int


uint8 = Dtype("uint8", 1)
bfloat16 = Dtype("bfloat16", 2)


class KVQuantMode(IntEnum):
    NONE = 0
    FP8_PER_TENSOR = 1


def get_kv_quant_mode(kv_cache_dtype: str) -> KVQuantMode:
    if kv_cache_dtype.startswith("fp8"):
        return KVQuantMode.FP8_PER_TENSOR
    return KVQuantMode.NONE


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True, kw_only=True)
class AttentionSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: Dtype
    kv_quant_mode: KVQuantMode = KVQuantMode.NONE
    page_size_padded: int | None = None

    @property
    def page_size_bytes(self) -> int:
        return self.page_size_padded or self.real_page_size_bytes


@dataclass(frozen=True, kw_only=True)
class _DeepseekV4Spec(AttentionSpec):
    cache_dtype_str: str | None = None
    alignment: int | None = None
    compress_ratio: int = 1
    model_version: str | None = None

    def __post_init__(self) -> None:
        # Pages are padded up to the alignment; the padding is skipped with a
        # strided view, never read.
        if self.alignment is not None:
            padded = round_up(self.real_page_size_bytes, self.alignment)
            if padded != self.real_page_size_bytes:
                object.__setattr__(self, "page_size_padded", padded)

    @property
    def storage_block_size(self) -> int:
        return self.block_size // self.compress_ratio

    @property
    def real_page_size_bytes(self) -> int:
        if self.cache_dtype_str == "fp8_ds_mla" and self.model_version == "deepseek_v4":
            # 448 fp8 NoPE + 128 B bf16 RoPE + 7 UE8M0 scales + 1 pad byte.
            return self.storage_block_size * 584
        return self.storage_block_size * self.num_kv_heads * self.head_size * self.dtype.itemsize


@dataclass(frozen=True, kw_only=True)
class MLAAttentionSpec(_DeepseekV4Spec):
    sliding_window: int | None = None  # set where a sliding-window spec was promoted to full attention


@dataclass(frozen=True, kw_only=True)
class SlidingWindowMLASpec(_DeepseekV4Spec):
    sliding_window: int
    extra_retained_tokens: int = 0  # (vLLM 0.33.0's fields)
    bounded_replay: bool = False


def replace_as(spec, target_cls, *, drop=(), **changes):
    """``spec`` rebuilt as ``target_cls``: each of its fields passed on, but those in ``drop``, then ``changes``."""
    values = {f.name: getattr(spec, f.name) for f in fields(spec) if f.init and f.name not in drop}
    return target_cls(**{**values, **changes})
