"""What a patch is: a target, a probe that decides, and the replacement.

A patch module shows its replacement first: a plain function that takes vLLM's
own function as its first argument (positional-only). It calls vLLM first and passes the answer through a correction,
a plain function of values. A stop raises its finding before calling vLLM.
Patches never import the registry: a guard that finds something wrong raises
:class:`Finding`, and the registry alone decides what that means.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple


class Need(NamedTuple):
    """Whether the running vLLM needs a patch: the probe's answer, from calling vLLM's own function.

    ``needed`` is None when the probe could not decide; the patch is then
    applied, because every correction returns answers that are right unchanged.
    """

    needed: bool | None
    detail: str


class Finding(Exception):
    """A guard saw what the patches it guards exist to prevent."""


@dataclass(frozen=True)
class Patch:
    name: str
    module: str
    qualname: str  # "Class.method", or "function" for a module-level one
    parameters: tuple[str, ...]  # vLLM's, checked before wrapping
    replacement: Callable[..., Any]  # replacement(vllm_function, /, *vLLM's arguments)
    # A patch: calls vLLM's function with stand-in objects. None for a guard.
    probe: Callable[[Callable[..., Any]], Need] | None = None
    # A guard: the patches it guards; it is needed where any of them is.
    guards: tuple[str, ...] = ()
    # Why a vLLM without the target does not need the patch; empty: a missing target is a failure.
    absent: str = ""
    # A finding stops vLLM (it would not survive it anyway); otherwise it is logged as an error.
    stops: bool = False
    # Judged in every process that judges the other patches: where vLLM never imports its (light)
    # module, the registry does, so that every process kind gives the same verdict.
    everywhere: bool = False

    @property
    def target(self) -> str:
        return f"{self.module}.{self.qualname}"
