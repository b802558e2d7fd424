"""``dspark-hotfix doctor``: will the fix be active where it is needed?

Run it inside the serving image, with the environment the server gets, before a
rollout. It imports vLLM's target modules with the registry active in its own
process and reads the registry's records, exactly as ``status`` does (one
decision, made by the hooks; no second way of working out states), then checks
the serving environment: which ``sitecustomize`` ran and what it chained,
whether vLLM allows the plugin entry point (read as vLLM reads ``VLLM_PLUGINS``),
``PYTHONPATH`` and wrapt.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
import sys
from typing import Any

import dspark_hotfix
from dspark_hotfix import config, registry, state
from dspark_hotfix.patches import ALL

PLUGIN_GROUP = "vllm.general_plugins"
PLUGIN_NAME = "dspark_hotfix"


def version_of(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def wrapt_supported(version: str) -> bool:
    """Whether ``version`` is in config.WRAPT_RANGE."""
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return False
    return config.WRAPT_OLDEST <= (major, minor) and major <= config.WRAPT_NEWEST_MAJOR


def cut(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def cut_or_none(raw: str | None) -> str | None:
    return None if raw is None else cut(raw)


def few(items: list[str], limit: int = 3) -> list[str]:
    """At most ``limit`` of ``items``, each cut short, then "... (N more)": doctor's output
    stays short whatever the environment holds, as config's warnings do."""
    return [cut(item) for item in items[:limit]] + [f"... ({len(items) - limit} more)"] * (len(items) > limit)


def is_shim(file: str) -> bool:
    """Whether the sitecustomize.py at ``file`` is a copy of ours, known by where it lies (doctor
    reads no files): in a dspark_hotfix package's start-up directory, or beside the package."""
    here = os.path.dirname(os.path.realpath(file))
    package = os.path.dirname(here) if os.path.basename(here) == "startup" else os.path.join(here, "dspark_hotfix")
    return os.path.basename(package) == "dspark_hotfix" and os.path.isfile(os.path.join(package, "__init__.py"))


def pythonpath_warnings(entries: list[str], site: dict[str, Any]) -> list[str]:
    """Entries that put the working directory (or a path relative to it) on sys.path,
    and what the sitecustomize ours chained at start-up did, or one that failed, where it matters."""
    warnings = []
    if "" in entries:
        warnings.append("PYTHONPATH has an empty entry: the working directory is on sys.path of every process; "
                        "use `dspark-hotfix run`, or ${PYTHONPATH:+:$PYTHONPATH} when extending it")
    relative = [e for e in dict.fromkeys(entries) if e and not os.path.isabs(e)]
    if relative:
        warnings.append(f"PYTHONPATH has relative entries, whose meaning depends on the working directory: "
                        f"{', '.join(few([repr(e) for e in relative]))}")
    file, error = (site["chained"] or {}).get("file"), (site["chained"] or {}).get("error")
    if file and os.path.dirname(os.path.realpath(file)) == os.path.realpath(os.getcwd()):
        warnings.append(f"the sitecustomize that ours ran at start-up is {file}, from the working directory")
    copies = [e for e in dict.fromkeys(entries) if e and os.path.isfile(os.path.join(e, "sitecustomize.py"))
              and is_shim(os.path.join(e, "sitecustomize.py"))]
    if len(copies) > 1:  # each chains the next: it works, but which one runs depends on the order
        warnings.append(f"PYTHONPATH has {len(copies)} copies of the shim's start-up directory "
                        f"({', '.join(few(copies))}): keep one")
    if error:
        warnings.append(f"the sitecustomize that ours chained failed at start-up, in every process: {error}")
    if site["failed"]:
        warnings.append(f"{site['failed']} is on sys.path but start-up did not import it: it failed, in every "
                        "process (site printed why on stderr)")
    return warnings


