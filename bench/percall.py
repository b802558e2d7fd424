"""Per-call cost of the wrapped vLLM functions; run by ``bench/run.py`` in a child process.

``python bench/percall.py standin``: the stand-in build is on ``PYTHONPATH`` with
the shim, so the shim's own hooks have wrapped the three functions; vLLM's
original is ``Class.__dict__[m].__wrapped__``.

``python bench/percall.py real``: a real vLLM release (shim off, so nothing is
wrapped at import); every patch is then applied through the shim's own
``hooks._apply`` with its probe forced to say "needed", which is how the shim
would wrap vLLM's functions if they were wrong.

Both arms call through the class, as vLLM's call sites do (``self.m(x)``), with
the class attribute swapped between wrapper and original, interleaved;
best-of-N of timeit loops. Prints one JSON line.
"""

from __future__ import annotations

import json
import sys
import timeit
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# Short loops, many of them: on a shared machine a short loop more often runs without being
# preempted, and the best of many is then the cost itself.
REPEATS = 150
SLOW_CALLS = 300  # spec functions build a dataclass: a few us a call
FAST_CALLS = 2_000  # remap: about 1 us a call
TARGETS = {
    "remap_dspark_name": ("vllm.models.deepseek_v4.nvidia.dspark", "DSparkDeepseekV4ForCausalLM", "_remap_dspark_name"),
    "attention_kv_cache_spec": ("vllm.models.deepseek_v4.attention", "DeepseekV4Attention", "get_kv_cache_spec"),
    "swa_kv_cache_spec": ("vllm.v1.attention.backends.mla.sparse_swa", "DeepseekV4SWACache", "get_kv_cache_spec"),
}


def owner(patch: str) -> type:
    import importlib

    module, cls, _ = TARGETS[patch]
    return getattr(importlib.import_module(module), cls)


def wrapped_and_original(patch: str) -> tuple[object, object]:
    wrapper = owner(patch).__dict__[TARGETS[patch][2]]
    original = getattr(wrapper, "__wrapped__", None)
    if original is None:
        raise SystemExit(f"{patch}: not wrapped, nothing to measure ({wrapper!r})")
    return wrapper, original


def force_wrap() -> None:
    """Wrap real vLLM's functions the way the shim would if they were wrong."""
    import importlib

    from dspark_hotfix import hooks
    from dspark_hotfix.patches import ALL, Verdict

    for patch in ALL:
        if patch.name in TARGETS:
            record = hooks._Record(patch, hooks.PENDING, "benchmark")
            patch.probe = lambda original: Verdict(True, "forced by bench/percall.py")
            hooks._apply(record, importlib.import_module(patch.module))
            if record.state != hooks.INSTALLED:
                raise SystemExit(f"{patch.name}: {record.state}: {record.detail}")


def instance_of(patch: str, fields: SimpleNamespace) -> object:
    """An instance of vLLM's class, not built (no GPU, no config), with just the attributes the
    method reads, so that ``self.m(x)`` finds the method on the class as in vLLM. Some of the
    classes are abstract: a subclass that declares nothing abstract inherits the method as is."""
    cls = type("Bench", (owner(patch),), {})
    cls.__abstractmethods__ = frozenset()
    obj = cls.__new__(cls)
    obj.__dict__.update(vars(fields))
    return obj


