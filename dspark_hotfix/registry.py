"""The registry: when to patch, how, and what every failure means.

Interpreter start only inserts the start-up hook's ``VllmImportWatcher``; this module
is imported when ``vllm`` is. :func:`activate` puts the shim's finder (:func:`_find`)
ahead of wrapt's: from then on it hands each load of a patch's module wrapt's
loader, which runs the patch's post-import hook once the module has run (wrapt's
finder, which can hang two importing threads, is never asked). A module loaded
before is judged by ``activate`` itself, once whole: a load under way in another
thread is waited for, outside the registration's lock. A hook
asks the patch's probe whether the running vLLM needs the patch, and only then
wraps vLLM's function: its answer goes through ``patch.correction``.
Each record holds one state, and ``state`` is the one reading of it.

The failure policy is :func:`_fail`: say it, and let vLLM run unpatched. In
strict mode (``DSPARK_HOTFIX_STRICT=1``), and for a stop's finding (what
vLLM would not survive anyway), it raises :class:`HotfixError` instead.
Elsewhere a failure only sets a record's state, which every reporter shows.

Limits: ``importlib.reload`` of a target builds new functions, and wrapt's hooks
fire once per module, so a reloaded target runs unpatched (as with wrapt
itself); its record then reads ``failed``. Nothing unwraps vLLM's functions in
a running process: ``DSPARK_HOTFIX=0`` and a restart do.
"""

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
from dspark_hotfix import HotfixError, config, metrics, patches, state
from dspark_hotfix.patches import Finding, Patch
from dspark_hotfix.state import (
    DISABLED,
    EXCLUDED,
    FAILED,
    NOT_NEEDED,
    PATCHED,
    PENDING,
    UNDECIDED,
    Record,
    log,
)


class Unavailable(Exception):
    """The running vLLM lacks the target, or its parameters are not the expected ones."""


class Absent(Unavailable):
    """The running vLLM has no such class or function."""


class Activation:
    """The activation of the registry in this process: made once, never undone."""

    def __init__(self, source: str) -> None:
        self.source, self.enabled = source, dspark_hotfix.enabled()
        # The last line said, and the stderr writer it went to (see _report).
        self.said: tuple[Any, Any] = ("", None)
        self.settings = config.settings()
        # The patch set in force when it activates.
        self.records = {p.name: Record(p) for p in patches.ALL}
        # One thread registers, or decides, at a time.
        self.registering = threading.RLock()
        self.hooks = [
            (module, functools.partial(_on_import, self, r))
            for r in self.records.values()
            for module in r.patch.modules
        ]
        # The places of a target that this vLLM has no module for.
        self.missing: set[str] = set()
        if self.enabled:
            # The gauges on /metrics, from the import of vLLM's metrics client on.
            gauges = functools.partial(metrics.publish, source, self.records.values())
            self.hooks.append(("prometheus_client", gauges))
            # The switches' complaints, said once in the process.
            for problem in (*self.settings.problems, self.settings.warning):
                if problem:
                    log(logging.WARNING, problem)


_active: Activation | None = None  # guarded by state.lock

# Modules that were being imported when this process forked: their importer is not here.
_stuck: set[str] = set()


def _after_fork_in_child() -> None:
    """Fresh locks, wrapt's too: its import finder takes that lock on every import, so one held at
    the fork would hang every import in the child. The child keeps what its parent had done, and
    completes the rest itself, a registration another thread had under way included. It never
    waits for a module that was part-way imported at the fork: its importer is not in the child."""
    state.lock = threading.Lock()
    importer = sys.modules.get("wrapt.importer")
    if hasattr(importer, "_post_import_hooks_lock"):
        importer._post_import_hooks_lock = threading.RLock()  # type: ignore[union-attr]
    # CPython's table holds a lock for each import under way: those stay stuck in the child.
    _stuck.update(list(sys.modules["importlib._bootstrap"]._module_locks))
    if _active is not None:
        _active.registering = threading.RLock()
        # What this cannot complete stays pending, and its record says what it waits for.
        with contextlib.suppress(Exception):
            activate(_active.source)


os.register_at_fork(after_in_child=_after_fork_in_child)


