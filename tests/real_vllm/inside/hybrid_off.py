"""DeepSeek-V4's KV caches in a real vLLM with the hybrid KV cache manager on and off, as one JSON
object.

Run by ``tests/real_vllm/test_hybrid_off.py`` as ``<venv python> hybrid_off.py``, with the shim on
``PYTHONPATH`` or without it (or with ``DSPARK_HOTFIX=0``): nothing of the shim is imported before
vLLM, so whatever the environment activated is what answers. CPU only, no GPU, no model weights.

The specs come from vLLM's own ``get_kv_cache_spec`` methods (called with stand-in ``self`` objects)
for a representative model: 4 target layers with compress ratios 0, 4, 128, 0 (0 means sliding
window only) and 3 DSpark draft layers (sliding window only), block size 256, ``fp8_ds_mla``. For
the hybrid manager on and off, vLLM's ``get_kv_cache_groups`` groups them (with a stand-in
vllm_config holding a real CacheConfig) and, where it succeeds, the V2 runner's views are built on
CPU tensors with vLLM's own code (``_allocate_kv_cache`` + ``_reshape_kv_cache`` on 0.25-0.28,
``allocate_kv_cache`` on 0.29+). Also ``SlidingWindowMLASpec.merge([swa, swa])`` and, where
``_reshape_kv_cache`` exists, its view; and ``dspark_hotfix.status()`` where the package is
importable. Anything that fails unexpectedly is named under ``"errors"``; the caller treats a
non-empty one as a failure.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import os
import sys
import traceback
from collections.abc import Callable
from types import SimpleNamespace as NS
from typing import Any

BLOCK_SIZE = 256
CACHE_DTYPE = "fp8_ds_mla"
NUM_BLOCKS = 4  # blocks per tensor in the CPU allocations
TARGET_RATIOS = (0, 4, 128, 0)  # vLLM takes max(1, ratio): 1 is sliding window only
NUM_DRAFT = 3  # DSpark draft layers: sliding window only
WINDOW = 128
HEAD_DIM = 512
INDEXER_HEAD_DIM = 128
INDEXER_QUANT_BLOCK = 128
# Where vLLM's KV-cache grouping lives: kv_cache_utils up to 0.32, kv_cache_planning from 0.33.0 on.
GROUPING_MODULES = ("vllm.v1.core.kv_cache_utils", "vllm.v1.core.kv_cache_planning")

ERRORS: dict[str, str] = {}


def described(exc: BaseException) -> dict[str, Any]:
    frames = traceback.extract_tb(exc.__traceback__)
    last = frames[-1] if frames else None
    return {
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc),
        "raised_at": f"{os.path.basename(last.filename)}:{last.name}" if last else None,
    }


def attempt(key: str, fn: Callable[[], Any], default: Any = None) -> Any:
    try:
        return fn()
    except Exception as exc:
        ERRORS[key] = f"{type(exc).__name__}: {exc} @ {described(exc)['raised_at']}"
        return default


def imp(name: str) -> Any:
    return importlib.import_module(name)


def mode_name(spec: Any) -> str | None:
    mode = getattr(spec, "kv_quant_mode", None)
    return None if mode is None else str(getattr(mode, "name", mode))


class Model:
    """The representative model's per-layer specs, from vLLM's own spec methods."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.attn_mod = imp("vllm.models.deepseek_v4.attention")
        self.swa_mod = imp("vllm.v1.attention.backends.mla.sparse_swa")
        self.comp_mod = imp("vllm.models.deepseek_v4.compressor")
        self.cache = NS(block_size=BLOCK_SIZE, cache_dtype=CACHE_DTYPE)
        self.config = NS(cache_config=self.cache)
        self.backends = self._backends()
        self.backend_of: dict[str, Any] = {}
        self.kind_of: dict[str, str] = {}

    def _backends(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "swa": getattr(self.swa_mod, "DeepseekSparseSWABackend", None),
            "attn": None,
        }
        try:
            flashmla = imp("vllm.models.deepseek_v4.nvidia.flashmla")
            for _, cls in inspect.getmembers(flashmla, inspect.isclass):
                if cls.__module__ == flashmla.__name__ and "backend_cls" in vars(cls):
                    found["attn"] = vars(cls)["backend_cls"]
                    if vars(cls).get("swa_backend_cls") is not None:
                        found["swa"] = vars(cls)["swa_backend_cls"]
        except ImportError:
            found["attn"] = imp("vllm.models.deepseek_v4.sparse_mla").DeepseekV4FlashMLABackend
        found["state"] = getattr(self.comp_mod, "CompressorBackend", None)
        found["indexer"] = imp("vllm.v1.attention.backends.mla.indexer").DeepseekV4IndexerBackend
        return found

    def swa(self) -> Any:
        layer = NS(
            block_size=64,
            head_dim=HEAD_DIM,
            window_size=WINDOW,
            dtype=self.torch.uint8,
            cache_config=self.cache,
            bounded_replay=False,
            packed_bytes_per_token=584,
            packed_page_alignment=576,
            packed_block_stride_alignment=None,
            backend_cls=self.backends["swa"],
        )
        return self.swa_mod.DeepseekV4SWACache.get_kv_cache_spec(layer, self.config)

    def attn(self, ratio: int) -> Any:
        layer = NS(
            compress_ratio=ratio,
            kv_cache_dtype=CACHE_DTYPE,
            head_dim=HEAD_DIM,
            kv_cache_torch_dtype=self.torch.uint8,
            cache_config=self.cache,
        )
        return self.attn_mod.DeepseekV4Attention.get_kv_cache_spec(layer, self.config)

    def state(self, ratio: int, head_dim: int) -> Any:
        coff = 1 + (ratio == 4)
        layer = NS(
            state_dim=2 * coff * head_dim,
            dtype=self.torch.float32,
            compress_ratio=ratio,
            sliding_window=coff * ratio,
            block_size=4 if ratio == 4 else 8,
            cache_config=self.cache,
        )
        return self.comp_mod.CompressorStateCache.get_kv_cache_spec(layer, self.config)

    def indexer(self, ratio: int) -> Any:
        head = INDEXER_HEAD_DIM + INDEXER_HEAD_DIM // INDEXER_QUANT_BLOCK * 4
        layer = NS(
            head_dim=head, dtype=self.torch.uint8, compress_ratio=ratio, cache_config=self.cache
        )
        return self.attn_mod.DeepseekV4IndexerCache.get_kv_cache_spec(layer, self.config)

    def specs(self) -> dict[str, Any]:
        """A fresh dict of fresh specs, in the order DeepseekV4Attention registers its caches."""
        specs: dict[str, Any] = {}
        for i, ratio in enumerate([max(1, r) for r in TARGET_RATIOS] + [1] * NUM_DRAFT):
            prefix = f"model.layers.{i}.attn"
            items: list[tuple[str, str, Callable[[], Any]]] = []
            if ratio == 4:
                items.append(
                    (f"{prefix}.indexer.k_cache", "indexer", functools.partial(self.indexer, ratio))
                )
                items.append(
                    (
                        f"{prefix}.indexer.compressor.state_cache",
                        "state",
                        functools.partial(self.state, ratio, INDEXER_HEAD_DIM),
                    )
                )
            items.append((f"{prefix}.swa_cache", "swa", self.swa))
            if ratio > 1:
                items.append((prefix, "attn", functools.partial(self.attn, ratio)))
                state = functools.partial(self.state, ratio, HEAD_DIM)
                items.append((f"{prefix}.compressor.state_cache", "state", state))
            for name, kind, build in items:
                specs[name] = build()
                self.kind_of[name] = kind
                self.backend_of[name] = self.backends[kind]
        return specs


