"""The real-vLLM tier: the shim against vLLM releases from PyPI, on the CPU.

For each release a cached venv gets ``vllm==X`` (tests/real_vllm/venvs.py), and
``inside/check_real_vllm.py`` runs there under that venv's pytest with the
shim activated the way an operator does it: the repository on ``PYTHONPATH``.
Beside it, a short script there copies and pickles the specs wrapt's hooks hand out.
This tier never skips: if PyPI cannot be reached, it fails and says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.cases import CASES
from tests.conftest import REPO, clean_env
from tests.real_vllm.venvs import VERSIONS, ensure_venv

pytestmark = pytest.mark.real_vllm

INSIDE = Path(__file__).resolve().parent / "inside" / "check_real_vllm.py"
EVIDENCE = REPO / "docs" / "evidence" / "kv_views.json"
# Measured with vLLM's own code (docs/evidence/hybrid-off.md): whose hybrid-off KV-cache grouping
# rebuilds the sliding-window specs without the fp8_ds_mla layout.
HYBRID_OFF_LOSES_LAYOUT = {"0.25.0": "1", "0.33.0": "0"}
# Need the V2 runner's "auto" rule, which releases from 0.29.0 on no longer have.
RESHAPE = {"test_v2_runner_reshape_gives_512_before_and_584_after_the_correction"}


@pytest.mark.parametrize("version", VERSIONS)
def test_shim_on_real_vllm(version, tmp_path):
    python, install_seconds = ensure_venv(version)
    # Each release runs with one end of the supported wrapt range (venvs.WRAPT).
    wrapt = subprocess.run([str(python), "-c", "import wrapt; print(wrapt.__version__)"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert wrapt == "1.17.3" if version == "0.25.0" else wrapt.startswith("2."), wrapt
    junit = tmp_path / "junit.xml"
    views = tmp_path / "kv_views.json"
    env = clean_env(PYTHONPATH=str(REPO), KV_VIEWS_OUT=str(views),
                    HYBRID_OFF_LOSES_LAYOUT=HYBRID_OFF_LOSES_LAYOUT[version])
    proc = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", str(INSIDE)],
        env=env, cwd=str(REPO), capture_output=True, text=True, timeout=1800,
    )
    report = f"vllm=={version} (installed in {install_seconds:.0f} s)\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    print(report)
    assert proc.returncode == 0, report

    cases = ET.parse(junit).getroot().iter("testcase")
    skipped = {case.get("name") for case in cases if case.find("skipped") is not None}
    if version == "0.25.0":
        # The crash path must really have run on vLLM's own reshape here.
        assert not skipped, skipped
        recorded = json.loads(views.read_text())
        if os.environ.get("DSPARK_HOTFIX_UPDATE_EVIDENCE") == "1":
            EVIDENCE.write_text(json.dumps(recorded, indent=2) + "\n")
        committed = json.loads(EVIDENCE.read_text())
        assert committed["vllm"] == version
        assert committed["views"] == recorded["views"], "docs/evidence/kv_views.json is stale"
    else:
        assert skipped <= RESHAPE, skipped


# Once vLLM is imported, the spec of a module the shim still waits for (find_spec imports the parent
# package, which imports the other targets) has wrapt's proxy loader: it copies, deep-copies and pickles.
SPECS = """
import copy, importlib, importlib.util, json, pickle, sys
import vllm, dspark_hotfix
from dspark_hotfix.patches import ALL
for name in ["prometheus_client", *dict.fromkeys(p.module for p in ALL)]:
    if "." in name:
        importlib.import_module(name.rpartition(".")[0])
    if name not in sys.modules:
        spec = importlib.util.find_spec(name)
        copies = [copy.copy(spec), copy.deepcopy(spec), pickle.loads(pickle.dumps(spec)), copy.copy(spec.loader)]
        print(json.dumps([name, type(spec.loader).__name__] + [
            (c.loader if hasattr(c, "loader") else c).get_filename(name) == spec.origin for c in copies]))
        importlib.import_module(name)
print(json.dumps({r["name"]: r["state"] for r in dspark_hotfix.status()["patches"]}))
"""


@pytest.mark.parametrize("version", VERSIONS)
def test_a_hooked_modules_spec_copies_and_pickles_and_the_module_is_judged(version):
    python, _ = ensure_venv(version)  # wrapt 1.17.3 on 0.25.0, the newest 2.x on 0.33.0
    proc = subprocess.run([str(python), "-c", SPECS], env=clean_env(PYTHONPATH=str(REPO)), cwd=str(REPO),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    *rows, states = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith(("[", "{"))]
    # Importing each target's package imports every target on these releases: prometheus_client is left.
    assert rows == [["prometheus_client", "_ImportHookChainedLoader", True, True, True, True]], proc.stderr[-3000:]
    loses = HYBRID_OFF_LOSES_LAYOUT[version] == "1"
    assert states == {name: case.released if loses else "not_needed" for name, case in CASES.items()}
