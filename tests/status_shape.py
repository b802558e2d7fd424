"""``dspark_hotfix.status()`` (schema 2) as the OCI and Ray tiers read it from another process."""

from __future__ import annotations

from typing import Any

from tests.cases import CORRECTIONS

FIXES = tuple(p.name for p in CORRECTIONS)


def rows(status: dict[str, Any]) -> dict[str, dict]:
    """Per-patch rows by name."""
    assert status["schema"] == 2, status
    return {row["name"]: row for row in status["patches"]}


def activated_by(status: dict[str, Any]) -> str | None:
    return status["activated_by"]


def pid(status: dict[str, Any]) -> int:
    return status["pid"]


def fixes_installed(status: dict[str, Any]) -> bool:
    """The corrections are wrapped around vLLM's functions."""
    got = rows(status)
    return all(got[name]["state"] == "patched" for name in FIXES)
