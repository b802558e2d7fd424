"""How fast FlashMLA decodes from the corrected 584-byte layout, against HBM bandwidth.

Sparse decode is a gather: each request reads its selected tokens (584 bytes each,
shared by all 64 query heads) from pages scattered over the pool. The pools here are
several times the H200's 60 MB L2 and the L2 is flushed before every timed launch,
so the bandwidth reported is that of HBM, not of the cache.
"""

from __future__ import annotations

import statistics
from typing import Any

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip(
    "torch", reason="needs an NVIDIA GPU with torch CUDA: torch not installed"
)

from .decode_case import H_Q, SM_SCALE, geometry, make_decode_case  # noqa: E402
from .fp8_ds_mla import BYTES_PER_TOKEN, HEAD_DIM  # noqa: E402

H200_PEAK_BYTES_PER_S = 4.8e12  # vendor datasheet, HBM3e
SEQ_LEN = 8192  # every request full: a 128-token window and 2048 compressed tokens
WARMUP = 10
RUNS = 200
L2_FLUSH_BYTES = 256 << 20
GPU_SLEEP_CYCLES = 100_000_000  # ~50 ms at H200 clocks: room to queue every launch


def _time_launches(launch: Any) -> tuple[float, float]:
    """(median of cold-L2 launches, mean of back-to-back launches), in seconds.

    Each timed loop starts behind a GPU sleep, so the host has queued every launch
    before the GPU reaches them and Python dispatch time never shows in the events.
    """
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    for _ in range(WARMUP):
        launch()
    torch.cuda._sleep(GPU_SLEEP_CYCLES)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(RUNS)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(RUNS)]
    for start, end in zip(starts, ends, strict=True):
        flush.zero_()
        start.record()
        launch()
        end.record()
    torch.cuda.synchronize()
    cold = statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)) / 1e3

    first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(GPU_SLEEP_CYCLES)
    first.record()
    for _ in range(RUNS):
        launch()
    last.record()
    torch.cuda.synchronize()
    return cold, first.elapsed_time(last) / 1e3 / RUNS


@pytest.mark.parametrize("with_extra", [False, True], ids=["swa_only", "swa_plus_compressed"])
@pytest.mark.parametrize("batch", [1, 8, 32, 128, 512])
def test_corrected_layout_decode_speed(
    flashmla: Any,
    kv_views: dict[str, Any],
    cuda_device: Any,
    evidence: dict[str, Any],
    batch: int,
    with_extra: bool,
) -> None:
    block_size, bytes_per_token, page_stride = geometry(kv_views["swa_corrected"])
    # At least 8192 pages of 37440 bytes (300 MB) per cache, requests' pages spread
    # over it; a request holds up to 3 SWA pages and 32 compressed ones.
    pages = max(8192, 33 * batch + 64)
    case = make_decode_case(
        [SEQ_LEN] * batch, block_size=block_size, page_stride=page_stride,
        swa_pages=pages, extra_pages=pages if with_extra else None,
        attn_sink=True, device=cuda_device, seed=batch,
    )  # fmt: skip
    main_kv = case.swa.pool.kernel_view(bytes_per_token)
    extra: dict[str, Any] = {}
    if case.extra is not None:
        extra = {
            "extra_kv": case.extra.pool.kernel_view(bytes_per_token),
            "extra_indices": case.extra.indices,
            "extra_topk_length": case.extra.lengths,
        }

    def decode(scheduler: Any = None) -> Any:
        return flashmla.sparse_decode(
            case.q, main_kv, case.swa.indices, case.swa.lengths, SM_SCALE,
            attn_sink=case.attn_sink, scheduler=scheduler, **extra,
        )  # fmt: skip

    # vLLM plans the split-KV schedule once per step and reuses it across layers.
    out, _, scheduler = decode()
    cold_s, warm_s = _time_launches(lambda: decode(scheduler))

    assert bool(torch.isfinite(out).all())
    assert cold_s > 0 and warm_s > 0

    caches = [case.swa] if case.extra is None else [case.swa, case.extra]
    tokens = sum(int(c.valid().sum()) for c in caches)
    index_bytes = sum(c.indices.numel() * 4 + c.lengths.numel() * 4 for c in caches)
    q_out_lse_bytes = batch * H_Q * (HEAD_DIM * 2 * 2 + 4)
    moved = tokens * BYTES_PER_TOKEN + index_bytes + q_out_lse_bytes
    flops = 2 * H_Q * tokens * (HEAD_DIM + HEAD_DIM)  # q.k and p.v over the 512-wide K=V
    evidence[f"speed_{'swa_plus_compressed' if with_extra else 'swa_only'}_b{batch}"] = {
        "batch": batch,
        "with_extra": with_extra,
        "attended_tokens": tokens,
        "bytes_moved": moved,
        "cold_l2_median_us": cold_s * 1e6,
        "back_to_back_mean_us": warm_s * 1e6,
        "cold_l2_gb_per_s": moved / cold_s / 1e9,
        "cold_l2_fraction_of_peak": moved / cold_s / H200_PEAK_BYTES_PER_S,
        "cold_l2_tflop_per_s": flops / cold_s / 1e12,
        "runs": RUNS,
    }
