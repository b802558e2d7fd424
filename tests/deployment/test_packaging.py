"""The wheel, installed into a fresh venv: what it installs, the wrapt it gets, and ``make dist``.

The way autowrapt tests itself: build the wheel, install it where nothing else
of ours is, and run real subprocesses from there. The venv is the root conftest's
``venv`` fixture; the plugin path, doctor and the launcher from it are tested in
their own folders (activation, reporting, launcher).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tarfile
import zipfile
from functools import partial
from pathlib import Path

import pytest

from dspark_hotfix import __version__
from tests import status_shape
from tests.child import environ, import_modules, print_status, wrapt_version
from tests.conftest import (
    IMAGE_CUSTOMISATION,
    STANDIN,
    json_lines,
    program,
    run_in_venv,
    startup_dir,
)


def test_a_fresh_install_gets_the_newest_wrapt_2_while_the_suite_runs_the_dockerfiles(venv):
    # Both ends of the supported range are exercised: this venv (every test in this
    # file) gets pip's choice, the newest 2.x; the rest of the suite runs on the wrapt
    # the Dockerfile installs where an image has none.
    import re

    from tests.conftest import REPO

    (fresh,) = json_lines(run_in_venv(venv, program(wrapt_version)).stdout)
    assert fresh.startswith("2."), fresh
    pinned = re.search(r"^ARG WRAPT=wrapt==(\S+)$", (REPO / "Dockerfile").read_text(), re.MULTILINE)
    assert pinned and f"wrapt=={pinned[1]}" in (REPO / "requirements-dev.txt").read_text().split()
    import wrapt

    assert wrapt.__version__ == pinned[1]


def test_installing_the_wheel_leaves_the_images_sitecustomize_alone(venv):
    assert (venv["purelib"] / "sitecustomize.py").read_text() == IMAGE_CUSTOMISATION


def test_sitecustomize_path_from_the_wheel_patches_and_chains_the_image_one(venv):
    code = program(partial(import_modules, status_shape.target_modules()), print_status,
                   partial(environ, "IMAGE_SITECUSTOMIZE"))
    proc = run_in_venv(venv, code, path=(startup_dir(venv), STANDIN))
    assert proc.returncode == 0, proc.stderr
    rows, image = json_lines(proc.stdout)
    assert {r["state"] for r in rows.values()} == {"patched"}
    assert {r["activated_by"] for r in rows.values()} == {"sitecustomize"}
    assert image == "ran"


def clone(root: Path, umask: int, mtime: int) -> Path:
    """This repository's commit as another clone would have it (its umask, its file times), with the
    scripts/dist.py under test."""
    from tests.conftest import REPO

    subprocess.run(["sh", "-c", f'umask {umask:03o} && git clone -q "$0" "$1"', str(REPO), str(root)], check=True)
    (root / "scripts" / "dist.py").write_bytes((REPO / "scripts" / "dist.py").read_bytes())
    for path in root.rglob("*"):
        if ".git" not in path.relative_to(root).parts:
            os.utime(path, (mtime, mtime), follow_symlinks=False)
    return root


def make_dist(tree: Path, out: Path) -> dict[str, bytes]:
    proc = subprocess.run([sys.executable, str(tree / "scripts" / "dist.py"), str(out)], cwd=tree,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {p.name: p.read_bytes() for p in out.iterdir()}


def test_make_dist_builds_the_same_bytes_twice_and_lists_their_sums(tmp_path):
    import hashlib
    import time

    built = [make_dist(clone(tmp_path / f"clone{n}", umask, mtime), tmp_path / f"dist{n}")
             for n, (umask, mtime) in enumerate(((0o022, int(time.time())), (0o002, 1_000_000_000)))]
    first, second = built
    dist = dist_module()
    assert sorted(first) == ["SHA256SUMS", f"dspark_hotfix-{__version__}-py3-none-any.whl",
                             f"dspark_hotfix-{__version__}.tar.gz", dist.WRAPT_WHEEL]
    assert first == second  # byte for byte, the sums included
    sums = dict(line.split("  ")[::-1] for line in first["SHA256SUMS"].decode().splitlines())
    assert sums == {name: hashlib.sha256(data).hexdigest() for name, data in first.items() if name != "SHA256SUMS"}
    assert sums[dist.WRAPT_WHEEL] == dist.WRAPT_SHA256  # the bytes pinned, whatever the index served


def test_make_dist_refuses_a_wrapt_wheel_whose_sum_is_not_the_pinned_one(tmp_path, monkeypatch):
    module = dist_module()
    monkeypatch.setattr(module, "WRAPT_SHA256", "0" * 64)
    with pytest.raises(SystemExit, match=f"{module.WRAPT_WHEEL} has sha256 [0-9a-f]{{64}}, not 0{{64}}"):
        module.wrapt_wheel(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_make_dist_builds_the_commit_not_the_working_tree(tmp_path):
    tree = clone(tmp_path / "clone", 0o022, 1_000_000_000)
    (tree / "dspark_hotfix" / "stray.py").write_text("STRAY = 1\n")  # untracked
    init = tree / "dspark_hotfix" / "__init__.py"
    committed = init.read_bytes()
    init.write_bytes(committed + b"EDITED = 1\n")  # modified, not committed
    make_dist(tree, tmp_path / "dist")
    with zipfile.ZipFile(tmp_path / "dist" / f"dspark_hotfix-{__version__}-py3-none-any.whl") as wheel:
        assert "dspark_hotfix/stray.py" not in wheel.namelist()
        assert wheel.read("dspark_hotfix/__init__.py") == committed
    with tarfile.open(tmp_path / "dist" / f"dspark_hotfix-{__version__}.tar.gz") as sdist:
        names = sdist.getnames()
        assert not any(name.endswith("/stray.py") for name in names), names
        (member,) = [name for name in names if name.endswith("/dspark_hotfix/__init__.py")]
        extracted = sdist.extractfile(member)
        assert extracted is not None and extracted.read() == committed


def dist_module():
    from tests.conftest import REPO

    spec = importlib.util.spec_from_file_location("dist", REPO / "scripts" / "dist.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_make_dist_runs_on_a_python_whose_extractall_has_no_filter(tmp_path, monkeypatch):
    # Python before 3.10.12 and 3.11.4 (Debian 12 ships 3.11.2): no tarfile.data_filter, no filter argument.
    plain = tarfile.TarFile.extractall

    def extractall(self, path=".", members=None, *, numeric_owner=False):
        return plain(self, path, members, numeric_owner=numeric_owner, filter="fully_trusted")

    monkeypatch.delattr(tarfile, "data_filter")
    monkeypatch.setattr(tarfile.TarFile, "extractall", extractall)
    assert dist_module().main([str(tmp_path)]) == 0
    with zipfile.ZipFile(tmp_path / f"dspark_hotfix-{__version__}-py3-none-any.whl") as wheel:
        assert "dspark_hotfix/startup/sitecustomize.py" in wheel.namelist()
