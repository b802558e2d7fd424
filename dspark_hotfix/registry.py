"""The registry: when to patch, how, and what every problem means.

Interpreter start only inserts ``dspark_hotfix.VllmImportWatcher``; this module
is imported when ``vllm`` is imported. :func:`activate` registers one wrapt
post-import hook per patch. A hook fires when vLLM has imported the patch's
module (at once if it is imported already; a module another thread is still
importing is waited for), asks the patch's probe whether the running vLLM needs
it, and only then puts ``patch.replacement`` in front of vLLM's function. A
guard is decided once the patches it guards are. Each record holds one state;
:func:`status`, ``dspark-hotfix status`` and ``doctor``, and the log line all
read those states, and ``says`` is the one reading of them (the verdict, the line).

The log line: once every patch (guards aside) is judged, one INFO line gives
the verdict and every record's state; a later change (a guard decided when its
module is imported) gives a new, whole line. The last line of a pid is its state.

The failure policy is :func:`_fail`, and only it:

- a patch that cannot be applied (target missing, signature changed, wrapt
  missing or unusable, a probe that raised) is reported (``status()``, one
  warning) and vLLM runs unpatched;
- a correction that raises gives back vLLM's own answer, with one warning;
- a guard's finding is logged as an error (``draft_load_coverage``), except
  where the patch ``stops`` (``kv_view_guard``, ``kv_cache_groups``): vLLM is
  stopped with an error naming the cause, as it would stop anyway, less clearly;
- with ``DSPARK_HOTFIX_STRICT=1`` each of these raises :class:`HotfixError`,
  and every retry of the import it aborted raises it again.

Limits: ``importlib.reload`` of a target module builds new functions and wrapt's
hooks fire once per module, so a reloaded target runs unpatched (as with wrapt
itself); ``status()`` then reports the patch ``failed``. Nothing unwraps vLLM's
functions in a running process: ``DSPARK_HOTFIX=0`` and a restart do.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import logging
import os
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

import dspark_hotfix
from dspark_hotfix import config, metrics
from dspark_hotfix.patches import ALL, Finding, Patch

PENDING = "pending"  # not decided yet: its module is not imported (a guard: or its patches are undecided)
PATCHED = "patched"  # vLLM's function is wrapped
NOT_NEEDED = "not_needed"  # the running vLLM is already right: left untouched
EXCLUDED = "excluded"  # judged, never applied: DSPARK_HOTFIX_PATCHES leaves it off
FAILED = "failed"  # the target was imported but the patch could not be applied (or is no longer applied)
DISABLED = "disabled"  # the shim is off (judged, never applied, where doctor or status activate), or not installed
STATES = (PATCHED, NOT_NEEDED, PENDING, EXCLUDED, FAILED, DISABLED)  # what the verdict reads: see says.py
SCHEMA = 2


class HotfixError(RuntimeError):
    """Strict mode (or a stop): the shim stops vLLM, saying why."""


class Unavailable(Exception):
    """The running vLLM lacks the target, or its parameters are not the expected ones."""


class Absent(Unavailable):
    """The running vLLM has no such class or function."""


class Record:
    """One patch in this process: its state and what the state rests on."""

    def __init__(self, patch: Patch, state: str = PENDING, detail: str = "") -> None:
        self.patch, self.state = patch, state
        self.detail = detail or f"waiting for {patch.module}" + (f" and the verdicts of {', '.join(patch.guards)}"
                                                                 if patch.guards else "")
        self.needed: bool | None = None  # after the decision: None when it could not be judged
        self.calls = self.corrections = 0  # of the wrapper: the shim's whole cost while vLLM runs
        self.module: Any = None  # a guard's module, once imported
        self.wrapper: Any = None  # what vLLM's function was replaced with
        self.warned = False


class Activation:
    """The activation of the registry in this process."""

    def __init__(self, source: str) -> None:
        self.source, self.enabled, self.said = source, dspark_hotfix.enabled(), ""  # said: the last line's state
        self.settings = config.Settings(p.name for p in ALL)
        self.records = {p.name: Record(p) for p in ALL}
        self.thread = threading.get_ident()
        self.done = threading.Event()  # every hook is registered (or activation gave up)


# Guards `_active` and every state change. Never held while wrapt, vLLM's code
# or an import runs: hooks run under their module's import lock, and a thread
# holding this lock while waiting for that module would hang both.
_lock = threading.Lock()
_active: Activation | None = None
_log = logging.getLogger("dspark_hotfix")
if not _log.handlers:  # vLLM's format, on a handler of our own: vLLM's logging neither swallows nor doubles it
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(name)s] %(message)s", "%m-%d %H:%M:%S"))
    _log.addHandler(_handler)
    _log.propagate = False
    _log.setLevel(logging.INFO)


def _say(level: int, text: str) -> None:
    # This logger exists before vLLM configures logging (activation runs at `import vllm`): a
    # VLLM_LOGGING_CONFIG_PATH config without disable_existing_loggers=false would disable it and
    # lose the line. Naming "dspark_hotfix" in that config still sets its level.
    _log.disabled = False
    _log.log(level, "%s", text)


def _before_fork() -> None:
    """A fork waits (10 s at most) for another thread's activation: the child would inherit the import
    lock of ``vllm``, held by a thread it does not have, and hang on ``import vllm``. A fork during
    vLLM's own import (seconds long) hangs such a child all the same: that hazard is Python's."""
    if _active is not None and _active.thread != threading.get_ident():
        _active.done.wait(10)


def _after_fork_in_child() -> None:
    """Fresh locks, wrapt's too: its import finder takes that lock on every import, so one held at
    the fork would hang every import in the child. An activation the wait above gave up on stays as
    the fork left it (its undecided patches pending, never judged here) instead of hanging a caller."""
    global _lock
    _lock = threading.Lock()
    if hasattr(importer := sys.modules.get("wrapt.importer"), "_post_import_hooks_lock"):
        importer._post_import_hooks_lock = threading.RLock()  # type: ignore[union-attr]
    if _active is not None:
        _active.done.set()


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def install(source: str = "api") -> None:
    """Arrange for every selected patch to be applied; idempotent. ``source`` names
    the activation path (``sitecustomize``, ``vllm-plugin``, ``api``)."""
    dspark_hotfix.start(source)


def activate(source: str) -> None:
    """Register the post-import hooks. Whole or not started: a second caller waits
    until the first has registered every hook. With ``DSPARK_HOTFIX`` off (only
    ``doctor`` and ``status`` activate then) every patch is judged, none applied."""
    global _active
    with _lock:
        activation, mine = _active, _active is None
        if mine:
            activation = _active = Activation(source)
    assert activation is not None
    if not mine:
        if activation.thread != threading.get_ident():  # the same thread: a hook of this very activation
            activation.done.wait()
        return
    try:
        for problem in activation.settings.problems if activation.enabled else ():
            _say(logging.WARNING, problem)
        try:
            import wrapt

            for record in activation.records.values():
                name = record.patch.module
                if _initializing(name):  # another thread is importing it: wait, as hooks judge whole modules
                    with contextlib.suppress(Exception):  # (its own error is vLLM's to meet)
                        importlib.import_module(name)
                if _initializing(name):  # this very thread is, further up: no hook can judge it
                    record.detail = f"{name} was part-way imported by this thread when the shim activated"
                    continue
                wrapt.register_post_import_hook(functools.partial(_on_import, activation, record), name)
            wrapt.register_post_import_hook(functools.partial(metrics.on_import, activation), "prometheus_client")
        except HotfixError:  # a hook that fired at once: strict mode, or a stop
            raise
        except Exception as exc:  # absent, broken in this environment, or not the wrapt we know
            why = f"wrapt is not usable ({type(exc).__name__}: {exc})"
            for record in activation.records.values():
                _settle(activation, record, FAILED, None, why)
            _fail(activation, None, f"not active: {why}; install wrapt ({config.WRAPT_RANGE}) where vLLM runs, or "
                                    f"set {config.ENABLE}=0. vLLM runs unpatched.", cause=exc, refuse="vllm")
            return
    finally:
        activation.done.set()
    _follow(activation)


def _initializing(name: str) -> bool:
    return bool(getattr(getattr(sys.modules.get(name), "__spec__", None), "_initializing", False))


def _on_import(activation: Activation, record: Record, module: Any) -> None:
    if _active is not activation:  # a hook of an activation a fork left (the child started anew)
        return
    try:
        record.module = module
        _decide(activation, record, module)
        _follow(activation)
    except HotfixError as exc:  # strict mode: this import fails, and so must every retry of it
        _refuse(module.__name__, str(exc))
        raise


def _follow(activation: Activation) -> None:
    """After a decision: the guards it lets decide, the log line, then, once every other patch is
    judged and every hook registered, an ``everywhere`` patch whose module vLLM did not import here
    (``kv_cache_groups`` in a tensor-parallel worker): imported, so that its hook judges it, and this
    process gives the verdict every other process gives."""
    for guard in activation.records.values():
        if guard.patch.guards and guard.state == PENDING:
            _decide(activation, guard, guard.module)
    _summarize(activation)
    metrics.publish(activation)
    records = activation.records.values()
    if activation.done.is_set() and all(r.state != PENDING or r.patch.guards or r.patch.everywhere for r in records):
        for r in records:
            if r.state == PENDING and r.patch.everywhere and r.patch.module not in sys.modules:
                with contextlib.suppress(Exception):  # then it stays pending, and says what it waits for
                    importlib.import_module(r.patch.module)


def _decide(activation: Activation, record: Record, module: Any) -> None:
    """Judge ``record``'s patch on ``module``, then settle its one state. A guard is judged once the
    patches it guards are: not needed where none of them is (its module imported or not), else on its
    module (where a guarded patch failed too: the guard is there for that)."""
    patch, target = record.patch, None
    try:
        if patch.guards:
            guarded = [activation.records[name] for name in patch.guards]
            on = [r.patch.name for r in guarded if r.needed is not False]
            if any(r.state == PENDING for r in guarded) or (on and module is None):
                return
            needed: bool | None = bool(on)
            why = f"needed (guards {', '.join(on)})" if on else \
                f"not needed (guards {', '.join(patch.guards)}, none needed here)"
            if on:  # a guard of patches that are not needed never looks at vLLM
                target = resolve(patch, module)
        else:
            target = resolve(patch, module)
            assert patch.probe is not None
            needed, why = patch.probe(target[2])
        state = PATCHED if needed is not False else NOT_NEEDED
    except Absent as exc:
        needed, why, state = (False, f"not needed ({exc}: {patch.absent})", NOT_NEEDED) if patch.absent else \
            (None, str(exc), FAILED)
    except Exception as exc:  # Unavailable, or a probe that raised on a vLLM it does not know
        needed, state = None, FAILED
        why = str(exc) if isinstance(exc, Unavailable) else f"{type(exc).__name__}: {exc}"
    settled = _settle(activation, record, state, needed, why, target)
    if settled == FAILED:
        _fail(activation, patch, f"cannot patch {patch.target}: {why}; vLLM runs unpatched ({_remedy(patch)})")
    elif settled == EXCLUDED and needed is not False:
        _say(logging.WARNING, f"{config.PATCHES} leaves off what this vLLM needs: {patch.name}")


def _remedy(patch: Patch) -> str:
    return f"check `dspark-hotfix doctor`, or exclude it with {config.PATCHES}=-{patch.name}"


def _settle(activation: Activation, record: Record, state: str, needed: bool | None, why: str,
            target: tuple[Any, str, Any] | None = None) -> str | None:
    """Record the one decision on ``record``, exactly once, where the switches
    allow it; wrap vLLM's function if it is to be patched."""
    with _lock:
        if record.state != PENDING:
            return None
        if not activation.enabled:
            state, why = DISABLED, f"{config.ENABLE} turns the shim off; {why}"
        elif record.patch.name not in activation.settings.selected:
            state, why = EXCLUDED, f"excluded by {config.PATCHES}; {why}"
        elif state == PATCHED and target is not None:
            owner, name, original = target
            record.wrapper = _wrap(activation, record, original)
            setattr(owner, name, record.wrapper)
        record.state, record.needed, record.detail = state, needed, why
        return state


