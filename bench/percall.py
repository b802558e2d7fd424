"""Per-call cost of the shim's wrapper around vLLM's functions; run by ``bench/run.py`` in a child
process.

``python bench/percall.py standin [repeats]``: the stand-in build (the reported
defect) is on ``PYTHONPATH`` with the shim, so the registry wrapped the three
functions when they were imported; vLLM's own function is the wrapper's
``__wrapped__``. The shim keeps nothing between calls: every call of a wrapped
spec function there rebuilds the corrected spec, and that is what is timed.

``python bench/percall.py real [repeats]``: a real vLLM release, shim off. The
shim wraps nothing on a release (its functions are right), so the wrapper is
built as the registry builds it, ``registry._wrap`` around vLLM's own function
(found and signature-checked by ``registry.resolve``), and put on the class only
while it is timed: what a wrap would cost there.

Every arm calls through the class, as vLLM's call sites do (``self.m(x)``), with
the class attribute swapped between the arms, interleaved; best-of-N of timeit
loops. Prints one JSON line.
"""

from __future__ import annotations

import functools
import importlib
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


def patch_named(name: str) -> Any:
    from dspark_hotfix.patches import ALL

    return next(p for p in ALL if p.name == name)


def correction_on(cls_name: str) -> str | None:
    """The name of the shim's correction (a patch decided by a probe) of a method of vLLM's class
    ``cls_name``; None where the patch set has none (a patch removed: its cases are not run)."""
    from dspark_hotfix.patches import ALL

    corrections = [p for p in ALL if not p.stops]
    return next((p.name for p in corrections if p.qualname.split(".")[0] == cls_name), None)


def owner(name: str) -> type:
    patch = patch_named(name)
    return getattr(importlib.import_module(patch.module), patch.qualname.rpartition(".")[0])


def method_of(name: str) -> str:
    return str(patch_named(name).qualname.rpartition(".")[2])


def wrapped_and_original(build: str, name: str) -> tuple[Any, Any]:
    """The shim's wrapper and vLLM's own function."""
    if build == "standin":
        wrapper = vars(owner(name))[method_of(name)]
        original = getattr(wrapper, "__wrapped__", None)
        if original is None:
            raise SystemExit(f"{name}: not wrapped, nothing to measure ({wrapper!r})")
        return wrapper, original
    from dspark_hotfix import registry

    patch = patch_named(name)
    _, _, original = registry.resolve(patch, importlib.import_module(patch.module))
    return (
        registry._wrap(registry.Activation("benchmark"), registry.Record(patch), original),
        original,
    )


def instance_of(name: str, fields: SimpleNamespace) -> object:
    """An instance of vLLM's class, not built (no GPU, no config), with just the attributes the
    method reads, so that ``self.m(x)`` finds the method on the class as in vLLM. Some of the
    classes are abstract: a subclass that declares nothing abstract inherits the method as is."""
    cls = type("Bench", (owner(name),), {})
    cls.__abstractmethods__ = frozenset()
    obj = cls.__new__(cls)
    obj.__dict__.update(vars(fields))
    return obj


def cases(build: str) -> list[tuple[str, str, object, object, int]]:
    """(case, patch, instance, argument, calls per loop), for the corrections the patch set has."""
    return [case for case in all_cases(build) if case[1] is not None]


