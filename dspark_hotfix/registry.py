"""The registry: when to patch, how, and what every problem means.

Interpreter start only inserts ``dspark_hotfix.VllmImportWatcher``; this module
is imported when vLLM imports the package of a patch's target. :func:`activate`
registers one wrapt post-import hook per patch. A hook fires when vLLM imports
the patch's module (at once if it is imported already), asks the patch's probe
whether the running vLLM needs it, and only then puts ``patch.replacement`` in
front of vLLM's function. A guard is decided by the patches it guards.

The failure policy lives here and only here:

- a patch that cannot be applied (target missing, signature changed, wrapt
  missing) is reported (``status()``, one warning) and vLLM runs unpatched;
- a correction that raises gives back vLLM's own answer, with one warning;
- a guard's finding is logged as an error (``draft_load_coverage``), except
  ``kv_view_guard``'s, which stops vLLM with an error naming the layers and the
  patch that did not apply: the views it found are ones FlashMLA rejects at the
  first decode, so vLLM would stop anyway, with a less useful message;
- with ``DSPARK_HOTFIX_STRICT=1`` each of these raises :class:`HotfixError`.

Limits, stated rather than handled: ``importlib.reload`` of a target module
builds new functions and wrapt's hooks fire once per module, so a reloaded
target runs unpatched (as with wrapt itself); ``uninstall()`` restores the
functions it wrapped, not copies that other modules took by name.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import dspark_hotfix
from dspark_hotfix import config
from dspark_hotfix.patches import ALL, Finding, Patch, Verdict

PENDING = "pending"  # the target module is not imported yet (or a guard waits for its patches)
INSTALLED = "installed"  # vLLM's function is wrapped
NOT_NEEDED = "not_needed"  # the running vLLM is already right: left untouched
EXCLUDED = "excluded"  # switched off by DSPARK_HOTFIX_PATCHES; still probed, to warn if needed
FAILED = "failed"  # the target was imported but the patch could not be applied
DISABLED = "disabled"  # the shim is off, or not installed in this process

SCHEMA = 1
STOPS = frozenset({"kv_view_guard"})  # findings vLLM would not survive anyway


class HotfixError(RuntimeError):
    """Strict mode (or kv_view_guard): the shim stops vLLM, saying why."""


class Unavailable(Exception):
    """The running vLLM lacks the target, or its parameters are not the expected ones."""


class Record:
    """One patch in this process."""

    def __init__(self, patch: Patch, state: str, detail: str) -> None:
        self.patch, self.state, self.detail = patch, state, detail
        self.needed: bool | None = None
        self.corrections = 0
        self.claimed = False  # a thread is deciding it, or has decided it
        self.decided = False
        self.module: Any = None  # a guard's module, once imported: decided when its patches are
        self.owner: Any = None
        self.original: Any = None
        self.wrapper: Any = None
        self.warned = False


# Guards claims and the building of the records; never held while vLLM code
# runs: hooks run under the import lock of their module, and a probe that
# waited for a module another thread is hooking would deadlock.
_lock = threading.RLock()
_records: dict[str, Record] = {}
_activated_by: str | None = None
_summarized = False
_settings: config.Settings | None = None


def settings() -> config.Settings:
    global _settings
    if _settings is None:
        _settings = config.Settings()
    return _settings


def logger() -> Any:
    """The ``dspark_hotfix`` logger, in vLLM's format, with a handler of its own so
    that vLLM's logging configuration neither swallows nor doubles its lines."""
    import logging

    log = logging.getLogger("dspark_hotfix")
    with _lock:
        if not log.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(name)s] %(message)s",
                                                   "%m-%d %H:%M:%S"))
            log.addHandler(handler)
            log.propagate = False
            log.setLevel(settings().level)
    return log


def install(source: str = "api") -> None:
    """Arrange for every selected patch to be applied; idempotent. ``source`` names
    the activation path (``sitecustomize``, ``vllm-plugin``, ``api``)."""
    dspark_hotfix.start(source)


def activate(source: str) -> None:
    """Register the post-import hooks now: the targets' packages are being imported."""
    global _activated_by
    if not dspark_hotfix.enabled():
        return
    with _lock:
        if _records:  # another thread, or the other activation path, got here first
            return
        selected, problems = settings().selection(p.name for p in ALL)
        for p in ALL:
            on = p.name in selected
            _records[p.name] = Record(p, PENDING if on else EXCLUDED,
                                      f"waiting for {p.module}" if on else f"excluded by {config.PATCHES}")
        _activated_by = source
        records = list(_records.values())
    for problem in settings().problems + problems:
        logger().warning(problem)
    try:
        import wrapt
    except Exception as exc:  # absent, or broken in this environment
        why = f"wrapt is not importable ({type(exc).__name__}: {exc})"
        for record in records:
            record.state, record.detail, record.claimed, record.decided = FAILED, why, True, True
        remedy = f"install wrapt ({config.WRAPT_RANGE}) where vLLM runs, or set {config.ENABLE}=0"
        if settings().strict:
            raise HotfixError(f"{why}; {remedy}") from exc
        logger().warning("not active: %s; %s. vLLM runs unpatched.", why, remedy)
        return
    for record in records:
        wrapt.register_post_import_hook(functools.partial(_on_import, record), record.patch.module)


