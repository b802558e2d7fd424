"""FlashMLA's sparse decode on the SWA KV views, before and after the hotfix.

The reported crash is FlashMLA refusing vLLM's sliding-window view: 512 bytes per
token (the bf16 "auto" layout) where DeepSeek-V4's ``fp8_ds_mla`` needs 584. These
tests take the views' geometry from docs/evidence/kv_views.json (vLLM's own
reshape), hand them to the real kernel, and check the corrected one attends right.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip(
    "torch", reason="needs an NVIDIA GPU with torch CUDA: torch not installed"
)

from .decode_case import (  # noqa: E402
    EXTRA_TOPK,
    H_Q,
    SM_SCALE,
    SWA_WINDOW,
    geometry,
    make_decode_case,
)
from .fp8_ds_mla import BYTES_PER_TOKEN, HEAD_DIM, PagePool  # noqa: E402

MAIN_SHAPE_ERROR = "kv must have shape (num_blocks, page_block_size, h_kv, bytes_per_token)"
EXTRA_SHAPE_ERROR = "extra_kv must have shape"

# Output tolerance, elementwise: |out - ref| <= RTOL * |ref| + ATOL_OF_MAX * max|ref|.
# bf16 keeps 8 significant bits, so one rounding costs at most 2^-9 relative. The
# kernel rounds the softmax weights to bf16 before P @ V and rounds the output to
# bf16, summing up to 640 weighted tokens in between; 2^-7 relative covers that
# with margin (on the H200 the largest error is about a quarter of the bound).
# Where heads cancel to near zero a relative bound means nothing, hence the
# absolute floor of 2^-8 of the largest output. A layout mistake is far outside
# both: a scale read from the wrong place is mostly off by 2x or more (tile gains
# differ by powers of two), a token read past topk_length moves the output by hundreds.
RTOL = 2**-7
ATOL_OF_MAX = 2**-8
# The log-sum-exp comes from fp32 scores of exactly representable bf16 products
# (e4m3 times a power of two is exact in bf16), so only summation order differs.
LSE_ATOL = 1e-3

SEQ_LENS = [5, 64, 127, 128, 300, 1000, 2048, 4095]  # windows shorter and longer than 128


def _minimal_inputs(batch: int, device: Any) -> dict[str, Any]:
    return {
        "q": torch.zeros(batch, 1, H_Q, HEAD_DIM, dtype=torch.bfloat16, device=device),
        "indices": torch.zeros(batch, 1, SWA_WINDOW, dtype=torch.int32, device=device),
        "topk_length": torch.ones(batch, dtype=torch.int32, device=device),
        "sm_scale": SM_SCALE,
    }


def test_pre_fix_swa_view_raises_the_reported_error(
    flashmla: Any, kv_views: dict[str, Any], cuda_device: Any, evidence: dict[str, Any]
) -> None:
    block_size, bytes_per_token, page_stride = geometry(kv_views["swa_pre_fix"])
    assert bytes_per_token != BYTES_PER_TOKEN, "kv_views.json's pre-fix view is not the buggy one"
    pool = PagePool.allocate(8, block_size, page_stride, cuda_device)

    with pytest.raises(RuntimeError) as raised:
        flashmla.sparse_decode(
            kv=pool.kernel_view(bytes_per_token), **_minimal_inputs(2, cuda_device)
        )

    message = str(raised.value)
    assert MAIN_SHAPE_ERROR in message
    assert EXTRA_SHAPE_ERROR not in message
    evidence["pre_fix_main_cache"] = {
        "view": {
            "shape": list(pool.kernel_view(bytes_per_token).shape),
            "page_stride": page_stride,
        },
        "error": message.splitlines()[0],
        # Whether the page under the buggy view could hold the real layout: if it
        # can, only the view's last dimension is wrong, which is what the shim fixes.
        "page_holds_fp8_ds_mla_block": page_stride >= block_size * BYTES_PER_TOKEN,
    }


def test_pre_fix_view_as_extra_cache_names_extra_kv_instead(
    flashmla: Any, kv_views: dict[str, Any], cuda_device: Any, evidence: dict[str, Any]
) -> None:
    # Tells which cache the bug report's message is about: a bad *compressed*
    # (extra) cache would have said extra_kv, so the report's is the SWA cache.
    good_block, good_bytes, good_stride = geometry(kv_views["swa_corrected"])
    bad_block, bad_bytes, bad_stride = geometry(kv_views["swa_pre_fix"])
    main = PagePool.allocate(8, good_block, good_stride, cuda_device)
    extra = PagePool.allocate(8, bad_block, bad_stride, cuda_device)

    with pytest.raises(RuntimeError) as raised:
        flashmla.sparse_decode(
            kv=main.kernel_view(good_bytes),
            extra_kv=extra.kernel_view(bad_bytes),
            extra_indices=torch.zeros(2, 1, EXTRA_TOPK, dtype=torch.int32, device=cuda_device),
            extra_topk_length=torch.ones(2, dtype=torch.int32, device=cuda_device),
            **_minimal_inputs(2, cuda_device),
        )

    message = str(raised.value)
    assert EXTRA_SHAPE_ERROR in message
    assert not re.search(r"(?<!extra_)kv must have shape", message)
    evidence["pre_fix_extra_cache"] = {"error": message.splitlines()[0]}


def test_corrected_swa_view_is_accepted(
    flashmla: Any, kv_views: dict[str, Any], cuda_device: Any, evidence: dict[str, Any]
) -> None:
    block_size, bytes_per_token, page_stride = geometry(kv_views["swa_corrected"])
    assert bytes_per_token == BYTES_PER_TOKEN
    case = make_decode_case(
        SEQ_LENS, block_size=block_size, page_stride=page_stride,
        swa_pages=64, extra_pages=None, attn_sink=False, device=cuda_device,
    )  # fmt: skip
    kv = case.swa.pool.kernel_view(bytes_per_token)

    out, lse, _ = flashmla.sparse_decode(case.q, kv, case.swa.indices, case.swa.lengths, SM_SCALE)
    torch.cuda.synchronize()

    assert out.shape == (case.batch, 1, H_Q, HEAD_DIM)
    assert out.dtype == torch.bfloat16
    assert bool(torch.isfinite(out).all())
    assert bool(torch.isfinite(lse).all())
    evidence["corrected_main_cache"] = {
        "view": {"shape": list(kv.shape), "stride": list(kv.stride())},
        "out_shape": list(out.shape),
        "lse_shape": list(lse.shape),
    }


def _lse_per_head(lse: Any, batch: int) -> Any:
    # FlashMLA documents lse as (batch, h_q, s_q); accept (batch, s_q, h_q) too,
    # since s_q == 1 and h_q == 64 cannot be confused.
    if lse.shape == (batch, H_Q, 1):
        return lse[:, :, 0]
    assert lse.shape == (batch, 1, H_Q), f"unexpected lse shape {tuple(lse.shape)}"
    return lse[:, 0, :]


@pytest.mark.parametrize(
    ("layer", "with_extra", "with_sink"),
    [
        ("dspark_draft_swa_only", False, False),
        ("swa_only_with_sink", False, True),
        ("c4a_swa_plus_compressed", True, True),
    ],
)
def test_corrected_layout_attends_like_fp32_reference(
    flashmla: Any,
    kv_views: dict[str, Any],
    cuda_device: Any,
    evidence: dict[str, Any],
    layer: str,
    with_extra: bool,
    with_sink: bool,
) -> None:
    block_size, bytes_per_token, page_stride = geometry(kv_views["swa_corrected"])
    case = make_decode_case(
        SEQ_LENS, block_size=block_size, page_stride=page_stride,
        swa_pages=64, extra_pages=64 if with_extra else None,
        attn_sink=with_sink, device=cuda_device, seed=len(layer),
    )  # fmt: skip
    extra: dict[str, Any] = {}
    if case.extra is not None:
        extra = {
            "extra_kv": case.extra.pool.kernel_view(bytes_per_token),
            "extra_indices": case.extra.indices,
            "extra_topk_length": case.extra.lengths,
        }

    out, lse, _ = flashmla.sparse_decode(
        case.q, case.swa.pool.kernel_view(bytes_per_token), case.swa.indices, case.swa.lengths,
        SM_SCALE, attn_sink=case.attn_sink, **extra,
    )  # fmt: skip
    ref_out, ref_lse = case.reference()

    got = out[:, 0].float()
    error = (got - ref_out).abs()
    scale = float(ref_out.abs().max())
    bound = RTOL * ref_out.abs() + ATOL_OF_MAX * scale
    lse_error = (_lse_per_head(lse, case.batch) - ref_lse).abs()
    cosine = torch.nn.functional.cosine_similarity(
        got.double().flatten(), ref_out.double().flatten(), dim=0
    )
    valid = case.swa.valid().sum() + (case.extra.valid().sum() if case.extra else 0)
    evidence[f"correctness_{layer}"] = {
        "batch": case.batch,
        "h_q": H_Q,
        "seq_lens": SEQ_LENS,
        "swa_topk": SWA_WINDOW,
        "extra_topk": EXTRA_TOPK if case.extra else None,
        "attended_tokens": int(valid),
        "invalid_index_entries": int((case.extra.indices < 0).sum()) if case.extra else 0,
        "max_abs_error": float(error.max()),
        "mean_abs_error": float(error.mean()),
        "max_abs_ref": scale,
        "mean_abs_ref": float(ref_out.abs().mean()),
        "relative_max_error": float(error.max()) / scale,
        "relative_mean_error": float(error.mean() / ref_out.abs().mean()),
        "max_error_over_bound": float((error / bound).max()),
        "one_minus_cosine": float(1 - cosine),
        "lse_max_abs_error": float(lse_error.max()),
        "tolerance": {"rtol": RTOL, "atol": ATOL_OF_MAX * scale, "lse_atol": LSE_ATOL},
    }

    assert bool((error <= bound).all()), f"max error {float(error.max()):.4g} beyond bound"
    assert float(lse_error.max()) <= LSE_ATOL
