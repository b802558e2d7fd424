"""Each real patch's test knowledge lives in one module: ``tests/patches/test_<name>.py``.

Beside its own tests (its correction as a plain function, its properties), that module declares:

``PATCH``
    The patch (``dspark_hotfix.patches.<name>.PATCH``).
``FIX``
    Its upstream fix: ``(old, new)`` edits of its target module's file in a copy of the stand-in.
``FAULTS``
    Stand-in builds it does not expect, each a :class:`Fault`.
``RELEASED``
    Its state on each real vLLM release the real tier installs (``RELEASES``).
``REVERT``
    The :class:`Revert` edits that re-create the reported build from vLLM 0.25.0 for it
    (``tests/real_vllm/revert.py`` applies them; its state there is ``patched``). Empty: none.
``exercise()``
    Where a fault is ``at_call``: calls its target in the stand-in as vLLM does, and returns the
    answer.

Checks on real vLLM that only this patch makes close the module, in a section marked ``real_vllm``
that uses ``tests/real_vllm/runs.py`` (``released``, ``reverted``, ``hybrid_off``, ``in_venv``).

``tests/patches/test_every_patch.py`` runs the same tests over ``dspark_hotfix.patches.ALL`` from
these declarations. Nothing else in tests/ names a real patch: adding one is its module, its entry
in ``ALL``, its test module and its stand-in edit; removing one is the reverse.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from dspark_hotfix.patches import Patch
from scripts.venvs import LINES_VERSIONS as RELEASES  # noqa: F401  (the releases RELEASED covers)


@dataclass(frozen=True)
class Fault:
    """A stand-in build the patch does not expect: the stand-in with ``edits`` (file -> (old, new)
    pairs)."""

    edits: dict[str, list[tuple[str, str]]]
    detail: str  # what the patch's status detail must say
    at_call: bool = False  # the correction fails when vLLM calls the function, not at import
    state: str = (
        "failed"  # its state: failed, or undecided where its probe cannot tell on that build
    )
    remove: tuple[str, ...] = field(default=())  # files taken out of the copy


@dataclass(frozen=True)
class Revert:
    """One line of a released vLLM changed back to the reported build's."""

    path: str  # inside the vllm package
    function: str  # Class.method holding the line
    line: str  # the line as it reads in the release, without its indentation
    replacement: str | None  # None: the line is dropped


KVI = "vllm/v1/kv_cache_interface.py"
# where the stand-in builds its sliding-window spec
SWA_FILE = "vllm/v1/attention/backends/mla/sparse_swa.py"

# The stand-in builds several patches meet, each written once: a patch that meets one declares it in
# its FAULTS under the same name, with what its status says there (``Fault(BUILDS[name], detail,
# ...)``).
BUILDS: dict[str, dict[str, list[tuple[str, str]]]] = {
    # Renamed everywhere, as a release renames it: a model module that imports it (a spec patch's
    # FIX applied, once that patch is removed) imports the new name.
    "get_kv_quant_mode missing": {"*": [("get_kv_quant_mode", "kv_quant_mode_for")]},
    # Spec classes a probe cannot build or size: it cannot tell, and leaves vLLM's function alone.
    "spec class with an unknown required field": {
        KVI: [
            ("from dataclasses import dataclass", "from dataclasses import InitVar, dataclass"),
            (
                "class SlidingWindowMLASpec(_DeepseekV4Spec):\n    sliding_window: int\n",
                (
                    "class SlidingWindowMLASpec(_DeepseekV4Spec):\n    sliding_window: int\n"
                    "    window_layout: InitVar[str]\n\n"
                    "    def __post_init__(self, window_layout: str) -> None:\n"
                    "        super().__post_init__()\n"
                ),
            ),
        ],
        SWA_FILE: [
            ('model_version="deepseek_v4",', 'model_version="deepseek_v4", window_layout="ring",')
        ],
    },
    "spec page rule raises": {
        KVI: [
            (
                "class SlidingWindowMLASpec(_DeepseekV4Spec):\n    sliding_window: int\n",
                (
                    "class SlidingWindowMLASpec(_DeepseekV4Spec):\n    sliding_window: int\n\n   "
                    " @property\n    def real_page_size_bytes(self) -> int:\n        if"
                    " self.kv_quant_mode != KVQuantMode.NONE:\n            raise"
                    " NotImplementedError('quantized SWA pages are sized by the backend')\n       "
                    " return _DeepseekV4Spec.real_page_size_bytes.fget(self)\n"
                ),
            )
        ]
    },
}


def engine_start(standin_shim: Any, monkeypatch: Any, switch: str) -> dict[str, Any]:
    """The stand-in engine's start (tests/standin/warmup.py) in this process, ``DSPARK_HOTFIX`` set
    to ``switch``: its KV views, the draft weights it loaded and its error."""
    import dspark_hotfix

    standin_shim()
    monkeypatch.setenv("DSPARK_HOTFIX", switch)
    dspark_hotfix.install()
    return importlib.import_module("warmup").run()


def declared(patch: Patch) -> ModuleType:
    """The test module of ``patch``: tests/patches/test_<name>.py."""
    return importlib.import_module(f"tests.patches.test_{patch.name}")


def module_file(patch: Patch) -> str:
    """The file of ``patch``'s target module inside the stand-in build (or a vLLM package's
    parent)."""
    return patch.module.replace(".", "/") + ".py"


def fixed_edits(patches: tuple[Patch, ...] | list[Patch]) -> dict[str, list[tuple[str, str]]]:
    """The stand-in edits of the upstream fixes of ``patches``, by file; two patches on one module
    both apply."""
    edits: dict[str, list[tuple[str, str]]] = {}
    for patch in patches:
        edits.setdefault(module_file(patch), []).extend(declared(patch).FIX)
    return edits
