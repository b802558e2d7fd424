"""Shared helpers: real subprocesses with the shim and the stand-in build on the path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "tests" / "standin"


def clean_env(**overrides: str) -> dict[str, str]:
    """The current environment without any switch of ours or a PYTHONPATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("DSPARK_HOTFIX") and k not in ("PYTHONPATH", "PYTHONSAFEPATH")
    }
    env.update(overrides)
    return env


def run_python(
    code: str,
    *,
    path: tuple[Path | str, ...] = (REPO, STANDIN),
    env: dict[str, str] | None = None,
    flags: tuple[str, ...] = (),
    python: str = sys.executable,
    cwd: Path | str | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter, as an operator's process would start."""
    full_env = clean_env(**(env or {}))
    if path:
        full_env["PYTHONPATH"] = os.pathsep.join(str(p) for p in path)
    proc = subprocess.run(
        [python, *flags, "-c", code],
        env=full_env,
        cwd=str(cwd) if cwd else None,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def last_json(stdout: str) -> object:
    return json.loads(stdout.strip().splitlines()[-1])


STATUS = "import json, dspark_hotfix; print(json.dumps({r['name']: r for r in dspark_hotfix.status()}))"


@pytest.fixture
def standin_modules():
    """Import the stand-in build in this process; forget it afterwards."""
    sys.path.insert(0, str(STANDIN))
    try:
        yield
    finally:
        sys.path.remove(str(STANDIN))
        for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
            del sys.modules[name]