def _sitecustomize(entries: list[str], activated_by: str | None) -> dict[str, Any]:
    """The sitecustomize that won and what ours chained; where none is imported, the one on
    sys.path that raised at start-up (``failed``); where a foreign one won and ours did not run,
    the copy of ours on PYTHONPATH that it kept out (``ahead``): it does not chain."""
    module = sys.modules.get("sitecustomize")
    file = getattr(module, "__file__", None)
    ours = getattr(module, "boot", None) is dspark_hotfix.boot
    chained = dspark_hotfix.chained if ours else None
    if chained and "error" in chained:
        chained = {"error": cut(str(chained["error"]))}
    failed = None
    if module is None and not sys.flags.no_site:  # site found none, or one that raised (site drops it)
        # sys.path[0] (the script's directory, or the working directory) is added after start-up.
        paths = sys.path[0 if getattr(sys.flags, "safe_path", False) else 1:]
        failed = next((f for f in (os.path.join(p, "sitecustomize.py") for p in paths if p) if os.path.isfile(f)), None)
    kept_out = [os.path.join(e, "sitecustomize.py") for e in entries if os.path.isabs(e)]
    ahead = None if ours or file is None or activated_by == "sitecustomize" or sys.flags.ignore_environment else \
        next((f for f in kept_out if os.path.isfile(f) and is_shim(f)), None)
    return {"ours": ours, "file": file, "chained": chained, "failed": failed, "ahead": ahead}


def _plugin() -> tuple[dict[str, Any], list[str]]:
    """The plugin entry point, and whether vLLM allows it: read with vLLM's own
    ``envs.VLLM_PLUGINS`` (which does not strip spaces) where vLLM has it."""
    visible = any(p.name == PLUGIN_NAME for p in importlib.metadata.entry_points(group=PLUGIN_GROUP))
    raw = os.environ.get("VLLM_PLUGINS")
    try:
        names = importlib.import_module("vllm.envs").VLLM_PLUGINS
    except Exception:
        names = None if raw is None else raw.split(",")
    allowed = names is None or PLUGIN_NAME in names
    spaced = [repr(n) for n in dict.fromkeys(names or ()) if n != n.strip() and n.strip() == PLUGIN_NAME]
    problems = [f"VLLM_PLUGINS={dspark_hotfix.shown(raw)}: vLLM reads {', '.join(few(spaced))} with the spaces, "
                f"so it does not load {PLUGIN_NAME}; write it without spaces"] if spaced and not allowed else []
    return {"visible": visible, "allowed": allowed, "vllm_plugins": cut_or_none(raw),
            "active": visible and allowed}, problems


def report(source: str) -> dict[str, Any]:
    """Import vLLM's target modules in this process with the registry active (with
    ``DSPARK_HOTFIX`` off it judges every patch and applies none), and read its
    rows: ``status`` prints this, ``doctor`` adds the serving environment."""
    problems = list(config.settings().problems)
    version = None
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)  # this process's series must not join a server's
    # vLLM logs to stdout and binds its handler when imported: keep stdout for the report.
    with contextlib.redirect_stdout(sys.stderr):
        try:
            vllm = importlib.import_module("vllm")
        except Exception as exc:
            problems.append(f"vLLM cannot be imported by {sys.executable} ({type(exc).__name__}: {exc})")
        else:
            version = version_of("vllm") or getattr(vllm, "__version__", "unknown")
            for module in dict.fromkeys(p.module for p in ALL):  # activated as in the server, where it is
                try:
                    importlib.import_module(module)
                except Exception as exc:
                    problems.append(f"cannot import {module}: {type(exc).__name__}: {exc}")
            registry.activate(source)  # where nothing did: the hooks fire at once on what is imported
    out = registry.status()
    out.update(vllm=version, warnings=[w for w in [config.settings().unknown] if w])
    return finish(out, problems)


