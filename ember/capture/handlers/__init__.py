"""Capture, opcode handlers: `HANDLERS[opname] = fn(tracer, frame, instr)`.

Each handler is registered with `@handler("OPNAME", since=(3, 11), until=None)` (version range of
CPython that has the opcode, https://docs.python.org/3/library/dis.html). A handler returns None
to continue, or a `Return` to finish the frame. Families: stack.py (locals, globals, constants,
stack ops), ops.py (operators, subscripts), containers.py (BUILD_*, unpacking, iteration),
calls.py (CALL, MAKE_FUNCTION, attributes), control.py (jumps, return, generators, raise,
match), contexts.py (with-statements).
"""
from __future__ import annotations

import sys

HANDLERS: dict = {}
_PY = sys.version_info[:2]


def handler(*opnames: str, since=(3, 11), until=None):
    def deco(fn):
        if _PY >= since and (until is None or _PY < until):
            for op in opnames:
                HANDLERS[op] = fn
        return fn
    return deco


from . import calls, containers, contexts, control, ops, stack  # noqa: E402,F401
from .. import aggregates, iters, stdlib  # noqa: E402,F401  (add their entries to BUILTINS)