def all_cases(build: str) -> list[tuple[Any, ...]]:
    remap = correction_on("DSparkDeepseekV4ForCausalLM")
    attention_spec, swa_spec = (
        correction_on("DeepseekV4Attention"),
        correction_on("DeepseekV4SWACache"),
    )
    config = SimpleNamespace(cache_config=SimpleNamespace(block_size=256, cache_dtype="fp8_ds_mla"))
    if build == "standin":
        draft = owner(remap)() if remap else None
        attention = owner(attention_spec)(4, "fp8_ds_mla") if attention_spec else None
        swa = owner(swa_spec)(512, cache_dtype="fp8_ds_mla") if swa_spec else None
        swa_auto = owner(swa_spec)(512, cache_dtype="auto") if swa_spec else None
        return [
            (
                "remap, layer name: the defect, corrected",
                remap,
                draft,
                "mtp.1.attn.wkv.weight",
                FAST_CALLS,
            ),
            ("remap, head name", remap, draft, "mtp.2.norm.weight", FAST_CALLS),
            ("remap, name vLLM maps to None", remap, draft, "embed.weight", FAST_CALLS),
            (
                "attention spec, fp8_ds_mla: the defect, corrected (rebuilt every call)",
                attention_spec,
                attention,
                config,
                SLOW_CALLS,
            ),
            (
                "SWA spec, fp8_ds_mla: the defect, corrected (rebuilt every call)",
                swa_spec,
                swa,
                config,
                SLOW_CALLS,
            ),
            ("SWA spec, other dtype (auto)", swa_spec, swa_auto, config, SLOW_CALLS),
        ]
    sys.path.insert(0, str(REPO / "tests" / "real_vllm" / "inside"))
    import grid

    draft = instance_of(remap, grid.draft(43, 3)) if remap else None
    attention = (
        instance_of(attention_spec, grid.attention_layer(4, "fp8_ds_mla"))
        if attention_spec
        else None
    )
    swa = instance_of(swa_spec, grid.swa_layer(64, "fp8_ds_mla")) if swa_spec else None
    return [
        ("remap, layer name", remap, draft, "mtp.1.attn.wkv.weight", FAST_CALLS),
        ("remap, head name", remap, draft, "mtp.2.norm.weight", FAST_CALLS),
        ("remap, name vLLM maps to None", remap, draft, "embed.weight", FAST_CALLS),
        ("attention spec, fp8_ds_mla", attention_spec, attention, config, SLOW_CALLS),
        ("SWA spec, fp8_ds_mla", swa_spec, swa, config, SLOW_CALLS),
    ]


def measure(
    build: str, name: str, instance: object, argument: object, calls: int, repeats: int
) -> dict[str, float]:
    """Best ns/call with the shim's wrapper on the class (A), with vLLM's function (B), and with a
    plain function that only passes the call on (W: what any wrapper costs, without the correction).
    """
    cls, method = owner(name), method_of(name)
    wrapper, original = wrapped_and_original(build, name)

    @functools.wraps(original)
    def passthrough(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **kwargs)

    arms = {"A": wrapper, "B": original, "W": passthrough}
    before = vars(cls)[method]  # the shim's wrapper on the stand-in, vLLM's function on a release
    # vLLM's own call site: the attribute lookup (and the binding it does) is part of the cost.
    timer = timeit.Timer(
        f"instance.{method}(argument)", globals={"instance": instance, "argument": argument}
    )
    best = dict.fromkeys(arms, float("inf"))
    try:
        for rep in range(repeats + 1):
            order = list(arms)[rep % 3 :] + list(arms)[: rep % 3]
            for arm in order:
                setattr(cls, method, arms[arm])
                seconds = timer.timeit(calls)
                if rep:  # the first round warms caches and logs the first correction
                    best[arm] = min(best[arm], seconds / calls * 1e9)
    finally:
        setattr(cls, method, before)
    return best


def main() -> None:
    build = sys.argv[1]
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else REPEATS
    import vllm

    rows = []
    for case, name, instance, argument, calls in cases(build):
        best = measure(build, name, instance, argument, calls, repeats)
        rows.append(
            {
                "case": case,
                "patch": name,
                "calls": calls,
                "wrapped_ns": best["A"],
                "original_ns": best["B"],
                "passthrough_ns": best["W"],
            }
        )
    print(json.dumps({"build": build, "vllm": vllm.__version__, "repeats": repeats, "rows": rows}))


if __name__ == "__main__":
    main()
