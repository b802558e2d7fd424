"""The shim's state on vLLM's own ``/metrics``, as three Prometheus gauges.

``dspark_hotfix_info{version,activated_by}`` is 1 in every process where the shim is active.
``dspark_hotfix_patch_state{patch,state,stop}`` is 1 for each patch's current state, and 0 for each
other state (a state set). ``dspark_hotfix_patch_needed{patch,stop}`` says, once the patch is judged
in the process, whether this vLLM needs it: 1, 0, or -1 where its probe could not tell. ``stop`` is
``true`` for a stop, which corrects nothing (docs/OPERATORS.md's alert for guarding pods reads it).

The values are ``state.judge``'s rows, as everywhere else. :func:`publish` runs
after each decision, and at each scrape of prometheus_client's default
registry, which vLLM serves with one API server. So a reloaded target shows
``failed`` there, as ``status()`` does.

The shim never imports ``prometheus_client``: the registry hooks its import,
so a process that never imports it pays nothing. With ``PROMETHEUS_MULTIPROC_DIR``
(vLLM's ``--api-server-count`` above 1), the gauges write per-process files
that vLLM's ``MultiProcessCollector`` reads; each series keeps its ``pid``
(``liveall``), because the processes of one server judge differently. There no
scrape runs in the process that writes them, so a thread of each process
publishes again every ``EVERY`` seconds. It takes ``state.lock`` to publish, and
a fork waits for that lock: prometheus_client's own lock, held at a fork by
that thread, would hang the child's next metric.

A failure here is said once and never reaches vLLM, in strict mode too.
"""

import logging
import os
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any

import dspark_hotfix
from dspark_hotfix import state

_gauges: tuple[Any, ...] | None = None  # info, state, needed: set once made; (): they could not be
EVERY = 5.0  # seconds between a process's publishes under PROMETHEUS_MULTIPROC_DIR
_refresher = 0  # the pid whose refresher runs
_held = False  # whether this fork's _hold took state.lock


def publish(source: str, records: Iterable[state.Record], module: Any = None) -> None:
    """Set the gauges to the records' states; nothing until ``prometheus_client`` has run. Also
    wrapt's hook on ``prometheus_client`` (``module``): it runs once the module has run, inside its
    import."""
    global _gauges
    if module is None and not state.running("prometheus_client"):
        module = sys.modules.get("prometheus_client")
    # Further up this thread, the module is still running.
    if not hasattr(module, "Gauge"):
        return
    try:
        with state.lock:
            # The gauges are marked made once they are registered too: an interrupt before that
            # leaves both to the next publish, which registers the same collector again (it names
            # no series until then).
            if _gauges is None:
                made = _make(module)
                _at_scrape.args = (source, records)
                module.REGISTRY.register(_at_scrape)
                _gauges = made
            if not _gauges:
                return
            info, states, needed = _gauges
            # Set at every publish: a forked child's files start empty.
            info.labels(dspark_hotfix.__version__, source).set(1)
            for record, row in zip(records, state.judge(records)["patches"], strict=True):
                # "true" for a stop, which corrects nothing (see Patch.stops).
                stop = str(record.patch.stops).lower()
                for word in state.STATES:
                    states.labels(row["name"], word, stop).set(int(word == row["state"]))
                if row["state"] != state.PENDING:
                    judged = -1 if row["needed"] is None else int(row["needed"])
                    needed.labels(row["name"], stop).set(judged)
            if "PROMETHEUS_MULTIPROC_DIR" in os.environ and _refresher != os.getpid():
                _refresh(source, records)
    except Exception as exc:
        _gauges = ()  # said once, never retried
        state.log(
            logging.WARNING,
            f"cannot show the shim's state on /metrics ({type(exc).__name__}: {exc}); "
            "the patches are not affected",
        )


def _refresh(source: str, records: Iterable[state.Record]) -> None:
    """This process's refresher (a forked child starts its own at its first publish)."""
    global _refresher

    def loop() -> None:
        while True:
            time.sleep(EVERY)
            publish(source, records)

    if not _refresher:
        os.register_at_fork(before=_hold, after_in_parent=_release)
    threading.Thread(target=loop, name="dspark_hotfix metrics", daemon=True).start()
    _refresher = os.getpid()


def _hold() -> None:
    # Not forever: the forking thread may hold it itself. The child gets a fresh lock (registry).
    global _held
    _held = state.lock.acquire(timeout=1)


def _release() -> None:
    global _held
    if _held:
        _held = False
        state.lock.release()


def _make(module: Any) -> tuple[Any, ...]:
    # Per process (see above), and apart from any registry: the scrape-time collector serves them.
    apart = {"multiprocess_mode": "liveall", "registry": None}
    return (
        module.Gauge(
            "dspark_hotfix_info",
            "The dspark_hotfix shim is active in this process: its version and what activated it",
            ["version", "activated_by"],
            **apart,
        ),
        module.Gauge(
            "dspark_hotfix_patch_state",
            "1 for the patch's state in this process, 0 for each other "
            "state; stop: whether the patch is a stop",
            ["patch", "state", "stop"],
            **apart,
        ),
        module.Gauge(
            "dspark_hotfix_patch_needed",
            "Whether this vLLM needs the patch, once judged in this "
            "process: 1 yes, 0 no, -1 could not be judged",
            ["patch", "stop"],
            **apart,
        ),
    )


class _AtScrape:
    """The one collector registered: it brings the gauges up to date when scraped, then serves them.
    Until they are made it names no series, so registering it again (after an interrupt) is
    harmless."""

    args: tuple[str, Iterable[state.Record]] = ("", ())

    def collect(self) -> list[Any]:
        # A scrape during a publish, or during a state change, reads what that writes.
        if not state.lock.locked():
            publish(*self.args)
        return [family for gauge in _gauges or () for family in gauge.collect()]


_at_scrape = _AtScrape()