def activate(source: str) -> None:
    """Put the shim's finder in place, then judge every patch whose module is loaded already.

    The first caller makes the activation. A second caller waits for a registration under way, then
    completes whatever an interrupt left; ``install`` does so before an interrupt goes on. Nothing
    is ever undone. With ``DSPARK_HOTFIX`` off, only ``doctor`` and ``status`` activate, and every
    patch is judged but none applied."""
    global _active
    with state.lock:
        activation = _active = _active or Activation(source)
    with activation.registering:
        _register(activation)
    # A load under way in another thread ends first, outside the lock: that thread may wait for
    # this activation, in the start-up hook's loader. A load under way in this thread is further up
    # its stack: importing it here would run it ahead of vLLM's package, which the import system
    # runs first. Its hooks are armed (see _register). Its import's own error is vLLM's to meet.
    for module in (m for m, _ in activation.hooks if _loading_elsewhere(m)):
        with contextlib.suppress(Exception):
            importlib.import_module(module)
    # A module loaded before is judged here, whole. wrapt's at-once firing would judge half of a
    # module that another thread puts in sys.modules meanwhile.
    with activation.registering:
        for record in activation.records.values():
            for module in record.patch.modules:
                if record.state == PENDING and module in sys.modules and not state.running(module):
                    _decide(activation, record, sys.modules[module])
    _import_everywhere(activation)
    _report(activation)


def _loading_elsewhere(module: str) -> bool:
    """Whether another thread holds ``module``'s import lock, in CPython's private table of them: a
    load under way there. A lock held at a fork has no owner in the child (``_stuck``)."""
    ref = sys.modules["importlib._bootstrap"]._module_locks.get(module)
    lock = ref() if ref is not None else None
    if lock is None or module in _stuck:
        return False
    return getattr(lock, "owner", None) != threading.get_ident()


def _register(activation: Activation) -> None:
    """Put the shim's finder ahead of wrapt's, once; arm the hooks of the modules still running."""
    try:
        import wrapt

        if not any(finder is _finder for finder in sys.meta_path):
            # A wrapt without its chained loader fails here. Its specs copy and pickle (see the
            # note below).
            chained = wrapt.importer._ImportHookChainedLoader
            chained.__copy__ = chained.__deepcopy__ = None
            chained.__reduce_ex__ = lambda self, protocol: self.__wrapped__.__reduce_ex__(protocol)
            # wrapt's first registration puts its finder first on sys.meta_path; ours goes ahead.
            wrapt.register_post_import_hook(lambda module: None, __name__)
            sys.meta_path.insert(0, _finder)
        # A module still running gets its hooks from its loader, wrapt's or the start-up hook's:
        # both run the hooks armed once the module has run.
        for module in (m for m, _ in activation.hooks if state.running(m)):
            _arm(activation, module)
    except Exception as exc:  # absent, broken in this environment, or not the wrapt we know
        # Said once; strict mode raises at every try.
        why = f"wrapt is not usable ({type(exc).__name__}: {exc})"
        settled = [
            _set_state(activation, r, FAILED, None, why) for r in activation.records.values()
        ]
        if any(settled) or activation.settings.strict:
            _fail(
                activation,
                None,
                f"not active: {why}; install wrapt ({config.WRAPT_RANGE}) into {sys.executable}, "
                f"or set {config.ENABLE}=0",
                cause=exc,
                unpatched=True,
            )


# wrapt's private names, in _register, _after_fork_in_child, _find and _arm
# (tests/activation/test_wrapt_internals.py holds them to the wrapt releases the project supports):
# its import hooks' lock and table, its finder and its chained loader. The specs _find gives carry
# that loader: an ObjectProxy, whose __copy__, __deepcopy__ and __reduce__ (wrapt 1.x: __reduce_ex__
# too) raise NotImplementedError, where availability checks copy and pickle specs (the defect the
# start-up hook's ActivatingLoader is built to avoid). So _register makes a copy or a pickle of it
# one of the loader it wraps: loading through a copy fires no hook, as through any spec found before
# the hooks; the proxy itself loads, and fires the hooks, as before.


def _on_import(activation: Activation, record: Record, module: Any) -> None:
    # In strict mode a HotfixError fails this import, and every retry of it (see _find).
    _decide(activation, record, module)
    _import_everywhere(activation)
    _report(activation)