def _on_import(record: Record, module: Any) -> None:
    if record.patch.guards:
        record.module = module
        if record.state == PENDING:
            record.detail = f"waiting for the verdicts of {', '.join(record.patch.guards)}"
    else:
        _decide(record, module)
    for guard in list(_records.values()):
        if guard.patch.guards and guard.module is not None:
            _decide(guard, guard.module)
    _summarize()


def _states() -> dict[str, tuple[str, bool | None]]:
    return {name: (r.state if r.decided else PENDING, r.needed) for name, r in _records.items()}


def _decide(record: Record, module: Any) -> None:
    patch = record.patch
    if patch.guards and guard_verdict(patch, _states()) is None:
        return  # decided once the patches it guards are
    with _lock:  # one thread decides each patch, once; none after uninstall()
        if record.claimed or _records.get(patch.name) is not record:
            return
        record.claimed = True
    try:
        verdict, target = judge(patch, module, _states())
        assert verdict is not None
        record.needed = verdict.needed
        if record.state == EXCLUDED:
            record.detail = f"excluded by {config.PATCHES}; {verdict.detail}"
        elif verdict.needed is False:
            record.state, record.detail = NOT_NEEDED, verdict.detail
        else:
            owner, name, original = target
            record.wrapper = _wrap(record, original)
            record.owner, record.original = owner, original
            setattr(owner, name, record.wrapper)
            record.state, record.detail = INSTALLED, verdict.detail
        logger().debug("%s: %s: %s", patch.name, record.state, record.detail)
    except Unavailable as exc:
        if record.state == EXCLUDED:
            record.detail = f"excluded by {config.PATCHES}; {exc}"
        else:
            _fail(record, str(exc))
    except HotfixError:
        raise
    except Exception as exc:  # a probe is written never to raise; belt and braces
        _fail(record, f"{type(exc).__name__}: {exc}")
    finally:
        record.decided = True


def judge(patch: Patch, module: Any, states: dict[str, tuple[str, bool | None]]) -> tuple[Verdict | None, Any]:
    """The registry's decision on ``patch`` for the imported ``module``: its verdict
    (None: a guard whose patches are undecided) and its target (owner, name, function).
    Raises :class:`Unavailable`. Used by the hooks and by ``doctor``."""
    if patch.guards:
        verdict = guard_verdict(patch, states)
        # A guard of patches that are not needed never looks at vLLM.
        return verdict, resolve(patch, module) if verdict is not None and verdict.needed is not False else None
    target = resolve(patch, module)
    assert patch.probe is not None
    return patch.probe(target[2]), target


def resolve(patch: Patch, module: Any) -> tuple[Any, str, Callable[..., Any]]:
    """The owner, attribute name and plain function ``patch`` targets in ``module``."""
    import inspect

    owner_name, dot, name = patch.qualname.rpartition(".")
    owner: Any = getattr(module, owner_name, None) if dot else module
    if dot and not isinstance(owner, type):
        raise Unavailable(f"{module.__name__} has no class {owner_name}")
    function = vars(owner).get(name)
    if function is None:
        raise Unavailable(f"{owner.__name__} defines no {name}")
    if not inspect.isfunction(function):  # a staticmethod or another tool's proxy binds differently
        raise Unavailable(f"{patch.qualname} is a {type(function).__name__}, not a plain function")
    parameters = tuple(inspect.signature(function).parameters)
    if parameters != patch.parameters:
        raise Unavailable(f"unexpected signature {patch.qualname}({', '.join(parameters)}); "
                          f"expected ({', '.join(patch.parameters)})")
    return owner, name, function


def guard_verdict(guard: Patch, states: dict[str, tuple[str, bool | None]]) -> Verdict | None:
    """A guard is needed where a patch it guards is needed, or could not be judged
    (failed, probe inconclusive); None while one of them is undecided."""
    guarded = [(name, *states[name]) for name in guard.guards if name in states]
    if any(state == PENDING for _, state, _ in guarded):
        return None
    on = [name for name, state, needed in guarded if state == FAILED or (state != DISABLED and needed is not False)]
    if on:
        return Verdict(True, f"needed (guards {', '.join(on)})")
    return Verdict(False, f"not needed (guards {', '.join(guard.guards)}, none needed here)")


def _wrap(record: Record, original: Callable[..., Any]) -> Callable[..., Any]:
    """vLLM's function with the patch's replacement in front of it."""
    replacement = record.patch.replacement

    @functools.wraps(original)
    def patched(*args: Any, **kwargs: Any) -> Any:
        returned: list[Any] = []

        def vllm(*a: Any, **kw: Any) -> Any:
            returned.append(original(*a, **kw))
            return returned[0]

        try:
            result = replacement(vllm, *args, **kwargs)
        except Exception as exc:
            if not returned:  # raised by vLLM's own function: its error, as it is
                raise
            return _after_vllm(record, exc, returned[0])
        if result is not returned[0]:
            record.corrections += 1
            if record.corrections == 1:
                logger().debug("%s: first correction: %s -> %s", record.patch.name, returned[0], result)
        return result

    return patched


