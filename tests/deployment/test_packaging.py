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
from tests.cache import offline
from tests.child import (
    environ,
    import_modules,
    print_status,
    sitecustomize_file,
    wrapt_version,
)
from tests.conftest import (
    IMAGE_CUSTOMISATION,
    REPO,
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

    # .venv runs the Dockerfile's; make wrapt2 runs the same tiers again on the newest 2.x.
    assert wrapt.__version__ == pinned[1] or wrapt.__version__ == fresh, wrapt.__version__


def test_installing_the_wheel_leaves_the_images_sitecustomize_alone(venv):
    assert (venv["purelib"] / "sitecustomize.py").read_text() == IMAGE_CUSTOMISATION


def test_sitecustomize_path_from_the_wheel_patches_and_chains_the_one_it_shadows(venv):
    # Without ours, the interpreter runs the first sitecustomize on its path: the image's in
    # site-packages, or a distribution's own ahead of it (Debian's, Ubuntu's). Ours chains that one.
    shadowed = program(partial(environ, "IMAGE_SITECUSTOMIZE"), sitecustomize_file)
    alone = run_in_venv(venv, shadowed, path=(STANDIN,))
    assert alone.returncode == 0, alone.stderr
    image_alone, file_alone = json_lines(alone.stdout)
    assert file_alone is not None
    code = program(
        partial(import_modules, status_shape.target_modules()),
        print_status,
        partial(environ, "IMAGE_SITECUSTOMIZE"),
        sitecustomize_file,
    )
    proc = run_in_venv(venv, code, path=(startup_dir(venv), STANDIN))
    assert proc.returncode == 0, proc.stderr
    rows, image, chained = json_lines(proc.stdout)
    assert {r["state"] for r in rows.values()} == {"patched"}
    assert {r["activated_by"] for r in rows.values()} == {"sitecustomize"}
    assert (chained, image) == (file_alone, image_alone)
    assert image == ("ran" if file_alone.startswith(str(venv["purelib"])) else None)


def clone(root: Path, umask: int, mtime: int) -> Path:
    """This repository's commit as another clone would have it (its umask, its file times), with the
    scripts/dist.py under test."""
    from tests.conftest import REPO

    subprocess.run(
        ["sh", "-c", f'umask {umask:03o} && git clone -q "$0" "$1"', str(REPO), str(root)],
        check=True,
    )
    (root / "scripts" / "dist.py").write_bytes((REPO / "scripts" / "dist.py").read_bytes())
    for path in root.rglob("*"):
        if ".git" not in path.relative_to(root).parts:
            os.utime(path, (mtime, mtime), follow_symlinks=False)
    return root


def make_dist(
    tree: Path, out: Path, umask: int = 0o022, prefix: tuple[str, ...] = (), **env: str
) -> dict[str, bytes]:
    """``make dist`` of ``tree`` into ``out``, run under ``umask``: the files it made, by name."""
    proc = subprocess.run(
        [
            *prefix,
            "sh",
            "-c",
            f'umask {umask:03o} && exec "$@"',
            "sh",
            sys.executable,
            str(tree / "scripts" / "dist.py"),
            str(out),
        ],
        cwd=tree,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {p.name: p.read_bytes() for p in out.iterdir()}


def git(tree: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(tree), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def released(tree: Path) -> tuple[str, str]:
    """The newest release the CHANGELOG names: its version and its commit."""
    import re

    found = re.search(
        r"^## (\d+\.\d+\.\d+) \(\S+, commit ([0-9a-f]+)\)$",
        (tree / "CHANGELOG.md").read_text(),
        re.M,
    )
    assert found is not None
    return found[1], git(tree, "rev-parse", found[2])


def built_as(tree: Path) -> str:
    """The version a build of ``tree``'s HEAD must carry: the release's at its commit, else after
    it."""
    version, commit = released(tree)
    head = git(tree, "rev-parse", "HEAD")
    if head == commit:
        return version
    return f"{version}.post{git(tree, 'rev-list', '--count', f'{commit}..HEAD')}.dev0+g{head[:12]}"


def names(version: str) -> list[str]:
    return sorted(
        [
            "SHA256SUMS",
            f"dspark_hotfix-{version}-py3-none-any.whl",
            f"dspark_hotfix-{version}.tar.gz",
            dist_module().WRAPT_WHEEL,
        ]
    )


def test_make_dist_builds_the_same_bytes_under_any_umask_and_lists_their_sums(tmp_path):
    import hashlib
    import time

    # Each umask's bits in turn: the clone's files and the build's own (setuptools writes the
    # wheel's files).
    umasks = [
        0o022,
        *(1 << bit for bit in range(6)),
        0o077,
    ]  # the owner's bits left alone: it reads what it wrote
    built = [
        make_dist(clone(tmp_path / f"clone{n}", umask, mtime), tmp_path / f"dist{n}", umask=umask)
        for n, (umask, mtime) in enumerate(
            (u, int(time.time()) if n % 2 else 1_000_000_000) for n, u in enumerate(umasks)
        )
    ]
    first = built[0]
    assert sorted(first) == names(built_as(REPO))
    assert all(other == first for other in built[1:])  # byte for byte, the sums included
    sums = dict(line.split("  ")[::-1] for line in first["SHA256SUMS"].decode().splitlines())
    assert sums == {
        name: hashlib.sha256(data).hexdigest()
        for name, data in first.items()
        if name != "SHA256SUMS"
    }
    assert (
        sums[dist_module().WRAPT_WHEEL] == dist_module().WRAPT_SHA256
    )  # the bytes pinned, whatever was served


def test_make_dist_runs_offline_once_it_has_run(tmp_path):
    tree = clone(tmp_path / "clone", 0o022, 1_000_000_000)
    cache = str(
        tmp_path / "cache"
    )  # a cache of its own: the first build fetches wrapt's wheel into it
    online = make_dist(tree, tmp_path / "online", DSPARK_HOTFIX_CACHE=cache)
    assert (
        make_dist(tree, tmp_path / "offline", prefix=offline(), DSPARK_HOTFIX_CACHE=cache) == online
    )


def test_only_the_release_commit_is_built_as_the_release(tmp_path):
    version, commit = released(REPO)
    tree = clone(tmp_path / "clone", 0o022, 1_000_000_000)
    assert built_as(tree) != version  # this commit came after the release
    later = make_dist(tree, tmp_path / "later")
    assert sorted(later) == names(built_as(tree))
    with zipfile.ZipFile(
        tmp_path / "later" / f"dspark_hotfix-{built_as(tree)}-py3-none-any.whl"
    ) as wheel:
        assert (
            f'__version__ = "{built_as(tree)}"' in wheel.read("dspark_hotfix/__init__.py").decode()
        )
    # The release's commit, built by today's make dist: the release's name, and its files as
    # committed.
    git(tree, "checkout", "-q", "--force", commit)  # clone() put today's dist.py there
    (tree / "scripts" / "dist.py").write_bytes((REPO / "scripts" / "dist.py").read_bytes())
    made = make_dist(tree, tmp_path / "release")
    assert sorted(made) == names(version)
    with zipfile.ZipFile(
        tmp_path / "release" / f"dspark_hotfix-{version}-py3-none-any.whl"
    ) as wheel:
        committed = subprocess.run(
            ["git", "-C", str(tree), "show", f"{commit}:dspark_hotfix/__init__.py"],
            check=True,
            capture_output=True,
        ).stdout
        assert wheel.read("dspark_hotfix/__init__.py") == committed


def test_make_dist_refuses_a_wrapt_wheel_whose_sum_is_not_the_pinned_one(tmp_path, monkeypatch):
    module = dist_module()
    monkeypatch.setattr(module, "WRAPT_SHA256", "0" * 64)
    monkeypatch.setenv("DSPARK_HOTFIX_CACHE", str(tmp_path / "cache"))
    with pytest.raises(
        SystemExit, match=f"{module.WRAPT_WHEEL} has sha256 [0-9a-f]{{64}}, not 0{{64}}"
    ):
        module.wrapt_wheel(tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def test_make_dist_builds_the_commit_not_the_working_tree(tmp_path):
    tree = clone(tmp_path / "clone", 0o022, 1_000_000_000)
    (tree / "dspark_hotfix" / "stray.py").write_text("STRAY = 1\n")  # untracked
    init = tree / "dspark_hotfix" / "__init__.py"
    committed = init.read_bytes()
    init.write_bytes(committed + b"EDITED = 1\n")  # modified, not committed
    make_dist(tree, tmp_path / "dist")
    version = built_as(
        tree
    )  # the commit's own version line, as make dist writes it after a release
    expected = committed.replace(
        f'__version__ = "{__version__}"'.encode(), f'__version__ = "{version}"'.encode()
    )
    with zipfile.ZipFile(tmp_path / "dist" / f"dspark_hotfix-{version}-py3-none-any.whl") as wheel:
        assert "dspark_hotfix/stray.py" not in wheel.namelist()
        assert wheel.read("dspark_hotfix/__init__.py") == expected
    with tarfile.open(tmp_path / "dist" / f"dspark_hotfix-{version}.tar.gz") as sdist:
        members = sdist.getnames()
        assert not any(name.endswith("/stray.py") for name in members), members
        (member,) = [name for name in members if name.endswith("/dspark_hotfix/__init__.py")]
        extracted = sdist.extractfile(member)
        assert extracted is not None and extracted.read() == expected


def dist_module():
    from tests.conftest import REPO

    spec = importlib.util.spec_from_file_location("dist", REPO / "scripts" / "dist.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_make_dist_runs_on_a_python_whose_extractall_has_no_filter(tmp_path, monkeypatch):
    # Python before 3.10.12 and 3.11.4 (Debian 12 ships 3.11.2): no tarfile.data_filter, no filter
    # argument. A newer Python is made to look like one; an older one is one.
    if hasattr(tarfile, "data_filter"):
        plain = tarfile.TarFile.extractall

        def extractall(self, path=".", members=None, *, numeric_owner=False):
            return plain(self, path, members, numeric_owner=numeric_owner, filter="fully_trusted")

        monkeypatch.delattr(tarfile, "data_filter")
        monkeypatch.setattr(tarfile.TarFile, "extractall", extractall)
    assert dist_module().main([str(tmp_path)]) == 0
    with zipfile.ZipFile(next(tmp_path.glob("dspark_hotfix-*.whl"))) as wheel:
        assert "dspark_hotfix/startup/sitecustomize.py" in wheel.namelist()
