"""The hook registry: when to patch, how, and what happened.

Interpreter start only inserts ``dspark_hotfix.VllmImportWatcher``; this module is
imported when vLLM imports the package of a patch's target. :func:`activate`
imports wrapt and registers one wrapt post-import hook per patch; each hook
fires when vLLM imports the patch's module, or at once if that module is
already imported, and replaces vLLM's function only where its probe says so.

The failure policy lives here and only here: a patch that cannot be applied is
reported in ``status()`` and logged once, and vLLM goes on unpatched; with
``DSPARK_HOTFIX_STRICT=1`` the import stops with :class:`HotfixError`.
"""

from __future__ import annotations

import os
import sys
import threading

import dspark_hotfix
from dspark_hotfix import config

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from dspark_hotfix.patches import Patch

PENDING = "pending"  # the target module is not imported yet
INSTALLED = "installed"  # vLLM's function is wrapped
NOT_NEEDED = "not_needed"  # the running vLLM is already right: left untouched
DISABLED = "disabled"  # switched off (or uninstalled)
FAILED = "failed"  # the target was imported but the patch could not be applied
APPLYING = "applying"  # claimed by one thread; reported as pending

# Guards the PENDING -> APPLYING claim only. It is never held while vLLM code
# or an import runs: hooks run under the import lock of their module, and a
# probe that imported a module another thread is hooking would deadlock.
_claim_lock = threading.Lock()


class HotfixError(RuntimeError):
    """Strict mode: a patch could not be applied (or its correction failed)."""


class _Record:
    """One patch in this process."""

    __slots__ = (
        "corrections", "deferred", "detail", "lost", "original", "owner", "patch", "state", "warned", "wrapper",
    )

    def __init__(self, patch: Patch, state: str, detail: str) -> None:
        self.patch = patch
        self.state = state
        self.detail = detail
        self.corrections = 0
        self.owner: Any = None
        self.original: Any = None
        self.wrapper: Any = None
        self.warned = False
        self.lost = False
        self.deferred: Any = None  # the imported module of a guard waiting for verdicts


class _Registry:
    def __init__(self) -> None:
        self.settings: config.Settings | None = None
        self.records: dict[str, _Record] = {}
        self.active = False
        self.activated_by: str | None = None
        self.complained = False
        self.generation = 0


_registry = _Registry()


def settings() -> config.Settings:
    """The switches of this process, read once."""
    if _registry.settings is None:
        _registry.settings = config.Settings()
    return _registry.settings


def _log() -> Any:
    from dspark_hotfix._log import logger

    return logger(settings().level)


def _complain_once() -> None:
    reg = _registry
    if not reg.complained:
        reg.complained = True
        for problem in settings().problems:
            _log().warning(problem)


def install(source: str = "api") -> None:
    """Arrange for every enabled patch to be applied; idempotent.

    ``source`` records which activation path ran (``sitecustomize``,
    ``vllm-plugin`` or ``api``). Cheap until vLLM is imported: see
    :func:`status` for what happened.
    """
    reg = _registry
    _complain_once()
    if not settings().enabled:
        return
    if reg.active:
        _reapply_lost()
        return
    if dspark_hotfix.triggered():
        activate(source)
    elif dspark_hotfix.watch(source):
        reg.activated_by = source


def activate(source: str) -> None:
    """Register the post-import hooks now: the targets' packages are being imported."""
    reg = _registry
    _complain_once()
    if reg.active or not settings().enabled:
        return
    if reg.activated_by is None:
        reg.activated_by = source
    reg.active = True
    try:
        from dspark_hotfix.patches import ALL

        selected, problems = settings().selection(p.name for p in ALL)
        for problem in problems:
            _log().warning(problem)
        reg.records = {
            p.name: _Record(p, PENDING, f"waiting for {p.module}")
            if p.name in selected
            else _Record(p, DISABLED, f"excluded by {config.PATCHES}")
            for p in ALL
        }
    except Exception as exc:  # the shim must never break `import vllm`
        _log().warning("not active: %s: %s; vLLM runs unpatched.", type(exc).__name__, exc)
        return
    try:
        import wrapt
    except Exception as exc:  # absent, or broken in this environment
        why = f"wrapt is not importable ({type(exc).__name__}: {exc})"
        for record in reg.records.values():
            if record.state == PENDING:
                record.state, record.detail = FAILED, why
        if settings().strict:
            raise HotfixError(
                f"{why}; install wrapt ({config.WRAPT_RANGE}) where vLLM runs, or set {config.ENABLE}=0"
            ) from exc
        _log().warning(
            "not active: %s; install wrapt (%s) where vLLM runs. vLLM runs unpatched.", why, config.WRAPT_RANGE
        )
        return
    generation = reg.generation
    for record in reg.records.values():
        if record.state == PENDING:
            wrapt.register_post_import_hook(_hook(record, generation), record.patch.module)