def _after_vllm(record: Record, exc: Exception, result: Any) -> Any:
    """A problem raised once vLLM's function had answered: decide what it means."""
    patch = record.patch
    if isinstance(exc, Finding):
        why = f"{patch.name}: {exc}. " + "; ".join(
            f"{name} {_records[name].state} ({_records[name].detail})" for name in patch.guards if name in _records
        )
        if patch.name in STOPS or settings().strict:
            raise HotfixError(f"{why}; see `dspark-hotfix doctor`, or run a vLLM with PR #47716 (>= 0.25.0)") \
                from None
        logger().error("%s", why)
        return result
    why = f"correction raised {type(exc).__name__}: {exc}"
    if settings().strict:
        raise HotfixError(f"{patch.name}: {why} in {patch.target}; vLLM's own result was not changed "
                          f"({_remedy(patch)})") from exc
    if not record.warned:
        record.warned = True
        record.detail = f"{record.detail}; {why} (vLLM's own result returned)"
        logger().warning("%s: %s; vLLM's own result is returned", patch.name, why)
    return result


def _remedy(patch: Patch) -> str:
    return f"check `dspark-hotfix doctor`, or exclude it with {config.PATCHES}=-{patch.name}"


def _fail(record: Record, why: str) -> None:
    patch = record.patch
    record.state, record.detail = FAILED, why
    if settings().strict:
        raise HotfixError(f"{patch.name}: cannot patch {patch.target}: {why} ({_remedy(patch)})")
    logger().warning("%s: not applied to %s: %s; vLLM runs unpatched (%s)", patch.name, patch.target, why,
                     _remedy(patch))


def _summarize() -> None:
    """One INFO line per process, once every patch (not guard) is decided."""
    global _summarized
    records = list(_records.values())
    with _lock:
        if _summarized or not all(r.decided for r in records if not r.patch.guards):
            return
        _summarized = True
    states = _states()
    left_off = [r.patch.name for r in records if r.state == EXCLUDED and _needed(r, states)]
    if left_off:
        logger().warning("%s leaves off what this vLLM needs: %s", config.PATCHES, ", ".join(left_off))
    head = f"dspark_hotfix {dspark_hotfix.__version__} (pid {os.getpid()}) via {_activated_by}"
    patches = [r for r in records if not r.patch.guards]
    if all(r.state == NOT_NEEDED for r in patches):
        logger().info("%s: not needed on this vLLM (fixed upstream), removable", head)
        return
    counts = {INSTALLED: "patched", NOT_NEEDED: "not needed", EXCLUDED: "excluded", FAILED: "failed"}
    parts = []
    for state, word in counts.items():
        names = [r.patch.name for r in patches if r.state == state]
        if names:
            parts.append(f"{len(names)} {word}" + (f" ({', '.join(names)})" if state in (EXCLUDED, FAILED) else ""))
    guards = [r for r in records if r.patch.guards and r.state != EXCLUDED]
    on = sum(1 for r in guards if _needed(r, states))
    logger().info("%s: %s, %d guards on", head, ", ".join(parts), on)


def _needed(record: Record, states: dict[str, tuple[str, bool | None]]) -> bool | None:
    verdict = guard_verdict(record.patch, states) if record.patch.guards else record
    return verdict.needed if verdict is not None else None


def uninstall() -> dict[str, Any]:
    """Put vLLM's original functions back and stop watching imports."""
    global _records, _activated_by, _summarized
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, dspark_hotfix.VllmImportWatcher)]
    with _lock:
        records, _records = _records, {}
        _activated_by, _summarized = None, False
    for record in records.values():
        name = record.patch.qualname.rpartition(".")[2]
        if record.state == INSTALLED and vars(record.owner).get(name) is record.wrapper:
            setattr(record.owner, name, record.original)
    return status()


def status() -> dict[str, Any]:
    """What the shim did in this process; reads state, changes nothing."""
    watcher = next((f for f in sys.meta_path if isinstance(f, dspark_hotfix.VllmImportWatcher)), None)
    records = list(_records.values())
    if not records:
        if not dspark_hotfix.enabled():
            state, detail = DISABLED, f"{config.ENABLE}={os.environ.get(config.ENABLE)!r} turns the shim off"
        elif watcher is not None:
            state, detail = PENDING, "waiting for vLLM to import the DeepSeek-V4 modules"
        else:
            state, detail = DISABLED, "not installed in this process"
        records = [Record(p, state, detail) for p in ALL]
    return {
        "schema": SCHEMA,
        "version": dspark_hotfix.__version__,
        "pid": os.getpid(),
        "activated_by": _activated_by or getattr(watcher, "source", None),
        "enabled": dspark_hotfix.enabled(),
        "strict": settings().strict,
        "patches": [
            {"name": r.patch.name, "target": r.patch.target, "state": r.state, "needed": r.needed,
             "corrections": r.corrections, "detail": r.detail}
            for r in records
        ],
    }
