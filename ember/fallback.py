"""The fallback policy, shared by every stage: an error while compiling (or, for work deferred to
the first call, while finishing the compile) makes that graph run eagerly, with one warning naming
the backend, the stage and a one-line reason. EMBER_STRICT=1 raises instead.

`stage(name)` tags an exception escaping a block with the stage it came from (the innermost tag
wins), so the warning can say "failed in lower" rather than just "failed".
"""
from __future__ import annotations

import contextlib

from . import config, counters
from .errors import BackendCompilerFailed
from .logging import get_logger, warn_once

log = get_logger("fallbacks")


@contextlib.contextmanager
def stage(name: str):
    try:
        yield
    except Exception as exc:
        if getattr(exc, "ember_stage", None) is None:
            try:
                exc.ember_stage = name
            except AttributeError:   # an exception type with __slots__: stage stays unknown
                pass
        raise


def fall_back(backend: str, exc: BaseException, what: str = "this graph") -> None:
    """Raise `exc` under EMBER_STRICT=1; otherwise count it, warn once and return (the caller
    then runs `what` eagerly)."""
    if config.strict():
        raise exc
    counters.bump("fallbacks")
    err = BackendCompilerFailed(backend, getattr(exc, "ember_stage", None) or "compile", exc)
    warn_once(f"backend-fallback:{backend}:{err}",
              f"{err}; running {what} eagerly (EMBER_STRICT=1 raises, "
              f"EMBER_LOGS=fallbacks shows the trace)")
    log.info("fallback in backend %s", backend, exc_info=exc)
