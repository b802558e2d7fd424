"""The input grid the real-vLLM checks feed to vLLM's own functions.

Stand-in ``self`` objects carry the attributes the released methods read
(0.25.0 to 0.33.0). ``python grid.py`` prints every result as JSON, so the
results of a process with the shim and one without can be compared.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import torch

DTYPES = ("fp8_ds_mla", "auto")
COMPRESS = (1, 4)
BLOCKS = (64, 256)
NAMES = (
    *(
        f"mtp.{i}.{rest}"
        for i in range(3)
        for rest in (
            "attn.wkv.weight",
            "attn.wq_a.weight",
            "attn.attn_sink",
            "attn.swa_cache.scale",
            "ffn.experts.7.w1.weight",
            "ffn.experts.7.w1.scale",
            "ffn.shared_experts.w2.weight",
            "ffn.gate.bias",
            "hc_attn_fn",
            "attn_norm.weight",
        )
    ),
    "mtp.2.norm.weight",
    "mtp.2.hc_head_fn",
    "mtp.2.hc_head_base",
    "mtp.2.hc_head_scale",
    "mtp.2.markov_head.w1.weight",
    "mtp.0.main_proj.weight",
    "mtp.0.main_norm.weight",
    "mtp.1.confidence_head.weight",
    "context_wkv_proj.weight",
    "context_wkv_proj.scale",
    "layers.0.attn.wkv.weight",
    "embed.weight",
    "head.weight",
    "norm.weight",
    "mtp.weight",
    "mtp.x.y",
)


def config(block_size: int, cache_dtype: str) -> SimpleNamespace:
    return SimpleNamespace(
        cache_config=SimpleNamespace(block_size=block_size, cache_dtype=cache_dtype)
    )


def attention_layer(compress_ratio: int, cache_dtype: str) -> SimpleNamespace:
    return SimpleNamespace(
        compress_ratio=compress_ratio,
        kv_cache_dtype=cache_dtype,
        head_dim=512,
        kv_cache_torch_dtype=torch.uint8 if cache_dtype == "fp8_ds_mla" else torch.bfloat16,
    )


def swa_layer(block_size: int, cache_dtype: str) -> SimpleNamespace:
    return SimpleNamespace(
        block_size=block_size,
        head_dim=512,
        window_size=128,
        dtype=torch.uint8 if cache_dtype == "fp8_ds_mla" else torch.bfloat16,
        cache_config=SimpleNamespace(block_size=256, cache_dtype=cache_dtype),
        bounded_replay=False,
        packed_bytes_per_token=584,
        packed_page_alignment=576,
        packed_block_stride_alignment=None,
    )


def draft(num_hidden_layers: int = 43, num_draft_layers: int = 3) -> SimpleNamespace:
    cfg = SimpleNamespace(num_hidden_layers=num_hidden_layers, n_mtp_layers=num_draft_layers)
    model = SimpleNamespace(
        config=cfg,
        num_hidden_layers=num_hidden_layers,
        num_dspark_layers=num_draft_layers,
        layers=[None] * num_draft_layers,
        confidence_head=None,
    )
    return SimpleNamespace(config=cfg, model=model)


def fp8_specs() -> dict[str, object]:
    """What vLLM's own spec methods answer for ``fp8_ds_mla`` layers (block 256):
    ``attention``, the compressed cache (ratio 4), and ``swa``, the sliding-window cache."""
    from vllm.models.deepseek_v4.attention import DeepseekV4Attention
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache

    cfg = config(256, "fp8_ds_mla")
    return {
        "attention": DeepseekV4Attention.get_kv_cache_spec(attention_layer(4, "fp8_ds_mla"), cfg),
        "swa": DeepseekV4SWACache.get_kv_cache_spec(swa_layer(64, "fp8_ds_mla"), cfg),
    }


def specs(block_size: int, cache_dtype: str) -> list[object]:
    """What vLLM's own spec methods answer for the grid's layers of one block size and cache
    dtype."""
    from vllm.models.deepseek_v4.attention import DeepseekV4Attention
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache

    cfg = config(block_size, cache_dtype)
    return [
        *(
            DeepseekV4Attention.get_kv_cache_spec(attention_layer(ratio, cache_dtype), cfg)
            for ratio in COMPRESS
        ),
        DeepseekV4SWACache.get_kv_cache_spec(swa_layer(block_size, cache_dtype), cfg),
    ]


def runner_view(
    reshape: Any, kind: str, spec: Any, num_blocks: int = 4, layer: str = "layer"
) -> dict[str, object]:
    """The KV view vLLM's V2 runner builds for ``spec`` (``kind``: ``attention`` or ``swa``).

    ``reshape`` is ``vllm.v1.worker.gpu.attn_utils._reshape_kv_cache``, called on
    a CPU tensor of ``num_blocks`` pages, as the runner calls it at start-up.
    """
    from vllm.models.deepseek_v4.sparse_mla import DeepseekV4FlashMLABackend
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWABackend

    backend = {"attention": DeepseekV4FlashMLABackend, "swa": DeepseekSparseSWABackend}[kind]
    group = SimpleNamespace(
        kv_cache_group_id=0, kv_cache_spec=spec, layer_names=[layer], backend=backend
    )
    raw = torch.zeros(num_blocks * spec.page_size_bytes, dtype=torch.int8)
    view = reshape(
        attn_groups=[group],
        kv_cache_raw_tensors={layer: raw},
        cache_dtype="fp8_ds_mla",
        kernel_block_sizes=[spec.storage_block_size],
        shared_kv_cache_layers={},
    )[layer]
    return {
        "shape": list(view.shape),
        "stride": list(view.stride()),
        "dtype": str(view.dtype).removeprefix("torch."),
        "page_bytes": spec.page_size_bytes,
        "bytes_per_token": view.shape[-1],
    }


def remap(d: Any, name: str) -> Any:
    """What vLLM's DSpark remap answers for the checkpoint weight ``name`` of draft ``d``, called
    through the class as vLLM's loader calls it (the shim's wrapper, where it applied one)."""
    from vllm.models.deepseek_v4.nvidia.dspark import DSparkDeepseekV4ForCausalLM

    return DSparkDeepseekV4ForCausalLM._remap_dspark_name(d, name)


def crash_path() -> dict[str, Any]:
    """vLLM's functions on the DSpark crash path, by name, as their classes (or module) hold
    them."""
    from vllm.models.deepseek_v4.attention import DeepseekV4Attention
    from vllm.models.deepseek_v4.nvidia.dspark import DSparkDeepseekV4ForCausalLM
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache
    from vllm.v1.worker.gpu import attn_utils

    return {
        "_reshape_kv_cache": attn_utils.__dict__["_reshape_kv_cache"],
        "DeepseekV4Attention.get_kv_cache_spec": DeepseekV4Attention.__dict__["get_kv_cache_spec"],
        "DeepseekV4SWACache.get_kv_cache_spec": DeepseekV4SWACache.__dict__["get_kv_cache_spec"],
        "DSparkDeepseekV4ForCausalLM._remap_dspark_name": DSparkDeepseekV4ForCausalLM.__dict__[
            "_remap_dspark_name"
        ],
    }


def describe(spec: Any) -> object:
    if spec is None:
        return None
    return {"repr": repr(spec), "page_size_bytes": spec.page_size_bytes}


def results() -> dict[str, object]:
    from vllm.models.deepseek_v4.attention import DeepseekV4Attention
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache

    out: dict[str, object] = {}
    for dtype in DTYPES:
        for block in BLOCKS:
            cfg = config(block, dtype)
            for ratio in COMPRESS:
                spec = DeepseekV4Attention.get_kv_cache_spec(attention_layer(ratio, dtype), cfg)
                out[f"attention/{dtype}/{block}/{ratio}"] = describe(spec)
            out[f"swa/{dtype}/{block}"] = describe(
                DeepseekV4SWACache.get_kv_cache_spec(swa_layer(block, dtype), cfg)
            )
    d = draft()
    for name in NAMES:
        try:
            out[f"remap/{name}"] = remap(d, name)
        except Exception as exc:  # some releases read attributes only some names need
            out[f"remap/{name}"] = f"raised {type(exc).__name__}"
    return out


if __name__ == "__main__":
    print(json.dumps(results()))