def _report(activation: Activation) -> None:
    """After a decision: the log line, where it changed, and the gauges.

    A verdict that exits 1, ``problem`` or ``undecided``, is a WARNING: log pipelines alert on the
    level. vLLM prefixes a process's lines with ``(EngineCore pid=N)`` by replacing ``write`` on
    its stderr, in an engine core after the targets are imported. Where that changed since the
    line was said, the next report says it again under the prefix; in an engine core that is the
    plugin's."""
    said = before = activation.said
    try:
        with state.lock:
            line = state.line(activation.records.values()) if activation.enabled else None
            # The writer is None where vLLM has not decorated stderr.
            said = (line, getattr(sys.stderr, "__dict__", {}).get("write"))
            before = activation.said
            if line:
                activation.said = said
        if line is not None and said != before:
            verdict = line.partition(":")[0]
            log(
                logging.INFO if verdict in state.EXIT else logging.WARNING,
                f"dspark_hotfix {dspark_hotfix.__version__} (pid {os.getpid()})"
                f" via {activation.source}: {line}",
            )
    except BaseException:  # an interrupt: not said, so the next report says it
        if activation.said is said:
            activation.said = before
        raise
    if activation.enabled:
        metrics.publish(activation.source, activation.records.values())


def _import_everywhere(activation: Activation) -> None:
    """Once every other patch is judged, import an ``everywhere`` patch's module where vLLM did not:
    a tensor-parallel worker may never import the KV-cache grouping, and every process kind gives
    one verdict. Its hook then decides and reports. A patch no module of this vLLM holds the target
    of is judged here, once every place is known (see Patch.absent)."""
    waiting = [r for r in activation.records.values() if state.row(r)["state"] == PENDING]
    # Only with the hooks in place, and once the patches left waiting are all judged everywhere.
    if _finder not in sys.meta_path or not all(r.patch.everywhere for r in waiting):
        return
    for module in dict.fromkeys(m for r in waiting for m in r.patch.modules):
        if module in sys.modules:
            continue
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == module:
                activation.missing.add(module)
        except HotfixError:
            # In strict mode a patch there that cannot be applied stops vLLM, as anywhere else.
            raise
        except Exception:
            # The patch stays pending, and its record says what it waits for.
            pass
    for record in waiting:
        _decide(activation, record, None)


def _decide(activation: Activation, record: Record, module: Any) -> None:
    """Judge ``record``'s patch on ``module``, one of its places (None: every place judged), then
    settle its one state. A place without the target waits for the others."""
    patch, target = record.patch, None
    if record.state != PENDING and not state.stale(record):
        return
    try:
        try:
            target = resolve(patch, module)
        except Absent:
            # No place holds the target: judged once every place is known, by the absence probe.
            name = getattr(module, "__name__", None)
            if any(_open(activation, patch, m) for m in patch.modules if m != name):
                return
            if patch.absent is None:
                raise
            needed, why = patch.absent()
        else:
            if target[2] is record.wrapper:  # wrapped by a decision an interrupt cut short
                _set_state(activation, record, PATCHED, record.needed, record.detail, None, module)
                return
            needed, why = patch.probe(target[2])
        word = {True: PATCHED, False: NOT_NEEDED}.get(needed, UNDECIDED)
    except Exception as exc:  # Unavailable, or a probe that raised on a vLLM it does not know
        needed, word = None, FAILED
        why = str(exc) if isinstance(exc, Unavailable) else f"{type(exc).__name__}: {exc}"
    settled = _set_state(activation, record, word, needed, why, target, module)
    # Where the shim cannot tell, or may not, vLLM runs its function as shipped.
    if settled in (FAILED, UNDECIDED):
        _fail(activation, patch, f"cannot patch {record.target}: {why}", unpatched=True)


def _open(activation: Activation, patch: Patch, module: str) -> bool:
    """Whether ``module``, a place of ``patch``'s target, may still decide it: not missing from this
    vLLM, and not loaded whole without the target."""
    if module in activation.missing:
        return False
    if module not in sys.modules or state.running(module):
        return True
    return state.attribute(sys.modules[module], patch.qualname)[2] is not None


def _set_state(
    activation: Activation,
    record: Record,
    word: str,
    needed: bool | None,
    why: str,
    target: tuple[Any, str, Any] | None = None,
    module: Any = None,
) -> str | None:
    """Record the one decision on ``record``, where the switches allow it, and wrap vLLM's
    function if it is to be patched. A decision is made once per module: an import cut short is
    retried on a new module, and decided again there."""
    with state.lock:
        # Decided already, on a module that is still vLLM's.
        if record.state != PENDING and not state.stale(record):
            return None
        if not activation.enabled:
            word, why = DISABLED, f"{config.ENABLE} turns the shim off; {why}"
        elif record.patch.name not in activation.settings.selected:
            word, why = EXCLUDED, f"excluded by {config.PATCHES}; {why}"
        record.needed, record.detail = needed, why
        # The state is set last: an interrupt before it leaves the wrapper in place, and the next
        # decision settles it.
        if word == PATCHED and target is not None:
            owner, name, original = target
            record.wrapper = _wrap(activation, record, original)
            setattr(owner, name, record.wrapper)
        record.state, record.module = word, module
        return word