def _hook(record: _Record, generation: int) -> Any:
    def on_import(module: Any) -> None:
        # wrapt runs hooks once per registration; an uninstall since then
        # bumps the generation and turns this one into a no-op.
        if generation != _registry.generation:
            return
        _guarded_apply(record, module)
        _resume_deferred()

    return on_import


def _remedy(patch: Patch) -> str:
    return (
        f"this vLLM build differs from what {patch.name} expects; check "
        f"`dspark-hotfix doctor`, or exclude it with {config.PATCHES}=-{patch.name}"
    )


def _fail(record: _Record, why: str) -> None:
    patch = record.patch
    record.state, record.detail = FAILED, why
    remedy = _remedy(patch)
    if settings().strict:
        raise HotfixError(f"{patch.name}: cannot patch {patch.target}: {why} ({remedy})")
    _log().warning("%s: not applied to %s: %s; vLLM runs unpatched (%s)", patch.name, patch.target, why, remedy)


def _apply(record: _Record, module: Any) -> None:
    from dspark_hotfix.patches import PatchUnavailable

    patch = record.patch
    # A guard is decided by the patches it guards, before its target is even
    # looked at: where they are not needed, it must not touch (or judge) vLLM.
    verdict = _dependency_verdict(patch) if patch.depends_on else None
    if patch.depends_on and verdict is None:
        record.detail = f"waiting for the verdicts of {', '.join(patch.depends_on)}"
        with _claim_lock:
            record.deferred, record.state = module, PENDING
        return None
    if verdict is None or verdict.needed:
        try:
            owner, method, original = patch.resolve(module)
            patch.prepare(module)
        except PatchUnavailable as exc:
            return _fail(record, str(exc))
    if verdict is None:
        verdict = patch.probe(original)
    if verdict.needed is False:
        record.state, record.detail = NOT_NEEDED, verdict.detail
        _log().debug("%s: %s; %s left untouched", patch.name, verdict.detail, patch.target)
        return None
    wrapper = _corrector(record, original)
    setattr(owner, method, wrapper)
    record.owner, record.original, record.wrapper = owner, original, wrapper
    record.state, record.detail = INSTALLED, verdict.detail
    _log().info("%s: patched %s in pid %d: %s", patch.name, patch.target, os.getpid(), verdict.detail)
    return None


def _dependency_verdict(patch: Patch) -> Any:
    """A guard's verdict from the patches it guards; None while any is undecided."""
    from dspark_hotfix.patches import Verdict

    records = [_registry.records[n] for n in patch.depends_on if n in _registry.records]
    applied = [r.patch.name for r in records if r.state in (INSTALLED, FAILED)]
    if applied:
        return Verdict(True, f"needed (guarding {', '.join(applied)})")
    if all(r.state in (NOT_NEEDED, DISABLED) for r in records):
        return Verdict(False, f"not needed ({', '.join(patch.depends_on)} not needed or excluded)")
    return None


def _resume_deferred() -> None:
    """Decide the guards whose patches have been decided since they were imported."""
    progress = True
    while progress:
        progress = False
        for record in list(_registry.records.values()):
            with _claim_lock:
                module = record.deferred if record.state == PENDING else None
                record.deferred = None
            if module is not None:
                _guarded_apply(record, module)
                progress = progress or record.deferred is None


def _claim(record: _Record) -> bool:
    """Let exactly one thread apply a pending patch."""
    with _claim_lock:
        if record.state != PENDING:
            return False
        record.state = APPLYING
        return True


def _guarded_apply(record: _Record, module: Any) -> None:
    if not _claim(record):
        return
    try:
        _apply(record, module)
    except HotfixError:
        raise
    except Exception as exc:
        _fail(record, f"{type(exc).__name__}: {exc}")
    finally:
        if record.state == APPLYING:  # a strict-mode stop: leave it retryable
            record.state = PENDING


def _corrector(record: _Record, original: Any) -> Any:
    """The function that takes vLLM's place: vLLM's own, then the correction.

    A plain function rather than a ``wrapt.FunctionWrapper``: it binds as a
    method like the original does and costs about half as much per call (the
    remap runs once per checkpoint name); the targets are plain functions,
    checked by ``Patch.resolve``. Targets of two parameters (``self`` and one
    argument: the remap and the spec methods) get a wrapper of exactly two, which
    spares packing the arguments on every call.
    """
    import functools

    correct = record.patch.correct
    parameters = record.patch.parameters
    two = _two_argument_corrector(record, original, correct)
    code = two.__code__
    if len(parameters) == 2 and not set(parameters) & set(code.co_varnames[2:]):
        # vLLM's parameter names, so that a keyword call binds as it would on vLLM's function.
        two.__code__ = code.replace(co_varnames=parameters + code.co_varnames[2:])
        return functools.wraps(original)(two)
    # Any other signature: the same wrapper, over the call's (args, kwargs).
    packed = _two_argument_corrector(
        record,
        lambda args, kwargs: original(*args, **kwargs),
        lambda result, args, kwargs: correct(result, *args, **kwargs),
    )

    def corrected(*args: Any, **kwargs: Any) -> Any:
        return packed(args, kwargs)

    return functools.wraps(original)(corrected)


