"""A patch's lifecycle as a property: every patch of ``ALL`` can be removed as the guide says.

For each patch, a copy of the repository without it, as the guide removes one (its module, its
entry and import in ``dspark_hotfix/patches/__init__.py`` with its section of that docstring, and
its test module deleted, and its defect taken out of the stand-in with its ``FIX``; the dated
records under docs/evidence stay, as history) must still pass what a maintainer
runs: ``make unit``'s fast tiers, ``make evidence`` and ``make bench`` with each measure run once
(``bench/run.py --smoke``), each with this interpreter, as the Makefile runs them. About six
minutes a patch on two cores: ``make lifecycle`` removes each; ``make test`` removes one, a
different one at each commit (``LIFECYCLE_ONE``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dspark_hotfix.patches import ALL
from tests.conftest import REPO, clean_env
from tests.patches import fixed_edits

pytestmark = pytest.mark.lifecycle

FAST = re.search(r"^FAST := (.+)$", (REPO / "Makefile").read_text(), re.M)[1]  # type: ignore[index]
RUNS = {
    "make unit": ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-n", "2", "--dist",
                  "loadfile", "-m", FAST],
    "make evidence": ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "harness/tests"],
    "make bench (each measure once)": ["bench/run.py", "--smoke"],
}  # fmt: skip


def without(name: str, root: Path) -> Path:
    """A clone of the repository (the docs' tests read its history), with the work tree's files
    over it (committed or not, less what git ignores), without the patch ``name``."""
    subprocess.run(["git", "clone", "-q", "--shared", str(REPO), str(root)], check=True)
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for path in filter(None, listed.split("\0")):
        if (REPO / path).is_file():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / path, root / path)
    # The stand-in's copy of the defect goes too, where vLLM fixed it: the patch's FIX.
    (patch,) = [p for p in ALL if p.name == name]
    for path, edits in fixed_edits([patch]).items():
        source = root / "tests" / "standin" / path
        text = source.read_text()
        for old, new in edits:
            assert old in text, (path, old)
            text = text.replace(old, new)
        source.write_text(text)
    (root / "dspark_hotfix" / "patches" / f"{name}.py").unlink()
    (root / "tests" / "patches" / f"test_{name}.py").unlink()
    registry = root / "dspark_hotfix" / "patches" / "__init__.py"
    text = registry.read_text()
    # Its section of the docstring (a paragraph that starts with its name), its import, its entry
    # with the comment above it.
    text = re.sub(rf"\n{name}\b.*?\n(?=\n|\"\"\")", "", text, count=1, flags=re.S)
    text = text.replace(f"    {name},\n", "", 1)
    text = re.sub(rf"(    #.*\n)*    {name}\.PATCH,\n", "", text, count=1)
    registry.write_text(text)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    return root


def removals() -> list[str]:
    """Every patch; with ``LIFECYCLE_ONE`` set (``make test``), the one HEAD's commit count
    picks, so that CI removes each in turn, in bounded time (about five minutes)."""
    names = [p.name for p in ALL]
    if os.environ.get("LIFECYCLE_ONE"):
        count = subprocess.run(
            ["git", "rev-list", "--count", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout
        names = [names[int(count) % len(names)]]
    return names


@pytest.mark.parametrize("name", removals())
def test_removing_a_patch_as_the_guide_says_leaves_unit_evidence_and_bench_working(name, tmp_path):
    root = without(name, tmp_path)
    check = [sys.executable, "-c", "from dspark_hotfix.patches import ALL; print(len(ALL))"]
    left = subprocess.run(check, cwd=root, capture_output=True, text=True, check=True)
    assert int(left.stdout) == len(ALL) - 1  # the copy really lacks it
    for what, args in RUNS.items():
        proc = subprocess.run(
            [sys.executable, *args],
            cwd=root,
            env={k: v for k, v in clean_env().items() if not k.startswith("PYTEST_")},
            capture_output=True,
            text=True,
            timeout=1200,
        )
        said = (proc.stdout + proc.stderr)[-3000:]
        assert proc.returncode == 0, f"without {name}, {what} fails:\n{said}"
