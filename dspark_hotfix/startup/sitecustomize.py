"""dspark_hotfix start-up hook: put this file's directory on PYTHONPATH.

It imports the standard library and the ``dspark_hotfix`` package module (no
other), arranges for the patches to be applied when vLLM imports them, then
runs the ``sitecustomize`` it shadows. ``DSPARK_HOTFIX=0`` turns it off.
"""

import sys

try:
    try:
        from dspark_hotfix import at_interpreter_start
    except ImportError:
        # A checkout: the package is two directories up. It is imported from
        # there without leaving the checkout on sys.path (its tests/, bench/
        # and scripts/ must not become importable in every process).
        import os

        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
        sys.path.insert(0, root)
        try:
            from dspark_hotfix import at_interpreter_start
        finally:
            sys.path.remove(root)
except Exception as exc:  # never break interpreter start, whatever stderr does
    try:
        sys.stderr.write(f"dspark_hotfix: not active: {sys.executable} cannot import the package "
                         f"({type(exc).__name__}: {exc}); install it into this interpreter "
                         f"from a checkout or a wheel built from one: {sys.executable} -m pip install PATH\n")
    except Exception:  # None under 2>&-, a read-only fd 2, a reader gone
        pass
else:
    at_interpreter_start(__file__)
