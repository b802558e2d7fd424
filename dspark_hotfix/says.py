"""What the shim says, read from the registry's records: ``status()``, the verdict, the log line.

The registry decides and records one state per patch; everything an operator
reads (``dspark_hotfix.status()``, ``dspark-hotfix status`` and ``doctor``,
the log line, and ``/metrics`` through ``metrics``) is read here, the same way.
Imported with the registry's first log line or the first ``status()``.

The verdict, from the patches (guards follow theirs):

- ``fixing``: the reported bug is in this vLLM, and the shim corrects it;
- ``guarding``: the bug is fixed upstream; the shim still stops, early and
  clearly, what vLLM would crash on (``kv_cache_groups``, vLLM 0.25.0 to 0.27.1);
- ``removable``: nothing here is needed: the shim can go;
- ``problem``: a patch this vLLM needs (or one that could not be judged, a
  guard too) is not in place;
- ``undecided``: a patch is not judged yet (its module is not imported).

The line is the verdict and every record's state, in the words ``status()``
uses (``patched``, ``not_needed``, ``pending``, ``excluded``, ``failed``),
with the names of all but the ``not_needed`` ones: the last line of a pid is
its whole state (docs/OPERATORS.md quotes each line real processes print).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import dspark_hotfix
from dspark_hotfix import config, registry
from dspark_hotfix.patches import ALL
from dspark_hotfix.registry import (
    DISABLED,
    EXCLUDED,
    FAILED,
    NOT_NEEDED,
    PATCHED,
    PENDING,
    SCHEMA,
    STATES,
    Activation,
    Record,
    _attribute,
)


def verdict(rows: list[dict[str, Any]]) -> str:
    """What the shim does on the running vLLM, from status() rows (see the words above)."""
    if any(row["state"] == FAILED or (row["state"] == EXCLUDED and row["needed"] is not False)
           or (row["state"] == DISABLED and row["needed"]) for row in rows):
        return "problem"
    stops = {p.name: p.stops for p in ALL if not p.guards}
    rows = [row for row in rows if row["name"] in stops]
    if any(row["state"] in (PENDING, DISABLED) and row["needed"] is None for row in rows):
        return "undecided"
    if any(row["state"] == PATCHED and not stops[row["name"]] for row in rows):
        return "fixing"
    return "guarding" if any(row["state"] == PATCHED for row in rows) else "removable"


def state_line(activation: Activation) -> str | None:
    """The log line's state, or None while it waits: for every patch's verdict, and for a guard whose
    module is imported (its hook is still to run), not for one whose module this process may never
    import (kv_view_guard in an API server)."""
    records = list(activation.records.values())
    if any(r.state == PENDING and (not r.patch.guards or r.patch.module in sys.modules) for r in records):
        return None
    rows = [row(r) for r in records]
    names = {s: [each["name"] + (f" until {r.patch.module} is imported" if s == PENDING else "")
                 for r, each in zip(records, rows, strict=True) if each["state"] == s] for s in STATES}
    return f"{verdict(rows)}: " + ", ".join(f"{len(n)} {s}" + (f" ({', '.join(n)})" if s != NOT_NEEDED else "")
                                            for s, n in names.items() if n)


def row(r: Record) -> dict[str, Any]:
    """A record as status() gives it; a patched function that is no longer the shim's wrapper is failed."""
    state, detail = r.state, r.detail
    if state == PATCHED and _attribute(sys.modules.get(r.patch.module), r.patch.qualname)[2] is not r.wrapper:
        state, detail = FAILED, f"patched, then replaced: {r.patch.target} is no longer the shim's wrapper " \
                                "(its module reloaded?); restart the process"
    return {"name": r.patch.name, "target": r.patch.target, "state": state, "needed": r.needed,
            "calls": r.calls, "corrections": r.corrections, "detail": detail}


def status() -> dict[str, Any]:
    """What the shim did in this process; reads the records' states, changes nothing."""
    activation = registry._active
    watcher = next((f for f in sys.meta_path if type(f).__name__ == "VllmImportWatcher"), None)
    off = f"{config.ENABLE}={dspark_hotfix.shown(os.environ.get(config.ENABLE))} turns the shim off"
    records = list(activation.records.values()) if activation is not None else \
        [Record(p, PENDING, "waiting for vLLM to be imported") if watcher else
         Record(p, DISABLED, "not installed in this process" if dspark_hotfix.enabled() else off) for p in ALL]
    rows = [row(r) for r in records]
    return {"schema": SCHEMA, "version": dspark_hotfix.__version__, "pid": os.getpid(),
            "activated_by": activation.source if activation is not None else getattr(watcher, "source", None),
            "enabled": dspark_hotfix.enabled(),
            "strict": (activation.settings if activation is not None else config.Settings(p.name for p in ALL)).strict,
            "verdict": verdict(rows), "patches": rows}
