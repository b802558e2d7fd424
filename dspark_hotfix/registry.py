"""The registry: when to patch, how, and what every problem means.

Interpreter start only inserts ``dspark_hotfix.VllmImportWatcher``; this module
is imported when ``vllm`` is imported. :func:`activate` registers one wrapt
post-import hook per patch. A hook fires when vLLM imports the patch's module
(at once if it is imported already), asks the patch's probe whether the running
vLLM needs it, and only then puts ``patch.replacement`` in front of vLLM's
function. A guard is decided once, when the patches it guards are. Each record
holds one state; :func:`status`, ``dspark-hotfix status`` and ``doctor``, and
the summary line all read those states and nothing else.

The failure policy is :func:`_fail`, and only it:

- a patch that cannot be applied (target missing, signature changed, wrapt
  missing, a probe that raised) is reported (``status()``, one warning) and vLLM
  runs unpatched;
- a correction that raises gives back vLLM's own answer, with one warning;
- a guard's finding is logged as an error (``draft_load_coverage``), except
  ``kv_view_guard``'s and ``kv_cache_groups``'s, which stop vLLM with an error
  naming the cause: vLLM would stop anyway, with a less useful message;
- with ``DSPARK_HOTFIX_STRICT=1`` each of these raises :class:`HotfixError`.

Limits, stated rather than handled: ``importlib.reload`` of a target module
builds new functions and wrapt's hooks fire once per module, so a reloaded
target runs unpatched (as with wrapt itself). Nothing unwraps vLLM's functions
in a running process: ``DSPARK_HOTFIX=0`` and a restart do.
"""

from __future__ import annotations

import functools
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
INSTALLED = "installed"  # vLLM's function is wrapped
NOT_NEEDED = "not_needed"  # the running vLLM is already right: left untouched
EXCLUDED = "excluded"  # judged, never applied: DSPARK_HOTFIX_PATCHES leaves it off
FAILED = "failed"  # the target was imported but the patch could not be applied
DISABLED = "disabled"  # the shim is off (judged, never applied, where doctor or status activate), or not installed

SCHEMA = 1
STOPS = frozenset({"kv_view_guard", "kv_cache_groups"})  # findings vLLM would not survive anyway


class HotfixError(RuntimeError):
    """Strict mode (or a stop): the shim stops vLLM, saying why."""


class Unavailable(Exception):
    """The running vLLM lacks the target, or its parameters are not the expected ones."""


class Absent(Unavailable):
    """The running vLLM has no such class or function."""


class Record:
    """One patch in this process: its state and what the state rests on."""

    def __init__(self, patch: Patch, state: str = PENDING, detail: str = "") -> None:
        self.patch, self.state, self.detail = patch, state, detail or f"waiting for {patch.module}"
        self.needed: bool | None = None  # after the decision: None when it could not be judged
        self.corrections = 0
        self.calls = 0  # of the wrapper: the shim's whole cost while vLLM runs
        self.module: Any = None  # a guard's module, once imported
        self.target: tuple[Any, str, Any] | None = None  # owner, name and vLLM's function, once wrapped
        self.warned = False


