"""The reported bug re-created in real vLLM: 0.25.0 with every patch's ``REVERT`` applied.

``revert.py`` builds, once per vLLM version, revert script and declared edits, a copy of the cached
venv's ``vllm`` package with the lines each patch's test module declares (``REVERT``) changed back
to the reported build's. ``inside/check_reverted.py`` runs in that venv with the copy first on
``PYTHONPATH`` and the repository after it (``runs.reverted``, once per session): every patch in its
declared state, the needed ones installed, doctor saying so. What vLLM answers there with and
without the shim is each patch's to judge (tests/patches/test_<name>.py); here it is held to the
committed evidence. This tier never skips: if PyPI cannot be reached, it fails and says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.real_vllm import revert, runs

VERSION = runs.REVERTED_VERSION
EVIDENCE = REPO / "docs" / "evidence" / f"reverted-{VERSION}.json"
# The remap answers the evidence keeps: a draft layer's weight, and head weights left where vLLM
# puts them.
RECORDED_NAMES = (
    "mtp.1.attn.wkv.weight",
    "mtp.2.norm.weight",
    "mtp.0.main_proj.weight",
    "mtp.2.markov_head.w1.weight",
)


def record(answers: dict) -> dict:
    """What both arms answered, as docs/evidence/reverted-0.25.0.json keeps it."""
    arms = (("reverted", answers["without_shim"]), ("with_shim", answers["with_shim"]))
    return {
        "source": (
            "vLLM 0.25.0 with PR #47716 reverted (tests/real_vllm/revert.py), on CPU: vLLM's own"
            " spec methods and V2 runner reshape (_reshape_kv_cache), its DSpark remap for a draft"
            " of 3 layers over 43; reverted = without the shim, with_shim = the repository on"
            " PYTHONPATH after the copy"
        ),
        "vllm": answers["vllm"],
        "torch": answers["torch"],
        "views": {
            f"{kind}_{arm}": arm_answers["views"][kind]
            for kind in answers["with_shim"]["views"]
            for arm, arm_answers in arms
        },
        "remap": {
            name: {arm: arm_answers["remap"][name] for arm, arm_answers in arms}
            for name in RECORDED_NAMES
        },
        "patches": {name: row["state"] for name, row in answers["status"].items()},
    }


@pytest.mark.real_vllm
def test_on_reverted_vllm_every_patch_is_in_its_declared_state_and_the_answers_are_the_evidences():
    run = runs.reverted()
    print(run["report"])
    assert run["returncode"] == 0, run["report"]
    assert len(run["cases"]) >= 6 and not run["skipped"], run["report"]
    recorded = record(run["answers"])
    if os.environ.get("DSPARK_HOTFIX_UPDATE_EVIDENCE") == "1":
        EVIDENCE.write_text(json.dumps(recorded, indent=2) + "\n")
    committed = json.loads(EVIDENCE.read_text())
    assert committed["vllm"] == VERSION
    stale = f"{EVIDENCE.relative_to(REPO)} is {runs.RECORDS}"
    assert "patches" in committed, stale
    if runs.history(committed["patches"], len(committed["patches"])):
        # Written with a patch removed since, whose REVERT the build no longer has: vLLM's answers
        # are history.
        assert {name: committed["patches"][name] for name in recorded["patches"]} == recorded[
            "patches"
        ], stale
    else:
        assert [committed[key] for key in ("views", "remap", "patches")] == [
            recorded[key] for key in ("views", "remap", "patches")
        ], stale


def test_the_declared_edits_are_one_per_line_each_in_a_file_of_vllm():
    edits = revert.declared_edits()
    assert edits, "no patch declares a line to revert"
    assert len({(e.path, e.line) for e in edits}) == len(edits)
    assert all(e.path.endswith(".py") and not e.path.startswith(("/", "vllm/")) for e in edits), (
        edits
    )


def test_revert_names_the_file_and_line_it_expected(tmp_path):
    edits = revert.declared_edits()
    package = tmp_path / "vllm"
    for edit in edits:
        (package / edit.path).parent.mkdir(parents=True, exist_ok=True)
        (package / edit.path).write_text(
            f"class {edit.function.split('.')[0]}:\n    def x(self):\n        pass\n"
        )
    (package / "__init__.py").write_text("")
    with pytest.raises(revert.RevertError) as caught:
        revert.revert(package, tmp_path / "out", edits)
    first = edits[0]
    assert str(package / first.path) in str(caught.value) and first.line in str(caught.value)
    assert first.function in str(caught.value) and "found 0" in str(caught.value)
    assert not (tmp_path / "out").exists()
    # The line in another function than the one named does not count either.
    owner, method = first.function.split(".")
    source = (
        f"class {owner}:\n    def other(self):\n        return f(\n            {first.line}\n      "
        f"  )\n\n    def {method}(self):\n        pass\n"
    )
    (package / first.path).write_text(source)
    with pytest.raises(revert.RevertError, match=rf"found it in {owner}\.other \(line 4\)"):
        revert.revert(package, tmp_path / "out", edits)
    proc = subprocess.run(
        [sys.executable, revert.__file__, str(package)], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "usage:" in proc.stderr


def test_revert_applies_each_edit_in_its_function_and_two_edits_of_one_file_both(tmp_path):
    """The shadow tree: the edited files real, everything else a link into the installed package."""
    package = tmp_path / "vllm"
    (package / "models").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "other.py").write_text("x = 1\n")
    (package / "models" / "m.py").write_text(
        "class A:\n    def f(self):\n        return g(\n            a=1,\n"
        "            b=2,\n        )\n"
    )
    edits = (
        revert.Edit("models/m.py", "A.f", "a=1,", None),
        revert.Edit("models/m.py", "A.f", "b=2,", "b=3,"),
    )
    copy = revert.revert(package, tmp_path / "out", edits)
    assert (
        copy / "models" / "m.py"
    ).read_text() == "class A:\n    def f(self):\n        return g(\n            b=3,\n        )\n"
    assert (copy / "other.py").is_symlink() and not (copy / "models" / "m.py").is_symlink()
    assert revert.from_json(revert.to_json(edits)) == edits
    with pytest.raises(revert.RevertError, match="no edits"):
        revert.revert(package, tmp_path / "none", ())
