"""``dspark-hotfix status`` and ``doctor``: what the shim does here, and will it be active where it
is needed?

Run doctor inside the serving image, with the environment the server gets,
before a rollout. Both commands import vLLM's target modules with the registry
active in their own process and read the registry's records through
``registry.status()`` (one decision, made by the hooks; no second way of working
out states). Doctor then checks the serving environment: which
``sitecustomize`` ran and what it chained, whether vLLM allows the plugin entry
point (read as vLLM reads ``VLLM_PLUGINS``), ``PYTHONPATH`` and wrapt.
"""

import contextlib
import importlib
import importlib.metadata
import os
import sys
from typing import Any

import dspark_hotfix
from dspark_hotfix import config, patches, registry, state

PLUGIN_NAME = "dspark_hotfix"
# Each of these interpreter flags keeps the start-up hook out.
FLAGS = (("-S", "no_site"), ("-E", "ignore_environment"), ("-I", "isolated"))


def few(items: list[str], limit: int = 3) -> list[str]:
    """At most ``limit`` of ``items``, each quoted as a switch's value is (short), then "... (N
    more)": doctor's output stays short whatever the environment holds."""
    more = [f"... ({len(items) - limit} more)"] if len(items) > limit else []
    return [dspark_hotfix.shown(item) for item in items[:limit]] + more


def wrapt_supported(version: str) -> bool:
    """Whether ``version`` is in config.WRAPT_RANGE."""
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return False
    return config.WRAPT_OLDEST <= (major, minor) and major <= config.WRAPT_NEWEST_MAJOR


def is_shim(file: str) -> bool:
    """Whether the sitecustomize.py at ``file`` is a copy of ours, known by where it lies (doctor
    reads no files): in a dspark_hotfix package's start-up directory, or beside the package."""
    here = os.path.dirname(os.path.realpath(file))
    package = (
        os.path.dirname(here)
        if os.path.basename(here) == "startup"
        else os.path.join(here, "dspark_hotfix")
    )
    return os.path.basename(package) == "dspark_hotfix" and os.path.isfile(
        os.path.join(package, "__init__.py")
    )


def plugin_state() -> tuple[dict[str, Any], list[str]]:
    """The plugin entry point, and whether vLLM allows it: read with vLLM's own
    ``envs.VLLM_PLUGINS`` (which does not strip spaces) where vLLM has it."""
    raw = os.environ.get("VLLM_PLUGINS")
    try:
        names = importlib.import_module("vllm.envs").VLLM_PLUGINS
    except Exception:
        names = None if raw is None else raw.split(",")
    visible = any(
        p.name == PLUGIN_NAME for p in importlib.metadata.entry_points(group="vllm.general_plugins")
    )
    allowed = names is None or PLUGIN_NAME in names
    spaced = [n for n in dict.fromkeys(names or ()) if n != n.strip() and n.strip() == PLUGIN_NAME]
    problems = []
    if spaced and not allowed:
        problems.append(
            f"VLLM_PLUGINS={dspark_hotfix.shown(raw)}: vLLM reads {', '.join(few(spaced))} with the"
            f" spaces, so it does not load {PLUGIN_NAME}; write it without spaces"
        )
    return {
        "visible": visible,
        "allowed": allowed,
        "vllm_plugins": raw if raw is None else dspark_hotfix.shown(raw),
        "active": visible and allowed,
    }, problems


def report(source: str) -> dict[str, Any]:
    """Import vLLM's target modules in this process with the registry active (with
    ``DSPARK_HOTFIX`` off it judges every patch and applies none), and read its
    rows: ``status`` prints this, ``doctor`` adds the serving environment."""
    problems = list(config.settings().problems)
    version = None
    # This process's series must not join a server's.
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    # vLLM logs to stdout and binds its handler when imported: keep stdout for the report.
    with contextlib.redirect_stdout(sys.stderr):
        try:
            version = getattr(importlib.import_module("vllm"), "__version__", "unknown")
        except Exception as exc:
            problems.append(
                f"vLLM cannot be imported by {sys.executable} ({type(exc).__name__}: {exc})"
            )
        else:
            # Each target module is imported as in the server, where the shim is active. A module
            # this vLLM lacks is no problem: its patches are judged without it (Patch.absent).
            for module in dict.fromkeys(m for p in patches.ALL for m in p.modules):
                try:
                    importlib.import_module(module)
                except Exception as exc:
                    if not (isinstance(exc, ModuleNotFoundError) and exc.name == module):
                        problems.append(f"cannot import {module}: {type(exc).__name__}: {exc}")
            # Where nothing activated the shim, this does: the hooks fire at once on what is
            # imported.
            registry.activate(source)
    out = registry.status()
    out.update(vllm=version, warnings=[w for w in [config.settings().warning] if w])
    return finish(out, problems)


