"""Fault injection: the shim against vLLM builds that differ from what it expects.

Each fault is a copy of the stand-in build with one edit, run in real
subprocesses three ways: shim on, shim off (``DSPARK_HOTFIX=0``, vLLM as
shipped) and strict. Shim on, vLLM must behave exactly as shim off where the
patch could not be applied, `status` must say why, and each failed patch must
log exactly one warning; strict, the process must stop naming the patch, its
target and the remedy. (One changed signature, of the SWA method, is in
test_activation.py.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest

from tests.conftest import REPO, edited_standin, last_json, patch_names, run_python, warning_lines

SWA, ATTENTION, REMAP, LOAD = "swa_kv_cache_spec", "attention_kv_cache_spec", "remap_dspark_name", "draft_load_coverage"
DSPARK = "vllm/models/deepseek_v4/nvidia/dspark.py"
ATTN = "vllm/models/deepseek_v4/attention.py"
SWA_FILE = "vllm/v1/attention/backends/mla/sparse_swa.py"
KVI = "vllm/v1/kv_cache_interface.py"

# What the driver calls for each patch: the outputs that must match vLLM as shipped.
GROUPS = "kv_cache_groups"  # the shim imports its module to judge it, as in a tensor-parallel worker
OUTPUTS = {SWA: ("swa",), ATTENTION: ("attention",), REMAP: ("remap", "load"), LOAD: (), GROUPS: ()}


@dataclass
class Fault:
    edits: dict[str, list[tuple[str, str]]]
    failed: dict[str, str]  # patch -> what its status detail must say
    names: dict[str, str] = field(default_factory=dict)  # renamed classes and methods, for the driver
    remove: tuple[str, ...] = ()
    at_call: bool = False  # the correction fails when vLLM calls the method, not at import


FAULTS = {
    "swa class renamed": Fault(
        {"*": [("DeepseekV4SWACache", "DeepseekV4SlidingWindowCache")]},
        {SWA: "has no class DeepseekV4SWACache"},
        {"swa_cls": "DeepseekV4SlidingWindowCache"},
    ),
    "attention class renamed": Fault(
        {"*": [("DeepseekV4Attention", "DeepseekV4MLAAttention")]},
        {ATTENTION: "has no class DeepseekV4Attention"},
        {"attn_cls": "DeepseekV4MLAAttention"},
    ),
    "draft class renamed": Fault(
        {"*": [("DSparkDeepseekV4ForCausalLM", "DSparkDraftForCausalLM")]},
        {REMAP: "has no class DSparkDeepseekV4ForCausalLM", LOAD: "has no class DSparkDeepseekV4ForCausalLM"},
        {"draft_cls": "DSparkDraftForCausalLM"},
    ),
    "swa method renamed": Fault(
        {SWA_FILE: [("def get_kv_cache_spec(", "def kv_cache_spec(")],
         "*": [("swa_cache.get_kv_cache_spec(", "swa_cache.kv_cache_spec(")]},  # warmup.py calls it
        {SWA: "DeepseekV4SWACache defines no get_kv_cache_spec"},
        {"swa_meth": "kv_cache_spec"},
    ),
    "attention method renamed": Fault(
        {ATTN: [("def get_kv_cache_spec(", "def kv_cache_spec(")]},
        {ATTENTION: "DeepseekV4Attention defines no get_kv_cache_spec"},
        {"attn_meth": "kv_cache_spec"},
    ),
    "remap method renamed": Fault(
        {DSPARK: [("_remap_dspark_name", "_remap_checkpoint_name")]},
        {REMAP: "DSparkDeepseekV4ForCausalLM defines no _remap_dspark_name"},
        {"remap_meth": "_remap_checkpoint_name"},
    ),
    "attention signature changed": Fault(
        {ATTN: [("get_kv_cache_spec(self, vllm_config)", "get_kv_cache_spec(self, vllm_config, kv_sharing=None)")]},
        {ATTENTION: "unexpected signature"},
    ),
    "remap signature changed": Fault(
        {DSPARK: [("def _remap_dspark_name(self, name)", "def _remap_dspark_name(self, name, *, stage_offset=0)")]},
        {REMAP: "unexpected signature"},
    ),
    "get_kv_quant_mode missing": Fault(
        {KVI: [("def get_kv_quant_mode(", "def kv_quant_mode_for(")]},
        {SWA: "get_kv_quant_mode", ATTENTION: "get_kv_quant_mode", GROUPS: "get_kv_quant_mode"},
    ),
    "spec class with an unknown required field": Fault(
        {KVI: [("from dataclasses import dataclass", "from dataclasses import InitVar, dataclass"),
               ("class SlidingWindowMLASpec(_DeepseekV4Spec):\n    sliding_window: int\n",
                "class SlidingWindowMLASpec(_DeepseekV4Spec):\n    sliding_window: int\n"
                "    window_layout: InitVar[str]\n\n"
                "    def __post_init__(self, window_layout: str) -> None:\n"
                "        super().__post_init__()\n")],
         SWA_FILE: [('model_version="deepseek_v4",', 'model_version="deepseek_v4", window_layout="ring",')]},
        {SWA: "correction raised ValueError"},
        at_call=True,
    ),
    "spec page rule raises": Fault(
        {KVI: [("class SlidingWindowMLASpec(_DeepseekV4Spec):\n    sliding_window: int\n",
                "class SlidingWindowMLASpec(_DeepseekV4Spec):\n    sliding_window: int\n\n"
                "    @property\n"
                "    def real_page_size_bytes(self) -> int:\n"
                "        if self.kv_quant_mode != KVQuantMode.NONE:\n"
                "            raise NotImplementedError('quantized SWA pages are sized by the backend')\n"
                "        return _DeepseekV4Spec.real_page_size_bytes.fget(self)\n")]},
        {SWA: "correction raised NotImplementedError"},
        at_call=True,
    ),
}

NAMES = {
    "swa_cls": "DeepseekV4SWACache", "swa_meth": "get_kv_cache_spec",
    "attn_cls": "DeepseekV4Attention", "attn_meth": "get_kv_cache_spec",
    "draft_cls": "DSparkDeepseekV4ForCausalLM", "remap_meth": "_remap_dspark_name",
}
CHECKPOINT = ["mtp.0.attn.wkv.weight", "mtp.1.ffn.gate.weight", "mtp.2.norm.weight", "layers.0.attn.wkv.weight"]


def driver(names: dict[str, str], draft: bool = True) -> str:
    """vLLM's import and calls, each call twice (a failure must be reported once), then status."""
    n = {**NAMES, **names}
    lines = [
        "import json",
        "from types import SimpleNamespace",
        "config = SimpleNamespace(cache_config=SimpleNamespace(block_size=256, cache_dtype='fp8_ds_mla'))",
        "out = {}",
        f"from vllm.v1.attention.backends.mla.sparse_swa import {n['swa_cls']} as S",
        f"from vllm.models.deepseek_v4.attention import {n['attn_cls']} as A",
        f"out['swa'] = [repr(S().{n['swa_meth']}(config)) for _ in range(2)]",
        f"out['attention'] = [repr(A(compress_ratio=4).{n['attn_meth']}(config)) for _ in range(2)]",
    ]
    if draft:
        lines += [
            f"from vllm.models.deepseek_v4.nvidia.dspark import {n['draft_cls']} as D",
            f"out['remap'] = [D().{n['remap_meth']}(name) for name in {CHECKPOINT!r} * 2]",
            f"out['load'] = sorted(D().load_weights((name, None) for name in {CHECKPOINT!r}))",
        ]
    lines += ["import dspark_hotfix", "out['status'] = {r['name']: r for r in dspark_hotfix.status()['patches']}",
              "print(json.dumps(out))"]
    return "\n".join(lines) + "\n"


