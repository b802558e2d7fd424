"""The real-vLLM tier for the hybrid-off stop: DeepSeek-V4 with the hybrid KV cache manager on and off.

For each release of ``venvs.VERSIONS``, and for 0.25.0 with PR #47716 reverted (``test_reverted.py``'s
shadow copy first on ``PYTHONPATH``), ``inside/hybrid_off.py`` runs once without the shim
(``DSPARK_HOTFIX=0``) and once with it (the repository on ``PYTHONPATH``, as an operator activates it),
each time having vLLM's own KV-cache grouping group the representative model's specs with the
hybrid manager on and off and building the V2 runner's views on the CPU. Released 0.25.0 loses the
``fp8_ds_mla`` layout with the manager off (512 bytes/token): with the shim that engine stops at grouping
with the cause, never silently at 512; with the manager on, the shim changes nothing. 0.33.0 raises its own
``TypeError`` with the manager off, with the shim or without. The answers are recorded in
``docs/evidence/hybrid-off.json`` (``DSPARK_HOTFIX_UPDATE_EVIDENCE=1`` writes it). This tier never skips:
if a venv cannot be built, it fails and says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.cases import SPECS, STOP, method
from tests.conftest import REPO, clean_env
from tests.real_vllm.test_reverted import VERSION as REVERTED_VERSION
from tests.real_vllm.test_reverted import reverted_copy
from tests.real_vllm.venvs import VERSIONS, ensure_venv

pytestmark = pytest.mark.real_vllm

INSIDE = Path(__file__).resolve().parent / "inside" / "hybrid_off.py"
EVIDENCE = REPO / "docs" / "evidence" / "hybrid-off.json"
REVERTED = f"{REVERTED_VERSION}-reverted"  # PR #47716 reverted: the reported build's specs
LABELS = (*VERSIONS, REVERTED)
ARMS = ("without_shim", "with_shim")
# How each release's hybrid-off grouping treats DeepSeek-V4 (measured: docs/evidence/hybrid-off.json).
LOSES_LAYOUT, RAISES = "loses the fp8_ds_mla layout", "raises its own TypeError"
BEHAVIOUR = {"0.25.0": LOSES_LAYOUT, "0.33.0": RAISES}
HOTFIX_ERROR = "dspark_hotfix.registry.HotfixError"
STOP_WORDS = ("hybrid KV cache manager", "--disable-hybrid-kv-cache-manager",
              "no vLLM release up to 0.33.0 runs DeepSeek-V4 with it off")
PARALLEL = 1  # one arm at a time: on 2 cores two vLLM imports side by side took 105 s in all, one by one 71 s
STALE = f"{EVIDENCE.relative_to(REPO)} is stale: rerun with DSPARK_HOTFIX_UPDATE_EVIDENCE=1"
GROUPING = method(STOP)  # vLLM's KV-cache grouping, which the stop wraps; inside/hybrid_off.py reports it by name


class Arms:
    """Every arm the selected tests need, queued at once and run in the background (``PARALLEL`` at a time)."""

    def __init__(self, labels: set[str]) -> None:
        self.pool = ThreadPoolExecutor(max_workers=PARALLEL)
        self.futures: dict[tuple[str, str], Future[dict[str, Any]]] = {}
        self.pythons: dict[str, Path | BaseException] = {}
        for version in sorted({REVERTED_VERSION if label == REVERTED else label for label in labels}):
            try:  # one at a time: two builds of one venv must not race
                self.pythons[version] = ensure_venv(version)[0]
            except Exception as exc:  # every test that needs this venv fails with it
                self.pythons[version] = exc
        self.copy: Path | BaseException | None = None
        if REVERTED in labels:
            try:
                python = self.python(REVERTED_VERSION)
                self.copy = reverted_copy(python, REVERTED_VERSION)
            except Exception as exc:
                self.copy = exc
        for label in (label for label in LABELS if label in labels):
            for arm in ARMS:
                self.futures[label, arm] = self.pool.submit(self.run, label, arm)

    def python(self, version: str) -> Path:
        python = self.pythons[version]
        if isinstance(python, BaseException):
            raise python
        return python

    def run(self, label: str, arm: str) -> dict[str, Any]:
        python = self.python(REVERTED_VERSION if label == REVERTED else label)
        path = [str(REPO)]
        if label == REVERTED:
            if isinstance(self.copy, BaseException) or self.copy is None:
                raise RuntimeError(f"no reverted copy of vLLM {REVERTED_VERSION}: {self.copy!r}")
            path.insert(0, str(self.copy))
        env = clean_env(PYTHONPATH=os.pathsep.join(path), **({"DSPARK_HOTFIX": "0"} if arm == "without_shim" else {}))
        start = time.monotonic()
        proc = subprocess.run([str(python), str(INSIDE)], env=env, cwd=str(REPO), capture_output=True, text=True,
                              timeout=600)
        seconds = time.monotonic() - start
        report = f"{label} {arm}: {INSIDE.name} exited {proc.returncode} after {seconds:.0f} s\n{proc.stderr[-4000:]}"
        assert proc.returncode == 0, report
        result = json.loads(proc.stdout)
        assert result["errors"] == {}, f"{report}\nunexpected failures inside: {result['errors']}"
        result["seconds"] = round(seconds, 1)
        result["stderr"] = proc.stderr
        return result

    def get(self, label: str, arm: str) -> dict[str, Any]:
        if (label, arm) not in self.futures:
            raise AssertionError(f"{label} {arm} was not started: the fixture did not see this test")
        return self.futures[label, arm].result()


def _labels_needed(session: pytest.Session) -> set[str]:
    needed: set[str] = set()
    for item in session.items:
        if getattr(getattr(item, "module", None), "__name__", None) != __name__:
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "version" in params:
            needed.add(params["version"])
        elif item.name.startswith("test_reverted"):
            needed.add(REVERTED)
        else:
            needed.update(LABELS)
    return needed or set(LABELS)


@pytest.fixture(scope="module")
def arms(request: pytest.FixtureRequest):
    measured = Arms(_labels_needed(request.session))
    yield measured
    measured.pool.shutdown(wait=True, cancel_futures=True)


def layers(result: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {name: row for name, row in result["layers"].items() if row["kind"] == kind}


def bytes_per_token(result: dict[str, Any], kind: str) -> set[int]:
    return {row["view"]["bytes_per_token"] for row in layers(result, kind).values()}


def status_of(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    assert result["status"] is not None, "dspark_hotfix was not importable in the arm"
    return result["status"]["patches"]


def assert_hybrid_on_views_584(result: dict[str, Any]) -> None:
    on = result["hybrid_on"]
    assert on["outcome"] == "ok", on
    assert on["specs_rebuilt"] == [], on["specs_rebuilt"]
    swa, states = layers(on, "swa"), layers(on, "state")
    assert len(swa) == 7 and len(states) == 3, on["layers"]
    assert {(r["spec"], r["kv_quant_mode"], r["block_size"]) for r in swa.values()} == {
        ("SlidingWindowMLASpec", "FP8_PER_TENSOR", 64)}, swa
    assert bytes_per_token(on, "swa") == bytes_per_token(on, "attn") == {584}, on["layers"]
    # The compressor states keep the block sizes their kernels take (4 for C4, 8 for C128).
    assert sorted(r["block_size"] for r in states.values()) == [4, 4, 8], states
    assert sorted(r["view"]["slots_per_block"] for r in states.values()) == [4, 4, 8], states


def assert_stopped_by_the_shim(result: dict[str, Any]) -> None:
    off = result["hybrid_off"]
    assert off["outcome"] == "error", f"no stop with the hybrid manager off: {off}"
    error = off["error"]
    assert error["type"] == HOTFIX_ERROR, error
    assert error["message"].startswith(f"{STOP.name}: DeepSeek-V4's fp8_ds_mla KV caches (9 layers"), error
    for words in STOP_WORDS:
        assert words in error["message"], (words, error["message"])
    # Before vLLM's conversion, which rebuilds specs in place (10 of them on 0.25.0): none was rebuilt.
    assert off["specs_rebuilt"] == [], off
    assert result[GROUPING] == {"module": "vllm.v1.core.kv_cache_utils", "wrapped": True}


def assert_never_narrow(result: dict[str, Any]) -> None:
    """With the shim, no grouping that went through gives an fp8_ds_mla view under 584 bytes/token."""
    for key in ("hybrid_on", "hybrid_off"):
        if result[key]["outcome"] == "ok":
            for kind in ("swa", "attn"):
                assert bytes_per_token(result[key], kind) == {584}, (key, result[key]["layers"])


@pytest.mark.parametrize("version", VERSIONS)
def test_without_the_shim(version, arms):
    if version not in BEHAVIOUR:
        pytest.fail(f"no expectation for vLLM {version}: run {INSIDE.relative_to(REPO)} there and add it to BEHAVIOUR")
    result = arms.get(version, "without_shim")
    print(f"vllm=={version} without the shim: {result['seconds']} s")
    assert result["vllm"] == version
    status = status_of(result)
    assert not result["status"]["enabled"] and {row["state"] for row in status.values()} == {"disabled"}, status
    assert not result[GROUPING]["wrapped"]
    assert_hybrid_on_views_584(result)
    off = result["hybrid_off"]
    if BEHAVIOUR[version] == LOSES_LAYOUT:
        # The reported error's view, on released vLLM: every SWA cache rebuilt as full attention without its
        # layout, viewed at 512 bytes/token, and every compressor state at the full-attention block size.
        assert off["outcome"] == "ok", off
        assert [(g["block_size"], g["layers"]) for g in off["groups"]] == [(256, 13)], off["groups"]
        swa, states = layers(off, "swa"), layers(off, "state")
        assert {(r["spec"], r["kv_quant_mode"], r["block_size"]) for r in swa.values()} == {
            ("MLAAttentionSpec", "NONE", 256)}, swa
        assert bytes_per_token(off, "swa") == {512}, swa
        assert {(r["block_size"], r["view"]["slots_per_block"]) for r in states.values()} == {(256, 256)}, states
        assert sorted(off["specs_rebuilt"]) == sorted([*swa, *states]), off["specs_rebuilt"]
        assert bytes_per_token(off, "attn") == {584}, off["layers"]  # the compressed MLA caches keep theirs
        assert "Hybrid KV cache manager is disabled" in result["stderr"]
    else:
        assert off["outcome"] == "error", off
        assert off["error"]["type"] == "builtins.TypeError" and "bounded_replay" in off["error"]["message"], off
    merge = result["merge"]
    assert (merge["spec"], merge["input_kv_quant_mode"], merge["kv_quant_mode"]) == (
        "SlidingWindowMLASpec", "FP8_PER_TENSOR", "NONE"), merge
    if BEHAVIOUR[version] == LOSES_LAYOUT:  # the V2 runner's "auto" rule: NONE views at 512
        assert merge["view"]["bytes_per_token"] == 512, merge


@pytest.mark.parametrize("version", VERSIONS)
def test_with_the_shim(version, arms):
    if version not in BEHAVIOUR:
        pytest.fail(f"no expectation for vLLM {version}: run {INSIDE.relative_to(REPO)} there and add it to BEHAVIOUR")
    result, without = arms.get(version, "with_shim"), arms.get(version, "without_shim")
    print(f"vllm=={version} with the shim: {result['seconds']} s")
    assert result["vllm"] == version
    status = status_of(result)
    assert result["status"]["activated_by"] == "sitecustomize", result["status"]
    # With the manager on the shim passes everything through: the same groups, the same views.
    assert_hybrid_on_views_584(result)
    assert result["hybrid_on"] == without["hybrid_on"]
    assert_never_narrow(result)
    if BEHAVIOUR[version] == LOSES_LAYOUT:
        assert_stopped_by_the_shim(result)
        assert status[STOP.name]["state"] == "patched", status[STOP.name]
    else:
        # Left as vLLM leaves it: its own TypeError, word for word.
        assert result["hybrid_off"] == without["hybrid_off"]
        assert result["hybrid_off"]["error"]["type"] == "builtins.TypeError", result["hybrid_off"]
        assert not result[GROUPING]["wrapped"], result[GROUPING]
        row = status[STOP.name]
        assert row["state"] == "not_needed" and f"kv_cache_utils defines no {GROUPING}" in row["detail"], row
    # A merged SWA spec loses kv_quant_mode in every release; no path measured views it (hybrid-off.md), and
    # the shim leaves it as vLLM makes it.
    assert result["merge"] == without["merge"]


def test_reverted_vllm_stops_with_the_shim_and_views_512_without(arms):
    """0.25.0 with PR #47716 reverted (the reported build's specs): the spec patches apply, and with the
    hybrid manager off the same stop comes at grouping, before any view."""
    result, without = arms.get(REVERTED, "with_shim"), arms.get(REVERTED, "without_shim")
    released = arms.get(REVERTED_VERSION, "with_shim") if (REVERTED_VERSION, "with_shim") in arms.futures else None
    print(f"vllm=={REVERTED_VERSION} reverted: {without['seconds']} s without the shim, {result['seconds']} s with it")
    for answer in (result, without):
        assert answer["vllm"] == REVERTED_VERSION
        assert "-reverted-" in answer["vllm_file"], answer["vllm_file"]  # the shadow copy, not the venv's package
    assert {row["state"] for row in status_of(without).values()} == {"disabled"}, status_of(without)
    on, off = without["hybrid_on"], without["hybrid_off"]
    assert on["outcome"] == off["outcome"] == "ok", (on, off)
    assert bytes_per_token(on, "swa") == bytes_per_token(off, "swa") == {512}, (on["layers"], off["layers"])
    assert bytes_per_token(on, "attn") == {512}, on["layers"]

    status = status_of(result)
    for name in (*(spec.name for spec in SPECS), STOP.name):
        assert status[name]["state"] == "patched", (name, status[name])
    assert_hybrid_on_views_584(result)  # the spec patches' correction
    assert_stopped_by_the_shim(result)
    assert_never_narrow(result)
    if released is not None:
        assert result["hybrid_off"]["error"] == released["hybrid_off"]["error"]


def deterministic(result: dict[str, Any]) -> dict[str, Any]:
    """What a rerun must reproduce: vLLM's answers, the shim's decisions; not paths, times or the shim's wording
    (the tests above check its words)."""

    def error(e: dict[str, Any] | None) -> dict[str, Any] | None:
        if e is None or not e["type"].startswith("dspark_hotfix."):
            return e
        return {"type": e["type"], "patch": e["message"].split(":", 1)[0]}

    out: dict[str, Any] = {"vllm": result["vllm"], GROUPING: result[GROUPING]}
    for key in ("hybrid_on", "hybrid_off"):
        out[key] = dict(result[key], error=error(result[key].get("error")))
    out["merge"] = dict(result["merge"], view_error=error(result["merge"].get("view_error")))
    status = result["status"]
    out["status"] = status and {name: [row["state"], row["needed"]] for name, row in status["patches"].items()}
    return out


def test_evidence_records_the_matrix(arms):
    recorded = {
        "about": "DeepSeek-V4's KV caches with vLLM's hybrid KV cache manager on and off, measured on the CPU with "
                 "vLLM's own code by tests/real_vllm/inside/hybrid_off.py (4 target layers with compress ratios "
                 "0, 4, 128, 0 and 3 DSpark draft layers, block size 256, fp8_ds_mla); bytes_per_token is the last "
                 "dimension's bytes of the V2 runner's view. Arms: without_shim (DSPARK_HOTFIX=0), with_shim (the "
                 f"repository on PYTHONPATH); {REVERTED}: vLLM {REVERTED_VERSION} with PR #47716 reverted.",
        "recorded_by": "tests/real_vllm/test_hybrid_off.py (DSPARK_HOTFIX_UPDATE_EVIDENCE=1)",
        "versions": {
            label: {arm: {k: v for k, v in arms.get(label, arm).items() if k not in ("vllm_file", "seconds", "stderr")}
                    for arm in ARMS}
            for label in LABELS
        },
    }
    if os.environ.get("DSPARK_HOTFIX_UPDATE_EVIDENCE") == "1":
        EVIDENCE.write_text(json.dumps(recorded, indent=1) + "\n")
    assert EVIDENCE.is_file(), STALE
    committed = json.loads(EVIDENCE.read_text())
    assert set(committed["versions"]) == set(LABELS), STALE
    for label in LABELS:
        assert set(committed["versions"][label]) == set(ARMS), STALE
        for arm in ARMS:
            assert deterministic(committed["versions"][label][arm]) == deterministic(
                recorded["versions"][label][arm]), f"{STALE} ({label}, {arm})"

