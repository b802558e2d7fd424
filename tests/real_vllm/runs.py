"""The real tier's shared runs: each costs vLLM imports of a minute or so, so each runs once per
session.

The generic tests in tests/real_vllm and each patch's real-vLLM section (the end of
tests/patches/test_<name>.py) read the same runs: the inside checks on a release
(:func:`released`), on 0.25.0 with every patch's ``REVERT`` applied (:func:`reverted`), and the
hybrid-off matrix (:func:`hybrid_off`). What a build should show comes from the patches'
declarations (:func:`expected`), passed to the venv as JSON: the declarations import pytest and
hypothesis, which a vLLM venv may lack.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pickle
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from dspark_hotfix.patches import ALL
from scripts.venvs import VERSIONS as VERSIONS
from scripts.venvs import cache_dir, ensure_venv, locked
from tests.conftest import REPO, clean_env, program
from tests.patches import declared
from tests.real_vllm import revert

INSIDE = Path(__file__).resolve().parent / "inside"
REVERTED_VERSION = (  # the first release with the upstream fixes, the reported build's torch (2.11)
    "0.25.0"
)
REVERTED = f"{REVERTED_VERSION} reverted"  # a build: the release with every patch's REVERT applied
RECORDS = (
    "stale: `make records` writes them anew (DSPARK_HOTFIX_UPDATE_EVIDENCE=1), then docs/MATRIX.md"
)


def expected(build: str) -> dict[str, str]:
    """Each patch's state on ``build`` (a release, or ``REVERTED``): ``patched`` where its REVERT
    re-creates the reported build's code, else its state on the release (``RELEASED``)."""
    version, _, how = build.partition(" ")
    return {
        p.name: (
            "patched" if how == "reverted" and declared(p).REVERT else declared(p).RELEASED[version]
        )
        for p in ALL
    }


def history(named: Iterable[str], counted: int) -> bool:
    """Whether a record written with ``counted`` patches, ``named`` among them, is history: written
    with a patch removed since. A run is then held to it only in the states of the patches of
    ``ALL`` (the record keeps the rest as it was measured); else the run must reproduce it whole.
    One that lacks a patch of ``ALL`` is stale."""
    gone = set(named) - {p.name for p in ALL}
    assert counted - len(gone) >= len(ALL), f"the records lack a patch of ALL: {RECORDS}"
    return bool(gone) or counted > len(ALL)


