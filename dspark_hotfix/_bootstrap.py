"""Interpreter start: install the watcher, then run the sitecustomize we shadow.

Called by ``sitecustomize.py``. Standard library only, and it never raises:
a start-up hook that fails would break every Python process in the image.
"""

from __future__ import annotations

import os
import sys


def boot(sitecustomize_file: str) -> None:
    try:
        from dspark_hotfix.hooks import install

        install(source="sitecustomize")
    except Exception as exc:
        sys.stderr.write(f"dspark_hotfix: not active: {type(exc).__name__}: {exc}\n")
    chain(sitecustomize_file)


def chain(sitecustomize_file: str) -> None:
    """Import the ``sitecustomize`` that ours shadows, exactly once.

    Only the first ``sitecustomize`` on ``sys.path`` runs, and Debian and Ubuntu
    Pythons ship their own. Our directory is taken off ``sys.path`` for the
    import and put back where it was; errors are reported the way ``site``
    reports its own sitecustomize's, and start-up goes on.
    """
    here = os.path.dirname(os.path.abspath(sitecustomize_file))
    ours = sys.modules.get("sitecustomize")
    saved = list(sys.path)
    sys.path[:] = [p for p in saved if os.path.abspath(p or os.curdir) != here]
    sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401  (the shadowed one, if any)
    except ImportError as exc:
        if exc.name != "sitecustomize":
            _report(exc)
    except Exception as exc:
        _report(exc)
    finally:
        sys.path[:] = saved
        if ours is not None:
            sys.modules["sitecustomize"] = ours


def _report(exc: BaseException) -> None:
    if sys.flags.verbose:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    else:
        sys.stderr.write(
            "Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
            f"{type(exc).__name__}: {exc}\n"
        )