class Activation:
    """The activation of the registry in this process."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.enabled = dspark_hotfix.enabled()
        self.settings = config.Settings(p.name for p in ALL)
        self.records = {p.name: Record(p) for p in ALL}
        self.thread = threading.get_ident()
        self.done = threading.Event()  # every hook is registered (or activation gave up)
        self.unsummarized: set[str] | None = None  # after the summary line: the patches it left pending


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
    # lose the one line per process. Naming "dspark_hotfix" in that config still sets its level.
    _log.disabled = False
    _log.log(level, "%s", text)


def _after_fork_in_child() -> None:
    """A child forked while another thread activated gets a fresh lock and, for an
    activation left half-built, none at all (what it had wrapped put back, so that
    no probe looks at vLLM through a wrapper): its own install() starts again."""
    global _lock, _active
    _lock = threading.Lock()
    if _active is not None and not _active.done.is_set():
        for record in _active.records.values():
            if record.target is not None:
                setattr(*record.target)  # owner, name, vLLM's own function
        _active = None


os.register_at_fork(after_in_child=_after_fork_in_child)


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
        except Exception as exc:  # absent, or broken in this environment
            why = f"wrapt is not importable ({type(exc).__name__}: {exc})"
            for record in activation.records.values():
                _settle(activation, record, FAILED, None, why)
            _fail(activation, None, f"not active: {why}; install wrapt ({config.WRAPT_RANGE}) where vLLM runs, "
                                    f"or set {config.ENABLE}=0. vLLM runs unpatched.", cause=exc)
            return
        for record in activation.records.values():
            wrapt.register_post_import_hook(functools.partial(_on_import, activation, record), record.patch.module)
        wrapt.register_post_import_hook(functools.partial(metrics.on_import, activation), "prometheus_client")
    finally:
        activation.done.set()


def _on_import(activation: Activation, record: Record, module: Any) -> None:
    if _active is not activation:  # a hook of an activation that a fork left half-built
        return
    try:
        if record.patch.guards:  # decided with the patches it guards, here or in their hooks
            record.detail = f"waiting for the verdicts of {', '.join(record.patch.guards)}"
            record.module = module
        else:
            _decide(activation, record, module)
        for guard in activation.records.values():
            if guard.module is not None and guard.state == PENDING:
                _decide(activation, guard, guard.module)
        _summarize(activation)
        metrics.publish(activation)
    except HotfixError as exc:  # strict mode: this import fails, and so must every retry of it
        _refuse(module.__name__, str(exc))
        raise


def _decide(activation: Activation, record: Record, module: Any) -> None:
    """Judge ``record``'s patch on ``module``, then settle its one state."""
    patch, target = record.patch, None
    try:
        if patch.guards:
            guarded = [activation.records[name] for name in patch.guards]
            # Decided once the patches it guards are; one whose module this process may never import
            # (kv_cache_groups in a tensor-parallel worker) counts as needed while it waits.
            if any(r.state == PENDING and (not r.patch.absent or r.patch.module in sys.modules) for r in guarded):
                return
            on = [r.patch.name + (" (not judged yet)" if r.state == PENDING else "") for r in guarded
                  if r.needed is not False]
            needed: bool | None = bool(on)
            why = f"needed (guards {', '.join(on)})" if on else \
                f"not needed (guards {', '.join(patch.guards)}, none needed here)"
            if on:  # a guard of patches that are not needed never looks at vLLM
                target = resolve(patch, module)
        else:
            target = resolve(patch, module)
            assert patch.probe is not None
            needed, why = patch.probe(target[2])
        state = INSTALLED if needed is not False else NOT_NEEDED
    except Absent as exc:
        needed, why, state = (False, f"not needed ({exc}: {patch.absent})", NOT_NEEDED) if patch.absent else \
            (None, str(exc), FAILED)
    except Exception as exc:  # Unavailable, or a probe that raised on a vLLM it does not know
        needed, state = None, FAILED
        why = str(exc) if isinstance(exc, Unavailable) else f"{type(exc).__name__}: {exc}"
    if _settle(activation, record, state, needed, why, target) == FAILED:
        _fail(activation, patch, f"cannot patch {patch.target}: {why}; vLLM runs unpatched ({_remedy(patch)})")


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
        elif state == INSTALLED and target is not None:
            owner, name, original = target
            setattr(owner, name, _wrap(activation, record, original))
            record.target = target
        record.state, record.needed, record.detail = state, needed, why
        return state


def _fail(activation: Activation, patch: Patch | None, message: str, *, stop: bool = False,
          level: int = logging.WARNING, cause: BaseException | None = None) -> None:
    """The one failure policy: say it and let vLLM run; in strict mode, or for a
    finding vLLM would not survive, stop it with the same words."""
    text = f"{patch.name}: {message}" if patch is not None else message
    if stop or activation.settings.strict:
        raise HotfixError(text) from cause
    _say(level, text)


