"""docs/WRITING_A_PATCH.md's worked example, followed on a copy of the repository as a new
maintainer would: each ``<!-- guide: ... -->`` block applied as the guide says, then the generic
tests run for the new patch.

It holds the guide to the truth (its steps are enough, and they are four files), and it holds the
promise that a patch is added in four files without touching anything else."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, clean_env

GUIDE = REPO / "docs" / "WRITING_A_PATCH.md"
STEP = re.compile(r"<!-- guide: (new|edit|append) (\S+) -->\n```\w*\n(.*?)```", re.DOTALL)


def steps() -> list[tuple[str, str, str]]:
    return STEP.findall(GUIDE.read_text())


def apply_diff(text: str, diff: str) -> str:
    """A diff block's ``+`` lines inserted after the context lines (`` `` prefix) that precede
    them."""
    context = [line[1:] for line in diff.splitlines() if line.startswith(" ")]
    added = [line[1:] for line in diff.splitlines() if line.startswith("+")]
    anchor = "\n".join(context) + "\n"
    assert text.count(anchor) == 1, (
        f"the guide's context is not in the file exactly once:\n{anchor}"
    )
    return text.replace(anchor, anchor + "".join(f"{line}\n" for line in added))


def copy_of_repository(root: Path) -> Path:
    """The tracked and untracked (not ignored) files, as a clone with the working tree's changes."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for rel in listed:
        source = REPO / rel
        if source.is_file() or source.is_symlink():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, root / rel, follow_symlinks=False)
    return root


def test_the_guide_adds_a_patch_in_four_files_and_the_generic_tests_pass_for_it(tmp_path):
    copy = copy_of_repository(tmp_path / "repo")
    touched = set()
    for action, rel, block in steps():
        path = copy / rel
        if action == "new":
            assert not path.exists(), rel
            path.write_text(block)
        elif action == "append":
            path.write_text(path.read_text() + block)
        else:
            path.write_text(apply_diff(path.read_text(), block))
        touched.add(rel)
    assert len(touched) == 4, touched
    new = re.search(r'name="(\w+)"', next(block for action, _, block in steps() if action == "new"))
    assert new is not None
    name = new[1]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/patches/test_every_patch.py",
            f"tests/patches/test_{name}.py",
            "-k",
            name,
        ],
        cwd=copy,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed[1]) >= 5, proc.stdout[
        -2000:
    ]  # the generic tests ran for it, not only its own
