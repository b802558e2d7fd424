"""promote_local_specs: DeepSeek-V4's sliding-window caches with the hybrid KV cache manager off, on
vLLM 0.31.0 to 0.33.0.

Symptom: with the hybrid KV cache manager off, DeepSeek-V4 cannot start on vLLM
0.31.0, 0.32.0 and 0.33.0: KV-cache planning raises ``TypeError: MLAAttentionSpec.__init__() got an
unexpected keyword argument 'bounded_replay'``. The manager is off with
``--disable-hybrid-kv-cache-manager``, or where vLLM turns it off for a
``--kv-transfer-config`` connector without support for it (many
prefill/decode-disaggregated setups).

Cause: ``_promote_local_kv_cache_specs`` (in ``vllm.v1.core.kv_cache_utils`` from
0.28.0, moved to ``kv_cache_planning`` in 0.33.0) rebuilds each
``SlidingWindowMLASpec`` as an ``MLAAttentionSpec`` with
``replace_as(spec, MLAAttentionSpec, drop=("extra_retained_tokens",), ...)``.
From 0.31.0 the sliding-window spec has one more field the target lacks,
``bounded_replay``, and ``replace_as`` passes on every field not dropped.

Upstream: vLLM 0.34.0 drops ``bounded_replay`` there too; this patch does the same
to the call (its arguments step), so the promotion keeps the layout: an
``MLAAttentionSpec`` with the ``fp8_ds_mla`` quantization mode, viewed at 584
bytes per token, as on 0.28.0.

Decision: at import, vLLM's own promotion is run on a stand-in pair of
DeepSeek-V4 ``fp8_ds_mla`` specs, as vLLM ships it and with the repaired call;
the patch is applied only if vLLM's raises and the repaired one keeps the
layout. A vLLM whose planning has no ``replace_as`` in either place (0.25.0 to
0.27.1) is judged by its hybrid-off grouping as it ships: not needed where it
raises no such ``TypeError``.

Removal: with vLLM 0.34.0 or later; ``dspark-hotfix status`` then reports
``not_needed``.
"""

import dataclasses
import inspect
import sys
import types
from collections.abc import Callable
from typing import Any

from dspark_hotfix.patches.base import Need, Patch
from dspark_hotfix.patches.fp8_ds_mla import (
    BYTES_PER_TOKEN,
    hybrid_off,
    quant_mode,
    runner_bytes_per_token,
    stand_in_pair,
)

FIELD = "bounded_replay"


def arguments(spec: Any, target_cls: Any, *, drop: Any = (), **changes: Any) -> Any:
    """The arguments of vLLM's ``replace_as`` in its KV-cache planning, repaired: a spec rebuilt as
    a class without ``bounded_replay`` drops it too. None (the call as it is) wherever it has
    nothing to drop."""
    fields = {f.name for f in dataclasses.fields(target_cls) if f.init}
    if FIELD in drop or FIELD in fields or not hasattr(spec, FIELD):
        return None
    return (spec, target_cls), {"drop": (*drop, FIELD), **changes}


def probe(vllm_replace_as: Callable[..., Any]) -> Need:
    mode = quant_mode()  # raises where vLLM lacks get_kv_quant_mode: the layout cannot be checked
    try:
        promote = _found("_promote_local_kv_cache_specs")
        specs = stand_in_pair(sys.modules["vllm.v1.kv_cache_interface"], mode)
    except Exception as exc:  # a planning this probe does not know: undecided
        return Need(None, f"probe inconclusive ({type(exc).__name__}: {exc})")
    try:
        promote(dict(specs))
        return Need(
            False, "not needed (vLLM's hybrid-off promotion of the sliding-window specs succeeds)"
        )
    except TypeError as exc:
        raised = f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # drift in vLLM's internals: undecided
        return Need(
            None, f"probe inconclusive (vLLM's promotion raised {type(exc).__name__}: {exc})"
        )
    try:
        swa = _repaired(promote, vllm_replace_as)(dict(specs))["swa"]
        width = runner_bytes_per_token(swa)
        if swa.kv_quant_mode != mode or width != BYTES_PER_TOKEN:
            raise ValueError(f"it gives {width} bytes/token")
    except Exception as exc:
        return Need(None, f"probe inconclusive (vLLM's promotion raised {raised}; repaired, {exc})")
    return Need(
        True,
        f"needed (vLLM's hybrid-off promotion raises {raised}; repaired, it keeps the layout: "
        f"{type(swa).__name__} at {width} bytes/token)",
    )


def absent() -> Need:
    """Where no place holds the call: vLLM's hybrid-off grouping as it ships (another patch's
    wrapper taken off), on the stand-in pair, raises no ``TypeError`` for a field."""
    raised = hybrid_off(inspect.unwrap(_found("get_kv_cache_groups")))[1]
    if isinstance(raised, TypeError) and "unexpected keyword argument" in str(raised):
        return Need(None, f"probe inconclusive (vLLM's hybrid-off grouping raises {raised})")
    return Need(
        False,
        "not needed (this vLLM's KV-cache planning makes no replace_as call, and its hybrid-off"
        " grouping raises no TypeError for a field)",
    )


def _found(name: str) -> Any:
    """vLLM's function ``name``, from the first place of the patch's target that defines it."""
    for module in PATCH.modules:
        if hasattr(sys.modules.get(module), name):
            return getattr(sys.modules[module], name)
    raise LookupError(f"this vLLM defines no {name} in {' or '.join(PATCH.modules)}")


def _repaired(
    promote: Callable[..., Any], vllm_replace_as: Callable[..., Any]
) -> Callable[..., Any]:
    """vLLM's own promotion, calling ``replace_as`` with the repaired arguments: a copy of the
    function, with its module's names, and that one changed; vLLM's module is left as it is."""

    def replace_as(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = arguments(*args, **kwargs) or (args, kwargs)
        return vllm_replace_as(*args, **kwargs)

    names = {**promote.__globals__, "replace_as": replace_as}
    return types.FunctionType(
        promote.__code__, names, promote.__name__, promote.__defaults__, promote.__closure__
    )


PATCH = Patch(
    name="promote_local_specs",
    module="vllm.v1.core.kv_cache_planning",
    qualname="replace_as",
    parameters=("spec", "target_cls", "drop", "changes"),
    arguments=arguments,
    probe=probe,
    also_in=("vllm.v1.core.kv_cache_utils",),
    absent=absent,
    everywhere=True,
)
