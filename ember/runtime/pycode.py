"""Stage 7, runtime: code objects of large generated Python sources, cached on disk.

Generated Python can be large: a ResNet-50's guard-and-run function (capture/entry.py) is
~400 KB and takes ~0.2 s to compile, its kernel wrapper ~0.05 s; a warm start would pay that
again in every new process. `compile_cached(source, filename)` keeps the code object (marshal)
under cache_dir()/pycode/, keyed by the sha256 of the source, the filename and the
interpreter's bytecode magic (marshal's format is per Python version). An entry carries the
sha256 of its bytes; a corrupt or unreadable one is compiled again, and a cache that cannot be
written is skipped. Sources under MIN_SIZE are compiled directly (a file read costs more).

Consumes: Python source text. Produces: code objects.
"""
from __future__ import annotations

import hashlib
import importlib.util
import marshal
import os
import tempfile
import types

from .. import config

MIN_SIZE = 16 << 10


def compile_cached(source: str, filename: str) -> types.CodeType:
    if len(source) < MIN_SIZE:
        return compile(source, filename, "exec")
    key = hashlib.sha256(importlib.util.MAGIC_NUMBER + f"\0{filename}\0{source}".encode())
    key = key.hexdigest()
    try:
        path = config.cache_subdir("pycode", key[:2]) / f"{key}.marshal"
        data = path.read_bytes()
        if hashlib.sha256(data[64:]).hexdigest().encode() == data[:64]:
            code = marshal.loads(data[64:])
            if isinstance(code, types.CodeType):
                return code
    except (OSError, ValueError, EOFError, TypeError):
        pass
    code = compile(source, filename, "exec")
    try:
        payload = marshal.dumps(code)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(hashlib.sha256(payload).hexdigest().encode() + payload)
        os.replace(tmp, path)
    except (OSError, NameError, ValueError):      # NameError: no cache dir (path unset)
        pass
    return code
