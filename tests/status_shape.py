"""``dspark_hotfix.status()`` (schema 2) as the OCI, Ray and coexistence tiers read it from another
process."""

from __future__ import annotations

from typing import Any

import dspark_hotfix.patches


def rows(status: dict[str, Any]) -> dict[str, dict]:
    """Per-patch rows by name."""
    assert status["schema"] == 2, status
    return {row["name"]: row for row in status["patches"]}


def activated_by(status: dict[str, Any]) -> str | None:
    return status["activated_by"]


def pid(status: dict[str, Any]) -> int:
    return status["pid"]


def fixes_installed(status: dict[str, Any]) -> bool:
    """Every correction of ``patches.ALL`` (each patch but the stops) is wrapped around vLLM's
    function."""
    got = rows(status)
    fixes = [p.name for p in dspark_hotfix.patches.ALL if not p.stops]
    return bool(fixes) and all(got[name]["state"] == "patched" for name in fixes)


def target_modules() -> list[str]:
    """Every patch's target module (``patches.ALL``), once each, in its order: once a child has
    imported them, every patch is judged."""
    return list(dict.fromkeys(p.module for p in dspark_hotfix.patches.ALL))
