"""``dspark-hotfix doctor``: will the fix be active where it is needed?

Run it inside the serving image, with the environment the server gets, before a
rollout. It reads the activation paths (which ``sitecustomize`` wins, whether
the vLLM plugin entry point is visible and allowed), ``PYTHONPATH``, the
switches and wrapt, imports vLLM's target modules, and takes each patch's
verdict from the registry: the registry's own records where the shim is active
in this process, otherwise the registry's own decision functions (its target
resolution, the patch's probe, its guard rule) called here.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
import sys
from typing import Any

import dspark_hotfix
from dspark_hotfix import config, registry
from dspark_hotfix.patches import ALL

PLUGIN_GROUP = "vllm.general_plugins"
PLUGIN_NAME = "dspark_hotfix"

OK, PROBLEM, USAGE, NOT_NEEDED = 0, 1, 2, 3
VERDICTS = {OK: "ok", PROBLEM: "problem", NOT_NEEDED: "not_needed"}


def version_of(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def wrapt_supported(version: str) -> bool:
    """Whether ``version`` is in ``config.WRAPT_RANGE`` (1.17 to 2.x)."""
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (1, 17) and major < 3


def switch_problems() -> list[str]:
    """Every complaint the switches of this environment raise."""
    raw = os.environ.get(config.ENABLE)
    words = dspark_hotfix.TRUE_WORDS + dspark_hotfix.FALSE_WORDS
    problems = [] if raw is None or raw.strip().lower() in words else [
        f"{config.ENABLE}={raw!r} is not one of {'/'.join(words)}: the shim is OFF"
    ]
    settings = config.Settings()
    return problems + settings.problems + settings.selection(p.name for p in ALL)[1]


def pythonpath_warnings(entries: list[str], chains: str | None) -> list[str]:
    """Entries that put the working directory (or a path relative to it) on sys.path,
    and a sitecustomize from the working directory that ours would run."""
    warnings = []
    if "" in entries:
        warnings.append("PYTHONPATH has an empty entry: the working directory is on sys.path of every process; "
                        "use `dspark-hotfix run`, or ${PYTHONPATH:+:$PYTHONPATH} when extending it")
    warnings += [f"PYTHONPATH entry {e!r} is relative: what it means depends on the working directory"
                 for e in dict.fromkeys(entries) if e and not os.path.isabs(e)]
    if chains and os.path.dirname(chains) == os.getcwd():
        warnings.append(f"the sitecustomize that ours runs next is {chains}, from the working directory")
    return warnings


def _sitecustomize() -> dict[str, Any]:
    module = sys.modules.get("sitecustomize")
    file = getattr(module, "__file__", None)
    ours = getattr(module, "boot", None) is dspark_hotfix.boot
    here = os.path.dirname(os.path.abspath(file)) if ours and file else None
    shadowed = None
    if ours:
        for entry in sys.path:
            candidate = os.path.join(os.path.abspath(entry or os.curdir), "sitecustomize.py")
            if os.path.dirname(candidate) != here and os.path.isfile(candidate):
                shadowed = candidate
                break
    return {"ours": ours, "file": file, "chains": shadowed}


def _plugin() -> dict[str, Any]:
    visible = any(p.name == PLUGIN_NAME for p in importlib.metadata.entry_points(group=PLUGIN_GROUP))
    allow = os.environ.get("VLLM_PLUGINS")
    allowed = allow is None or PLUGIN_NAME in [p.strip() for p in allow.split(",")]
    return {"visible": visible, "allowed": allowed, "vllm_plugins": allow, "active": visible and allowed}


def _judged_here() -> list[dict[str, Any]]:
    """Each patch's row: the registry's record where it decided in this process,
    else the registry's decision functions called on vLLM's own functions."""
    rows = {row["name"]: row for row in registry.status()["patches"]}
    settings = config.Settings()
    selected, _ = settings.selection(p.name for p in ALL)
    states: dict[str, tuple[str, bool | None]] = {}
    for patch in ALL:  # a guard comes after the patches it guards
        row = rows[patch.name]
        if row["state"] in (registry.PENDING, registry.DISABLED):
            row.update(state=registry.PENDING, needed=None, corrections=0)
            module = sys.modules.get(patch.module)
            if module is None:
                row["detail"] = f"cannot import {patch.module}"
            else:
                try:
                    verdict, _ = registry.judge(patch, module, states)
                except registry.Unavailable as exc:
                    row.update(state=registry.FAILED, detail=str(exc))
                else:
                    if verdict is not None:
                        state = (registry.EXCLUDED if patch.name not in selected
                                 else registry.NOT_NEEDED if verdict.needed is False else registry.INSTALLED)
                        row.update(state=state, needed=verdict.needed, detail=verdict.detail)
        states[patch.name] = (row["state"], row["needed"])
    return [rows[p.name] for p in ALL]


def diagnose() -> dict[str, Any]:
    site = _sitecustomize()
    plugin = _plugin()
    raw_path = os.environ.get("PYTHONPATH")
    entries = raw_path.split(os.pathsep) if raw_path is not None else []
    wrapt_version = version_of("wrapt")
    problems = switch_problems()
    report: dict[str, Any] = {
        "schema": registry.SCHEMA,
        "version": dspark_hotfix.__version__,
        "pid": os.getpid(),
        "activated_by": None,
        "python": {
            "version": sys.version.split()[0],
            "executable": sys.executable,
            "no_site": bool(sys.flags.no_site),
            "ignore_environment": bool(sys.flags.ignore_environment),
            "isolated": bool(sys.flags.isolated),
        },
        "sitecustomize": site,
        "plugin": plugin,
        "pythonpath": entries,
        "versions": {"dspark_hotfix": dspark_hotfix.__version__, "wrapt": wrapt_version, "vllm": None},
        "switches": {"enabled": dspark_hotfix.enabled(), "strict": config.Settings().strict,
                     "patches": os.environ.get(config.PATCHES), "log": os.environ.get(config.LOG)},
        "warnings": pythonpath_warnings(entries, site["chains"]),
        "problems": problems,
        "patches": [],
    }
    # vLLM logs to stdout and binds its handler when imported: keep stdout for the report.
    with contextlib.redirect_stdout(sys.stderr):
        try:
            vllm = importlib.import_module("vllm")
        except Exception as exc:
            problems.append(f"vLLM cannot be imported by {sys.executable} ({type(exc).__name__}: {exc})")
            return _verdict(report)
        report["versions"]["vllm"] = version_of("vllm") or getattr(vllm, "__version__", "unknown")
        for module in dict.fromkeys(p.module for p in ALL):
            try:
                importlib.import_module(module)
            except Exception as exc:
                problems.append(f"cannot import {module}: {type(exc).__name__}: {exc}")
        report["patches"] = _judged_here()
        report["activated_by"] = registry.status()["activated_by"]
    needed = [row["name"] for row in report["patches"] if row["needed"] is not False and row["state"] != "excluded"]
    for row in report["patches"]:
        if row["state"] == registry.FAILED:
            problems.append(f"{row['name']}: {row['detail']}")
        elif row["state"] == registry.EXCLUDED and row["needed"]:
            problems.append(f"{row['name']} is needed but excluded by {config.PATCHES}")
    if needed:
        if not dspark_hotfix.enabled():
            problems.append(f"{', '.join(needed)} needed but {config.ENABLE}={os.environ.get(config.ENABLE)!r} "
                            "turns the shim off")
        elif not (site["ours"] or plugin["active"]):
            problems.append("no activation path: put `dspark-hotfix path` on PYTHONPATH (or use `dspark-hotfix run`), "
                            "or install the wheel where vLLM runs and allow it in VLLM_PLUGINS")
        if wrapt_version is None:
            problems.append(f"wrapt is not installed for {sys.executable}: {sys.executable} -m pip install "
                            "wrapt==1.17.3")
        elif not wrapt_supported(wrapt_version):
            problems.append(f"wrapt {wrapt_version} is not one the shim is tested with ({config.WRAPT_RANGE}): "
                            "install e.g. wrapt==1.17.3")
    return _verdict(report)


def evaluate(report: dict[str, Any]) -> int:
    """The exit code for a report's problems and patch rows (also ``status``'s)."""
    guards = {p.name for p in ALL if p.guards}
    patches = [row for row in report["patches"] if row["name"] not in guards]
    if report["problems"] or not patches:
        return PROBLEM
    if all(row["needed"] is False for row in patches):
        return NOT_NEEDED
    return OK


def _verdict(report: dict[str, Any]) -> dict[str, Any]:
    report["problems"] = list(dict.fromkeys(report["problems"]))
    code = evaluate(report)
    report.update(verdict=VERDICTS[code], exit_code=code)
    return report


def render(report: dict[str, Any]) -> str:
    site, plugin, versions, flags = report["sitecustomize"], report["plugin"], report["versions"], report["python"]
    off = [f for f, key in (("-S", "no_site"), ("-E", "ignore_environment"), ("-I", "isolated")) if flags[key]]
    lines = [
        f"python        {flags['version']} ({flags['executable']}); "
        f"flags that skip activation: {', '.join(off) or 'none'}",
        "sitecustomize " + (f"ours ({site['file']})" + (f", chains {site['chains']}" if site["chains"] else "")
                            if site["ours"] else "not ours" + (f" ({site['file']})" if site["file"] else " (none)")),
        f"vLLM plugin   entry point {'visible' if plugin['visible'] else 'not visible'}, "
        + ("allowed" if plugin["allowed"] else f"not allowed by VLLM_PLUGINS={plugin['vllm_plugins']}"),
        f"versions      vllm {versions['vllm']}, wrapt {versions['wrapt']}, dspark_hotfix {versions['dspark_hotfix']}",
    ]
    for row in report["patches"]:
        lines.append(f"patch         {row['name']}: {row['state']}: {row['detail']}")
    lines += [f"WARNING       {w}" for w in report["warnings"]]
    lines += [f"PROBLEM       {p}" for p in report["problems"]]
    words = {OK: "ok: the fix will be active where it is needed",
             NOT_NEEDED: "not needed: this vLLM is fixed upstream; the shim is a no-op here and can be removed",
             PROBLEM: "PROBLEM: the fix will not be active where it is needed"}
    lines.append(f"verdict       {words[report['exit_code']]} (exit {report['exit_code']})")
    return "\n".join(lines)
