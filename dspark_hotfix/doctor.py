"""``dspark-hotfix doctor``: will the fix be active where it is needed?

Run it inside the serving image, with the environment the server gets, before a
rollout. It reads the activation paths (which ``sitecustomize`` wins, whether
the vLLM plugin entry point is visible and allowed), the switches, and for each
patch imports vLLM's target module and calls vLLM's own function with stand-in
objects on the CPU (no GPU, no model) to decide whether the patch is needed.
Exit status 0 only when every needed patch will be applied.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from typing import Any

import dspark_hotfix
from dspark_hotfix import config, hooks

PLUGIN_GROUP = "vllm.general_plugins"
PLUGIN_NAME = "dspark_hotfix"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _sitecustomize() -> dict[str, Any]:
    module = sys.modules.get("sitecustomize")
    file = getattr(module, "__file__", None)
    ours = getattr(module, "boot", None) is dspark_hotfix.boot
    here = os.path.dirname(os.path.abspath(file)) if ours and file else None
    shadowed = None
    for entry in sys.path:
        directory = os.path.abspath(entry or os.curdir)
        if directory == here:
            continue
        candidate = os.path.join(directory, "sitecustomize.py")
        if os.path.isfile(candidate):
            shadowed = candidate
            break
    return {
        "active": ours,
        "file": file,
        # Ours imports the next one on sys.path; another module that won is not ours to judge.
        "shadowed": shadowed if ours else None,
        "chained": bool(ours and shadowed),
    }


def _plugin() -> dict[str, Any]:
    points = importlib.metadata.entry_points(group=PLUGIN_GROUP)
    visible = any(p.name == PLUGIN_NAME for p in points)
    allow = os.environ.get("VLLM_PLUGINS")
    allowed = allow is None or PLUGIN_NAME in [p.strip() for p in allow.split(",")]
    return {"visible": visible, "allowed": allowed, "VLLM_PLUGINS": allow, "active": visible and allowed}


def _patch_report(patch: Any, selected: bool, earlier: list[dict[str, Any]]) -> dict[str, Any]:
    from dspark_hotfix.patches import PatchUnavailable

    row: dict[str, Any] = {
        "name": patch.name,
        "target": patch.target,
        "selected": selected,
        "found": False,
        "signature": None,
        "needed": None,
        "detail": "",
    }
    if patch.depends_on:
        # As the hooks decide: a guard is needed where a patch it guards would be
        # installed (selected and needed) or would fail; otherwise it is not looked at.
        guarded = [
            r["name"] for r in earlier
            if r["name"] in patch.depends_on and r["selected"] and (r["needed"] or r["signature"] is not True)
        ]
        if not guarded:
            row.update(found=None, signature=None, needed=False, detail="not needed (guards nothing needed)")
            return row
    try:
        module = importlib.import_module(patch.module)
    except Exception as exc:
        row["detail"] = f"cannot import {patch.module}: {type(exc).__name__}: {exc}"
        return row
    owner, method = patch.locate(module)
    row["found"] = owner is not None and method in owner.__dict__
    try:
        patch.resolve(module)
        patch.prepare(module)
    except PatchUnavailable as exc:
        row["signature"] = not str(exc).startswith("unexpected signature") and row["found"]
        row["detail"] = str(exc)
        return row
    row["signature"] = True
    if patch.depends_on:
        row["needed"], row["detail"] = True, f"needed (guards {', '.join(guarded)})"
        return row
    # vLLM's own function, also where this process has wrapped it already.
    verdict = patch.probe(hooks.unwrapped(owner.__dict__[method]))
    # An undecided probe means the shim would wrap (its corrections leave right answers alone).
    row["needed"] = verdict.needed is not False
    row["detail"] = verdict.detail
    return row


def wrapt_supported(version: str) -> bool:
    """Whether ``version`` is in ``config.WRAPT_RANGE`` (1.17 to 2.x)."""
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (1, 17) and major < 3


def diagnose() -> dict[str, Any]:
    from dspark_hotfix.patches import ALL

    settings = hooks.settings()
    selected, selection_problems = settings.selection(p.name for p in ALL)
    site = _sitecustomize()
    plugin = _plugin()
    wrapt_version = _version("wrapt")
    report: dict[str, Any] = {
        "python": {
            "version": sys.version.split()[0],
            "executable": sys.executable,
            "flags": {
                "-S (no site)": bool(sys.flags.no_site),
                "-E (ignore environment)": bool(sys.flags.ignore_environment),
                "-I (isolated)": bool(sys.flags.isolated),
            },
        },
        "sitecustomize": site,
        "plugin": plugin,
        "versions": {"dspark_hotfix": _version("dspark-hotfix"), "wrapt": wrapt_version, "vllm": None},
        "switches": {
            config.ENABLE: os.environ.get(config.ENABLE),
            config.PATCHES: os.environ.get(config.PATCHES),
            config.STRICT: os.environ.get(config.STRICT),
            config.LOG: os.environ.get(config.LOG),
            "problems": settings.problems + selection_problems,
        },
        "patches": [],
        "problems": [],
    }
    problems: list[str] = report["problems"]
    try:
        vllm = importlib.import_module("vllm")
        report["versions"]["vllm"] = _version("vllm") or getattr(vllm, "__version__", "unknown")
    except Exception as exc:
        problems.append(f"vLLM cannot be imported here ({type(exc).__name__}: {exc})")
        report["ok"] = False
        return report
    for patch in ALL:  # guards come after the patches they depend on
        report["patches"].append(_patch_report(patch, patch.name in selected, report["patches"]))
    active_path = site["active"] or plugin["active"]
    for row in report["patches"]:
        if not row["selected"]:
            if row["needed"]:
                problems.append(f"{row['name']} is needed but excluded by {config.PATCHES}")
            continue
        if row["signature"] is not True and (row["needed"] is not False or row["found"] is False):
            problems.append(f"{row['name']}: {row['detail']}")
        elif row["needed"]:
            if not settings.enabled:
                problems.append(f"{row['name']} is needed but {config.ENABLE}=0 turns the shim off")
            elif not active_path:
                problems.append(
                    f"{row['name']} is needed but no activation path is active: put `dspark-hotfix path` on "
                    "PYTHONPATH, or install the wheel where vLLM runs (plugin) and allow it in VLLM_PLUGINS"
                )
            elif wrapt_version is None:
                problems.append(f"{row['name']} is needed but wrapt is not installed")
            elif not wrapt_supported(wrapt_version):
                problems.append(
                    f"{row['name']} is needed but wrapt {wrapt_version} is not one the shim is tested with "
                    f"({config.WRAPT_RANGE}): install e.g. wrapt==1.17.3"
                )
    report["ok"] = not problems
    return report


def render(report: dict[str, Any]) -> str:
    site, plugin, versions = report["sitecustomize"], report["plugin"], report["versions"]
    flags = ", ".join(k for k, v in report["python"]["flags"].items() if v) or "none"
    lines = [
        f"python        {report['python']['version']} ({report['python']['executable']}); "
        f"flags that disable activation: {flags}",
        f"sitecustomize {'ours: ' + str(site['file']) if site['active'] else 'not ours: ' + str(site['file'])}"
        + (f"; chains {site['shadowed']}" if site["chained"] else ""),
        f"vLLM plugin   entry point {'visible' if plugin['visible'] else 'not visible'}, "
        f"{'allowed' if plugin['allowed'] else 'not allowed by VLLM_PLUGINS=' + str(plugin['VLLM_PLUGINS'])}",
        f"versions      vllm {versions['vllm']}, wrapt {versions['wrapt']}, dspark-hotfix {versions['dspark_hotfix']}",
        "switches      "
        + (", ".join(f"{k}={v}" for k, v in report["switches"].items() if k != "problems" and v is not None)
           or "(defaults)"),
    ]
    lines += [f"  ! {p}" for p in report["switches"]["problems"]]
    for row in report["patches"]:
        sel = "" if row["selected"] else " (excluded)"
        if row["found"] is None:
            looked = "target not looked at"
        else:
            signature = {True: "as expected", False: "unexpected", None: "?"}[row["signature"]]
            looked = f"target {'found' if row['found'] else 'missing'}, signature {signature}"
        lines.append(f"patch         {row['name']}{sel}: {looked}, {row['detail']}")
    lines += [f"PROBLEM       {p}" for p in report["problems"]]
    lines.append("verdict       " + ("ok: the fix will be active where it is needed" if report["ok"] else "NOT OK"))
    return "\n".join(lines)