def _two_argument_corrector(record: _Record, original: Any, correct: Any) -> Any:
    def two(first: Any, second: Any) -> Any:
        result = original(first, second)
        try:
            fixed = correct(result, first, second)
        except HotfixError:
            raise
        except Exception as exc:
            return _correction_failed(record, exc, result)
        if fixed is not result:
            record.corrections += 1
            if record.corrections == 1:
                _first_correction(record, result, fixed)
        return fixed

    return two


def unwrapped(function: Any) -> Any:
    """vLLM's own function behind one of our wrappers; anything else as it is."""
    for record in _registry.records.values():
        if record.wrapper is not None and record.wrapper is function:
            return record.original
    return function


def report_error(message: str) -> None:
    """A patch's guard found something vLLM will not survive well."""
    _log().error(message)


def _first_correction(record: _Record, before: Any, after: Any) -> None:
    try:
        what = record.patch.describe(before, after)
    except Exception as exc:
        what = f"(cannot describe: {exc})"
    _log().info("%s: first correction in pid %d: %s", record.patch.name, os.getpid(), what)


def _correction_failed(record: _Record, exc: Exception, result: Any) -> Any:
    """vLLM's own ``result``, after reporting (once) that the correction raised."""
    why = f"correction raised {type(exc).__name__}: {exc}"
    if settings().strict:
        patch = record.patch
        raise HotfixError(
            f"{patch.name}: {why} in {patch.target}; vLLM's own result was not changed ({_remedy(patch)})"
        ) from exc
    if not record.warned:
        record.warned = True
        record.detail = f"{record.detail}; {why} (vLLM's own result returned)"
        _log().warning("%s: %s; vLLM's own result is returned", record.patch.name, why)
    return result


def uninstall() -> list[dict[str, Any]]:
    """Put vLLM's original functions back and stop watching imports."""
    reg = _registry
    reg.generation += 1
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, dspark_hotfix.VllmImportWatcher)]
    for record in reg.records.values():
        if record.state == INSTALLED:
            method = record.patch.qualname.rpartition(".")[2]
            if record.owner.__dict__.get(method) is record.wrapper:
                setattr(record.owner, method, record.original)
                record.detail = "uninstalled: vLLM's original function restored"
            else:
                record.detail = "uninstalled, but something else has replaced the function since"
        if record.state != DISABLED:
            record.state = DISABLED
            if not record.detail.startswith("uninstalled"):
                record.detail = "uninstalled"
        record.owner = record.original = record.wrapper = None
    reg.active = False
    reg.activated_by = None
    return status()


def status() -> list[dict[str, Any]]:
    """One dict per patch: name, target, state, corrections, detail, activated_by."""
    reg = _registry
    if not reg.records:
        from dspark_hotfix.patches import ALL

        watcher = next((f for f in sys.meta_path if isinstance(f, dspark_hotfix.VllmImportWatcher)), None)
        by = reg.activated_by or getattr(watcher, "source", None)
        if not settings().enabled:
            state, detail = DISABLED, f"{config.ENABLE}=0"
        elif by is None:
            state, detail = DISABLED, "not installed in this process"
        else:
            state, detail = PENDING, "waiting for vLLM to import the DeepSeek-V4 modules"
        return [_row(_Record(p, state, detail), by) for p in ALL]
    for record in reg.records.values():
        _check_still_wrapped(record)
    return [_row(record, reg.activated_by) for record in reg.records.values()]


def _check_still_wrapped(record: _Record) -> None:
    """Notice a wrapper that is gone: ``importlib.reload`` of the target module
    builds a new class (wrapt's hooks fire once), so vLLM's reloaded function
    runs unpatched. That is reported, and ``install()`` applies the patch again.
    """
    if record.state != INSTALLED:
        return
    patch = record.patch
    module = sys.modules.get(patch.module)
    owner, method = patch.locate(module) if module is not None else (None, "")
    if owner is record.owner and owner.__dict__.get(method) is record.wrapper:
        return
    record.state, record.lost = FAILED, True
    record.detail = (
        f"lost: {patch.module} was reloaded (or {patch.qualname} replaced) after patching; "
        "vLLM runs unpatched there; call dspark_hotfix.install() to apply it again"
    )
    record.owner = record.original = record.wrapper = None
    _log().warning("%s: %s", patch.name, record.detail)


def _reapply_lost() -> None:
    for record in _registry.records.values():
        _check_still_wrapped(record)
        module = sys.modules.get(record.patch.module)
        if record.lost and module is not None:
            record.state, record.lost = PENDING, False
            _guarded_apply(record, module)


def _row(record: _Record, activated_by: str | None) -> dict[str, Any]:
    return {
        "name": record.patch.name,
        "target": record.patch.target,
        "state": PENDING if record.state == APPLYING else record.state,
        "corrections": record.corrections,
        "detail": record.detail,
        "activated_by": activated_by,
        "pid": os.getpid(),
    }
