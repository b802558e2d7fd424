"""One virtual environment per real vLLM release, built from PyPI and reused (the real-vLLM tier,
`make bench` and the harness tests build them).

They live outside the repository (``~/.cache/dspark-hotfix``, or
``$DSPARK_HOTFIX_CACHE``): one takes about 2 minutes and 9.5 GB to build.
A venv counts as ready only once its stamp file names exactly what was asked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

# 0.25.0: the first release with the fix, same torch (2.11) as the reported
# build, and the V2 runner's "auto" rule still present. 0.33.0: the newest.
# Each gets one end of the wrapt range the shim supports: 1.17.3 (what the
# Dockerfile installs where an image has none) and the newest 2.x.
VERSIONS = ("0.25.0", "0.33.0")
# Where what the shim says is measured (tests/real_vllm/test_lines.py), 0.28.0 too: the first
# release whose hybrid-off path keeps the layout, so the first on which the shim is removable.
LINES_VERSIONS = ("0.25.0", "0.28.0", "0.33.0")
WRAPT = {"0.25.0": "wrapt==1.17.3"}  # any other release: the newest 2.x
NEWEST_WRAPT = "wrapt>=2,<3"
EXTRA = ("pytest>=8",)
# vllm==0.28.0 resolves here to torch 2.13.0+cpu beside torchvision and torchaudio built for other
# torches, whose import fails ("operator torchvision::nms does not exist"); transformers imports
# them where they are installed, vLLM's DeepSeek-V4 modules need neither: they are removed.
MISMATCHED = {"0.28.0": ("torchvision", "torchaudio", "torchcodec")}
# Every other release (tests/real_vllm/test_releases.py judges them all) is its wheel alone,
# installed without dependencies over 0.33.0's venv (on sys.path through a .pth file), whose
# dependencies vLLM's DeepSeek-V4 and KV-cache modules import as they are: seconds and a few hundred
# MB each, where a venv of its own is 9.5 GB. vllm==0.34.0 has to be: it pins flashinfer-python==
# 0.7.3, which the registry this project reaches does not carry.
SHARED = "0.33.0"
FIRST = (0, 25, 0)  # the first release that carries DeepSeek-V4


def releases() -> list[str]:
    """Every final release of vLLM on the package registry from ``FIRST`` on, oldest first."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "vllm", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
    )
    listed = proc.stdout.partition("Available versions:")[2].split(",")
    found = [v.strip() for v in listed if v.strip().replace(".", "").isdigit()]
    if not found:
        raise RuntimeError(f"the registry lists no vLLM release (is it reachable?):\n{proc.stderr}")
    line = [v for v in found if tuple(map(int, v.split("."))) >= FIRST]
    return sorted(line, key=lambda v: tuple(map(int, v.split("."))))


def cache_dir() -> Path:
    return Path(os.environ.get("DSPARK_HOTFIX_CACHE", Path.home() / ".cache" / "dspark-hotfix"))


@contextlib.contextmanager
def locked(lock: Path) -> Iterator[None]:
    """One process at a time holds the file ``lock`` (pytest-xdist's workers build the same
    things)."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield


def ensure_venv(version: str) -> tuple[Path, float]:
    """The venv's python for ``vllm==version``, and the seconds spent installing."""
    with locked(cache_dir() / f"venv-vllm-{version}.lock"):
        return _ensure_venv(version)


def _ensure_venv(version: str) -> tuple[Path, float]:
    venv = cache_dir() / f"venv-vllm-{version}"
    python = venv / "bin" / "python"
    stamp = venv / ".dspark-hotfix-ready"
    base = None if version in (*VERSIONS, *LINES_VERSIONS) else SHARED
    install = [
        f"vllm=={version}",
        *(["--no-deps"] if base else [*EXTRA, WRAPT.get(version, NEWEST_WRAPT)]),
    ]
    wanted = " ".join(install) + (f" over vllm=={base}" if base else "")
    if stamp.exists() and stamp.read_text() == wanted and python.exists():
        # The tier activates the shim from the checkout only: an installed copy
        # (its plugin entry point) left there by hand would blur what is tested.
        subprocess.run(
            [str(python), "-m", "pip", "uninstall", "-q", "-y", "dspark-hotfix"],
            capture_output=True,
        )
        return python, 0.0
    start = time.monotonic()
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    if base:
        base_python, _ = ensure_venv(base)
        (site_packages(python) / f"dependencies-of-vllm-{base}.pth").write_text(
            f"{site_packages(base_python)}\n"
        )
    proc = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *install],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"could not install vllm=={version} from PyPI into {venv} (is the registry"
            " reachable?):\n" + proc.stderr[-3000:]
        )
    if MISMATCHED.get(version):
        subprocess.run(
            [str(python), "-m", "pip", "uninstall", "-q", "-y", *MISMATCHED[version]],
            check=True,
            capture_output=True,
        )
    stamp.write_text(wanted)
    return python, time.monotonic() - start


def site_packages(python: Path) -> Path:
    """The site-packages directory of the venv of ``python``."""
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(
        subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
