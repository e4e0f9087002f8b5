"""Per-area loggers, enabled by EMBER_LOGS=area,area (like TORCH_LOGS), and warn-once.

Areas: graph, guards, recompiles, graph_breaks, aot, output_code, perf (or "all").
"""
from __future__ import annotations

import logging as _logging
import sys
import threading
import warnings

from . import config

AREAS = ("graph", "guards", "recompiles", "graph_breaks", "aot", "output_code", "perf", "fallbacks",
         "dynamic")

_configured: set[str] = set()
_lock = threading.Lock()
_warned: set[str] = set()


def get_logger(area: str) -> _logging.Logger:
    """Logger `ember.<area>`; INFO output goes to stderr when the area is in EMBER_LOGS."""
    if area not in AREAS:
        raise ValueError(f"unknown log area {area!r}; valid: {', '.join(AREAS)}")
    logger = _logging.getLogger(f"ember.{area}")
    enabled = config.log_areas()
    on = area in enabled or "all" in enabled
    with _lock:
        if area not in _configured:
            handler = _logging.StreamHandler(sys.stderr)
            handler.setFormatter(_logging.Formatter(f"[ember:{area}] %(message)s"))
            logger.addHandler(handler)
            logger.propagate = False
            _configured.add(area)
        logger.setLevel(_logging.INFO if on else _logging.WARNING)
    return logger


def enabled(area: str) -> bool:
    areas = config.log_areas()
    return area in areas or "all" in areas


def warn_once(key: str, message: str, category: type[Warning] = UserWarning) -> None:
    """Issue `message` as a warning the first time `key` is seen in this process."""
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(f"ember: {message}", category, stacklevel=3)


def reset_warnings() -> None:
    with _lock:
        _warned.clear()
