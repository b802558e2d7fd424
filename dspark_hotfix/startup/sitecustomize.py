"""dspark_hotfix start-up hook: put this file's directory on PYTHONPATH.

It imports only the standard library and the small ``dspark_hotfix.hooks``
module, arranges for the patches to be applied when vLLM is imported, then runs
the ``sitecustomize`` it shadows. ``DSPARK_HOTFIX=0`` turns it off.
"""

try:
    from dspark_hotfix._bootstrap import boot
except Exception as exc:  # never break interpreter start
    import sys

    sys.stderr.write(f"dspark_hotfix: not active: cannot import the package: {exc}\n")
else:
    boot(__file__)