def _refuse(module: str, error: str) -> None:
    """Strict mode: wrapt has dropped the hook whose HotfixError aborted ``module``'s
    import; this finder fails every retry of that import the same way, instead of
    letting it load unpatched. Under the import lock it only compares a name."""
    def find_spec(fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname == module:
            raise HotfixError(error)

    sys.meta_path.insert(0, types.SimpleNamespace(find_spec=find_spec))


def resolve(patch: Patch, module: Any) -> tuple[Any, str, Callable[..., Any]]:
    """The owner, attribute name and plain function ``patch`` targets in ``module``."""
    owner_name, dot, name = patch.qualname.rpartition(".")
    owner: Any = getattr(module, owner_name, None) if dot else module
    if dot and not isinstance(owner, type):
        raise Absent(f"{module.__name__} has no class {owner_name}")
    function = vars(owner).get(name)
    if function is None:
        raise Absent(f"{owner.__name__} defines no {name}")
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
        answers: list[Any] = []

        def vllm(*a: Any, **kw: Any) -> Any:
            answers.append(record)  # marks the call: vLLM's own error passes through as it is
            answers[0] = original(*a, **kw)
            return answers[0]

        try:
            result = patch.replacement(vllm, *args, **kwargs)
        except Exception as exc:
            if answers and answers[0] is record:
                raise
            if isinstance(exc, Finding):
                guarded = "".join(f"; {r.patch.name} {r.state} ({r.detail})" for r in
                                  (activation.records[name] for name in patch.guards))
                _fail(activation, patch, f"{exc}{guarded}; see `dspark-hotfix doctor`", stop=patch.name in STOPS,
                      level=logging.ERROR)
            elif not record.warned or activation.settings.strict:
                record.warned = True
                what = "check" if patch.guards else "correction"
                record.detail += f"; {what} raised {type(exc).__name__}: {exc} (vLLM's own result returned)"
                _fail(activation, patch, f"{what} raised {type(exc).__name__}: {exc} in {patch.target}; vLLM's own "
                                         f"result is returned ({_remedy(patch)})", cause=exc)
            return answers[0] if answers else original(*args, **kwargs)
        if not answers or result is not answers[0]:
            record.corrections += 1
        return result

    return patched


WORDS = {INSTALLED: "patched", NOT_NEEDED: "not needed", EXCLUDED: "excluded", FAILED: "failed", PENDING: "pending"}


def _summarize(activation: Activation) -> None:
    """One INFO line per process, once every patch is decided, and every guard whose
    module is imported: the records' states. A patch it left pending and decided
    later gets a line of its own."""
    with _lock:
        records = list(activation.records.values())
        if not activation.enabled:
            return
        first = activation.unsummarized is None
        if activation.unsummarized is None:  # (not `first`: mypy narrows the set on this test alone)
            if any(r.state == PENDING and not ((r.patch.guards or r.patch.absent) and r.patch.module not in sys.modules)
                   for r in records):
                return  # a record whose module is imported has its hook still to run
            removable = all(r.needed is False for r in records if not r.patch.guards)
            # after "removable" the guards, which follow their patches, need no line of their own
            activation.unsummarized = set() if removable else {r.patch.name for r in records if r.state == PENDING}
            later = []
        else:
            later = [r for r in records if r.patch.name in activation.unsummarized and r.state != PENDING]
            activation.unsummarized.difference_update(r.patch.name for r in later)
    head = f"dspark_hotfix {dspark_hotfix.__version__} (pid {os.getpid()})"
    for r in later:
        _say(logging.INFO, f"{head}: {r.patch.name} {WORDS[r.state]}, now that {r.patch.module} is imported")
    if not first:
        return
    left_off = [r.patch.name for r in records if r.state == EXCLUDED and r.needed is not False]
    if left_off:
        _say(logging.WARNING, f"{config.PATCHES} leaves off what this vLLM needs: {', '.join(left_off)}")
    head += f" via {activation.source}"
    if removable:
        _say(logging.INFO, f"{head}: not needed on this vLLM (fixed upstream), removable")
        return
    counts = {s: [r.patch.name + (f" until {r.patch.module} is imported" if s == PENDING else "") for r in records
                  if r.state == s] for s in WORDS}
    _say(logging.INFO, f"{head}: " + ", ".join(f"{len(names)} {WORDS[s]}" + (f" ({', '.join(names)})" if s not in (
        INSTALLED, NOT_NEEDED) else "") for s, names in counts.items() if names))


def status() -> dict[str, Any]:
    """What the shim did in this process; reads the records' states, changes nothing."""
    activation = _active
    watcher = next((f for f in sys.meta_path if type(f).__name__ == "VllmImportWatcher"), None)
    if activation is not None:
        records = list(activation.records.values())
    elif watcher is not None:
        records = [Record(p, PENDING, "waiting for vLLM to be imported") for p in ALL]
    else:
        why = "not installed in this process" if dspark_hotfix.enabled() else \
            f"{config.ENABLE}={dspark_hotfix.shown(os.environ.get(config.ENABLE))} turns the shim off"
        records = [Record(p, DISABLED, why) for p in ALL]
    return {
        "schema": SCHEMA,
        "version": dspark_hotfix.__version__,
        "pid": os.getpid(),
        "activated_by": activation.source if activation is not None else getattr(watcher, "source", None),
        "enabled": dspark_hotfix.enabled(),
        "strict": (activation.settings if activation is not None else config.Settings(p.name for p in ALL)).strict,
        "patches": [
            {"name": r.patch.name, "target": r.patch.target, "state": r.state, "needed": r.needed,
             "calls": r.calls, "corrections": r.corrections, "detail": r.detail}
            for r in records
        ],
    }
