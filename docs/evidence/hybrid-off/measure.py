#!/usr/bin/env python
"""Measure how the installed vLLM builds DeepSeek-V4 KV-cache specs/views with the
hybrid KV cache manager ON vs OFF.  CPU only; calls vLLM's own functions with
stand-in (SimpleNamespace) `self` / config objects.  Prints one JSON object.

Usage: <venv python> docs/evidence/hybrid-off/measure.py > docs/evidence/hybrid-off/<version>.json
(run from outside the repository, with PYTHONDONTWRITEBYTECODE=1; docs/evidence/hybrid-off.md)
"""
import copy
import importlib
import inspect
import io
import json
import logging
import os
import re
import sys
import traceback
from contextlib import redirect_stderr, redirect_stdout
from types import SimpleNamespace as NS

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

_REAL_STDOUT = sys.stdout
sys.stdout = sys.stderr  # vLLM logs to stdout; keep stdout for the JSON
OUT: dict = {"errors": {}}
BLOCK_SIZE = 256
CACHE_DTYPE = "fp8_ds_mla"
NUM_BLOCKS = 4  # num_gpu_blocks_override for the CPU allocations
# target layers' compress ratios (0 -> vLLM uses max(1, 0) = 1: SWA only)
TARGET_RATIOS = [0, 4, 128, 0]
NUM_DRAFT = 3  # DSpark draft layers: layer_id >= num_hidden_layers -> ratio 1
WINDOW = 128
HEAD_DIM = 512
INDEXER_HEAD_DIM = 128
INDEXER_QUANT_BLOCK = 128


