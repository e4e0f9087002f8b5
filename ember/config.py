"""The one place that reads ember's environment variables, and the per-compile settings.

Environment (read when asked, so tests can set them with monkeypatch):
  EMBER_LOGS       comma list of log areas (see ember.logging.AREAS), or "all"
  EMBER_DEBUG_DIR  directory where each compile writes every stage's IR as readable files
  EMBER_CACHE_DIR  on-disk cache for built kernels and compiled graphs (default: ~/.cache/ember)
  EMBER_BACKEND_CACHE  "0": a new process recompiles captured graphs after capture instead of
                   loading the backend's product from the cache dir (backends/backend_cache.py)
  EMBER_STRICT     "1": internal errors raise instead of falling back to eager
  EMBER_PROGRESS   "0": no live progress line on a TTY
  EMBER_PROFILE    "1": generated kernels show in torch.profiler tables by name (the "profile"
                   backend option)
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable

MODES = ("default", "reduce-overhead", "max-autotune")


def _flag(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() not in ("0", "false", "no", "off")


def log_areas() -> set[str]:
    raw = os.environ.get("EMBER_LOGS", "")
    return {a.strip() for a in raw.split(",") if a.strip()}


def debug_dir() -> Path | None:
    raw = os.environ.get("EMBER_DEBUG_DIR")
    return Path(raw) if raw else None


def cache_dir() -> Path:
    raw = os.environ.get("EMBER_CACHE_DIR")
    if raw:
        return Path(raw)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ember"


def cache_subdir(*parts: str) -> Path:
    """`cache_dir()/parts...`, created private to the user (0700): the cache holds code that
    ember loads and runs, so no other user may write into it."""
    d = cache_dir()
    for p in ("",) + parts:
        d = d / p if p else d
        if not d.is_dir():
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
    return d


def write_json(path: Path, data) -> None:
    """Write `data` as JSON to `path` (a cache file) atomically: a reader sees the old file or
    the whole new one, never a part."""
    import json
    import tempfile
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def backend_cache() -> bool:
    return _flag("EMBER_BACKEND_CACHE", default=True)


def strict() -> bool:
    return _flag("EMBER_STRICT")


def progress() -> bool:
    return _flag("EMBER_PROGRESS", default=True)


def profile_kernels() -> bool:
    return _flag("EMBER_PROFILE")


@dataclasses.dataclass(frozen=True)
class CompileSettings:
    """Everything one `ember.compile(...)` call fixed. Passed down to capture as `ctx`."""

    backend: Callable[..., Any]          # backend protocol: (gm, example_inputs) -> callable
    backend_name: str
    mode: str = "default"
    fullgraph: bool = False
    dynamic: bool | None = None
    options: dict = dataclasses.field(default_factory=dict)
    recompile_limit: int = 8
    # the compile() arguments these settings came from: what a pickled compiled module carries
    request: dict | None = dataclasses.field(default=None, compare=False)