@pytest.fixture(params=sorted(FAULTS), ids=lambda k: k.replace(" ", "-"))
def fault(request, tmp_path):
    spec = FAULTS[request.param]
    return spec, edited_standin(tmp_path / "standin", spec.edits, spec.remove)


def test_vllm_runs_as_shipped_where_a_patch_fails_and_status_says_why(fault):
    spec, standin = fault
    code = driver(spec.names)
    on = last_json(run_python(code, path=(REPO, standin)).stdout)
    off = last_json(run_python(code, path=(REPO, standin), env={"DSPARK_HOTFIX": "0"}).stdout)
    for name, why in spec.failed.items():
        for key in OUTPUTS[name]:
            assert on[key] == off[key], f"{name} failed, yet vLLM's {key} changed"
        row = on["status"][name]
        assert why in row["detail"]
        assert row["state"] in (("patched", "failed") if spec.at_call else ("failed",))
    # The patches the fault does not touch still correct vLLM: the comparison above is not vacuous.
    for name in set(patch_names()) - set(spec.failed):
        if name in OUTPUTS and not set(OUTPUTS[name]) & {k for f in spec.failed for k in OUTPUTS[f]}:
            assert on["status"][name]["state"] == "patched"
            assert all(on[key] != off[key] for key in OUTPUTS[name])