def reverted_copy(python: Path, version: str = REVERTED_VERSION) -> Path:
    """The directory to put first on ``PYTHONPATH``: ``revert.py`` with the declared edits, applied
    to the venv's ``vllm``.

    Kept under the venv cache, keyed by the version, the installed package's place, the revert
    script and the edits, so it is built once (milliseconds: a shadow tree).
    """
    src = subprocess.run(
        [str(python), "-c", program(vllm_package)],
        env=clean_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    package = json.loads(src.stdout)
    edits = revert.declared_edits()
    key = hashlib.sha256(
        Path(revert.__file__).read_bytes() + revert.to_json(edits).encode() + package.encode()
    ).hexdigest()[:12]
    dest = cache_dir() / f"vllm-{version}-reverted-{key}"
    if not (dest / revert.STAMP).is_file():
        revert.revert(package, dest, edits)
    return dest


def vllm_package() -> str:
    """The directory of this interpreter's ``vllm`` package."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations is not None
    return next(iter(spec.submodule_search_locations))


def inside_pytest(
    python: Path, checks: tuple[str, ...], env: dict[str, str], tmp: Path
) -> dict[str, Any]:
    """``checks`` (files of inside/) under the venv's pytest: its output, its skipped tests, what
    they wrote."""
    junit, out = tmp / "junit.xml", tmp / "answers.json"
    start = time.monotonic()
    proc = subprocess.run(
        [
            str(python),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={junit}",
            *(str(INSIDE / check) for check in checks),
        ],
        env=dict(env, ANSWERS_OUT=str(out)),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    report = (
        f"{', '.join(checks)} ran {time.monotonic() - start:.0f}"
        f" s\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    )
    cases = list(ET.parse(junit).getroot().iter("testcase")) if junit.is_file() else []
    return {
        "returncode": proc.returncode,
        "report": report,
        "cases": [case.get("name") for case in cases],
        "skipped": sorted(case.get("name") for case in cases if case.find("skipped") is not None),
        "answers": json.loads(out.read_text()) if out.is_file() else {},
    }


def once_per_run(run: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """``functools.cache``, shared by pytest-xdist's workers: the first to ask runs it, the others
    wait and read its result (a pickle in a folder of this test run's own)."""

    @functools.cache
    @functools.wraps(run)
    def shared(*args: str) -> dict[str, Any]:
        run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
        if not run_id:
            return run(*args)
        folder = Path(tempfile.gettempdir()) / f"dspark-hotfix-runs-{run_id}"
        key = hashlib.sha256(json.dumps([run.__name__, *args]).encode()).hexdigest()[:16]
        with locked(folder / f"{key}.lock"):
            done = folder / f"{key}.pickle"
            if done.is_file():
                return pickle.loads(done.read_bytes())
            result = run(*args)
            done.write_bytes(pickle.dumps(result))
            return result

    return shared


def scratch(name: str) -> Path:
    """A directory of this run's own for what the inside checks write."""
    return Path(tempfile.mkdtemp(prefix=f"dspark-hotfix-{name}-"))


@once_per_run
def released(version: str) -> dict[str, Any]:
    """inside/check_real_vllm.py and check_layout.py on ``vllm==version``, the shim activated
    through ``PYTHONPATH``; its ``answers`` hold each patch's status row, its ``views`` the V2
    runner's views of the layout (None where the release no longer views NONE-mode specs as 'auto').
    """
    python, seconds = ensure_venv(version)
    tmp = scratch(f"released-{version}")
    env = clean_env(
        PYTHONPATH=str(REPO),
        EXPECTED_STATES=json.dumps(expected(version)),
        KV_VIEWS_OUT=str(tmp / "kv_views.json"),
    )
    run = inside_pytest(python, ("check_real_vllm.py", "check_layout.py"), env, tmp)
    views = (
        json.loads((tmp / "kv_views.json").read_text())
        if (tmp / "kv_views.json").is_file()
        else None
    )
    return dict(
        run, views=views, report=f"vllm=={version} (installed in {seconds:.0f} s)\n{run['report']}"
    )


@once_per_run
def reverted() -> dict[str, Any]:
    """inside/check_reverted.py on 0.25.0 with every patch's REVERT applied; its ``answers`` hold
    vLLM's answers without the shim and with it (``runner_answers.py``) and the correction counts of
    one more round with it."""
    python, seconds = ensure_venv(REVERTED_VERSION)
    copy = reverted_copy(python)
    env = clean_env(
        PYTHONPATH=os.pathsep.join((str(copy), str(REPO))),
        REVERTED_VLLM=str(copy),
        REVERT_EDITS=revert.to_json(revert.declared_edits()),
        EXPECTED_STATES=json.dumps(expected(REVERTED)),
    )
    run = inside_pytest(python, ("check_reverted.py",), env, scratch("reverted"))
    return dict(
        run,
        copy=str(copy),
        report=(
            f"vllm=={REVERTED_VERSION} reverted at {copy} "
            f"(installed in {seconds:.0f} s)\n{run['report']}"
        ),
    )


@once_per_run
def hybrid_off(build: str, arm: str) -> dict[str, Any]:
    """inside/hybrid_off.py on ``build`` (a release or ``REVERTED``), ``arm`` ``without_shim``
    (``DSPARK_HOTFIX=0``) or ``with_shim`` (the repository on ``PYTHONPATH``): vLLM's KV-cache
    grouping of DeepSeek-V4's specs with the hybrid manager on and off, its runner views, and the
    shim's status."""
    version = build.split()[0]
    python, _ = ensure_venv(version)
    path = [str(REPO)]
    if build == REVERTED:
        path.insert(0, str(reverted_copy(python)))
    env = clean_env(
        PYTHONPATH=os.pathsep.join(path),
        **({"DSPARK_HOTFIX": "0"} if arm == "without_shim" else {}),
    )
    start = time.monotonic()
    proc = subprocess.run(
        [str(python), str(INSIDE / "hybrid_off.py")],
        env=env,
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=600,
    )
    seconds = time.monotonic() - start
    report = (
        f"{build} {arm}: hybrid_off.py exited {proc.returncode} after {seconds:.0f}"
        f" s\n{proc.stderr[-4000:]}"
    )
    assert proc.returncode == 0, report
    result = json.loads(proc.stdout)
    assert result["errors"] == {}, f"{report}\nunexpected failures inside: {result['errors']}"
    return dict(result, seconds=round(seconds, 1), stderr=proc.stderr)


def in_venv(
    version: str,
    code: str,
    *,
    shim: bool = True,
    timeout: int = 900,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -c code`` (a :func:`tests.conftest.program`) in the venv of ``vllm==version``,
    inside/ on ``sys.path``, with the shim activated through ``PYTHONPATH`` (or not there at all),
    and ``env`` beside it.
    """
    python, _ = ensure_venv(version)
    path = [str(INSIDE), *([str(REPO)] if shim else [])]
    return subprocess.run(
        [str(python), "-c", code],
        env=clean_env(PYTHONPATH=os.pathsep.join(path), **(env or {})),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