def err(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    where = f" @ {os.path.basename(tb[-1].filename)}:{tb[-1].lineno}" if tb else ""
    return f"{type(e).__name__}: {e}{where}"[:1500]


def attempt(key, fn, default=None):
    try:
        return fn()
    except BaseException as e:  # noqa: BLE001
        if isinstance(e, KeyboardInterrupt):
            raise
        OUT["errors"][key] = err(e)
        return default


def imp(mod):
    return importlib.import_module(mod)


def first_attr(mods, name):
    for m in mods:
        try:
            mod = imp(m)
        except Exception:  # noqa: BLE001
            continue
        if hasattr(mod, name):
            return getattr(mod, name), m
    raise ImportError(f"{name} not found in {mods}")


# ----------------------------------------------------------------------------
# Imports
import torch  # noqa: E402
import vllm  # noqa: E402

OUT["vllm_version"] = getattr(vllm, "__version__", "?")
OUT["torch_version"] = torch.__version__
OUT["python"] = sys.executable

kvi = imp("vllm.v1.kv_cache_interface")
KVQuantMode = getattr(kvi, "KVQuantMode", None)

CORE_MODS = [
    "vllm.v1.core.kv_cache_planning",
    "vllm.v1.core.kv_cache_utils",
]


def qm(spec):
    m = getattr(spec, "kv_quant_mode", None)
    return None if m is None else getattr(m, "name", str(m))


def quant_is_none(spec):
    m = getattr(spec, "kv_quant_mode", None)
    return m is None or (KVQuantMode is not None and m == KVQuantMode.NONE)


def spec_summary(spec):
    d = {"class": type(spec).__name__}
    for f in (
        "block_size", "storage_block_size", "head_size", "num_kv_heads",
        "sliding_window", "compress_ratio", "tokens_per_state", "cache_dtype_str",
        "model_version", "alignment", "state_content_bytes", "bounded_replay",
        "page_size_padded", "state_content_size_bytes", "max_tp_shards",
    ):
        try:
            v = getattr(spec, f)
        except Exception:  # noqa: BLE001
            continue
        if callable(v):
            continue
        d[f] = v
    try:
        d["dtype"] = str(spec.dtype).replace("torch.", "")
    except Exception:  # noqa: BLE001
        pass
    d["kv_quant_mode"] = qm(spec)
    for f in ("page_size_bytes", "real_page_size_bytes"):
        try:
            d[f] = getattr(spec, f)
        except Exception as e:  # noqa: BLE001
            d[f] = "ERR " + err(e)
    return d


# ----------------------------------------------------------------------------
# 1. Per-layer specs from vLLM's own get_kv_cache_spec methods
attn_mod = attempt("import.attention", lambda: imp("vllm.models.deepseek_v4.attention"))
swa_mod = attempt(
    "import.sparse_swa", lambda: imp("vllm.v1.attention.backends.mla.sparse_swa")
)
comp_mod = attempt("import.compressor", lambda: imp("vllm.models.deepseek_v4.compressor"))

cache_ns = NS(block_size=BLOCK_SIZE, cache_dtype=CACHE_DTYPE)
spec_cfg = NS(cache_config=cache_ns)


def backends():
    b = {}
    b["swa"] = getattr(swa_mod, "DeepseekSparseSWABackend", None)
    b["attn"] = None
    try:
        fm = imp("vllm.models.deepseek_v4.nvidia.flashmla")
        for _, cls in inspect.getmembers(fm, inspect.isclass):
            if cls.__module__ == fm.__name__ and "backend_cls" in vars(cls):
                b["attn"] = vars(cls)["backend_cls"]
                if vars(cls).get("swa_backend_cls") is not None:
                    b["swa"] = vars(cls)["swa_backend_cls"]
                b["attn_layer_class"] = cls.__name__
    except Exception as e:  # noqa: BLE001
        OUT["errors"]["import.nvidia.flashmla"] = err(e)
        try:
            b["attn"] = imp("vllm.models.deepseek_v4.sparse_mla").DeepseekV4FlashMLABackend
        except Exception as e2:  # noqa: BLE001
            OUT["errors"]["import.sparse_mla"] = err(e2)
    b["compressor"] = getattr(comp_mod, "CompressorBackend", None)
    try:
        b["indexer"] = imp("vllm.v1.attention.backends.mla.indexer").DeepseekV4IndexerBackend
    except Exception as e:  # noqa: BLE001
        OUT["errors"]["import.indexer"] = err(e)
        b["indexer"] = None
    return b


BACKENDS = attempt("backends", backends, {}) or {}
OUT["backends"] = {
    k: (v.__name__ if isinstance(v, type) else v) for k, v in BACKENDS.items()
}


def mk_swa_spec(layer_id):
    ns = NS(
        block_size=64, head_dim=HEAD_DIM, window_size=WINDOW, dtype=torch.uint8,
        cache_config=cache_ns, bounded_replay=False, packed_bytes_per_token=584,
        packed_page_alignment=576, packed_block_stride_alignment=None,
        backend_cls=BACKENDS.get("swa"),
    )
    return swa_mod.DeepseekV4SWACache.get_kv_cache_spec(ns, spec_cfg)


def mk_attn_spec(ratio):
    ns = NS(
        compress_ratio=ratio, kv_cache_dtype=CACHE_DTYPE, head_dim=HEAD_DIM,
        kv_cache_torch_dtype=torch.uint8, cache_config=cache_ns,
    )
    return attn_mod.DeepseekV4Attention.get_kv_cache_spec(ns, spec_cfg)


def mk_state_spec(ratio, head_dim):
    coff = 1 + (ratio == 4)
    ns = NS(
        state_dim=2 * coff * head_dim, dtype=torch.float32, compress_ratio=ratio,
        sliding_window=coff * ratio, block_size=4 if ratio == 4 else 8,
        cache_config=cache_ns,
    )
    return comp_mod.CompressorStateCache.get_kv_cache_spec(ns, spec_cfg)


def mk_indexer_spec(ratio):
    k_head = INDEXER_HEAD_DIM + INDEXER_HEAD_DIM // INDEXER_QUANT_BLOCK * 4
    ns = NS(
        head_dim=k_head, dtype=torch.uint8, compress_ratio=ratio, cache_config=cache_ns
    )
    return attn_mod.DeepseekV4IndexerCache.get_kv_cache_spec(ns, spec_cfg)


LAYER_BACKEND: dict = {}


def build_layer_specs():
    specs = {}
    ratios = [max(1, r) for r in TARGET_RATIOS] + [1] * NUM_DRAFT
    for i, r in enumerate(ratios):
        p = f"model.layers.{i}.attn"
        # registration order in DeepseekV4Attention.__init__:
        # indexer (k_cache, compressor.state_cache), swa_cache, attn, compressor
        items = []
        if r == 4:
            items.append((f"{p}.indexer.k_cache", lambda: mk_indexer_spec(r), "indexer"))
            items.append(
                (f"{p}.indexer.compressor.state_cache",
                 lambda: mk_state_spec(r, INDEXER_HEAD_DIM), "compressor")
            )
        items.append((f"{p}.swa_cache", lambda: mk_swa_spec(i), "swa"))
        if r > 1:
            items.append((p, lambda: mk_attn_spec(r), "attn"))
            items.append(
                (f"{p}.compressor.state_cache", lambda: mk_state_spec(r, HEAD_DIM),
                 "compressor")
            )
        for name, fn, bk in items:
            s = attempt(f"spec.{name}", fn)
            if s is not None:
                specs[name] = s
                LAYER_BACKEND[name] = BACKENDS.get(bk)
    # The attention get_kv_cache_spec for ratio 1 must be None (SWA only).
    OUT["attn_spec_ratio1_is_None"] = attempt(
        "spec.attn_ratio1", lambda: mk_attn_spec(1) is None
    )
    return specs


LAYER_SPECS = attempt("build_layer_specs", build_layer_specs, {}) or {}

# ----------------------------------------------------------------------------
# V2 GPU runner helpers (vllm/v1/worker/gpu/attn_utils.py, 0.25..0.28)
attn_utils = attempt("import.v2_attn_utils", lambda: imp("vllm.v1.worker.gpu.attn_utils"))
OUT["v2_reshape_kv_cache_exists"] = bool(
    attn_utils is not None and hasattr(attn_utils, "_reshape_kv_cache")
)
wutils = attempt("import.worker_utils", lambda: imp("vllm.v1.worker.utils"))


def v2_layer_cache_dtype(spec):
    """The V2 0.25-0.28 rule: 'auto' when kv_quant_mode is NONE."""
    tq = getattr(kvi, "TQFullAttentionSpec", ())
    if quant_is_none(spec) and not (tq and isinstance(spec, tq)):
        return "auto"
    return CACHE_DTYPE


def shape_bytes_per_slot(backend, spec, kernel_block_size):
    """bytes/slot from backend.get_kv_cache_shape (method B)."""
    if backend is not None and not hasattr(backend, "get_kv_cache_shape") and hasattr(
        kvi, "compute_layer_kv_cache_shape_bytes"
    ):
        # 0.29+: the runner's per-layer byte shape is (B, H, N, C bytes) from the spec
        shape = kvi.compute_layer_kv_cache_shape_bytes(spec, 2, kernel_block_size)
        return {
            "method": "kv_cache_interface.compute_layer_kv_cache_shape_bytes",
            "cache_dtype_str": "n/a(0.29+)",
            "shape(2 blocks)": list(shape),
            "bytes_per_slot": shape[1] * shape[3],
        }
    if backend is None:
        return None
    dt = v2_layer_cache_dtype(spec)
    shape = backend.get_kv_cache_shape(
        2, kernel_block_size, spec.num_kv_heads, spec.head_size, cache_dtype_str=dt
    )
    esize = torch.empty((), dtype=spec.dtype).element_size()
    n = 1
    for x in shape:
        n *= x
    return {
        "cache_dtype_str": dt,
        "shape(2 blocks)": list(shape),
        "bytes_per_slot": n * esize // (2 * kernel_block_size),
    }


def select_kernel_block(spec, backends_):
    bs = spec.block_size
    if getattr(spec, "storage_block_size", bs) != bs:
        return spec.storage_block_size
    if wutils is not None and hasattr(wutils, "select_common_block_size"):
        try:
            return wutils.select_common_block_size(bs, [b for b in backends_ if b])
        except Exception as e:  # noqa: BLE001
            return f"ERR {err(e)}"
    return bs


def view_summary(t, kernel_block_size, bhnc=False):
    if isinstance(t, (list, tuple)):
        return [view_summary(x, kernel_block_size, bhnc) for x in t]
    d = {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
         "stride": list(t.stride())}
    if bhnc and t.dim() == 4:
        # 0.29+: allocate_kv_cache views are [B, H, N, C]
        d["bytes_per_slot"] = t.shape[1] * t.shape[3] * t.element_size()
        d["slots_per_block"] = t.shape[2]
        return d
    # bytes per kernel slot = product of dims after (blocks, slots) * elsize.
    # DeepSeek-V4 views are (blocks, slots, bytes|head) or (blocks, slots, 1, head)
    if t.dim() >= 2:
        n = 1
        for x in t.shape[2:]:
            n *= x
        d["bytes_per_slot"] = n * t.element_size()
        d["slots_per_block"] = t.shape[1]
    return d


def call_reshape(groups_for_runner, raw, kernel_block_sizes, kv_cache_config):
    fn = attn_utils._reshape_kv_cache
    params = inspect.signature(fn).parameters
    kwargs = dict(
        attn_groups=groups_for_runner,
        kv_cache_raw_tensors=raw,
        cache_dtype=CACHE_DTYPE,
        kernel_block_sizes=kernel_block_sizes,
        shared_kv_cache_layers={},
        kv_cache_config=kv_cache_config,
    )
    kwargs = {k: v for k, v in kwargs.items() if k in params}
    return fn(**kwargs)


# per-layer V2 view (each layer alone, as the hybrid-ON group would see it)
def per_layer_table():
    rows = {}
    for name, spec in LAYER_SPECS.items():
        row = spec_summary(spec)
        be = LAYER_BACKEND.get(name)
        row["backend"] = getattr(be, "__name__", None)
        kb = select_kernel_block(spec, [be])
        row["kernel_block_size"] = kb
        row["v2_cache_dtype_rule"] = v2_layer_cache_dtype(spec)
        if isinstance(kb, int):
            row["shape_method"] = attempt(
                f"shape.{name}", lambda: shape_bytes_per_slot(be, spec, kb)
            )
        if OUT["v2_reshape_kv_cache_exists"] and isinstance(kb, int):
            def run():
                raw = {name: torch.zeros(spec.page_size_bytes * NUM_BLOCKS, dtype=torch.int8)}
                g = NS(backend=be, layer_names=[name], kv_cache_spec=spec,
                       kv_cache_group_id=0)
                v = call_reshape([g], raw, [kb], None)
                return view_summary(v[name], kb)
            row["v2_reshape_view"] = attempt(f"reshape.{name}", run)
        rows[name] = row
    return rows


OUT["per_layer"] = attempt("per_layer", per_layer_table)

# ----------------------------------------------------------------------------
# 2. get_kv_cache_groups with hybrid ON / OFF
get_groups, groups_mod = attempt(
    "import.get_kv_cache_groups", lambda: first_attr(CORE_MODS, "get_kv_cache_groups"),
    (None, None),
)
OUT["get_kv_cache_groups_module"] = groups_mod


def real_cache_config():
    try:
        CacheConfig = imp("vllm.config").CacheConfig
        cc = CacheConfig(block_size=BLOCK_SIZE, cache_dtype=CACHE_DTYPE)
        try:
            cc.num_gpu_blocks_override = NUM_BLOCKS
        except Exception:  # noqa: BLE001
            pass
        return cc, "vllm.config.CacheConfig"
    except Exception as e:  # noqa: BLE001
        OUT["errors"]["real_CacheConfig"] = err(e)
        return NS(block_size=BLOCK_SIZE, cache_dtype=CACHE_DTYPE,
                  num_gpu_blocks_override=NUM_BLOCKS, kv_cache_layout=None), "stand-in"


def make_vllm_config(disable_hybrid: bool, eagle: bool = True):
    cc, kind = real_cache_config()
    spec_cfg_ = NS(use_eagle=lambda: eagle, method="dspark", num_speculative_tokens=3)
    return NS(
        scheduler_config=NS(disable_hybrid_kv_cache_manager=disable_hybrid,
                            max_num_batched_tokens=8192, max_num_seqs=8),
        cache_config=cc,
        model_config=NS(max_model_len=4096, use_mla=True,
                        hf_config=NS(model_type="deepseek_v4",
                                     architectures=["DeepseekV4ForCausalLM"]),
                        attention_chunk_size=None, is_hybrid=False),
        parallel_config=NS(tensor_parallel_size=1, pipeline_parallel_size=1,
                           decode_context_parallel_size=1,
                           prefill_context_parallel_size=1,
                           data_parallel_size=1),
        speculative_config=spec_cfg_ if eagle else None,
        kv_transfer_config=None,
        attention_config=NS(hisparse_config=None),
        compilation_config=NS(static_forward_context={}),
    ), kind


def maybe_resolve_layout(vcfg, specs):
    """0.29+: CacheConfig.kv_cache_layout must be resolved before grouping."""
    cc = vcfg.cache_config
    if getattr(cc, "kv_cache_layout", "absent") is not None:
        return getattr(cc, "kv_cache_layout", None)
    bu = imp("vllm.v1.attention.backends.utils")
    bks = [b for b in {LAYER_BACKEND.get(n) for n in specs} if b is not None]
    layouts = bu.get_supported_kv_cache_layouts(bks)
    names = [l.name for l in layouts]
    layout = bu.resolve_kv_cache_layout(vcfg, [names], list(specs.values()))
    try:
        cc.kv_cache_layout = layout.name
    except Exception:  # noqa: BLE001
        object.__setattr__(cc, "kv_cache_layout", layout.name)
    return {"supported": names, "resolved": layout.name}


def group_summary(g):
    spec = g.kv_cache_spec
    d = {"layer_names": list(g.layer_names), "spec": spec_summary(spec)}
    if hasattr(spec, "kv_cache_specs"):
        d["per_layer"] = {n: spec_summary(s) for n, s in spec.kv_cache_specs.items()}
    if hasattr(g, "is_eagle_group"):
        d["is_eagle_group"] = g.is_eagle_group
    return d


def layer_spec_in_group(g, name):
    spec = g.kv_cache_spec
    if hasattr(spec, "kv_cache_specs"):
        return spec.kv_cache_specs[name]
    return spec


def runner_views(vcfg, groups):
    """Build the V2 runner views with the real helpers where they exist."""
    res = {}
    attn_groups = []
    for gid, g in enumerate(groups):
        per_key = {}
        for name in g.layer_names:
            s = layer_spec_in_group(g, name)
            be = LAYER_BACKEND.get(name)
            key = (getattr(be, "__name__", None), id(s) if False else repr(s))
            if key not in per_key:
                per_key[key] = NS(backend=be, layer_names=[], kv_cache_spec=s,
                                  kv_cache_group_id=gid)
            per_key[key].layer_names.append(name)
        attn_groups.append(list(per_key.values()))
    # kv cache config (real get_kv_cache_config_from_groups, if callable)
    kv_cache_config = None
    try:
        fn, _ = first_attr(CORE_MODS + ["vllm.v1.core.kv_cache_config_builder"],
                           "get_kv_cache_config_from_groups")
        params = list(inspect.signature(fn).parameters)
        # small budget: NUM_BLOCKS blocks of every layer's page (override also set)
        avail = NUM_BLOCKS * sum(
            layer_spec_in_group(g, n).page_size_bytes for g in groups for n in g.layer_names
        )
        if "num_blocks" in params:
            kv_cache_config = fn(vcfg, groups, NUM_BLOCKS)
        else:
            kv_cache_config = fn(vcfg, groups, avail)
        res["kv_cache_config"] = {
            "num_blocks": kv_cache_config.num_blocks,
            "tensors": [
                {k: getattr(t, k) for k in ("size", "shared_by", "layers", "offset",
                                             "layer_stride", "block_stride")
                 if hasattr(t, k)}
                for t in kv_cache_config.kv_cache_tensors
            ],
        }
    except Exception as e:  # noqa: BLE001
        res["kv_cache_config_error"] = err(e)
    # kernel block sizes (real prepare_kernel_block_sizes)
    kbs = None
    try:
        kcfg = kv_cache_config or NS(kv_cache_groups=groups)
        kbs = wutils.prepare_kernel_block_sizes(kcfg, attn_groups)
        res["kernel_block_sizes"] = list(kbs)
        res["kernel_block_sizes_method"] = "vllm.v1.worker.utils.prepare_kernel_block_sizes"
    except Exception as e:  # noqa: BLE001
        res["kernel_block_sizes_error"] = err(e)
        kbs = [g.kv_cache_spec.block_size for g in groups]
        res["kernel_block_sizes"] = kbs
        res["kernel_block_sizes_method"] = "fallback: group block_size"
    # shape-method bytes/slot
    shp = {}
    for gid, ags in enumerate(attn_groups):
        for ag in ags:
            s = ag.kv_cache_spec
            kb = s.storage_block_size if getattr(s, "storage_block_size", s.block_size) != s.block_size else kbs[gid]
            for n in ag.layer_names:
                shp[n] = attempt(f"gshape.{n}", lambda: dict(
                    kernel_block_size=kb, **shape_bytes_per_slot(ag.backend, s, kb)))
    res["shape_method"] = shp
    if not OUT["v2_reshape_kv_cache_exists"]:
        # 0.29+: the runner's views come from vllm.v1.worker.utils.allocate_kv_cache
        if kv_cache_config is not None and hasattr(wutils, "allocate_kv_cache"):
            try:
                tot = max(t.size for t in kv_cache_config.kv_cache_tensors)
                assert tot < (1 << 31), f"refusing to allocate {tot} bytes"
                layout = vcfg.cache_config.get_resolved_kv_cache_layout()
                views = wutils.allocate_kv_cache(
                    kv_cache_config, torch.device("cpu"), layout, list(kbs))
                res["reshape_inputs"] = (
                    f"real vllm.v1.worker.utils.allocate_kv_cache (layout {layout.name})")
                res["views"] = {n: view_summary(v, None, bhnc=True) for n, v in views.items()}
            except Exception as e:  # noqa: BLE001
                res["reshape_error"] = err(e)
        return res
    # real _reshape_kv_cache
    try:
        flat = [ag for ags in attn_groups for ag in ags]
        if kv_cache_config is not None:
            tot = sum(t.size for t in kv_cache_config.kv_cache_tensors)
            assert tot < (1 << 31), f"refusing to allocate {tot} bytes"
            raw = attn_utils._allocate_kv_cache(kv_cache_config, {}, torch.device("cpu"))
            views = call_reshape(flat, raw, kbs, kv_cache_config)
            res["reshape_inputs"] = "real _allocate_kv_cache + real KVCacheConfig"
        else:
            raw = {}
            for ag in flat:
                for n in ag.layer_names:
                    raw[n] = torch.zeros(ag.kv_cache_spec.page_size_bytes * NUM_BLOCKS,
                                         dtype=torch.int8)
            views = call_reshape(flat, raw, kbs, None)
            res["reshape_inputs"] = "per-layer raw tensors, kv_cache_config=None"
        res["views"] = {n: view_summary(v, None) for n, v in views.items()}
    except Exception as e:  # noqa: BLE001
        res["reshape_error"] = err(e)
    return res


def run_groups(disable_hybrid: bool):
    if get_groups is None:
        return None
    r = {}
    specs = dict(LAYER_SPECS)  # get_kv_cache_groups mutates the dict in place
    vcfg, kind = make_vllm_config(disable_hybrid)
    r["cache_config_kind"] = kind
    r["layout"] = attempt(f"layout.{disable_hybrid}", lambda: maybe_resolve_layout(vcfg, specs))
    log_buf = io.StringIO()
    h = logging.StreamHandler(log_buf)
    logging.getLogger("vllm").addHandler(h)
    try:
        groups = get_groups(vcfg, specs)
    except Exception as e:  # noqa: BLE001
        r["error"] = err(e)
        return r
    finally:
        logging.getLogger("vllm").removeHandler(h)
    r["log"] = log_buf.getvalue().strip()[:800]
    r["specs_after_call"] = {n: spec_summary(s) for n, s in specs.items()
                             if spec_summary(s) != spec_summary(LAYER_SPECS[n])}
    r["num_groups"] = len(groups)
    r["groups"] = [group_summary(g) for g in groups]
    r["runner"] = attempt(f"runner.{disable_hybrid}", lambda: runner_views(vcfg, groups))
    return r


OUT["groups_hybrid_on"] = attempt("groups_on", lambda: run_groups(False))
OUT["groups_hybrid_off"] = attempt("groups_off", lambda: run_groups(True))

# unify/promote function applied alone (what hybrid-OFF does to each layer spec)
def unify_alone():
    fn, mod = first_attr(CORE_MODS, "unify_hybrid_kv_cache_specs")
    specs = dict(LAYER_SPECS)
    fn(specs)
    return {"function": f"{mod}.unify_hybrid_kv_cache_specs",
            "specs": {n: spec_summary(s) for n, s in specs.items()}}


OUT["unify_hybrid_alone"] = attempt("unify_alone", unify_alone)

# ----------------------------------------------------------------------------
# 3. SlidingWindowMLASpec.merge([spec, spec])
def merge_test():
    res = {}
    for name, spec in LAYER_SPECS.items():
        if type(spec).__name__ != "SlidingWindowMLASpec":
            continue
        tag = "swa" if name.endswith("swa_cache") else "state"
        if any(k.startswith(tag + ":") for k in res):
            continue
        m = type(spec).merge([spec, spec])
        d = spec_summary(m)
        be = LAYER_BACKEND.get(name)
        kb = select_kernel_block(m, [be])
        if isinstance(kb, int):
            d["shape_method"] = attempt(f"mshape.{name}", lambda: shape_bytes_per_slot(be, m, kb))
        if OUT["v2_reshape_kv_cache_exists"] and isinstance(kb, int):
            def run():
                raw = {name: torch.zeros(m.page_size_bytes * NUM_BLOCKS, dtype=torch.int8)}
                g = NS(backend=be, layer_names=[name], kv_cache_spec=m, kv_cache_group_id=0)
                return view_summary(call_reshape([g], raw, [kb], None)[name], kb)
            d["v2_reshape_view"] = attempt(f"mreshape.{name}", run)
        d["input_kv_quant_mode"] = qm(spec)
        res[f"{tag}:{name}"] = d
    return res


OUT["merge"] = attempt("merge", merge_test)

# ----------------------------------------------------------------------------
# 5. Where the hybrid-OFF path lives; config auto-disable messages
def where():
    d = {}
    for m in CORE_MODS:
        try:
            mod = imp(m)
        except Exception:  # noqa: BLE001
            continue
        for fname in ("get_kv_cache_groups", "unify_hybrid_kv_cache_specs",
                      "_promote_local_kv_cache_specs", "group_and_unify_kv_cache_specs",
                      "get_kv_cache_configs", "get_kv_cache_config_from_groups",
                      "_try_get_full_allocation_fallback_groups"):
            f = getattr(mod, fname, None)
            if f is not None and getattr(f, "__module__", None) == m:
                try:
                    line = inspect.getsourcelines(f)[1]
                except Exception:  # noqa: BLE001
                    line = None
                d[f"{m}.{fname}"] = {"file": inspect.getsourcefile(f), "line": line}
    # who calls get_kv_cache_groups with the flag
    try:
        src = inspect.getsource(imp(d and CORE_MODS[0] if False else groups_mod))
        d["flag_check_lines"] = [
            l.strip() for l in src.splitlines()
            if "disable_hybrid_kv_cache_manager" in l
        ][:6]
    except Exception as e:  # noqa: BLE001
        d["flag_check_lines_error"] = err(e)
    # vllm/config/vllm.py messages
    try:
        vmod = imp("vllm.config.vllm")
        src = inspect.getsource(vmod)
        lines = src.splitlines()
        hits = [i for i, l in enumerate(lines) if "need_disable_hybrid_kv_cache_manager" in l]
        d["config_vllm_py"] = inspect.getsourcefile(vmod)
        d["config_flag_lines"] = [i + 1 for i in hits][:3] + ["..."]
        msgs = []
        for m_ in re.finditer(r'logger\.(warning|info)(?:_once)?\(\s*((?:"[^"]*"\s*)+)', src):
            text = "".join(re.findall(r'"([^"]*)"', m_.group(2)))
            if "hybrid" in text.lower():
                msgs.append(text)
        d["config_log_messages"] = msgs
        d["kv_connector_auto_disable"] = "supports_hma_config" in src
    except Exception as e:  # noqa: BLE001
        d["config_error"] = err(e)
    return d


OUT["where"] = attempt("where", where)

_REAL_STDOUT.write(json.dumps(OUT, indent=1, default=str) + "\n")
_REAL_STDOUT.flush()