def test_each_failed_patch_logs_exactly_one_warning(fault):
    spec, standin = fault
    proc = run_python(driver(spec.names), path=(REPO, standin))
    warnings = warning_lines(proc.stderr)
    assert len(warnings) == len(spec.failed), warnings
    for name in spec.failed:
        assert len([w for w in warnings if w.startswith(f"{name}: ")]) == 1, (name, warnings)


def test_strict_mode_stops_naming_the_patch_its_target_and_the_remedy(fault):
    spec, standin = fault
    proc = run_python(driver(spec.names), path=(REPO, standin), env={"DSPARK_HOTFIX_STRICT": "1"}, check=False)
    assert proc.returncode != 0 and proc.stdout == ""
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("dspark_hotfix.registry.HotfixError: ")
    named = [name for name in spec.failed if f"HotfixError: {name}: " in last]
    assert len(named) == 1, last
    from dspark_hotfix.patches import ALL

    target = next(p for p in ALL if p.name == named[0]).target
    assert target in last, f"the message does not name the target {target}: {last}"
    assert f"DSPARK_HOTFIX_PATCHES=-{named[0]}" in last, f"the message names no remedy: {last}"


def test_strict_remedy_names_only_commands_that_exist(tmp_path):
    spec = FAULTS["attention signature changed"]
    standin = edited_standin(tmp_path / "standin", spec.edits)
    proc = run_python(driver(spec.names), path=(REPO, standin), env={"DSPARK_HOTFIX_STRICT": "1"}, check=False)
    message = proc.stderr.strip().splitlines()[-1]
    assert "DSPARK_HOTFIX_PATCHES=-attention_kv_cache_spec" in message
    for command in re.findall(r"`dspark-hotfix ([a-z-]+)[^`]*`", message):
        help_run = run_python(f"import sys; sys.argv = ['dspark-hotfix', {command!r}, '--help']\n"
                              "from dspark_hotfix.cli import main; main()", path=(REPO,), check=False)
        assert help_run.returncode == 0, f"the remedy names `dspark-hotfix {command}`, which does not exist"


@pytest.fixture
def without_dspark(tmp_path):
    """A build without the DSpark draft module (vLLM 0.23/0.24 ship none)."""
    return edited_standin(
        tmp_path / "standin",
        {"vllm/models/deepseek_v4/__init__.py": [
            ("from .nvidia.dspark import DSparkDeepseekV4ForCausalLM", "DSparkDeepseekV4ForCausalLM = None")]},
        remove=(DSPARK,),
    )


def test_missing_target_module_leaves_its_patches_waiting_without_a_warning(without_dspark):
    code = driver({}, draft=False)
    proc = run_python(code, path=(REPO, without_dspark))
    on = last_json(proc.stdout)
    for name in (REMAP, LOAD):  # never imported: nothing failed, nothing to say
        assert on["status"][name]["state"] == "pending"
        assert "waiting for vllm.models.deepseek_v4.nvidia.dspark" in on["status"][name]["detail"]
    assert on["status"][SWA]["state"] == on["status"][ATTENTION]["state"] == "patched"
    assert warning_lines(proc.stderr) == []
    strict = run_python(code, path=(REPO, without_dspark), env={"DSPARK_HOTFIX_STRICT": "1"})
    assert last_json(strict.stdout)["status"][REMAP]["state"] == "pending"


def test_missing_target_module_is_named_by_status_import_targets(without_dspark):
    proc = run_python("from dspark_hotfix.cli import main; raise SystemExit(main(['status', '--import-targets']))",
                      path=(REPO, without_dspark), check=False)
    assert proc.returncode == 1
    assert "PROBLEM  cannot import vllm.models.deepseek_v4.nvidia.dspark: ModuleNotFoundError" in proc.stdout