def _fail(
    activation: Activation,
    patch: Patch | None,
    message: str,
    *,
    stop: bool = False,
    cause: BaseException | None = None,
    unpatched: bool = False,
) -> None:
    """The one failure policy: say it and let vLLM run; in strict mode, or for a
    finding vLLM would not survive, stop it with the same words."""
    text = f"{patch.name}: {message}" if patch is not None else message
    if patch is not None and not stop:  # what helps with a patch that fails
        text += (
            f" (check `dspark-hotfix doctor`, or exclude it with {config.PATCHES}=-{patch.name})"
        )
    if stop or activation.settings.strict:
        raise HotfixError(text) from cause
    if unpatched:
        text += "; vLLM runs unpatched"
    log(logging.WARNING, text)


def _find(fullname: str, path: Any = None, target: Any = None) -> Any:
    """The shim's finder, ahead of wrapt's on ``sys.meta_path`` from before the first hook: it does
    wrapt's finder's work for the modules the shim hooks, so that wrapt's is never asked for them.

    For each new load of such a module, it asks the finders after it, all but wrapt's, for the
    spec, with the ``path`` the import system gives. It puts the module's hooks back in wrapt's
    table, and hands the spec wrapt's chained loader, which runs them once the module has run.
    wrapt drops a module's hooks as it runs them, so an import cut short after that would be
    retried unhooked. So a hook is armed whatever ended the module's last import: in strict mode,
    the hook whose HotfixError failed an import fails every retry of it the same way.

    wrapt's own finder is never asked because it imports the module's parent package with the
    import lock held: a thread importing a target while another still executes ``vllm`` would wait
    for it while it waited for the lock.

    Called with the import lock held, it imports nothing; it takes only wrapt's lock, as wrapt's
    finder does."""
    if _active is None or fullname in sys.modules:
        return None
    if _finder not in sys.meta_path or all(module != fullname for module, _ in _active.hooks):
        return None
    importer = sys.modules["wrapt.importer"]  # wrapt's private names: see the note above
    for finder in sys.meta_path[sys.meta_path.index(_finder) + 1 :]:
        if isinstance(finder, importer.ImportHookFinder) or not hasattr(finder, "find_spec"):
            continue
        # A finder that asks the meta path again guards its own re-entry, as wrapt's does: it
        # would ask itself again too.
        spec = finder.find_spec(fullname, path, target)
        if spec is not None:
            break
    else:
        return None
    if spec.loader is not None:
        _arm(_active, fullname)
        # The loader only wrapt's finder hands out, and that finder is skipped.
        spec.loader = importer._ImportHookChainedLoader(spec.loader)
    return spec


def _arm(activation: Activation, fullname: str) -> None:
    """Put the module's hooks in wrapt's table, where its loader runs them, then drops them, once
    the module has run. A hook that is there already is not put there twice. Only wrapt's lock is
    taken."""
    importer = sys.modules["wrapt.importer"]
    with importer._post_import_hooks_lock:
        armed = importer._post_import_hooks.setdefault(fullname, [])
        armed.extend(
            h for m, h in activation.hooks if m == fullname and not any(each is h for each in armed)
        )


_finder = types.SimpleNamespace(find_spec=_find)


def resolve(patch: Patch, module: Any) -> tuple[Any, str, Callable[..., Any]]:
    """The owner, attribute name and plain function ``patch`` targets in ``module``."""
    owner, name, function = state.attribute(module, patch.qualname)
    if module is None:
        raise Absent(f"this vLLM defines no {patch.qualname} in {' or '.join(patch.modules)}")
    if function is None:
        raise Absent(
            f"{owner.__name__} defines no {name}"
            if isinstance(owner, (type, types.ModuleType))
            else f"{module.__name__} has no class {patch.qualname.rpartition('.')[0]}"
        )
    if not inspect.isfunction(function):  # a staticmethod or another tool's proxy binds differently
        raise Unavailable(f"{patch.qualname} is a {type(function).__name__}, not a plain function")
    parameters = inspect.signature(function).parameters
    if tuple(parameters) != patch.parameters:
        raise Unavailable(
            f"unexpected signature {patch.qualname}({', '.join(parameters)}); "
            f"expected ({', '.join(patch.parameters)})"
        )
    if patch.arguments is not Patch.arguments:
        _check_step(patch, function)
    return owner, name, function


