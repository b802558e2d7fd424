"""The fault sweep's child: one activation path, interrupted once at each point of the shim's work
in turn.

A point is a call event of a frame with the shim's code on its stack (the shim's own functions, and
what they call: wrapt, the import system, logging, a probe's call into vLLM), the return of a call
the shim makes into C, or a jump back in the shim's own code: everywhere CPython can run a signal
handler while the shim works. :func:`sweep` runs the path once whole, counting the main thread's
points, then forks one process per point; that process raises ``KeyboardInterrupt`` at its point
(from a trace function, as a Ctrl-C's handler would), then does what the process would do next: the
interrupted step again (an import retried, ``install()`` called again; vLLM's plugin loader, which
loads plugins once per process, returns at once), then the rest of the process kind's imports. It
reports what every reader says then, and what the process does.

The paths: the start-up hook (the test puts the checkout first on the path), ``install()``, and
vLLM's plugin loader. The process kinds' import orders are those of vLLM's processes on the toy
build: the API server imports the metrics client early, the engine core late, a tensor-parallel
worker never imports the planner (the registry does). ``waiting``: at the first point a second
thread starts what waits for the activation the main thread is making (:func:`second_step`).

Standard library (and ``tests.child``) only at the top: the sweep's process must reach the path with
nothing of it imported.
"""

from __future__ import annotations

import dis
import inspect
import json
import os
import sys
import tempfile
import threading
import time
from functools import partial
from typing import Any

from tests.child import toy_calls, use_toys, wrap_depths

KINDS = ("api_server", "engine_core", "worker")
TOY_MODULES = [
    "vllm.toy_model",
    "vllm.toy_planner",
]  # the toys' targets (the planner's is imported everywhere)


def imports(kind: str, modules: list[str]) -> list[str]:
    """A process kind's imports, in its order, where the patches target ``modules`` (the last one is
    imported everywhere)."""
    return {
        "api_server": ["vllm", "prometheus_client", *reversed(modules)],
        "engine_core": ["vllm", *modules, "prometheus_client"],
        "worker": ["vllm", *modules[:-1], "prometheus_client"],
    }[kind]


SHIM = os.path.join(os.sep, "dspark_hotfix", "")
HUNG = 10.0  # seconds before a point's process counts as hung
GENERATOR = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def shim_code(code: Any, seen: dict[Any, bool] = {}) -> bool:  # noqa: B006  (a cache, on purpose)
    if code not in seen:
        seen[code] = SHIM in os.path.realpath(code.co_filename)
    return seen[code]


# The jumps back where CPython checks for a signal (a loop's end): JUMP_BACKWARD_NO_INTERRUPT does
# not.
BACKWARD = {
    code for name, code in dis.opmap.items() if "BACKWARD" in name and "NO_INTERRUPT" not in name
}


def profiler(at: int, on_first: Any, every: bool) -> tuple[Any, Any, list[int]]:
    """A profile function and a trace function raising KeyboardInterrupt at the ``at``-th point (0:
    never), and the count so far.

    CPython runs a signal's handler where it checks for one: as a function starts, as a call into C
    returns, and at a loop's jump back. So with ``every`` the points are the start and the return of
    each function of the shim and of each it calls, the return of each call the shim makes into C,
    and each jump back in the shim's own code (the trace function's, from its opcode events);
    without, the start of each function of the shim (the fast tier's bound), and no trace function.
    A generator's frames are left out: resumed, it does not check."""
    count = [0]

    def point() -> None:
        count[0] += 1
        if count[0] == 1 and on_first is not None:
            on_first()
        if count[0] == at:
            sys.setprofile(None)
            sys.settrace(None)
            raise KeyboardInterrupt

    def profile(frame: Any, event: str, arg: Any) -> None:
        if not every:
            if event != "call" or frame.f_code.co_flags & GENERATOR or not shim_code(frame.f_code):
                return
        elif event == "c_return":
            if not shim_code(frame.f_code):
                return
        elif (
            event not in ("call", "return")
            or frame.f_code.co_flags & GENERATOR
            or not (
                shim_code(frame.f_code)
                or (frame.f_back is not None and shim_code(frame.f_back.f_code))
            )
        ):
            return
        point()

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if event == "call":
            if frame.f_code.co_flags & GENERATOR or not shim_code(frame.f_code):
                return None
            frame.f_trace_lines, frame.f_trace_opcodes = False, True
        elif event == "opcode" and frame.f_code.co_code[frame.f_lasti] in BACKWARD:
            point()
        return trace

    return profile, trace if every else None, count


