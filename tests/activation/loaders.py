"""The children of test_import_watcher.py, as real Python: each function is one child process's
whole run, started in a fresh interpreter by ``tests.conftest.call_in_child`` (the repository first
on its path: the start-up hook active). Each imports vLLM the way the tool it mimics does (ddtrace's
module watchdog, wrapt's importer, importlib's lazy loader, an availability check), then prints
status() as its last line. Standard library (and ``tests.child``) only at the top.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import pickle
import sys
import types
from collections.abc import Callable
from typing import Any

from tests.child import import_toy_targets, print_status, use_toys


def copies_of(spec: Any) -> list[Any]:
    """The spec's type of loader, and whether each copy of the spec (copy, deepcopy, pickle) and of
    its loader still reads the module's file."""
    copies = [
        copy.copy(spec),
        copy.deepcopy(spec),
        pickle.loads(pickle.dumps(spec)),
        copy.copy(spec.loader),
    ]
    return [type(spec.loader).__name__] + [
        (c.loader if hasattr(c, "loader") else c).get_filename(spec.name) == spec.origin
        for c in copies
    ]


def then_status() -> None:
    import_toy_targets()
    print_status()


def vllm_spec_copied_before_the_import() -> None:
    """Availability checks call find_spec("vllm") before vLLM is imported: its loader is the
    proxy."""
    use_toys()
    print(json.dumps(copies_of(importlib.util.find_spec("vllm"))))
    then_status()


def hooked_specs_copied_before_their_import(module: str) -> None:
    """Once vLLM is imported, wrapt's finder gives each hook target not imported yet (``module``,
    and prometheus_client) its own proxy loader: copies of those specs, then the imports."""
    use_toys()
    import vllm  # noqa: F401

    for name in (module, "prometheus_client"):
        print(json.dumps(copies_of(importlib.util.find_spec(name))))
    import_toy_targets()
    import prometheus_client

    print(b"dspark_hotfix_info{" in prometheus_client.generate_latest())
    print_status()


def vllm_executed_from_its_spec_outside_sys_modules() -> None:
    """A version probe runs vLLM's package module without importing it: the real import follows."""
    use_toys()
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    print(module.__version__)
    then_status()


def outer_finder(
    exec_module: Callable[[Any, Any], None],
    create_module: Callable[[Any, Any], Any] | None = None,
) -> None:
    """A finder ahead of the watcher that wraps whatever loader the finders after it give (the
    watcher's proxy) in an ``Outer`` loader, the way ddtrace's ModuleWatchdog does:
    ``exec_module(outer, module)`` is its exec_module, ``create_module(outer, spec)`` its
    create_module (by default the inner one's)."""

    class Outer:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def create_module(self, spec: Any) -> Any:
            return create_module(self, spec) if create_module else self.inner.create_module(spec)

        def exec_module(self, module: Any) -> None:
            exec_module(self, module)

    class OuterFinder:
        def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
            if name != "vllm":
                return None
            for finder in sys.meta_path[sys.meta_path.index(self) + 1 :]:
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    spec.loader = Outer(spec.loader)  # type: ignore[assignment]  # a loader without the abc
                    return spec
            return None

    sys.meta_path.insert(0, OuterFinder())


def loader_wrapped_around_the_proxy() -> None:
    """The outer loader sees its own object in __loader__ and __spec__.loader while the proxy
    runs."""
    use_toys()

    def exec_module(outer: Any, module: Any) -> None:
        outer.inner.exec_module(module)
        print(module.__loader__ is outer, module.__spec__.loader is outer)

    outer_finder(exec_module)
    import vllm

    print(type(vllm.__loader__).__name__)
    then_status()


def vllms_own_loaders() -> None:
    """With nothing wrapped around the proxy: the types of vLLM's __loader__ and __spec__.loader."""
    use_toys()
    import vllm

    print(type(vllm.__loader__).__name__, type(vllm.__spec__.loader).__name__)


def module_refusing_its_loader() -> None:
    """A module type whose __loader__ is read-only (the proxy, given at creation)."""
    use_toys()

    class Refusing(types.ModuleType):
        given: Any = None
        __loader__ = property(lambda module: module.given)

    def create_module(outer: Any, spec: Any) -> Any:
        module = Refusing(spec.name)
        module.given = outer.inner
        return module

    outer_finder(lambda outer, module: outer.inner.exec_module(module), create_module)
    import vllm

    print(type(vllm).__name__, type(vllm.__loader__).__name__, type(vllm.__spec__.loader).__name__)
    then_status()


def get_code_set_on_the_proxy() -> None:
    """ddtrace's watchdog (ddtrace/internal/module.py) assigns get_code on the loader it wraps, to
    transform the module's code."""
    use_toys()

    def exec_module(outer: Any, module: Any) -> None:
        original, transformed = outer.inner.get_code, []

        def get_code(fullname: str) -> Any:
            transformed.append(fullname)
            return original(fullname)

        outer.inner.get_code = get_code
        outer.inner.exec_module(module)
        print(transformed)

    outer_finder(exec_module)
    import vllm  # noqa: F401

    then_status()


def vllm_through_the_lazy_loader() -> None:
    use_toys()
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.loader is not None
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules["vllm"] = module
    spec.loader.exec_module(module)
    print(type(module.__loader__).__name__, type(module).__name__)
    then_status()


def wrapt_hook_on_vllm_registered_before_the_import() -> None:
    """wrapt's own finder goes ahead of the watcher and wraps the proxy in its chained loader."""
    use_toys()
    import wrapt

    fired: list[str] = []
    wrapt.register_post_import_hook(
        lambda module: fired.append(type(module.__loader__).__name__), "vllm"
    )
    import vllm  # noqa: F401

    print(fired)
    then_status()


def loaders_of_vllm_modules_after_activation() -> None:
    """The loader the finders give vLLM's modules: the package (the first import, which activates),
    then a module imported once the activation is whole."""
    use_toys()
    print(type(importlib.util.find_spec("vllm").loader).__name__)  # type: ignore[union-attr]
    import vllm  # noqa: F401

    print(type(importlib.util.find_spec("vllm.envs").loader).__name__)  # type: ignore[union-attr]
