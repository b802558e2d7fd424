"""Packages from PyPI that a tier needs, installed once with ``pip --target`` under the project's
cache.

The cache is ``~/.cache/dspark-hotfix``, or ``$DSPARK_HOTFIX_CACHE``; a directory
counts as ready only once its stamp names exactly what was asked.
What a host cannot provide (PyPI, root, apt-get, a network namespace) skips the
test with the reason, except in CI (``CI=true``), where it fails: CI never skips silently.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

import pytest

from scripts.venvs import cache_dir, locked


def unavailable(reason: str) -> NoReturn:
    """Skip with ``reason`` where this host cannot run the test; fail in CI."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"cannot run in CI: {reason}")
    pytest.skip(reason)


def pip_target(name: str, wanted: str) -> Path:
    """``wanted`` (requirements, space-separated) in ``<cache>/<name>``; this tier skips (fails in
    CI) without PyPI."""
    with locked(cache_dir() / f"{name}.lock"):
        return _pip_target(name, wanted)


def _pip_target(name: str, wanted: str) -> Path:
    target = cache_dir() / name
    stamp = target / ".dspark-hotfix-ready"
    if stamp.exists() and stamp.read_text() == wanted:
        return target
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--upgrade",
            "--target",
            str(target),
            *wanted.split(),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        unavailable(f"could not install {wanted} from PyPI: {proc.stderr[-2000:]}")
    stamp.write_text(wanted)
    return target


def offline() -> tuple[str, ...]:
    """A prefix that runs a command without any network (only a loopback), where this machine allows
    it."""
    if (
        shutil.which("unshare") is None
        or subprocess.run(["unshare", "--net", "true"]).returncode != 0
    ):
        unavailable("needs unshare --net (root) to run a command without a network")
    return ("unshare", "--net")