def steps(path: str, names: list[str]) -> list[tuple[str, Any]]:
    """The path's steps, with a process kind's imports ``names``: (what, a call)."""
    import importlib

    imported = [(name, partial(importlib.import_module, name)) for name in names]
    if (
        path == "install"
    ):  # an application's `import dspark_hotfix; dspark_hotfix.install()`, retried whole
        return [
            ("install()", lambda: importlib.import_module("dspark_hotfix").install("api")),
            *imported,
        ]
    if path == "plugin":  # plugins load after much of vLLM: here before the kind's last import
        return [*imported[:-1], ("load_general_plugins()", load_plugins), imported[-1]]
    return imported


def second_step(path: str, modules: list[str]) -> tuple[str, Any]:
    """What the second thread does: import the first target's module, right under the package the
    main thread executes (the start-up hook makes it wait for the activation), or call ``install()``
    (which waits for the registration under way)."""
    import importlib

    if path == "sitecustomize":
        return modules[0], partial(importlib.import_module, modules[0])
    import dspark_hotfix

    return "install()", lambda: dspark_hotfix.install("api")


def load_plugins() -> None:
    import vllm.plugins

    vllm.plugins.load_general_plugins()


def plugin_distribution(folder: str) -> None:
    """The shim's ``vllm.general_plugins`` entry point, visible to importlib.metadata from
    ``folder``."""
    info = os.path.join(folder, "dspark_hotfix-0.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: dspark_hotfix\nVersion: 0\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write("[vllm.general_plugins]\ndspark_hotfix = dspark_hotfix.plugin:register\n")
    sys.path.append(folder)


def run_point(
    path: str,
    kind: str,
    waiting: bool,
    every: bool,
    modules: list[str],
    at: int,
    out: int,
    folder: str,
) -> None:
    """One process of the sweep: the path interrupted at point ``at``, what the process does next,
    and what every reader says, written as JSON to ``out``."""
    stderr = os.open(os.path.join(folder, "stderr"), os.O_WRONLY | os.O_CREAT)
    os.dup2(stderr, 2)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = os.path.join(folder, "metrics")
    os.mkdir(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    second: list[threading.Thread] = []

    def start_second() -> None:
        thread = threading.Thread(
            target=run_steps, args=([second_step(path, modules)], []), daemon=True
        )
        second.append(thread)
        thread.start()
        time.sleep(0.005)  # it runs until it waits for what the main thread holds

    interrupted: list[str] = []
    profile, trace, count = profiler(at, start_second if waiting else None, every)
    sys.setprofile(profile)
    sys.settrace(trace)
    try:
        run_steps(steps(path, imports(kind, modules)), interrupted)
    finally:
        sys.setprofile(None)
        sys.settrace(None)
    for thread in second:
        thread.join(HUNG / 2)
    run_steps(steps("", [*modules, "prometheus_client"]), [])  # the engine's later imports
    result = {"points": count[0], "interrupted": interrupted, **readings()}
    os.write(out, json.dumps(result).encode())


def run_steps(todo: list[tuple[str, Any]], interrupted: list[str]) -> None:
    for what, call in todo:
        try:
            call()
        except KeyboardInterrupt:
            interrupted.append(what)
            call()  # what the process does next: the same again


def readings() -> dict[str, Any]:
    """What each reader says, and what the process does."""
    import prometheus_client
    from prometheus_client import multiprocess

    import dspark_hotfix
    from dspark_hotfix import doctor

    status = dspark_hotfix.status()
    files = prometheus_client.CollectorRegistry()
    multiprocess.MultiProcessCollector(
        files
    )  # vLLM's /metrics with more than one API server: read first
    served = {"multiprocess": scraped(files), "single": scraped(prometheus_client.REGISTRY)}
    sys.stderr.flush()
    with open("/proc/self/fd/2") as said:
        lines = [
            line for line in said.read().splitlines() if "dspark_hotfix" in line and " via " in line
        ]
    seen = {
        "depths": wrap_depths(),
        "calls": toy_calls(),
        "status": states(status),
        "line": last_state(lines),
        "rows": [
            {k: v for k, v in r.items() if k not in ("calls", "corrections")}
            for r in status["patches"]
        ],
        "status_line": status["verdict"],
        **served,
    }
    report = doctor.report("api")  # last: it imports and activates what nothing did
    return {**seen, "doctor": [report["verdict"], states(report)]}


def states(report: dict[str, Any]) -> dict[str, str]:
    return {row["name"]: row["state"] for row in report["patches"]}


def last_state(lines: list[str]) -> str | None:
    return lines[-1].partition(": ")[2] if lines else None


def scraped(registry: Any) -> dict[str, str]:
    import prometheus_client

    found = {}
    for line in prometheus_client.generate_latest(registry).decode().splitlines():
        if line.startswith("dspark_hotfix_patch_state{") and line.endswith(" 1.0"):
            labels = dict(
                p.split("=", 1) for p in line[line.index("{") + 1 : line.index("}")].split(",")
            )
            found[labels["patch"].strip('"')] = labels["state"].strip('"')
    return found


def sweep(
    path: str, kind: str, waiting: bool, every: bool = False, modules: list[str] | None = None
) -> None:
    """Every point of the path in turn, each in a forked process; prints the whole run's reading,
    then one JSON line per point whose reading differs from it (with its number), then the number of
    points. On the toys, or (``modules``: the real patches' targets) on the stand-in with the real
    patches."""
    if modules is None:
        use_toys()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = (
        tempfile.mkdtemp()
    )  # its values go to files (each point's own)
    sys.pycache_prefix, sys.dont_write_bytecode = (
        tempfile.mkdtemp(),
        False,
    )  # the shim compiled once, not per point
    import importlib.metadata  # noqa: F401  (what doctor reads)

    import prometheus_client  # noqa: F401
    import wrapt  # noqa: F401  (what the activation imports, but for its own modules: time, not points)

    for name in [name for name in sys.modules if name.split(".")[0] == "prometheus_client"]:
        del sys.modules[name]  # imported by the path, its standard library already here
    if path == "plugin":
        plugin_distribution(tempfile.mkdtemp())
    whole = fork_point(path, kind, waiting, every, modules or TOY_MODULES, 0)
    print(json.dumps(whole))
    for at in range(1, whole["points"] + 1):
        reading = fork_point(path, kind, waiting, every, modules or TOY_MODULES, at)
        if reading["points"] < at and waiting and "error" not in reading:
            continue  # this interleaving ended sooner: no such point
        if {k: v for k, v in reading.items() if k not in ("points", "interrupted")} != {
            k: v for k, v in whole.items() if k not in ("points", "interrupted")
        } or not reading["interrupted"]:
            print(json.dumps({"at": at, **reading}))
    print(json.dumps(whole["points"]))


def fork_point(
    path: str, kind: str, waiting: bool, every: bool, modules: list[str], at: int
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                run_point(path, kind, waiting, every, modules, at, w, folder)
            except BaseException as exc:
                os.write(
                    w, json.dumps({"points": -1, "interrupted": [], "error": repr(exc)}).encode()
                )
            finally:
                os._exit(0)
        os.close(w)
        timer = threading.Timer(HUNG, os.kill, (pid, 9))
        timer.start()
        with os.fdopen(r) as f:
            text = f.read()
        os.waitpid(pid, 0)
        timer.cancel()
        return (
            json.loads(text)
            if text
            else {"points": -1, "interrupted": [], "error": "hung, or no reading"}
        )