def finish(report: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """The report with the problems found beside the registry's: any problem makes the verdict ``problem``."""
    report["problems"] = list(dict.fromkeys(problems + report["problems"]))
    report["verdict"] = "problem" if report["problems"] else report["verdict"]
    report["exit_code"] = state.exit_code(report)
    return report


def diagnose() -> dict[str, Any]:
    out = report("doctor")
    raw_path = os.environ.get("PYTHONPATH")
    entries = raw_path.split(os.pathsep) if raw_path is not None else []
    site = _sitecustomize(entries, out["activated_by"])
    plugin, plugin_problems = _plugin()
    wrapt_version = version_of("wrapt")
    problems = plugin_problems
    warnings = out["warnings"] + pythonpath_warnings(entries, site)
    # A tool's wrapper (opentelemetry-instrument) put its sitecustomize ahead of ours: a problem
    # where that leaves no activation path, else a warning.
    ahead = site["ahead"] and (f"{site['file']} runs ahead of ours ({site['ahead']}) and does not chain it, so "
                               "ours does not run: start `dspark-hotfix run` inside the tool's wrapper, which puts "
                               "ours first and chains theirs (opentelemetry-instrument dspark-hotfix run -- COMMAND)")
    out.update(
        python={"version": sys.version.split()[0], "executable": sys.executable, "no_site": bool(sys.flags.no_site),
                "ignore_environment": bool(sys.flags.ignore_environment), "isolated": bool(sys.flags.isolated)},
        sitecustomize=site, plugin=plugin, pythonpath=few(entries, 20),
        versions={"dspark_hotfix": dspark_hotfix.__version__, "wrapt": wrapt_version, "vllm": out.pop("vllm")},
        switches={"enabled": dspark_hotfix.enabled(), "strict": out["strict"],
                  "patches": cut_or_none(os.environ.get(config.PATCHES))},
        warnings=warnings,
    )
    if out["versions"]["vllm"] and dspark_hotfix.enabled() and any(
            row["needed"] is not False and row["state"] != state.EXCLUDED for row in out["patches"]):
        if not (site["ours"] or plugin["active"]):
            problems.append(ahead or "no activation path: put `dspark-hotfix path` on PYTHONPATH (or use "
                            "`dspark-hotfix run`), or install the wheel where vLLM runs and allow it in VLLM_PLUGINS")
        if wrapt_version is None:
            problems.append(f"wrapt is not installed for {sys.executable}: {sys.executable} -m pip install "
                            "wrapt==1.17.3")
        elif not wrapt_supported(wrapt_version):
            problems.append(f"wrapt {wrapt_version} is not one the shim is tested with ({config.WRAPT_RANGE}): "
                            "install e.g. wrapt==1.17.3")
    if ahead and ahead not in problems:
        warnings.append(ahead)
    return finish(out, problems)


def _chained(chained: dict[str, Any] | None) -> str:
    if not chained:
        return ", shadows none"
    if "error" in chained:
        return f", chained one that failed: {chained['error']}"
    return f", chained {chained['file']}"


def render(report: dict[str, Any]) -> str:
    site, plugin, versions, flags = report["sitecustomize"], report["plugin"], report["versions"], report["python"]
    off = [f for f, key in (("-S", "no_site"), ("-E", "ignore_environment"), ("-I", "isolated")) if flags[key]]
    lines = [
        f"python        {flags['version']} ({flags['executable']}); "
        f"flags that skip activation: {', '.join(off) or 'none'}",
        "sitecustomize " + (f"ours ({site['file']})" + _chained(site["chained"]) if site["ours"]
                            else "not ours" + (f" ({site['file']})" if site["file"] else " (none)")),
        f"vLLM plugin   entry point {'visible' if plugin['visible'] else 'not visible'}, "
        + ("allowed" if plugin["allowed"] else f"not allowed by VLLM_PLUGINS={plugin['vllm_plugins']}"),
        f"versions      vllm {versions['vllm']}, wrapt {versions['wrapt']}, dspark_hotfix {versions['dspark_hotfix']}",
    ]
    return "\n".join([*lines, render_state(report)])


def render_state(report: dict[str, Any]) -> str:
    """The rows, the warnings, the problems and the verdict: the end of status's text and of doctor's."""
    lines = [f"patch         {row['name']}: {row['state']}: {row['detail']}" for row in report["patches"]]
    lines += [f"WARNING       {w}" for w in report["warnings"]]
    lines += [f"PROBLEM       {p}" for p in report["problems"]]
    verdict = report["verdict"]
    lines.append(f"verdict       {verdict}: {state.VERDICTS[verdict]} (exit {report['exit_code']})")
    return "\n".join(lines)