def first_attr(modules: tuple[str, ...], name: str) -> tuple[Any, str]:
    for module in modules:
        try:
            found = imp(module)
        except ImportError:
            continue
        if hasattr(found, name):
            return getattr(found, name), module
    raise ImportError(f"{name} not found in {', '.join(modules)}")


def vllm_config(disable_hybrid: bool) -> Any:
    cache_config = imp("vllm.config").CacheConfig(block_size=BLOCK_SIZE, cache_dtype=CACHE_DTYPE)
    cache_config.num_gpu_blocks_override = NUM_BLOCKS
    return NS(
        scheduler_config=NS(
            disable_hybrid_kv_cache_manager=disable_hybrid,
            max_num_batched_tokens=8192,
            max_num_seqs=8,
        ),
        cache_config=cache_config,
        model_config=NS(
            max_model_len=4096,
            use_mla=True,
            attention_chunk_size=None,
            is_hybrid=False,
            hf_config=NS(model_type="deepseek_v4", architectures=["DeepseekV4ForCausalLM"]),
        ),
        parallel_config=NS(
            tensor_parallel_size=1,
            pipeline_parallel_size=1,
            decode_context_parallel_size=1,
            prefill_context_parallel_size=1,
            data_parallel_size=1,
        ),
        speculative_config=NS(
            use_eagle=lambda: True,
            use_eagle_block_drop=lambda: True,  # vLLM 0.31.0 on: what use_eagle() gives, by default
            method="dspark",
            num_speculative_tokens=3,
        ),
        kv_transfer_config=None,
        attention_config=NS(hisparse_config=None),
        compilation_config=NS(static_forward_context={}),
    )


