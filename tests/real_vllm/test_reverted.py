"""The reported bug re-created in real vLLM: 0.25.0 with upstream PR #47716 reverted.

``revert.py`` builds, once per vLLM version and revert script, a copy of the
cached venv's ``vllm`` package in which both DeepSeek-V4 KV-cache specs lack
``kv_quant_mode`` and the DSpark remap shifts draft layers by
``num_hidden_layers``, as in the reported build. ``inside/check_reverted.py``
runs in that venv with the copy first on ``PYTHONPATH`` and the repository
after it: vLLM's own V2 runner views 512 bytes/token without the shim, 584 with
it. This tier never skips: if PyPI cannot be reached, it fails and says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.conftest import REPO, clean_env
from tests.real_vllm import revert
from tests.real_vllm.venvs import cache_dir, ensure_venv

VERSION = "0.25.0"  # the first release with PR #47716, the reported build's torch (2.11), the V2 "auto" rule
INSIDE = Path(__file__).resolve().parent / "inside" / "check_reverted.py"
EVIDENCE = REPO / "docs" / "evidence" / f"reverted-{VERSION}.json"


def reverted_copy(python: Path, version: str) -> Path:
    """The directory to put first on ``PYTHONPATH``: ``revert.py`` applied to the venv's ``vllm``.

    Kept under the venv cache, keyed by the version, the installed package's
    place and the revert script, so it is built once (milliseconds: a shadow tree).
    """
    locate = "import importlib.util as u; print(u.find_spec('vllm').submodule_search_locations[0])"
    src = subprocess.run([str(python), "-c", locate], env=clean_env(), capture_output=True, text=True, check=True)
    package = src.stdout.strip()
    key = hashlib.sha256(Path(revert.__file__).read_bytes() + package.encode()).hexdigest()[:12]
    dest = cache_dir() / f"vllm-{version}-reverted-{key}"
    if not (dest / revert.STAMP).is_file():
        revert.revert(package, dest)
    return dest


@pytest.mark.real_vllm
def test_reverted_vllm_views_512_without_the_shim_and_584_with_it(tmp_path):
    python, install_seconds = ensure_venv(VERSION)
    copy = reverted_copy(python, VERSION)
    junit = tmp_path / "junit.xml"
    answers = tmp_path / "reverted.json"
    env = clean_env(PYTHONPATH=os.pathsep.join((str(copy), str(REPO))), REVERTED_VLLM=str(copy),
                    REVERTED_OUT=str(answers))
    start = time.monotonic()
    proc = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", str(INSIDE)],
        env=env, cwd=str(REPO), capture_output=True, text=True, timeout=1800,
    )
    report = (f"vllm=={VERSION} reverted at {copy} (installed in {install_seconds:.0f} s, checks ran "
              f"{time.monotonic() - start:.0f} s)\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}")
    print(report)
    assert proc.returncode == 0, report

    cases = list(ET.parse(junit).getroot().iter("testcase"))
    assert len(cases) >= 8, report
    assert not [case.get("name") for case in cases if case.find("skipped") is not None], report
    recorded = json.loads(answers.read_text())
    if os.environ.get("DSPARK_HOTFIX_UPDATE_EVIDENCE") == "1":
        EVIDENCE.write_text(json.dumps(recorded, indent=2) + "\n")
    committed = json.loads(EVIDENCE.read_text())
    assert committed["vllm"] == VERSION
    stale = f"{EVIDENCE.relative_to(REPO)} is stale: rerun with DSPARK_HOTFIX_UPDATE_EVIDENCE=1"
    assert (committed["views"], committed["remap"]) == (recorded["views"], recorded["remap"]), stale


def test_revert_names_the_file_and_line_it_expected(tmp_path):
    package = tmp_path / "vllm"
    for edit in revert.EDITS:
        (package / edit.path).parent.mkdir(parents=True, exist_ok=True)
        (package / edit.path).write_text(f"class {edit.function.split('.')[0]}:\n    def x(self):\n        pass\n")
    (package / "__init__.py").write_text("")
    with pytest.raises(revert.RevertError) as caught:
        revert.revert(package, tmp_path / "out")
    first = revert.EDITS[0]
    assert str(package / first.path) in str(caught.value) and first.line in str(caught.value)
    assert first.function in str(caught.value) and "found 0" in str(caught.value)
    assert not (tmp_path / "out").exists()
    # The line in another function than the one named does not count either.
    owner, method = first.function.split(".")
    source = (f"class {owner}:\n    def other(self):\n        return f(\n            {first.line}\n        )\n\n"
              f"    def {method}(self):\n        pass\n")
    (package / first.path).write_text(source)
    with pytest.raises(revert.RevertError, match=rf"found it in {owner}\.other \(line 4\)"):
        revert.revert(package, tmp_path / "out")
    proc = subprocess.run([sys.executable, revert.__file__, str(package)], capture_output=True, text=True)
    assert proc.returncode == 2 and "usage:" in proc.stderr