def _check_step(patch: Patch, function: Callable[..., Any]) -> None:
    """The arguments step is called as vLLM's function is, so it must take every call that takes:
    each parameter by position and by keyword where vLLM's takes it so, and without the ones that
    have defaults. Checked on a call of each form, with the parameters' names as values."""
    vllm, step = inspect.signature(function), inspect.signature(patch.arguments)
    kind = inspect.Parameter
    for by_keyword, required_only in ((False, False), (True, False), (False, True)):
        args, kwargs = [], {}
        for p in vllm.parameters.values():
            if required_only and p.default is not kind.empty:
                continue
            if p.kind == kind.VAR_POSITIONAL:
                args.append(p.name)
            elif p.kind == kind.VAR_KEYWORD or p.kind == kind.KEYWORD_ONLY:
                kwargs[p.name] = p.name
            elif p.kind == kind.POSITIONAL_OR_KEYWORD and by_keyword:
                kwargs[p.name] = p.name
            else:
                args.append(p.name)
        try:
            step.bind(*args, **kwargs)
        except TypeError as exc:
            raise Unavailable(
                f"{patch.qualname}{vllm} takes calls its arguments step{step} does not ({exc})"
            ) from None


def _wrap(
    activation: Activation, record: Record, original: Callable[..., Any]
) -> Callable[..., Any]:
    """vLLM's function, called with the arguments the patch's arguments step gives, its answer
    passed through the patch's correction."""
    patch = record.patch

    @functools.wraps(original)
    def patched(*args: Any, **kwargs: Any) -> Any:
        record.calls += 1
        changed = _run(activation, record, None, patch.arguments, *args, **kwargs)
        if changed is not None:
            args, kwargs = changed
            record.corrections += 1
        answer = original(*args, **kwargs)  # vLLM's own errors pass through as they are
        result = _run(activation, record, answer, patch.correction, answer, *args, **kwargs)
        if result is not answer:
            record.corrections += 1
        return result

    return patched


def _run(
    activation: Activation,
    record: Record,
    default: Any,
    function: Callable[..., Any],
    *args: Any,
    **kwargs: Any,
) -> Any:
    """The patch's own code under the failure policy: a finding stops vLLM; any other error is
    said (once, unless strict mode stops vLLM) and ``default``, what vLLM gave, is returned."""
    try:
        return function(*args, **kwargs)
    except Finding as exc:
        _fail(activation, record.patch, str(exc), stop=True)  # its own words say what helps
    except Exception as exc:
        what, kept = (
            ("arguments step", "arguments")
            if function is record.patch.arguments
            else ("correction", "result")
        )
        if not record.raised or activation.settings.strict:
            record.raised = (
                f"its {what} raised {type(exc).__name__}: {exc} (vLLM's own {kept} used)"
            )
            _report(activation)
            _fail(
                activation,
                record.patch,
                f"{what} raised {type(exc).__name__}: {exc} in {record.target}; "
                f"vLLM's own {kept} used",
                cause=exc,
            )
    return default


def status() -> dict[str, Any]:
    """What the shim did in this process, as every reporter reads it; changes nothing. With the shim
    off nothing activated it, and ``status`` and ``doctor`` judge the patches all the same."""
    activation = _active
    watcher = next((f for f in sys.meta_path if type(f).__name__ == "VllmImportWatcher"), None)
    source: str | None = getattr(watcher, "source", None)
    if activation is not None:
        records = list(activation.records.values())
        source = activation.source if activation.enabled else None
    elif watcher is not None:
        records = [Record(p, PENDING, "waiting for vLLM to be imported") for p in patches.ALL]
    else:
        value = dspark_hotfix.shown(os.environ.get(config.ENABLE))
        off = f"{config.ENABLE}={value} turns the shim off"
        why = "not installed in this process" if dspark_hotfix.enabled() else off
        records = [Record(p, DISABLED, why) for p in patches.ALL]
    report = state.judge(records)
    settings = activation.settings if activation else config.settings()
    return {
        "schema": state.SCHEMA,
        "version": dspark_hotfix.__version__,
        "pid": os.getpid(),
        "activated_by": source,
        "enabled": dspark_hotfix.enabled(),
        "strict": settings.strict,
        **report,
        "exit_code": state.exit_code(report),
    }
