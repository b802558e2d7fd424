"""The shim's state in this process, and the one reading of it.

The registry keeps one :class:`Record` per patch and sets its state. Every
reporter reads the records through this module, and only through it: the log
line, ``status()``, ``dspark-hotfix status`` and ``doctor``, and ``/metrics``.
So they cannot disagree. It imports nothing of the shim but the switches.
"""

import logging
import os
import sys
import threading
import types
from collections.abc import Iterable
from typing import Any

import dspark_hotfix
from dspark_hotfix import config

SCHEMA = 2  # of status() and the commands' JSON

# Guards every state change, which the registry makes, and every publish of the states to the
# gauges, where a slower publish must not write older states over newer. Never held while wrapt,
# vLLM's code or an import runs: hooks run under their module's import lock, and a thread holding
# this lock while waiting for that module would hang both. The registry renews it in a forked child.
lock = threading.Lock()

# A patch's state in this process.
PENDING = "pending"  # not judged yet: its module is not imported
PATCHED = "patched"  # vLLM calls the shim's wrapper
RAISED = "raised"  # patched, but its correction raised: vLLM's own answer was used at least once
NOT_NEEDED = "not_needed"  # the running vLLM is right already: left untouched
UNDECIDED = "undecided"  # judged, not applied: its probe could not tell whether this vLLM needs it
EXCLUDED = "excluded"  # judged, not applied: DSPARK_HOTFIX_PATCHES leaves it off
FAILED = "failed"  # cannot be applied, or vLLM no longer calls the wrapper (its module reloaded)
DISABLED = "disabled"  # the shim is off, or not installed in this process
STATES = (PATCHED, RAISED, NOT_NEEDED, UNDECIDED, PENDING, EXCLUDED, FAILED, DISABLED)

# The verdict: one word for the process, and what it means. Exit codes of status and doctor.
VERDICTS = {
    "fixing": "this vLLM has a bug a patch corrects or repairs, and the shim does",
    "guarding": (
        "this vLLM has the fix; the shim corrects nothing and only stops early, naming the cause,"
        " a setting this vLLM would crash on (the patched row): remove it only where no deployment"
        " uses that setting"
    ),
    "removable": (
        "this vLLM needs none of the patches: the shim does nothing here and can be removed"
    ),
    "undecided": (
        "a patch is not judged yet (its module is not imported, or its probe could not tell)"
    ),
    "problem": "a patch this vLLM needs is not in place",
}
# Any other verdict exits 1 (any problem makes the verdict "problem").
EXIT = {"fixing": 0, "guarding": 0, "removable": 3}
EXIT_CODES = """\
exit status of status and doctor:
  0  fixing or guarding: the fix is active where this vLLM needs it
  1  a problem (each is named), or undecided
  2  usage error
  3  removable: this vLLM needs none of the patches
"""


class Record:
    """One patch in this process: its state, and what the state rests on."""

    def __init__(self, patch: Any, state: str = PENDING, detail: str = "") -> None:
        self.patch, self.state = patch, state
        self.detail = detail or f"waiting for {' or '.join(patch.modules)}"
        self.needed: bool | None = None  # once judged; None: the probe could not tell
        self.calls = self.corrections = 0  # of the wrapper: the shim's whole cost while vLLM runs
        self.raised = ""  # what the correction raised, if it ever did
        self.wrapper: Any = None  # what vLLM's function was replaced with
        self.module: Any = None  # the module the decision was made on

    @property
    def target(self) -> str:
        """The target in the module it was decided on, or its first place until then."""
        return f"{getattr(self.module, '__name__', self.patch.module)}.{self.patch.qualname}"


def attribute(module: Any, qualname: str) -> tuple[Any, str, Any]:
    """The owner, name and value of the attribute ``qualname`` names in ``module``. The owner is
    None where the module has no such class, the value where there is no such attribute."""
    owner_name, dot, name = qualname.rpartition(".")
    owner = getattr(module, owner_name, None) if dot else module
    return (
        owner,
        name,
        vars(owner).get(name) if isinstance(owner, (type, types.ModuleType)) else None,
    )


def running(module: str) -> bool:
    """Whether the module is imported, but its code is still running (further up a thread)."""
    return bool(getattr(getattr(sys.modules.get(module), "__spec__", None), "_initializing", False))


