"""The harnesses' own tests: they check the committed records in docs/evidence/ and docs/MATRIX.md
when the records are written (``make evidence``), not in the fast tier: a record is a dated run, and
a patch added or removed since does not make it wrong."""

import importlib.util

import pytest

from harness.common import REPO


@pytest.fixture(scope="session")
def matrix():
    """scripts/matrix.py, a command-line tool (not a package), loaded from its path."""
    spec = importlib.util.spec_from_file_location("matrix", REPO / "scripts" / "matrix.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
