"""What a patch is: a name, a target, a probe that decides, and a correction.

A patch module defines one :class:`Patch` subclass. The correction proper is a
plain function of values in the same module (a spec in, a spec out; a name in,
a name out), so it can be tested against real vLLM types without wrapt.
"""

from __future__ import annotations

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
    qualname: str = ""  # "Class.method"
    parameters: tuple[str, ...] = ()
    summary: str = ""

    @property
    def target(self) -> str:
        return f"{self.module}.{self.qualname}"

    def resolve(self, module: Any) -> tuple[type, str, Any]:
        """The class, method name and function this patch targets in ``module``.

        Raises PatchUnavailable when the running vLLM has no such class or
        method, or the method's parameters are not the ones the patch expects.
        """
        import inspect

        class_name, _, method = self.qualname.partition(".")
        owner = getattr(module, class_name, None)
        if not isinstance(owner, type):
            raise PatchUnavailable(f"{module.__name__} has no class {class_name}")
        function = owner.__dict__.get(method)
        if function is None or not callable(function):
            raise PatchUnavailable(f"{class_name} defines no method {method}")
        try:
            params = tuple(inspect.signature(function).parameters)
        except (TypeError, ValueError) as exc:
            raise PatchUnavailable(f"cannot read the signature of {self.qualname}: {exc}") from exc
        if params != self.parameters:
            raise PatchUnavailable(
                f"unexpected signature {self.qualname}({', '.join(params)}); "
                f"expected ({', '.join(self.parameters)})"
            )
        return owner, method, function

    def prepare(self, module: Any) -> None:
        """Resolve what the correction needs from vLLM; raise PatchUnavailable."""

    def probe(self, original: Any) -> Verdict:
        raise NotImplementedError

    def correct(self, instance: Any, args: tuple, kwargs: dict, result: Any) -> Any:
        """Return ``result`` itself when it is right, else the corrected value."""
        raise NotImplementedError

    def describe(self, before: Any, after: Any) -> str:
        """One line for the log: what the first correction changed."""
        return f"{before!r} -> {after!r}"
