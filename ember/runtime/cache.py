"""Stage 7, runtime: the on-disk cache of built kernels.

An entry is `<cache_dir>/kernels/<key[:2]>/<key>.so` plus `<key>.json` recording the .so's
sha256; the key hashes source, compiler flags, compiler and torch versions. Entries are written
to temp files and renamed into place, and an entry whose marker is missing or whose hash does
not match (partial write, corruption) is treated as absent and rebuilt.

Consumes: source text + flags. Produces: paths, lookup/commit.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .. import config, counters

# (kind, key) of every entry this process built or used: what save_cache_artifacts packs
# ("kernels": <key>.so/.cpp/.json here; "graphs": graph_cache's entries)
USED: set = set()


def key_of(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


def entry_dir(key: str) -> Path:
    return config.cache_subdir("kernels", key[:2])


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def lookup(key: str) -> Path | None:
    d = entry_dir(key)
    so, marker = d / f"{key}.so", d / f"{key}.json"
    try:
        meta = json.loads(marker.read_text())
        if so.exists() and meta.get("sha256") == _digest(so):
            USED.add(("kernels", key))
            counters.bump("kernel_cache_hits")
            return so
    except (OSError, ValueError):
        pass
    return None


def commit(key: str, built: Path, source: str) -> Path:
    """Move a freshly built .so into the cache atomically, then write its marker."""
    d = entry_dir(key)
    so = d / f"{key}.so"
    os.replace(built, so)
    (d / f"{key}.cpp").write_text(source)
    config.write_json(d / f"{key}.json", {"sha256": _digest(so)})
    USED.add(("kernels", key))
    return so