def cases(build: str) -> list[tuple[str, str, object, object, int]]:
    """(case, patch, instance, argument, calls per loop)."""
    remap = "remap_dspark_name"
    config = SimpleNamespace(cache_config=SimpleNamespace(block_size=256, cache_dtype="fp8_ds_mla"))
    if build == "standin":
        draft = owner(remap)()
        attention = owner("attention_kv_cache_spec")(4, "fp8_ds_mla")
        swa = owner("swa_kv_cache_spec")(512, cache_dtype="fp8_ds_mla")
        swa_auto = owner("swa_kv_cache_spec")(512, cache_dtype="auto")
        return [
            ("remap, layer name: the defect, corrected", remap, draft, "mtp.1.attn.wkv.weight", FAST_CALLS),
            ("remap, head name", remap, draft, "mtp.2.norm.weight", FAST_CALLS),
            ("remap, name vLLM maps to None", remap, draft, "embed.weight", FAST_CALLS),
            ("attention spec, fp8_ds_mla: the defect, corrected", "attention_kv_cache_spec", attention, config,
             SLOW_CALLS),
            ("SWA spec, fp8_ds_mla: the defect, corrected", "swa_kv_cache_spec", swa, config, SLOW_CALLS),
            ("SWA spec, other dtype (auto)", "swa_kv_cache_spec", swa_auto, config, SLOW_CALLS),
        ]
    sys.path.insert(0, str(REPO / "tests" / "real_vllm" / "inside"))
    import grid

    draft = instance_of(remap, grid.draft(43, 3))
    attention = instance_of("attention_kv_cache_spec", grid.attention_layer(4, "fp8_ds_mla"))
    swa = instance_of("swa_kv_cache_spec", grid.swa_layer(64, "fp8_ds_mla"))
    return [
        ("remap, layer name", remap, draft, "mtp.1.attn.wkv.weight", FAST_CALLS),
        ("remap, head name", remap, draft, "mtp.2.norm.weight", FAST_CALLS),
        ("remap, name vLLM maps to None", remap, draft, "embed.weight", FAST_CALLS),
        ("attention spec, fp8_ds_mla", "attention_kv_cache_spec", attention, config, SLOW_CALLS),
        ("SWA spec, fp8_ds_mla", "swa_kv_cache_spec", swa, config, SLOW_CALLS),
    ]


def passthrough(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    return wrapped(*args, **kwargs)


def measure(patch: str, instance: object, argument: object, calls: int) -> dict[str, float]:
    """Best ns/call with the shim's wrapper on the class (A), with vLLM's original (B), and with a
    wrapt wrapper that only passes the call on (W: what wrapt itself costs)."""
    import wrapt

    cls, method = owner(patch), TARGETS[patch][2]
    wrapper, original = wrapped_and_original(patch)
    arms = {"A": wrapper, "B": original, "W": wrapt.FunctionWrapper(original, passthrough)}
    # vLLM's own call site: the attribute lookup (and the binding it does) is part of the cost.
    timer = timeit.Timer(f"instance.{method}(argument)", globals={"instance": instance, "argument": argument})
    best = dict.fromkeys(arms, float("inf"))
    try:
        for rep in range(REPEATS + 1):
            order = list(arms)[rep % 3:] + list(arms)[:rep % 3]
            for arm in order:
                setattr(cls, method, arms[arm])
                seconds = timer.timeit(calls)
                if rep:  # the first round warms caches and logs the first correction
                    best[arm] = min(best[arm], seconds / calls * 1e9)
    finally:
        setattr(cls, method, wrapper)
    return best


def first_call(patch: str, instance: object, argument: object, calls: int = 300) -> float:
    """Median ns a spec call adds right after the shim forgot every spec it corrected: what the
    first layer of each kind pays (the rebuild); the layers after it find the correction made."""
    import statistics
    from time import perf_counter_ns

    from dspark_hotfix.patches import ALL

    correction = next(p for p in ALL if p.name == patch)
    cls, method = owner(patch), TARGETS[patch][2]
    wrapper, original = wrapped_and_original(patch)
    median = {}
    try:
        for arm, function in (("A", wrapper), ("B", original)):
            setattr(cls, method, function)
            samples = []
            for _ in range(calls):
                correction._known.clear()  # type: ignore[attr-defined]
                start = perf_counter_ns()
                getattr(instance, method)(argument)
                samples.append(perf_counter_ns() - start)
            median[arm] = statistics.median(samples)
    finally:
        setattr(cls, method, wrapper)
    return median["A"] - median["B"]


def main() -> None:
    build = sys.argv[1]
    if build == "real":
        force_wrap()
    import vllm

    rows = []
    for case, patch, instance, argument, calls in cases(build):
        best = measure(patch, instance, argument, calls)
        first = first_call(patch, instance, argument) if "corrected" in case and "spec" in case else None
        rows.append({"case": case, "patch": patch, "calls": calls, "wrapped_ns": best["A"], "original_ns": best["B"],
                     "wrapt_only_ns": best["W"], "first_call_extra_ns": first})
    print(json.dumps({"build": build, "vllm": vllm.__version__, "repeats": REPEATS, "rows": rows}))


if __name__ == "__main__":
    main()
