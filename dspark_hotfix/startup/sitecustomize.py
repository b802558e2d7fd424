"""dspark_hotfix start-up hook: put this file's directory on PYTHONPATH.

It imports the standard library and the ``dspark_hotfix`` package module (no
other), arranges for the patches to be applied when vLLM imports them, then
runs the ``sitecustomize`` it shadows. ``DSPARK_HOTFIX=0`` turns it off.
"""

try:
    from dspark_hotfix import boot
except Exception as exc:  # never break interpreter start
    import sys

    sys.stderr.write(f"dspark_hotfix: not active: cannot import the package: {exc}\n")
else:
    boot(__file__)
