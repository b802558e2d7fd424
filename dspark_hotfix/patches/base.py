"""What a patch is: a target, a probe that decides, and the correction.

A patch module shows its steps first, plain functions around one call of vLLM's
function. ``arguments`` runs before it, with vLLM's arguments, and gives the
arguments to call it with (None: as they are): it repairs a call that would fail.
``correction`` runs after it: it takes what vLLM's function answered, then vLLM's
arguments, and returns the answer vLLM's caller gets. A stop corrects nothing: its
``arguments`` step only raises :class:`Finding` where vLLM would not survive.
Patches never import the registry; the registry alone decides what a finding means.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple


class Need(NamedTuple):
    """Whether the running vLLM needs a patch: the probe's answer, from calling vLLM's own function.

    ``needed`` is None when the probe could not decide: the patch is then not applied, and the
    verdict is ``undecided``.
    """

    needed: bool | None
    detail: str


class Finding(Exception):
    """What vLLM would not survive, seen by a stop: the registry stops vLLM with it."""


@dataclass(frozen=True)
class Patch:
    name: str
    # The target's module; ``also_in``: where other releases define it, the same qualname in
    # another module (one fix, several places). One place per release holds it.
    module: str
    qualname: str  # "Class.method", or "function" for a module-level one
    parameters: tuple[str, ...]  # vLLM's, checked before wrapping
    # Whether the running vLLM needs the patch: calls vLLM's function with stand-in objects.
    probe: Callable[[Callable[..., Any]], Need]
    # arguments(*vLLM's arguments), before vLLM's function runs: None to call it with them as they
    # are, or the (args, kwargs) to call it with instead. By default, None.
    arguments: Callable[..., tuple[tuple[Any, ...], dict[str, Any]] | None] = (
        lambda *args, **kwargs: None
    )
    # correction(vllm_answer, /, *vLLM's arguments): the answer to return. By default, vLLM's
    # answer.
    correction: Callable[..., Any] = lambda answer, /, *args, **kwargs: answer
    # A stop corrects nothing: its arguments step only stops vLLM, early and clearly, where vLLM
    # would crash.
    stops: bool = False
    # Where no place of the running vLLM holds the target: the probe that shows whether the bug can
    # happen there all the same (it calls vLLM's functions as ``probe`` does). None: a missing
    # target is a failure.
    absent: Callable[[], Need] | None = None
    also_in: tuple[str, ...] = ()
    # Judged in every process that judges the other patches: where vLLM never imports its (light)
    # module, the registry does, so that every process kind gives the same verdict.
    everywhere: bool = False

    @property
    def modules(self) -> tuple[str, ...]:
        return (self.module, *self.also_in)
