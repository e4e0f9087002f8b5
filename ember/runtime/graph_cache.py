"""Stage 7, runtime: whole-graph cache, so a warm process skips lowering and codegen too.

Key: the aten graph's code, its placeholders' shapes/strides/dtypes, the backend options,
torch's version and a hash of ember's lower/schedule/codegen/runtime sources (a compiler change
invalidates every entry). Value (JSON): wrapper source, C++ source, kernel signatures, the aten
ops the wrapper calls (by qualified name) and the graph's stats, stored with the sha256 of that
payload. Written atomically; an entry that does not parse or whose hash does not match (a
truncated write, a corrupt disk, an edit) is rebuilt with one warning. The wrapper source is
executed on load, so only entries whose hash verifies are used; nothing is unpickled.

Consumes: fx.GraphModule. Produces: entries for the kernel backend (ember.backends.ember).
"""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import torch

from .. import config
from ..logging import warn_once
from . import cache


@functools.lru_cache(None)
def sources_hash(packages: tuple = ("loopir", "lower", "schedule", "codegen", "runtime")) -> str:
    """A hash of the sources of these ember packages: a cache entry made by other code is
    not reused."""
    root = Path(__file__).resolve().parents[1]
    parts = []
    for pkg in packages:
        for f in sorted((root / pkg).glob("*.py")):
            parts.append(f.read_text())
    return cache.key_of(*parts)


def graph_key(gm, options) -> str | None:
    try:
        specs = []
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                v = n.meta.get("val", n.meta.get("example_value"))
                if isinstance(v, torch.Tensor):
                    specs.append((tuple(v.shape), tuple(v.stride()), str(v.dtype), str(v.device)))
                else:
                    specs.append(repr(v))
            elif n.op == "get_attr":
                return None
            elif isinstance(n.meta.get("val"), torch.Tensor):
                # the traced layouts are part of the program (an aot change to them, e.g. a
                # channels-last conv, must not be served a wrapper built for the old ones)
                specs.append((n.name, tuple(n.meta["val"].stride())))
        return cache.key_of(gm.code, repr(specs), repr(sorted(options.items())), torch.__version__,
                            sources_hash())
    except Exception:  # noqa: BLE001 - an uncachable graph just compiles
        return None


def _path(key: str) -> Path:
    return config.cache_subdir("graphs", key[:2]) / f"{key}.json"


def _payload_hash(payload: str) -> str:
    return hashlib.sha256(payload.encode()).hexdigest()


def load(key: str):
    path = _path(key)
    try:
        text = path.read_text()
    except OSError:
        return None
    try:
        doc = json.loads(text)
        if doc["sha256"] == _payload_hash(doc["payload"]):
            entry = json.loads(doc["payload"])
            cache.USED.add(("graphs", key))
            return entry
    except (ValueError, KeyError, TypeError):
        pass
    warn_once(f"graph-cache:{key}", f"graph cache entry {path} is corrupt (hash mismatch or "
              f"truncated); rebuilding it")
    return None


def store(key: str, entry: dict) -> None:
    path = _path(key)
    payload = json.dumps(entry)
    config.write_json(path, {"sha256": _payload_hash(payload), "payload": payload})
    cache.USED.add(("graphs", key))


def resolve_op(qualname: str):
    """'aten::mm.out' -> torch.ops.aten.mm.out"""
    ns_name, _, overload = qualname.rpartition(".")
    ns, _, name = ns_name.partition("::")
    return getattr(getattr(getattr(torch.ops, ns), name), overload or "default")
