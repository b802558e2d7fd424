"""DeepSeek-V4 decode steps as vLLM feeds them to FlashMLA, with their fp32 reference.

The main cache is the sliding-window (SWA) cache: every request attends to its
last ``window`` tokens through ``indices`` / ``topk_length``. A compressed-attention
layer adds the compressed cache as FlashMLA's *extra* cache, with the indexer's
top-k selection. DSpark draft layers are SWA-only, so they never pass an extra cache.

Slots are global: ``page * block_size + offset``, with each request's pages drawn
at random from its pool as a block table would hand them out. Index entries past a
request's length point at *poison* tokens (huge values that would swamp the softmax)
so that a kernel reading beyond ``topk_length`` cannot go unnoticed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .fp8_ds_mla import HEAD_DIM, PagePool, reference_sparse_decode

H_Q = 64
SWA_WINDOW = 128  # DeepSeek-V4's sliding window
COMPRESS_RATIO = 4  # the C4A layers' compressed cache
EXTRA_TOPK = 512  # the indexer's top-k for C4A layers
SM_SCALE = HEAD_DIM**-0.5
FILL_CHUNK = 1 << 16


@dataclasses.dataclass
class Cache:
    pool: PagePool
    indices: torch.Tensor  # (b, 1, topk) int32 global slots, -1 for none
    lengths: torch.Tensor  # (b,) int32

    def valid(self) -> torch.Tensor:
        """(b, topk): the entries that count, i.e. a slot and inside the length."""
        idx = self.indices[:, 0, :]
        position = torch.arange(idx.shape[1], device=idx.device)
        return (idx >= 0) & (position.unsqueeze(0) < self.lengths.unsqueeze(1))

    def gather(self) -> torch.Tensor:
        """Dequantized tokens (b, topk, 512); entries that do not count read slot 0."""
        idx = self.indices[:, 0, :].long().clamp_min(0)
        return self.pool.read(idx.flatten()).view(*idx.shape, HEAD_DIM)


@dataclasses.dataclass
class DecodeCase:
    q: torch.Tensor  # (b, 1, H_Q, 512) bf16
    swa: Cache
    extra: Cache | None
    attn_sink: torch.Tensor | None

    @property
    def batch(self) -> int:
        return int(self.q.shape[0])

    def reference(self) -> tuple[torch.Tensor, torch.Tensor]:
        caches = [self.swa] if self.extra is None else [self.swa, self.extra]
        kv = torch.cat([c.gather() for c in caches], dim=1)
        valid = torch.cat([c.valid() for c in caches], dim=1)
        return reference_sparse_decode(self.q[:, 0], kv, valid, SM_SCALE, self.attn_sink)


def geometry(view: dict[str, Any]) -> tuple[int, int, int]:
    """(block_size, bytes_per_token, page_stride) of a (blocks, tokens, bytes) view in
    kv_views.json."""
    _, block_size, bytes_per_token = view["shape"]
    return block_size, bytes_per_token, view["stride"][0]


def _random_tokens(n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    # Each 64-value tile gets its own magnitude (2^-3 .. 2^3) so that a scale read
    # from the wrong token or tile shows up as a large error, not a subtle one.
    values = torch.randn(n, HEAD_DIM, generator=generator, device=device)
    tile_gain = torch.exp2(
        torch.randint(-3, 4, (n, HEAD_DIM // 64), generator=generator, device=device).float()
    )
    return values * tile_gain.repeat_interleave(64, dim=1)


def _fill_pool(pool: PagePool, generator: torch.Generator) -> None:
    total = pool.num_blocks * pool.block_size
    for start in range(0, total, FILL_CHUNK):
        slots = torch.arange(start, min(start + FILL_CHUNK, total), device=pool.buffer.device)
        pool.write(slots, _random_tokens(slots.numel(), generator, pool.buffer.device))


def _cache(
    pool: PagePool,
    spans: list[tuple[int, int]],
    topk: int,
    generator: torch.Generator,
    *,
    select: int | None = None,
    invalid_fraction: float = 0.0,
) -> Cache:
    """Index the positions ``[lo, hi)`` of each request, paged through a block table.

    With ``select``, a random subset of at most ``select`` positions is taken (the
    indexer's top-k); otherwise all of them in order (the sliding window).
    """
    device = pool.buffer.device
    bs = pool.block_size
    pages = torch.randperm(pool.num_blocks, generator=generator, device=device)
    # The last page of the pool is reserved for poison.
    poison_page = int(pages[-1])
    pages = pages[:-1]
    poison = torch.arange(bs, device=device) + poison_page * bs
    signs = torch.randint(0, 2, (bs, HEAD_DIM), generator=generator, device=device) * 2 - 1
    pool.write(poison, 400.0 * signs.float())

    next_page = 0
    rows, lengths = [], []
    for lo, hi in spans:
        first_block = lo // bs
        n_blocks = (hi - 1) // bs - first_block + 1 if hi > lo else 0
        if next_page + n_blocks > pages.numel():
            raise ValueError("pool too small for the requested spans")
        table = pages[next_page : next_page + n_blocks]
        next_page += n_blocks
        positions = torch.arange(lo, hi, device=device)
        if select is not None and positions.numel() > select:
            keep = torch.randperm(positions.numel(), generator=generator, device=device)[:select]
            positions = positions[keep]
        slots = table[positions // bs - first_block] * bs + positions % bs
        if invalid_fraction:
            drop = torch.rand(slots.shape, generator=generator, device=device) < invalid_fraction
            slots = torch.where(drop, torch.full_like(slots, -1), slots)
        row = poison[torch.randint(0, bs, (topk,), generator=generator, device=device)]
        row[: slots.numel()] = slots
        rows.append(row)
        lengths.append(slots.numel())
    indices = torch.stack(rows).to(torch.int32).unsqueeze(1)
    return Cache(pool, indices, torch.tensor(lengths, dtype=torch.int32, device=device))


def make_decode_case(
    seq_lens: list[int],
    *,
    block_size: int,
    page_stride: int,
    swa_pages: int,
    extra_pages: int | None,
    attn_sink: bool,
    device: torch.device,
    seed: int = 0,
) -> DecodeCase:
    """One decode token per request, at position ``seq_len - 1``."""
    generator = torch.Generator(device=device).manual_seed(seed)
    b = len(seq_lens)
    q = torch.randn(b, 1, H_Q, HEAD_DIM, generator=generator, device=device).to(torch.bfloat16)

    swa_pool = PagePool.allocate(swa_pages, block_size, page_stride, device)
    _fill_pool(swa_pool, generator)
    windows = [(max(0, n - SWA_WINDOW), n) for n in seq_lens]
    swa = _cache(swa_pool, windows, SWA_WINDOW, generator)

    extra = None
    if extra_pages is not None:
        extra_pool = PagePool.allocate(extra_pages, block_size, page_stride, device)
        _fill_pool(extra_pool, generator)
        compressed = [(0, n // COMPRESS_RATIO) for n in seq_lens]
        extra = _cache(
            extra_pool, compressed, EXTRA_TOPK, generator, select=EXTRA_TOPK, invalid_fraction=0.1
        )

    sink = None
    if attn_sink:
        sink = 2.0 * torch.randn(H_Q, generator=generator, device=device) + 3.0
    return DecodeCase(q, swa, extra, sink)
