"""Packages from PyPI that a tier needs, installed once with ``pip --target`` under the project's cache.

The cache is ``~/.cache/dspark-hotfix``, or ``$DSPARK_HOTFIX_CACHE``; a directory
counts as ready only once its stamp names exactly what was asked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.venvs import cache_dir


def pip_target(name: str, wanted: str) -> Path:
    """``wanted`` (requirements, space-separated) in ``<cache>/<name>``; this tier skips (fails in CI) without PyPI."""
    target = cache_dir() / name
    stamp = target / ".dspark-hotfix-ready"
    if stamp.exists() and stamp.read_text() == wanted:
        return target
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           "--upgrade", "--target", str(target), *wanted.split()],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        message = f"could not install {wanted} from PyPI: {proc.stderr[-2000:]}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    stamp.write_text(wanted)
    return target
