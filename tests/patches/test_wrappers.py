"""How a patch is wrapped around vLLM's function: the wrapper takes vLLM's arguments as vLLM's function
does (whatever their names), a replacement that never calls vLLM or raises before it, and a guard's finding
logged (or, for a guard that stops, raised) worded as the finding."""

from __future__ import annotations

import logging

import pytest

from tests.cases import REMAP, SWA, VIEW_GUARD, method
from tests.conftest import (
    IMPORT_ALL,
    last_json,
    run_python,
)


def test_wrappers_take_vllms_arguments_the_way_vllms_functions_do():
    # Keyword calls bind as on vLLM's function, and a wrong call fails the same way.
    code = IMPORT_ALL + f"""
import inspect, json
from vllm.models.deepseek_v4.nvidia.dspark import DSparkDeepseekV4ForCausalLM as D
from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache as S
from types import SimpleNamespace
wrapper = D.__dict__[{method(REMAP)!r}]
config = SimpleNamespace(cache_config=SimpleNamespace(block_size=256, cache_dtype="fp8_ds_mla"))
try:
    D().{method(REMAP)}(nom="mtp.1.attn.wkv.weight")
    wrong = None
except TypeError as exc:
    wrong = str(exc)
print(json.dumps({{
    "signature": list(inspect.signature(wrapper).parameters),
    "keyword": D().{method(REMAP)}(name="mtp.1.attn.wkv.weight"),
    "positional": D().{method(REMAP)}("mtp.1.attn.wkv.weight"),
    "spec_keyword": S().get_kv_cache_spec(vllm_config=config).kv_quant_mode.name,
    "wrong": wrong,
}}))
"""
    got = last_json(run_python(code).stdout)
    assert got["signature"] == ["self", "name"]
    assert got["keyword"] == got["positional"] == "model.layers.1.attn.wkv.weight"
    assert got["spec_keyword"] == "FP8_PER_TENSOR"
    assert "unexpected keyword argument 'nom'" in got["wrong"]


@pytest.mark.parametrize("parameters", [("self", "name"), ("self", "result"), ("self", "vllm"), ("self", "returned"),
                                        ("a", "b", "c")])
def test_a_wrapper_binds_arguments_as_vllms_function_whatever_their_names(parameters):
    from dspark_hotfix import registry
    from dspark_hotfix.patches import Patch

    namespace: dict = {}
    exec(f"def target({', '.join(parameters)}):\n    return ({', '.join(parameters)},)", namespace)

    def replacement(vllm, /, *args, **kwargs):
        return (*vllm(*args, **kwargs), "corrected")

    patch = Patch("echo", "nowhere", "target", parameters, replacement)
    wrapper = registry._wrap(registry.Activation("test"), registry.Record(patch), namespace["target"])
    values = list(range(len(parameters)))
    assert wrapper(*values) == (*values, "corrected")
    assert wrapper(**dict(zip(parameters, values, strict=True))) == (*values, "corrected")
    assert wrapper.__wrapped__ is namespace["target"]


@pytest.fixture
def shim_log(monkeypatch):
    """The registry's log records in this process, whatever handlers an earlier activation left."""
    monkeypatch.delenv("DSPARK_HOTFIX_STRICT", raising=False)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    log = logging.getLogger("dspark_hotfix")
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def wrapped(replacement, name: str = "t", guards: tuple[str, ...] = (), stops: bool = False):
    """vLLM's function ``f(x) -> ("vllm", x)`` with ``replacement`` wrapped in front, as the registry wraps it."""
    from dspark_hotfix import registry
    from dspark_hotfix.patches import Patch

    patch = Patch(name=name, module="m", qualname="f", parameters=("x",), replacement=replacement,
                  guards=guards, stops=stops)
    return registry._wrap(registry.Activation("t"), registry.Record(patch), lambda x: ("vllm", x))


def test_a_replacement_that_never_calls_vllm_returns_its_answer(shim_log):
    assert wrapped(lambda vllm, x: ("shim", x))(1) == ("shim", 1)


def test_a_replacement_that_raises_before_calling_vllm_gives_vllms_answer(shim_log):
    def broken(vllm, x):
        raise ValueError("no layout")

    assert wrapped(broken)(1) == ("vllm", 1)
    (warning,) = [r.getMessage() for r in shim_log if r.levelno >= logging.WARNING]
    assert warning.startswith("t: correction raised ValueError: no layout"), warning


@pytest.mark.parametrize("when", ["before vLLM answers", "after vLLM answers"], ids=["before", "after"])
def test_a_guards_finding_is_logged_as_the_finding(shim_log, when):
    from dspark_hotfix.patches import Finding

    def check(vllm, x):
        if when == "after vLLM answers":
            vllm(x)
        raise Finding("views too narrow")

    assert wrapped(check, guards=(SWA.name,))(1) == ("vllm", 1)
    (error,) = [r.getMessage() for r in shim_log if r.levelno >= logging.WARNING]
    assert error.startswith(f"t: views too narrow; {SWA.name} ") and " raised " not in error, error


def test_the_view_guards_finding_stops_vllm_worded_as_the_finding(shim_log):
    from dspark_hotfix.patches import Finding
    from dspark_hotfix.registry import HotfixError

    def check(vllm, x):
        vllm(x)
        raise Finding("views too narrow")

    with pytest.raises(HotfixError, match=rf"^{VIEW_GUARD.name}: views too narrow; ") as stopped:
        wrapped(check, name=VIEW_GUARD.name, guards=(SWA.name,), stops=True)(1)
    assert " raised " not in str(stopped.value)
