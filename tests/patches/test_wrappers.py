"""How a patch is wrapped around vLLM's function: the wrapper takes vLLM's arguments as vLLM's function
does (whatever their names), calls vLLM once and passes its answer through the correction; a correction or
check that raises gives vLLM's own answer, and a finding stops vLLM worded as the finding."""

from __future__ import annotations

import logging

import pytest

from tests.cases import REMAP, STOP, method
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
    from dspark_hotfix.patches import Need, Patch

    namespace: dict = {}
    exec(f"def target({', '.join(parameters)}):\n    return ({', '.join(parameters)},)", namespace)

    def correction(answer, /, *args, **kwargs):
        assert answer == tuple(args) + tuple(kwargs.values())
        return (*answer, "corrected")

    patch = Patch("echo", "nowhere", "target", parameters, probe=lambda function: Need(True, ""), correction=correction)
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


def wrapped(correction=None, check=None, name: str = "t", calls: list | None = None):
    """vLLM's function ``f(x) -> ("vllm", x)`` wrapped as the registry wraps it; ``calls`` gets vLLM's calls."""
    from dspark_hotfix import registry
    from dspark_hotfix.patches import Need, Patch

    def vllm(x):
        (calls if calls is not None else []).append(x)
        if x == "bad":
            raise KeyError(x)
        return ("vllm", x)

    patch = Patch(name=name, module="m", qualname="f", parameters=("x",), probe=lambda function: Need(True, ""),
                  correction=correction, check=check)
    return registry._wrap(registry.Activation("t"), registry.Record(patch), vllm)


def test_vllms_own_error_passes_through_and_no_correction_runs(shim_log):
    seen: list = []
    with pytest.raises(KeyError, match="bad"):
        wrapped(lambda answer, x: seen.append(answer))("bad")
    assert seen == [] and shim_log == []


@pytest.mark.parametrize("kind", ["correction", "check"])
def test_a_correction_or_check_that_raises_gives_vllms_answer_and_says_so(shim_log, kind):
    def broken(*args):
        raise ValueError("no layout")

    calls: list = []
    assert wrapped(**{kind: broken}, calls=calls)(1) == ("vllm", 1) and calls == [1]
    (warning,) = [r.getMessage() for r in shim_log if r.levelno >= logging.WARNING]
    assert warning.startswith(f"t: {kind} raised ValueError: no layout"), warning


@pytest.mark.parametrize("kind", ["check", "correction"])
def test_a_finding_stops_vllm_worded_as_the_finding(shim_log, kind):
    """A stop's check finds before vLLM's function runs (it never runs); a correction after it ran."""
    from dspark_hotfix.patches import Finding
    from dspark_hotfix.registry import HotfixError

    def finds(*args):
        raise Finding("views too narrow")

    calls: list = []
    with pytest.raises(HotfixError, match=rf"^{STOP.name}: views too narrow; see `dspark-hotfix doctor`$") as stopped:
        wrapped(**{kind: finds}, name=STOP.name, calls=calls)(1)
    assert " raised " not in str(stopped.value) and calls == ([] if kind == "check" else [1])
