"""What a patch is: a target, a probe that decides, and the correction.

A patch module shows its correction first: a plain function that takes what
vLLM's function answered, then vLLM's arguments, and returns the answer vLLM's
caller gets. A stop has a check instead, called with vLLM's arguments before
vLLM's function runs. Patches never import the registry: a stop that finds what
vLLM would not survive raises :class:`Finding`, and the registry alone decides
what that means.
"""

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
    """What vLLM would not survive, seen by a stop: the registry stops vLLM with it."""


@dataclass(frozen=True)
class Patch:
    name: str
    module: str
    qualname: str  # "Class.method", or "function" for a module-level one
    parameters: tuple[str, ...]  # vLLM's, checked before wrapping
    # Whether the running vLLM needs the patch: calls vLLM's function with stand-in objects.
    probe: Callable[[Callable[..., Any]], Need]
    # correction(vllm_answer, /, *vLLM's arguments): the answer to return.
    correction: Callable[..., Any] | None = None
    # check(*vLLM's arguments), before vLLM's function runs: a stop's.
    check: Callable[..., Any] | None = None
    # Why a vLLM without the target does not need the patch; empty: a missing target is a failure.
    absent: str = ""
    # Judged in every process that judges the other patches: where vLLM never imports its (light)
    # module, the registry does, so that every process kind gives the same verdict.
    everywhere: bool = False

    @property
    def stops(self) -> bool:
        """A stop corrects nothing: it only stops vLLM early and clearly where vLLM would crash."""
        return self.correction is None

    @property
    def target(self) -> str:
        return f"{self.module}.{self.qualname}"
