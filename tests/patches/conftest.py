"""The real patches' fixture: the ``shim`` fixture of tests/conftest.py on the product's patch
set."""

from __future__ import annotations

import functools

import pytest

import dspark_hotfix.patches

# The product's patch set, as this process imported it (a test may choose another with monkeypatch).
PRODUCT = dspark_hotfix.patches.ALL


@pytest.fixture
def standin_shim(shim):
    """``standin_shim(edits=None, remove=())``: the product's patches on the stand-in build (a copy
    with ``edits``, without ``remove``), in this process, no activation yet."""
    return functools.partial(shim, PRODUCT)