def _fail(activation: Activation, patch: Patch | None, message: str, *, stop: bool = False,
          level: int = logging.WARNING, cause: BaseException | None = None, refuse: str = "") -> None:
    """The one failure policy: say it and let vLLM run; in strict mode, or for a
    finding vLLM would not survive, stop it with the same words (and, where
    ``refuse`` names a module, every later import of it too)."""
    text = f"{patch.name}: {message}" if patch is not None else message
    if stop or activation.settings.strict:
        if refuse:
            _refuse(refuse, text)
        raise HotfixError(text) from cause
    _say(level, text)


def _refuse(module: str, error: str) -> None:
    """Strict mode: wrapt has dropped the hook whose HotfixError aborted ``module``'s
    import (or there is no usable wrapt to hook it); this finder fails every retry of
    that import the same way, instead of letting it load unpatched. Under the import
    lock it only compares a name."""
    def find_spec(fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname == module:
            raise HotfixError(error)

    sys.meta_path.insert(0, types.SimpleNamespace(find_spec=find_spec))


def _attribute(module: Any, qualname: str) -> tuple[Any, str, Any]:
    """The owner, name and value of the attribute ``qualname`` names in ``module`` (None: no such one)."""
    owner_name, dot, name = qualname.rpartition(".")
    owner = getattr(module, owner_name, None) if dot else module
    return owner, name, vars(owner).get(name) if isinstance(owner, (type, types.ModuleType)) else None


def resolve(patch: Patch, module: Any) -> tuple[Any, str, Callable[..., Any]]:
    """The owner, attribute name and plain function ``patch`` targets in ``module``."""
    owner, name, function = _attribute(module, patch.qualname)
    if function is None:
        raise Absent(f"{owner.__name__} defines no {name}" if isinstance(owner, (type, types.ModuleType)) else
                     f"{module.__name__} has no class {patch.qualname.rpartition('.')[0]}")
    if not inspect.isfunction(function):  # a staticmethod or another tool's proxy binds differently
        raise Unavailable(f"{patch.qualname} is a {type(function).__name__}, not a plain function")
    parameters = tuple(inspect.signature(function).parameters)
    if parameters != patch.parameters:
        raise Unavailable(f"unexpected signature {patch.qualname}({', '.join(parameters)}); "
                          f"expected ({', '.join(patch.parameters)})")
    return owner, name, function


def _wrap(activation: Activation, record: Record, original: Callable[..., Any]) -> Callable[..., Any]:
    """vLLM's function with the patch's replacement in front of it."""
    patch = record.patch

    @functools.wraps(original)
    def patched(*args: Any, **kwargs: Any) -> Any:
        record.calls += 1
        answered, answer, raising = False, None, False

        def vllm(*a: Any, **kw: Any) -> Any:
            nonlocal answered, answer, raising
            raising = True
            answer = original(*a, **kw)
            raising, answered = False, True
            return answer

        try:
            result = patch.replacement(vllm, *args, **kwargs)
        except Exception as exc:
            if raising:  # vLLM's own error passes through as it is
                raise
            if isinstance(exc, Finding):
                guarded = "".join(f"; {r.patch.name} {r.state} ({r.detail})" for r in
                                  (activation.records[name] for name in patch.guards))
                _fail(activation, patch, f"{exc}{guarded}; see `dspark-hotfix doctor`", stop=patch.stops,
                      level=logging.ERROR)
            elif not record.warned or activation.settings.strict:
                record.warned, what = True, "check" if patch.guards else "correction"
                record.detail += f"; {what} raised {type(exc).__name__}: {exc} (vLLM's own result returned)"
                _fail(activation, patch, f"{what} raised {type(exc).__name__}: {exc} in {patch.target}; vLLM's own "
                                         f"result is returned ({_remedy(patch)})", cause=exc)
            return answer if answered else original(*args, **kwargs)
        if not answered or result is not answer:
            record.corrections += 1
        return result

    return patched


def _summarize(activation: Activation) -> None:
    """The log line (``says.state_line``), once every patch is judged, again on every change after that."""
    from dspark_hotfix import says

    with _lock:
        line = says.state_line(activation) if activation.enabled else None
        if line is None or line == activation.said:
            return
        activation.said = line
    _say(logging.INFO, f"dspark_hotfix {dspark_hotfix.__version__} (pid {os.getpid()}) via {activation.source}: "
                       f"{line}")
