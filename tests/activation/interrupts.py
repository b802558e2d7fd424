"""The children of test_never_undone.py, as real Python: each function is one child process's whole
run, started in a fresh interpreter by ``tests.conftest.call_in_child`` with the stand-in alone on
its path (no start-up hook; the repository goes last, so the shim is imported only where the child
asks).

The interrupts are made where they land by the child itself (the registry's decision raises
``KeyboardInterrupt`` at a chosen call), never by a branch in the shim. Standard library (and
``tests.child``) only at the top.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from tests.child import (
    import_toy_targets,
    interrupt_registry,
    print_status,
    slow_import,
    states,
    use_toys,
    wrap_depths,
)


def plugin_interrupted(at: int) -> None:
    """vLLM calls a plugin once per process: its activation interrupted at the ``at``-th
    decision."""
    use_toys()
    import_toy_targets()
    interrupt_registry(at)
    from dspark_hotfix import plugin

    try:
        plugin.register()
        print(json.dumps(["not interrupted"]))
    except KeyboardInterrupt:
        print(json.dumps(["interrupted"]))
    print(json.dumps(wrap_depths()))
    print_status()


def waiter_of_an_interrupted_activation() -> None:
    """The main thread's activation is interrupted while a second thread waits for it in
    install()."""
    use_toys()
    import_toy_targets()
    import dspark_hotfix

    # the other thread is in install() by the time the interrupt lands, waiting for this activation
    inside = interrupt_registry(2, main_thread_only=True, pause=0.3)
    seen: dict[str, Any] = {}

    def other() -> None:
        inside.wait(5)
        dspark_hotfix.install("api")
        seen["waiter"] = states()

    thread = threading.Thread(target=other)
    thread.start()
    try:
        dspark_hotfix.install("vllm-plugin")
    except KeyboardInterrupt:
        seen["main"] = "interrupted"
    thread.join(10)
    print(json.dumps(seen))
    print(json.dumps(wrap_depths()))


def hook_interrupted_during_its_modules_import() -> None:
    """wrapt drops a module's hooks as it runs them: an interrupt in the decision ends the import,
    which is then retried."""
    use_toys()
    import dspark_hotfix
    from dspark_hotfix import registry

    dspark_hotfix.install("api")
    real = registry._decide
    done: list[int] = []

    def interrupted(activation: Any, record: Any, module: Any) -> Any:
        if not done:
            done.append(1)
            raise KeyboardInterrupt
        return real(activation, record, module)

    registry._decide = interrupted
    try:
        import vllm.toy_model  # noqa: F401
    except KeyboardInterrupt:
        print(json.dumps(["interrupted"]))
    registry._decide = real
    import_toy_targets()
    print(json.dumps(wrap_depths()))
    print_status()


def fork_while_a_thread_imports() -> None:
    """A thread of the parent is part-way through importing the planner's module when the parent
    forks; the child loads the plugin, as a forked worker does, and prints each patch's state and
    detail."""
    use_toys()
    release = threading.Event()  # the planner's import lock held in the importing thread until set
    inside = slow_import("vllm.toy_planner", "importer", release=release)
    import vllm.toy_model  # noqa: F401

    import dspark_hotfix.registry  # the shim loaded, as in any vLLM process where its plugin is

    importer = threading.Thread(target=lambda: __import__("vllm.toy_planner"), name="importer")
    importer.start()
    inside.wait(5)
    pid = os.fork()
    if pid == 0:
        import dspark_hotfix

        dspark_hotfix.install(
            "vllm-plugin"
        )  # a forked worker's plugin load: it must not wait for that import
        rows = {r["name"]: [r["state"], r["detail"]] for r in dspark_hotfix.status()["patches"]}
        print(json.dumps(rows), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
    release.set()
    importer.join()


def metrics_after_an_interrupted_activation_and_a_whole_one() -> None:
    """The scrape-time collector's gauges and status(), after an activation interrupted at its third
    decision and a whole one."""
    use_toys()
    import_toy_targets()
    import prometheus_client

    interrupt_registry(3)
    import dspark_hotfix

    try:
        dspark_hotfix.install("api")
    except KeyboardInterrupt:
        pass
    dspark_hotfix.install("api")
    gauges = {}
    for line in prometheus_client.generate_latest().decode().splitlines():
        if line.startswith("dspark_hotfix_patch_state{") and line.endswith(" 1.0"):
            labels = dict(
                part.split("=") for part in line[line.index("{") + 1 : line.index("}")].split(",")
            )
            gauges[labels["patch"].strip('"')] = labels["state"].strip('"')
    print(json.dumps([gauges, states()]))


def fork_after_a_whole_activation() -> None:
    """A child forked after the plugin's activation: its wrap depths and states, written to the
    parent."""
    use_toys()
    import_toy_targets()
    import dspark_hotfix

    dspark_hotfix.install("vllm-plugin")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, json.dumps([wrap_depths(), states()]).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        print(f.read())
    os.waitpid(pid, 0)