def resolve_layout(model: Model, config: Any, specs: dict[str, Any]) -> None:
    """0.29+: the CacheConfig's KV-cache layout is resolved before grouping (None before 0.29:
    nothing to do)."""
    cache_config = config.cache_config
    if getattr(cache_config, "kv_cache_layout", "absent") is not None:
        return
    utils = imp("vllm.v1.attention.backends.utils")
    backends = [b for b in {model.backend_of[n] for n in specs} if b is not None]
    names = [layout.name for layout in utils.get_supported_kv_cache_layouts(backends)]
    layout = utils.resolve_kv_cache_layout(config, [names], list(specs.values()))
    try:
        cache_config.kv_cache_layout = layout.name
    except Exception:  # a frozen config
        object.__setattr__(cache_config, "kv_cache_layout", layout.name)


def layer_spec(group: Any, name: str) -> Any:
    spec = group.kv_cache_spec
    return spec.kv_cache_specs[name] if hasattr(spec, "kv_cache_specs") else spec


def view_of(tensor: Any) -> dict[str, Any]:
    """Bytes per token (the last dimension's bytes, times the heads) and slots per block of a runner
    view."""
    shape = list(tensor.shape)
    heads = (
        shape[1] if tensor.dim() == 4 else 1
    )  # 0.29+: [blocks, heads, slots, bytes]; before: [blocks, slots, ...]
    return {
        "bytes_per_token": heads * shape[-1] * tensor.element_size(),
        "slots_per_block": shape[-2],
        "dtype": str(tensor.dtype).replace("torch.", ""),
    }


def call_reshape(
    reshape: Callable[..., Any],
    attn_groups: list[Any],
    raw: dict[str, Any],
    kernel_block_sizes: list[int],
    kv_cache_config: Any,
) -> Any:
    values = {
        "attn_groups": attn_groups,
        "kv_cache_raw_tensors": raw,
        "cache_dtype": CACHE_DTYPE,
        "kernel_block_sizes": kernel_block_sizes,
        "shared_kv_cache_layers": {},
        "kv_cache_config": kv_cache_config,
    }
    parameters = inspect.signature(reshape).parameters
    return reshape(**{k: v for k, v in values.items() if k in parameters})


def runner_views(model: Model, config: Any, groups: list[Any]) -> dict[str, Any]:
    """The V2 runner's view of every layer, built with vLLM's own code on CPU tensors."""
    import torch

    attn_utils = imp("vllm.v1.worker.gpu.attn_utils")
    worker_utils = imp("vllm.v1.worker.utils")
    attn_groups = []
    for group_id, group in enumerate(groups):
        by_spec: dict[tuple[Any, str], Any] = {}
        for name in group.layer_names:
            spec = layer_spec(group, name)
            backend = model.backend_of[name]
            key = (getattr(backend, "__name__", None), repr(spec))
            if key not in by_spec:
                by_spec[key] = NS(
                    backend=backend, layer_names=[], kv_cache_spec=spec, kv_cache_group_id=group_id
                )
            by_spec[key].layer_names.append(name)
        attn_groups.append(list(by_spec.values()))
    from_groups, _ = first_attr(
        (*GROUPING_MODULES, "vllm.v1.core.kv_cache_config_builder"),
        "get_kv_cache_config_from_groups",
    )
    if "num_blocks" in inspect.signature(from_groups).parameters:
        kv_cache_config = from_groups(config, groups, NUM_BLOCKS)
    else:
        available = NUM_BLOCKS * sum(
            layer_spec(g, n).page_size_bytes for g in groups for n in g.layer_names
        )
        kv_cache_config = from_groups(config, groups, available)
    kernel_block_sizes = list(worker_utils.prepare_kernel_block_sizes(kv_cache_config, attn_groups))
    if hasattr(attn_utils, "_reshape_kv_cache"):  # 0.25-0.28
        raw = attn_utils._allocate_kv_cache(kv_cache_config, {}, torch.device("cpu"))
        flat = [ag for ags in attn_groups for ag in ags]
        views = call_reshape(
            attn_utils._reshape_kv_cache, flat, raw, kernel_block_sizes, kv_cache_config
        )
        builder = "vllm.v1.worker.gpu.attn_utils._reshape_kv_cache"
    else:  # 0.29+
        layout = config.cache_config.get_resolved_kv_cache_layout()
        views = worker_utils.allocate_kv_cache(
            kv_cache_config, torch.device("cpu"), layout, kernel_block_sizes
        )
        builder = "vllm.v1.worker.utils.allocate_kv_cache"
    return {
        "builder": builder,
        "kernel_block_sizes": kernel_block_sizes,
        "views": {name: view_of(view) for name, view in views.items()},
    }


