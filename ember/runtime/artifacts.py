"""Stage 7, runtime: portable cache artifacts, to ship a warm disk cache to another machine.

`save(version) -> bytes` packs the disk-cache entries this process created or used (cache.USED:
built kernels, whole-graph entries) into one blob; `load(blob, version)` unpacks one into this
process's cache dir, where the next compile of the same graphs hits it.

Format 1:
    b"EMBER-CACHE\\0"  magic
    u32 (big endian)  length of the header
    header            JSON: format, the environment (ember version and compiler-source hash,
                      torch, python, C++ compiler, machine and the -march=native it means),
                      and per file: its path in the cache dir, size and sha256
    payload           the files' bytes, in the header's order

`load` checks everything before it writes anything: the magic, the header, an environment equal
to this one (a kernel built with -march=native for another CPU may not run here; a graph entry
of another ember or torch would never hit), the payload's size and every file's sha256. Then
each file goes to a temp file beside its destination, and only when all are written are they
renamed into place (kernels' .so before their marker): a blob is loaded whole or not at all.
Triton kernels (GPU) are not packed: they are rebuilt from source.

Consumes: the cache dir. Produces: bytes; files in the cache dir.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import struct
import subprocess
import sys
import tempfile

import torch

from .. import config
from . import build, cache, graph_cache

MAGIC = b"EMBER-CACHE\0"
FORMAT = 1
_PATH = re.compile(r"(kernels|graphs)/[0-9a-f]{2}/[0-9a-f]{64}\.(so|cpp|json)")


@functools.lru_cache(None)
def native_arch() -> str:
    """What -march=native means on this machine (the kernels are built for it)."""
    try:
        out = subprocess.run([build.CXX, "-march=native", "-Q", "--help=target"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    m = re.search(r"^\s*-march=\s*(\S+)", out, re.M)
    return m.group(1) if m else "unknown"


def environment(version: str) -> dict:
    return {"ember": version, "ember_compiler": graph_cache.sources_hash()[:16],
            "torch": torch.__version__, "python": "%d.%d" % sys.version_info[:2],
            "cxx": build.compiler_version(), "machine": platform.machine(),
            "march": native_arch()}


def _entry_files(kind: str, key: str) -> list[str]:
    if kind == "kernels":
        return [f"kernels/{key[:2]}/{key}.{ext}" for ext in ("so", "cpp", "json")]
    return [f"graphs/{key[:2]}/{key}.json"]


def save(version: str) -> bytes:
    root = config.cache_dir()
    files, blobs = [], []
    for kind, key in sorted(cache.USED):
        if kind == "kernels" and cache.lookup(key) is None:
            continue                     # gone or corrupt since: nothing worth shipping
        paths = _entry_files(kind, key)
        try:
            datas = [(root / p).read_bytes() for p in paths]
        except OSError:
            continue
        for p, data in zip(paths, datas):
            files.append({"path": p, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
            blobs.append(data)
    header = json.dumps({"format": FORMAT, "environment": environment(version),
                         "files": files}).encode()
    return MAGIC + struct.pack(">I", len(header)) + header + b"".join(blobs)


def _reject(why: str):
    raise ValueError(f"ember.load_cache_artifacts: {why}; nothing was loaded")


def _parse(data: bytes, version: str) -> list[tuple[str, bytes]]:
    if not data.startswith(MAGIC):
        _reject("not an ember cache artifact (no EMBER-CACHE header)")
    try:
        (n,) = struct.unpack_from(">I", data, len(MAGIC))
        start = len(MAGIC) + 4
        header = json.loads(data[start:start + n].decode())
        fmt, env, files = header["format"], header["environment"], header["files"]
    except (struct.error, ValueError, KeyError, TypeError, UnicodeDecodeError):
        _reject("the header is corrupt or truncated")
    if fmt != FORMAT:
        _reject(f"artifact format {fmt!r}; this ember reads format {FORMAT}")
    here = environment(version)
    foreign = [f"{k} {env.get(k)!r} (here {v!r})" for k, v in here.items() if env.get(k) != v]
    if foreign:
        _reject("made for another environment: " + ", ".join(foreign))
    out, pos = [], start + n
    for f in files:
        path, size = f.get("path"), f.get("size")
        if not isinstance(path, str) or not _PATH.fullmatch(path) or not isinstance(size, int):
            _reject(f"the header lists a bad entry {f!r}")
        body = data[pos:pos + size]
        pos += size
        if len(body) != size or hashlib.sha256(body).hexdigest() != f.get("sha256"):
            _reject(f"{path} is corrupt or truncated (size or sha256 mismatch)")
        out.append((path, body))
    if pos != len(data):
        _reject(f"{len(data) - pos} bytes after the last file")
    return out


def load(data: bytes, version: str) -> dict:
    files = _parse(data, version)
    root = config.cache_dir()
    temps: list[tuple[str, str]] = []
    try:
        for path, body in files:
            d = config.cache_subdir(*path.split("/")[:-1])
            temps.append((_write_temp(d, body), str(root / path)))
    except BaseException:
        for tmp, _ in temps:
            _unlink(tmp)
        raise
    # markers last: a kernel entry is valid once its .json (the .so's sha256) is in place
    temps.sort(key=lambda t: t[1].endswith(".json") and "/kernels/" in t[1])
    try:
        for i, (tmp, dest) in enumerate(temps):
            os.replace(tmp, dest)
    except BaseException:
        for tmp, _ in temps[i:]:
            _unlink(tmp)
        raise
    counts = {"kernels": 0, "graphs": 0}
    for path, _ in files:
        if path.startswith("graphs/") or path.endswith(".so"):
            counts[path.split("/")[0]] += 1
    return counts


def _write_temp(d, body: bytes) -> str:
    fd, tmp = tempfile.mkstemp(dir=d, suffix=".load.tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(body)
    except BaseException:
        _unlink(tmp)
        raise
    return tmp


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
