"""Prometheus's promtool, and the PromQL of docs/OPERATORS.md, for the tests that evaluate those
queries."""

from __future__ import annotations

import re
import shutil
import subprocess

from scripts.venvs import cache_dir
from tests.cache import unavailable
from tests.conftest import REPO


def documented_queries(section: str) -> list[str]:
    """The queries of the ```promql block of docs/OPERATORS.md's ``section``, each without its
    comment lines."""
    text = (
        (REPO / "docs" / "OPERATORS.md")
        .read_text()
        .split(f"\n## {section}\n", 1)[1]
        .split("\n## ", 1)[0]
    )
    block = re.search(r"^```promql\n(.*?)^```", text, re.M | re.S)
    assert block is not None, section
    queries: list[list[str]] = [[]]
    for line in block.group(1).splitlines():
        if line.startswith("#") or not line.strip():
            if queries[-1]:
                queries.append([])
        else:
            queries[-1].append(line)
    return ["\n".join(q) for q in queries if q]


def promtool() -> str:
    """Prometheus's promtool: on PATH, or from Debian's ``promtool`` package (``prometheus`` before
    Debian 13), downloaded with apt-get and unpacked once into the cache (never installed: no
    service of it starts). Where neither can be had, the test skips."""
    found = shutil.which("promtool")
    root = cache_dir() / "promtool"
    binary = root / "usr" / "bin" / "promtool"
    if found or binary.exists():
        return found or str(binary)
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        unavailable(
            "promtool is not on PATH, and this host has no apt-get and dpkg-deb to unpack Debian's"
            " prometheus"
        )
    download = root.with_name("promtool-deb")
    download.mkdir(parents=True, exist_ok=True)
    said = ""
    # Its own package from Debian 13 (trixie) on; within prometheus's before.
    for package in ("promtool", "prometheus"):
        for argv in (
            ["apt-get", "download", "-q", package],
            ["apt-get", "update", "-qq"],
            ["apt-get", "download", "-q", package],
        ):
            proc = subprocess.run(argv, cwd=download, capture_output=True, text=True, timeout=600)
            if proc.returncode == 0 and argv[1] == "download":
                break
        said += proc.stderr
        for deb in sorted(download.glob(f"{package}_*.deb"))[-1:]:
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True, timeout=120)
        if binary.exists():
            return str(binary)
    unavailable(
        "promtool is not on PATH and Debian's promtool or prometheus package could not be"
        f" downloaded, or had no promtool:\n{said}"
    )
