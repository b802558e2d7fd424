"""The shim's state on vLLM's own ``/metrics``, as three Prometheus gauges.

``dspark_hotfix_info{version,activated_by}`` is 1 in every process where the
shim is active; ``dspark_hotfix_patch_state{patch,state}`` is 1 for each
patch's current state and 0 for a state it has left; and
``dspark_hotfix_patch_needed{patch}`` says, once the patch is decided in the
process, whether the running vLLM needs it: 1, 0, or -1 where it could not be
judged (a patch that stays pending in a process never gets that series there).

The shim never imports ``prometheus_client``: :func:`on_import` is a wrapt
post-import hook on it, registered by ``registry.activate``, so a process that
never imports it pays nothing, and where the shim is off nothing is created.
:func:`publish` runs after each decision.

One mechanism serves both of vLLM's ``/metrics`` registries: gauges registered
in prometheus_client's default ``REGISTRY``, which vLLM serves with one API
server, write to per-process mmap files when ``PROMETHEUS_MULTIPROC_DIR`` was
set before ``prometheus_client`` was imported, and vLLM's
``MultiProcessCollector`` (``--api-server-count`` above 1) reads every
process's files. There each series keeps its ``pid`` (``liveall``): the
processes of one server decide differently (on vLLM 0.25.0 an API server
imports none of the patches' modules but ``kv_cache_utils``, the engine core
and the workers the rest), so a maximum or a sum would mix a pending patch in
one process with the same patch installed in another; and a process that
``mark_process_dead`` reports dead loses its series instead of keeping stale
ones. With one API server, ``/metrics`` shows that process's own gauges only.
A process forked after the gauges were made writes series of its own (its
pid) at its next decision; nothing is written at the fork itself, where a lock
of prometheus_client's may be held by a thread the child does not have.

Failure policy: a failure here is said once and never reaches vLLM, in strict
mode too (the metrics are a report, not a correction); the patches are not
touched by it.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

import dspark_hotfix

if TYPE_CHECKING:  # imported by the registry: it reads the registry's names when called, never at import
    from dspark_hotfix.registry import Activation

_lock = threading.Lock()  # one publish at a time: a slower one must not write older states over newer
_gauges: tuple[Any, Any, Any] | None = None  # info, state, needed; once per process, as Prometheus requires
_shown: dict[str, set[str]] = {}  # per patch: the states published, to set those it has left to 0
_warned = False


def on_import(activation: Activation, module: Any) -> None:
    """wrapt's hook on ``prometheus_client``: create the gauges, show the states so far."""
    global _gauges
    if not activation.enabled:
        return
    try:
        with _lock:
            if _gauges is None:
                mode = "liveall"  # per process, see the module's docstring
                _gauges = (
                    module.Gauge("dspark_hotfix_info", "The dspark_hotfix shim is active in this process: its "
                                 "version and what activated it", ["version", "activated_by"], multiprocess_mode=mode),
                    module.Gauge("dspark_hotfix_patch_state", "1 for the patch's state in this process, 0 for a "
                                 "state it has left", ["patch", "state"], multiprocess_mode=mode),
                    module.Gauge("dspark_hotfix_patch_needed", "Whether this vLLM needs the patch, once decided in "
                                 "this process: 1 yes, 0 no, -1 not judged", ["patch"], multiprocess_mode=mode),
                )
            _gauges[0].labels(dspark_hotfix.__version__, activation.source).set(1)
    except Exception as exc:
        _failed(exc)
        return
    publish(activation)


def publish(activation: Activation) -> None:
    """Set the gauges to the records' states; a no-op until ``prometheus_client`` is imported."""
    if _gauges is None:
        return
    from dspark_hotfix.registry import PENDING

    _, state, needed = _gauges
    try:
        with _lock:
            for record in list(activation.records.values()):
                name, now = record.patch.name, record.state
                for left in _shown.setdefault(name, set()) - {now}:
                    state.labels(name, left).set(0)
                state.labels(name, now).set(1)
                _shown[name].add(now)
                if now != PENDING:
                    needed.labels(name).set(-1 if record.needed is None else int(record.needed))
    except Exception as exc:
        _failed(exc)


def _failed(exc: Exception) -> None:
    global _warned
    if not _warned:
        from dspark_hotfix.registry import _say

        _warned = True
        _say(logging.WARNING, f"cannot show the shim's state on /metrics ({type(exc).__name__}: {exc}); "
                                       "the patches are not affected")
