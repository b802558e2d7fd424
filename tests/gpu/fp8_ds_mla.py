"""The DeepSeek-V4 ``fp8_ds_mla`` paged KV layout, written and read in plain torch.

This is the tier's own model of the bytes FlashMLA's MODEL1 sparse decode reads, so
that a reference attention can be computed from exactly what the kernel sees. It is
device-agnostic (runs on the CPU too) and imports torch, so only import it after
the tests have made sure torch exists.

A page of ``block_size`` tokens is *not* an array of 584-byte records: FlashMLA
reads all token bodies first and all scales after them::

    [0, bs*576)            per token: 448 fp8 e4m3 NoPE values, then 64 bf16 RoPE values
    [bs*576, bs*584)       per token: 7 UE8M0 scale exponents (one per 64 NoPE values), 1 pad byte
    [bs*584, page_stride)  padding up to a multiple of 576 bytes

The ``(num_blocks, block_size, 1, 584)`` tensor handed to the kernel is only a shape
it checks (and a page stride it uses); the 584 is the per-token byte budget. That is
why vLLM's 512-byte SWA view could exist at all: ``torch.as_strided`` accepts any
shape over a padded pool and only FlashMLA's shape check objects.
"""

from __future__ import annotations

import dataclasses
import math

import torch

D_NOPE = 448
D_ROPE = 64
HEAD_DIM = D_NOPE + D_ROPE  # d_qk == d_v == 512 for DeepSeek-V4
TILE = 64
N_TILES = D_NOPE // TILE  # 7
TOKEN_BODY_BYTES = D_NOPE + 2 * D_ROPE  # 576
SCALE_BYTES = N_TILES + 1  # 8: 7 exponents + 1 pad
BYTES_PER_TOKEN = TOKEN_BODY_BYTES + SCALE_BYTES  # 584
PAGE_ALIGNMENT = 576
FP8_MAX = 448.0
UE8M0_BIAS = 127


def padded_page_bytes(block_size: int) -> int:
    return math.ceil(block_size * BYTES_PER_TOKEN / PAGE_ALIGNMENT) * PAGE_ALIGNMENT


@dataclasses.dataclass
class PagePool:
    """A flat uint8 buffer of ``num_blocks`` pages, as vLLM allocates a KV cache."""

    buffer: torch.Tensor
    num_blocks: int
    block_size: int
    page_stride: int

    @classmethod
    def allocate(
        cls, num_blocks: int, block_size: int, page_stride: int, device: torch.device | str
    ) -> PagePool:
        buffer = torch.zeros(num_blocks * page_stride, dtype=torch.uint8, device=device)
        return cls(buffer, num_blocks, block_size, page_stride)

    def kernel_view(self, bytes_per_token: int) -> torch.Tensor:
        """The 4-D view FlashMLA takes: (num_blocks, block_size, h_kv=1, bytes_per_token).

        Built the way vLLM builds it: ``as_strided`` over the padded pool, then the
        h_kv axis inserted with ``unsqueeze(-2)`` so the page stride survives.
        """
        view = torch.as_strided(
            self.buffer,
            (self.num_blocks, self.block_size, bytes_per_token),
            (self.page_stride, bytes_per_token, 1),
        )
        return view.unsqueeze(-2)

    def _byte_offsets(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        slots = slots.to(device=self.buffer.device, dtype=torch.int64)
        page_base = (slots // self.block_size) * self.page_stride
        in_page = slots % self.block_size
        body = (page_base + in_page * TOKEN_BODY_BYTES).unsqueeze(1) + torch.arange(
            TOKEN_BODY_BYTES, device=self.buffer.device
        )
        scales = (page_base + self.block_size * TOKEN_BODY_BYTES + in_page * SCALE_BYTES).unsqueeze(
            1
        ) + torch.arange(SCALE_BYTES, device=self.buffer.device)
        return body, scales

    def write(self, slots: torch.Tensor, k: torch.Tensor) -> None:
        """Quantize ``k`` (n, 512) and store token ``i`` at global slot ``slots[i]``."""
        body, scales = quantize(k)
        body_at, scales_at = self._byte_offsets(slots)
        self.buffer[body_at.flatten()] = body.flatten().to(self.buffer.device)
        self.buffer[scales_at.flatten()] = scales.flatten().to(self.buffer.device)

    def read(self, slots: torch.Tensor) -> torch.Tensor:
        """Dequantize the tokens at ``slots`` back to float32 (n, 512)."""
        body_at, scales_at = self._byte_offsets(slots)
        n = body_at.shape[0]
        return dequantize(
            self.buffer[body_at.flatten()].view(n, TOKEN_BODY_BYTES),
            self.buffer[scales_at.flatten()].view(n, SCALE_BYTES),
        )


def quantize(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split (n, 512) values into 576-byte token bodies and 8-byte scale records.

    Each 64-value NoPE tile gets the smallest power-of-two scale that keeps it inside
    e4m3's +-448, stored as a biased UE8M0 exponent; RoPE stays bf16 because position
    information does not survive 3 mantissa bits.
    """
    n = k.shape[0]
    k = k.float()
    tiles = k[:, :D_NOPE].reshape(n, N_TILES, TILE)
    amax = tiles.abs().amax(dim=-1).clamp_min(1e-30)
    exponent = torch.ceil(torch.log2(amax / FP8_MAX))
    nope = (tiles * torch.exp2(-exponent).unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX)
    nope_bytes = nope.to(torch.float8_e4m3fn).view(torch.uint8).reshape(n, D_NOPE)
    rope_bytes = k[:, D_NOPE:].to(torch.bfloat16).contiguous().view(torch.uint8)
    body = torch.cat([nope_bytes, rope_bytes], dim=1)
    scales = torch.zeros(n, SCALE_BYTES, dtype=torch.uint8, device=k.device)
    scales[:, :N_TILES] = (exponent + UE8M0_BIAS).clamp(0, 254).to(torch.uint8)
    return body, scales


def dequantize(body: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    n = body.shape[0]
    nope = body[:, :D_NOPE].contiguous().view(torch.float8_e4m3fn).float()
    scale = torch.exp2(scales[:, :N_TILES].float() - UE8M0_BIAS)
    nope = (nope.reshape(n, N_TILES, TILE) * scale.unsqueeze(-1)).reshape(n, D_NOPE)
    rope = body[:, D_NOPE:].contiguous().view(torch.bfloat16).float()
    return torch.cat([nope, rope], dim=1)


def reference_sparse_decode(
    q: torch.Tensor,
    kv: torch.Tensor,
    valid: torch.Tensor,
    sm_scale: float,
    attn_sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 MQA attention of q (b, h, 512) over gathered kv (b, n, 512).

    ``valid`` (b, n) marks the gathered tokens that count (index >= 0 and inside
    the request's top-k length). V is the whole 512-wide K, as in DeepSeek-V4.
    Returns (out (b, h, 512), lse (b, h)) with lse the natural-log sum of exp over
    the valid scores; the sink only rescales ``out``, never ``lse``.
    """
    scores = torch.einsum("bhd,bnd->bhn", q.float(), kv.float()) * sm_scale
    scores = scores.masked_fill(~valid.unsqueeze(1), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("bhn,bnd->bhd", torch.exp(scores - lse.unsqueeze(-1)), kv.float())
    if attn_sink is not None:
        out = out * torch.sigmoid(lse - attn_sink.float().unsqueeze(0)).unsqueeze(-1)
    return out, lse
