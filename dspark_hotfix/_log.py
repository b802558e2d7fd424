"""The ``dspark_hotfix`` logger, built on first use.

``import logging`` costs a few milliseconds; the shim runs in every Python
process of a serving image, so nothing here runs until there is something to say.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

_logger: Any = None
# Threads importing vLLM at once may all have something to say first: one handler.
_lock = threading.Lock()


def logger(level: str = "INFO") -> Any:
    global _logger
    if _logger is None:
        with _lock:
            if _logger is None:
                import logging

                log = logging.getLogger("dspark_hotfix")
                if not log.handlers:
                    handler = logging.StreamHandler(sys.stderr)
                    handler.setFormatter(
                        logging.Formatter("%(name)s[%(process)d] %(levelname)s: %(message)s")
                    )
                    log.addHandler(handler)
                # Our own handler, so vLLM's logging configuration neither swallows
                # nor duplicates these lines.
                log.propagate = False
                log.setLevel(level)
                _logger = log
    return _logger
