"""What a patch is: a name, a target, a probe that decides, and a correction.

A patch module defines one :class:`Patch` subclass. The correction proper is a
plain function of values in the same module (a spec in, a spec out; a name in,
a name out), so it can be tested against real vLLM types without wrapt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


class PatchUnavailable(Exception):
    """The running vLLM lacks something the patch needs (class, method, helper)."""


class Verdict(NamedTuple):
    """Whether the running vLLM needs the patch, decided by calling its function.

    ``needed`` is None when the probe could not decide; the patch is then
    applied, because every correction leaves results that are already right
    untouched.
    """

    needed: bool | None
    detail: str


class Patch:
    name: str = ""
    module: str = ""
    qualname: str = ""  # "Class.method", or "function" for a module-level one
    parameters: tuple[str, ...] = ()
    summary: str = ""
    # Patches whose verdicts decide this one (a guard that only makes sense
    # where they apply): it waits for them, and is needed if any of them was
    # installed or failed to install.
    depends_on: tuple[str, ...] = ()

    @property
    def target(self) -> str:
        return f"{self.module}.{self.qualname}"

    def locate(self, module: Any) -> tuple[Any, str]:
        """Where the target lives in ``module``: (class or module, attribute name).

        ``qualname`` is ``Class.method`` for a method, or a bare name for a
        module-level function. The owner is None when the class is missing.
        """
        owner_name, dot, name = self.qualname.rpartition(".")
        if not dot:
            return module, name
        owner = getattr(module, owner_name, None)
        return (owner if isinstance(owner, type) else None), name

    def resolve(self, module: Any) -> tuple[Any, str, Any]:
        """The owner, attribute name and function this patch targets in ``module``.

        Raises PatchUnavailable when the running vLLM has no such class or
        function, or its parameters are not the ones the patch expects.
        """
        import inspect

        owner, name = self.locate(module)
        if owner is None:
            raise PatchUnavailable(f"{module.__name__} has no class {self.qualname.rpartition('.')[0]}")
        function = owner.__dict__.get(name)
        if function is None or not callable(function):
            where = owner.__name__ if isinstance(owner, type) else module.__name__
            raise PatchUnavailable(f"{where} defines no {'method' if owner is not module else 'function'} {name}")
        if not inspect.isfunction(function):
            # A staticmethod, classmethod or another tool's proxy: wrapping it in
            # a plain function would change how it binds.
            raise PatchUnavailable(f"{self.qualname} is a {type(function).__name__}, not a plain function")
        try:
            params = tuple(inspect.signature(function).parameters)
        except (TypeError, ValueError) as exc:
            raise PatchUnavailable(f"cannot read the signature of {self.qualname}: {exc}") from exc
        if params != self.parameters:
            raise PatchUnavailable(
                f"unexpected signature {self.qualname}({', '.join(params)}); "
                f"expected ({', '.join(self.parameters)})"
            )
        return owner, name, function

    def prepare(self, module: Any) -> None:
        """Resolve what the correction needs from vLLM; raise PatchUnavailable."""

    def probe(self, original: Any) -> Verdict:
        raise NotImplementedError

    # correct(result, *the target's arguments): what vLLM's function should have
    # returned for that call (``self`` is the first argument of a method);
    # ``result`` itself when it is right. It runs on every call of the target,
    # so each patch spells out the target's parameters (no packing) and takes
    # the fast way out first. Keyword arguments reach it only for targets of
    # other than two parameters: take ``result`` positional-only there
    # (``def correct(self, result, /, *args, **kwargs)``).
    correct: Callable[..., Any]

    def describe(self, before: Any, after: Any) -> str:
        """One line for the log: what the first correction changed."""
        return f"{before!r} -> {after!r}"