def still_called(record: Record) -> bool:
    """Whether vLLM's attribute is the wrapper, or another tool's wrapper around it."""
    function = attribute(record.module, record.patch.qualname)[2]
    for _ in range(8):  # a bounded walk: __wrapped__ chains can loop
        if function is record.wrapper:
            return True
        try:
            function = getattr(function, "__wrapped__", None)
        except Exception:  # a proxy that raises on look-up
            return False
    return False


def stale(record: Record) -> bool:
    """Whether the record's decision was made on a module whose import did not complete: the module
    in ``sys.modules`` is another now, or none."""
    return (
        record.module is not None and sys.modules.get(record.module.__name__) is not record.module
    )


def row(record: Record) -> dict[str, Any]:
    """A record as status() gives it. A decision made on a module whose import did not complete (an
    interrupt, an error) stands for nothing: the module's next import decides again."""
    state, detail = record.state, record.detail
    if stale(record):
        state = PENDING
        detail = f"waiting for {record.module.__name__} (its last import did not complete)"
    elif state == PATCHED and not still_called(record):
        state = FAILED
        detail = (
            f"patched, then replaced: {record.target} is no longer the shim's wrapper"
            " (its module reloaded?); restart the process"
        )
    elif state == PATCHED and record.raised:
        state, detail = RAISED, f"{detail}; {record.raised}"
    return {
        "name": record.patch.name,
        "target": record.target,
        "state": state,
        "needed": record.needed,
        "calls": record.calls,
        "corrections": record.corrections,
        "detail": detail,
    }


def problems(rows: list[dict[str, Any]]) -> list[str]:
    """What the rows say is wrong, one line each."""
    found = [f"{r['name']}: {r['detail']}" for r in rows if r["state"] in (FAILED, RAISED)]
    found += [
        f"{r['name']} is needed but excluded by {config.PATCHES}"
        for r in rows
        if r["state"] == EXCLUDED and r["needed"]
    ]
    off = [r["name"] for r in rows if r["state"] == DISABLED and r["needed"]]
    if off:
        value = dspark_hotfix.shown(os.environ.get(config.ENABLE))
        found.append(f"{', '.join(off)} needed but {config.ENABLE}={value} turns the shim off")
    return found


def verdict(records: list[Record], rows: list[dict[str, Any]], found: list[str]) -> str:
    """The process word (see VERDICTS)."""
    if found:
        return "problem"
    if any(
        each["state"] == UNDECIDED
        or (each["state"] in (PENDING, DISABLED, EXCLUDED) and each["needed"] is None)
        for each in rows
    ):
        return "undecided"
    patched = [r.patch for r, each in zip(records, rows, strict=True) if each["state"] == PATCHED]
    if any(not patch.stops for patch in patched):
        return "fixing"
    return "guarding" if patched else "removable"


def judge(records: Iterable[Record]) -> dict[str, Any]:
    """The verdict, the rows and the problems: what every reporter shows."""
    records = list(records)
    rows = [row(r) for r in records]
    found = problems(rows)
    return {"verdict": verdict(records, rows, found), "patches": rows, "problems": found}


def exit_code(report: dict[str, Any]) -> int:
    return EXIT.get(report["verdict"], 1)


def line(records: Iterable[Record]) -> str | None:
    """The log line's state, or None while a patch waits for its module."""
    judged = judge(records)
    if any(each["state"] == PENDING for each in judged["patches"]):
        return None
    counts = []
    for state in STATES:
        names = [each["name"] for each in judged["patches"] if each["state"] == state]
        # Each state's patches are named, but for the patches this vLLM does not need.
        if names and state == NOT_NEEDED:
            counts.append(f"{len(names)} {state}")
        elif names:
            counts.append(f"{len(names)} {state} ({', '.join(names)})")
    return f"{judged['verdict']}: {', '.join(counts)}"


# A handler of our own, in vLLM's format: vLLM's logging neither swallows nor doubles the lines.
# Each step is taken again where an interrupt cut an earlier import of this module short.
_log = logging.getLogger("dspark_hotfix")
_log.propagate = False
_log.setLevel(logging.INFO)
if not _log.handlers:
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setFormatter(
        logging.Formatter("%(levelname)s %(asctime)s [%(name)s] %(message)s", "%m-%d %H:%M:%S")
    )
    _log.addHandler(_handler)


def log(level: int, text: str) -> None:
    """One line to the operator. A logging config without disable_existing_loggers=false would
    disable this logger, made before vLLM configures logging: it is enabled again here."""
    _log.disabled = False
    _log.log(level, "%s", text)
