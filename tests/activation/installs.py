"""The children of test_registry.py, as real Python: each function is one child process's whole run,
started in a fresh interpreter by ``tests.conftest.call_in_child``. Standard library (and
``tests.child``) only at the top.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from tests.child import (
    import_toy_targets,
    interrupt_registry,
    print_status,
    start_and_join,
    states,
    use_toys,
    wrap_depths,
)


def two_installs_at_once() -> None:
    """vLLM's plugin loader and an application's own call install at once, after vLLM is imported
    (no start-up hook), each decision slowed down; prints what each caller returns to, the wrap
    depths, and the patches decided (one entry per decision)."""
    import_toy_targets()
    use_toys()
    import dspark_hotfix
    from dspark_hotfix import registry

    decide, decided = registry._decide, []

    def slow(
        activation: Any, record: Any, module: Any
    ) -> Any:  # widen the window between the first and the last
        decided.append(record.patch.name)
        time.sleep(0.05)
        return decide(activation, record, module)

    registry._decide = slow
    barrier = threading.Barrier(2)
    seen = {}

    def install(source: str) -> None:
        barrier.wait()
        dspark_hotfix.install(source=source)
        seen[source] = states()  # what it returns to

    start_and_join([threading.Thread(target=install, args=(s,)) for s in ("vllm-plugin", "api")])
    print(json.dumps(seen))
    print(json.dumps(wrap_depths()))
    print(json.dumps(sorted(decided)))


def status_after_a_function_is_put_back() -> None:
    """Somebody else puts the toy build's function back; status() twice, and each patch's state."""
    use_toys()
    import_toy_targets()
    from vllm.toy_model import Greeter

    import dspark_hotfix

    Greeter.greet = Greeter.greet.__wrapped__  # somebody else puts the toy build's function back
    first = dspark_hotfix.status()
    print(
        json.dumps(
            [first == dspark_hotfix.status(), {r["name"]: r["state"] for r in first["patches"]}]
        )
    )


def install_after_vllm() -> None:
    """A late install(): vLLM's targets imported first, no start-up hook."""
    import_toy_targets()
    use_toys()
    import dspark_hotfix

    dspark_hotfix.install()
    print(json.dumps(wrap_depths()))
    print_status()


def install_three_times() -> None:
    """install() three times, as vLLM's plugin loader, in a process the start-up hook activated."""
    use_toys()
    import_toy_targets()
    import dspark_hotfix

    for _ in range(3):
        dspark_hotfix.install(source="vllm-plugin")
    print(json.dumps(wrap_depths()))
    print_status()


def activation_interrupted_then_retried(install: bool) -> None:
    """Ctrl-C lands as the start-up hook's activation puts the shim's finder in place; then the
    import is retried (and, with ``install``, install() called)."""
    use_toys()
    from dspark_hotfix import registry

    real = registry._register
    interrupt_registry(1, "_register")
    try:
        import vllm
    except KeyboardInterrupt:
        print("interrupted")
    registry._register = real
    import vllm  # noqa: F401

    if install:
        import dspark_hotfix

        dspark_hotfix.install()
    import_toy_targets()
    print_status()


def wrapt_without_its_chained_loader() -> None:
    """A wrapt whose importer has no ``_ImportHookChainedLoader`` (the loader the shim's finder
    hands out): install(), then every target imported as vLLM would."""
    use_toys()
    import wrapt.importer

    del wrapt.importer._ImportHookChainedLoader
    import dspark_hotfix

    dspark_hotfix.install()
    import_toy_targets()
    print(json.dumps(wrap_depths()))
    print_status()