def finish(report: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """The report with the problems found beside the registry's: any problem makes the verdict
    ``problem``."""
    report["problems"] = list(dict.fromkeys(problems + report["problems"]))
    report["verdict"] = "problem" if report["problems"] else report["verdict"]
    report["exit_code"] = state.exit_code(report)
    return report


def draft(model: str) -> dict[str, Any]:
    """The quantization vLLM's own ``SpeculativeConfig`` gives a DSpark draft named explicitly
    (``--speculative-config.model``) for the checkpoint in the directory ``model``, beside the
    target's, from its config.json (nothing is loaded). Some vLLM releases give it the checkpoint's
    own ``fp8`` (vllm#51916): no patch can tell without the model's files, so doctor tells where
    it is given them."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a directory: nothing to ask the hub
    try:
        from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig

        target = ModelConfig(model=model, tokenizer=model, skip_tokenizer_init=True)
        named = SpeculativeConfig(
            target_model_config=target,
            target_parallel_config=ParallelConfig(),
            method="dspark",
            num_speculative_tokens=getattr(target.hf_config, "dspark_block_size", None) or 7,
            model=model,
        ).draft_model_config.quantization
    except Exception as exc:
        return {"model": model, "error": f"{type(exc).__name__}: {exc}"}
    return {"model": model, "target": target.quantization, "named": named}


def diagnose(model: str | None = None) -> dict[str, Any]:
    """``status``'s report, and how the shim gets into the server's processes from here; with a
    checkpoint's directory, the quantization vLLM gives its DSpark draft (:func:`draft`)."""
    out = report("doctor")
    out["draft"] = draft(model) if model and out["vllm"] else None
    entries = os.environ["PYTHONPATH"].split(os.pathsep) if os.environ.get("PYTHONPATH") else []
    # Where the fix matters: activation and wrapt are checked there only.
    needed = out["vllm"] is not None and dspark_hotfix.enabled() and out["verdict"] != "removable"
    plugin, problems = plugin_state()
    warnings = out["warnings"]
    # The sitecustomize that won, and what ours chained; where a foreign one won and ours did not
    # run, the copy of ours on PYTHONPATH that it kept out (``ahead``): a tool's wrapper
    # (opentelemetry-instrument).
    module = sys.modules.get("sitecustomize")
    # The start-up hook's import watcher marks our sitecustomize.
    ours = hasattr(module, "VllmImportWatcher")
    site = {
        "ours": ours,
        "file": getattr(module, "__file__", None),
        "chained": getattr(module, "chained", None),
        "ahead": None,
    }
    if (
        not ours
        and site["file"]
        and out["activated_by"] != "sitecustomize"
        and not sys.flags.ignore_environment
    ):
        copies = [os.path.join(e, "sitecustomize.py") for e in entries if os.path.isabs(e)]
        site["ahead"] = next((f for f in copies if os.path.isfile(f) and is_shim(f)), None)

    if site["ahead"]:
        # A problem where that leaves no activation path, else a warning.
        (problems if needed and not plugin["active"] else warnings).append(
            f"{site['file']} runs ahead of ours ({site['ahead']}) and does not chain it, so ours"
            " does not run: start `dspark-hotfix run` inside the tool's wrapper, which puts ours"
            " first and chains theirs (opentelemetry-instrument dspark-hotfix run -- COMMAND)"
        )
    elif needed and not (ours or plugin["active"]):
        problems.append(
            "no activation path: put `dspark-hotfix path` on PYTHONPATH (or use `dspark-hotfix"
            " run`), or install the wheel where vLLM runs and allow it in VLLM_PLUGINS"
        )
    relative = [e for e in dict.fromkeys(entries) if not os.path.isabs(e)]
    if relative:
        warnings.append(
            "PYTHONPATH has entries that depend on the working directory (an empty one is the"
            " working directory itself; `dspark-hotfix run` drops them, and"
            " ${PYTHONPATH:+:$PYTHONPATH} adds none when extending it):"
            f" {', '.join(few(relative))}"
        )

    try:
        wrapt = importlib.metadata.version("wrapt")
    except importlib.metadata.PackageNotFoundError:
        wrapt = None  # where it cannot be imported either, every row says so
    if needed and wrapt and not wrapt_supported(wrapt):
        problems.append(
            f"wrapt {wrapt} is not one the shim is tested with ({config.WRAPT_RANGE}): "
            "install e.g. wrapt==1.17.3"
        )
    out.update(
        python={
            "version": sys.version.split()[0],
            "executable": sys.executable,
            **{key: bool(getattr(sys.flags, key)) for _, key in FLAGS},
        },
        sitecustomize=site,
        plugin=plugin,
        versions={
            "dspark_hotfix": dspark_hotfix.__version__,
            "wrapt": wrapt,
            "vllm": out.pop("vllm"),
        },
    )
    return finish(out, problems)


def shadowed(chained: dict[str, Any] | None) -> str:
    """What ours did with the sitecustomize it shadows."""
    if not chained:
        return "shadows none"
    return (
        f"chained one that failed: {chained['error']}"
        if "error" in chained
        else f"chained {chained['file']}"
    )


def drafted(found: dict[str, Any] | None) -> str:
    """What doctor's text says of the quantization vLLM gives a DSpark draft named explicitly."""
    if not found or "error" in found:
        return "named, not judged: " + (found or {}).get("error", "doctor --model DIR judges it")
    wrong = found["named"] != found["target"]
    return f"named explicitly, it gets {found['named']}; the target, {found['target']}" + (
        " (vllm#51916, which no patch repairs): leave the draft unnamed" if wrong else ""
    )


def render(report: dict[str, Any]) -> str:
    """The report as text: doctor's lines on the environment, where it has them, then the rows,
    the warnings, the problems and the verdict."""
    disabled = "" if report["enabled"] else f": {config.ENABLE} turns the shim off"
    lines = [f"activated by  {report['activated_by'] or 'nothing'}{disabled} (pid {report['pid']})"]
    if "sitecustomize" in report:
        site, plugin, versions, python = (
            report[k] for k in ("sitecustomize", "plugin", "versions", "python")
        )
        off = [flag for flag, key in FLAGS if python[key]]
        lines += [
            f"python        {python['version']} ({python['executable']}); "
            f"flags that skip activation: {', '.join(off) or 'none'}",
            f"sitecustomize ours ({site['file']}), {shadowed(site['chained'])}"
            if site["ours"]
            else f"sitecustomize not ours ({site['file'] or 'none'})",
            f"vLLM plugin   entry point {'visible' if plugin['visible'] else 'not visible'}, "
            + (
                "allowed"
                if plugin["allowed"]
                else f"not allowed by VLLM_PLUGINS={plugin['vllm_plugins']}"
            ),
            f"versions      vllm {versions['vllm']}, wrapt {versions['wrapt']}, "
            f"dspark_hotfix {versions['dspark_hotfix']}",
            f"draft         {drafted(report['draft'])}",
        ]
    lines += [
        f"patch         {row['name']}: {row['state']}: {row['detail']}" for row in report["patches"]
    ]
    lines += [f"WARNING       {w}" for w in report["warnings"]]
    lines += [f"PROBLEM       {p}" for p in report["problems"]]
    verdict = report["verdict"]
    # Where it guards, the patched rows are stops: each says what it stops, in the first paragraph
    # of its step's docstring.
    if verdict == "guarding":
        said = {
            p.name: " ".join((p.arguments.__doc__ or "").split("\n\n")[0].split()).rstrip(".")
            for p in patches.ALL
        }
        lines += [
            f"guards        {row['name']}: {said.get(row['name'])};"
            " remove the shim where no deployment uses that"
            for row in report["patches"]
            if row["state"] == state.PATCHED
        ]
    lines.append(f"verdict       {verdict}: {state.VERDICTS[verdict]} (exit {report['exit_code']})")
    return "\n".join(lines)