def grouping(model: Model, get_groups: Callable[..., Any], disable_hybrid: bool) -> dict[str, Any]:
    specs = model.specs()
    before = dict(specs)
    config = vllm_config(disable_hybrid)
    resolve_layout(model, config, specs)
    out: dict[str, Any] = {"disable_hybrid_kv_cache_manager": disable_hybrid}
    try:
        groups = get_groups(config, specs)
    except Exception as exc:
        out["outcome"] = "error"
        out["error"] = described(exc)
        # The conversion rebuilds specs in place: none rebuilt means it stopped before vLLM's
        # conversion.
        out["specs_rebuilt"] = sorted(n for n in specs if specs[n] is not before[n])
        return out
    out["outcome"] = "ok"
    out["specs_rebuilt"] = sorted(n for n in specs if specs[n] is not before[n])
    out["groups"] = [
        {
            "spec": type(g.kv_cache_spec).__name__,
            "block_size": g.kv_cache_spec.block_size,
            "layers": len(g.layer_names),
        }
        for g in groups
    ]
    views = attempt(
        f"views.hybrid_{'off' if disable_hybrid else 'on'}",
        lambda: runner_views(model, config, groups),
        {},
    )
    out["builder"] = views.get("builder")
    out["kernel_block_sizes"] = views.get("kernel_block_sizes")
    layers = {}
    for group in groups:
        for name in group.layer_names:
            spec = layer_spec(group, name)
            layers[name] = {
                "kind": model.kind_of[name],
                "spec": type(spec).__name__,
                "kv_quant_mode": mode_name(spec),
                "block_size": spec.block_size,
                "view": views.get("views", {}).get(name),
            }
    out["layers"] = dict(sorted(layers.items()))
    return out


def merged(model: Model) -> dict[str, Any]:
    """``SlidingWindowMLASpec.merge([swa, swa])`` and, where ``_reshape_kv_cache`` exists, its
    view."""
    import torch

    swa = model.swa()
    spec = type(swa).merge([swa, swa])
    out: dict[str, Any] = {
        "spec": type(spec).__name__,
        "input_kv_quant_mode": mode_name(swa),
        "kv_quant_mode": mode_name(spec),
        "block_size": spec.block_size,
        "view": None,
    }
    attn_utils = imp("vllm.v1.worker.gpu.attn_utils")
    if hasattr(attn_utils, "_reshape_kv_cache"):
        name = "model.layers.0.attn.swa_cache"
        raw = {name: torch.zeros(spec.page_size_bytes * NUM_BLOCKS, dtype=torch.int8)}
        group = NS(
            backend=model.backends["swa"],
            layer_names=[name],
            kv_cache_spec=spec,
            kv_cache_group_id=0,
        )
        views = call_reshape(attn_utils._reshape_kv_cache, [group], raw, [spec.block_size], None)
        out["view"] = view_of(views[name])
    return out


def shim_status() -> dict[str, Any] | None:
    try:
        import dspark_hotfix
    except ImportError:
        return None
    raw = dspark_hotfix.status()
    return {
        "activated_by": raw["activated_by"],
        "enabled": raw["enabled"],
        "patches": {
            row["name"]: {"state": row["state"], "needed": row["needed"], "detail": row["detail"]}
            for row in raw["patches"]
        },
    }


def main() -> dict[str, Any]:
    import torch
    import vllm

    out: dict[str, Any] = {
        "vllm": vllm.__version__,
        "vllm_file": vllm.__file__,
        "torch": torch.__version__,
    }
    # The modules of the shim's two targets here, imported as an engine imports them: its hooks
    # decide now.
    for module in ("vllm.v1.core.kv_cache_utils", "vllm.v1.worker.gpu.attn_utils"):
        attempt(f"import {module}", functools.partial(imp, module))
    model = attempt("model", lambda: Model(torch))
    get_groups, where = attempt(
        "get_kv_cache_groups",
        lambda: first_attr(GROUPING_MODULES, "get_kv_cache_groups"),
        (None, None),
    )
    out["get_kv_cache_groups"] = {"module": where, "wrapped": hasattr(get_groups, "__wrapped__")}
    if model is not None and get_groups is not None:
        for disable, key in ((False, "hybrid_on"), (True, "hybrid_off")):
            out[key] = attempt(key, functools.partial(grouping, model, get_groups, disable))
        out["merge"] = attempt("merge", lambda: merged(model))
    out["status"] = attempt("status", shim_status)
    out["errors"] = ERRORS
    return out


if __name__ == "__main__":
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    stdout, sys.stdout = (
        sys.stdout,
        sys.stderr,
    )  # vLLM logs to stdout: keep it for the one JSON object
    result = main()
    stdout.write(json.dumps(result, indent=1) + "\n")
    stdout.flush()
