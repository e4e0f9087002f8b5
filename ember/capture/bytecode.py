"""Capture, bytecode layer: CPython 3.11/3.12 code objects → a normalized instruction list.

Consumes a code object; produces `list[Instr]` where version differences are folded once here so
the interpreter's handlers see one vocabulary:
  - 3.11 `PRECALL` is dropped and `KW_NAMES` is attached to the following `CALL` (`Instr.kw_names`);
  - 3.12 `LOAD_ATTR` with the method flag becomes `LOAD_METHOD`; `LOAD_GLOBAL`/`LOAD_ATTR` carry
    `push_null` instead of a low-bit flag;
  - directional jumps (`POP_JUMP_FORWARD_IF_FALSE`, `JUMP_BACKWARD`, ...) become `POP_JUMP_IF_FALSE`,
    `JUMP`; every jump names its target as an index into the list (`Instr.target`);
  - 3.12 `FOR_ITER` targets the instruction after its `END_FOR` (as 3.11 does).
The exception table is decoded into `ExceptionEntry` records (by instruction index).

`assemble(code)` goes the other way through the `bytecode` package (decode/assemble only); it is
used by the identity round-trip test and by later residual-bytecode work.
"""
from __future__ import annotations

import dataclasses
import dis
import sys
from types import CodeType

PY = sys.version_info[:2]

_JUMP_ALIASES = {
    "JUMP_FORWARD": "JUMP", "JUMP_BACKWARD": "JUMP", "JUMP_BACKWARD_NO_INTERRUPT": "JUMP",
    "POP_JUMP_FORWARD_IF_FALSE": "POP_JUMP_IF_FALSE", "POP_JUMP_BACKWARD_IF_FALSE": "POP_JUMP_IF_FALSE",
    "POP_JUMP_FORWARD_IF_TRUE": "POP_JUMP_IF_TRUE", "POP_JUMP_BACKWARD_IF_TRUE": "POP_JUMP_IF_TRUE",
    "POP_JUMP_FORWARD_IF_NONE": "POP_JUMP_IF_NONE", "POP_JUMP_BACKWARD_IF_NONE": "POP_JUMP_IF_NONE",
    "POP_JUMP_FORWARD_IF_NOT_NONE": "POP_JUMP_IF_NOT_NONE",
    "POP_JUMP_BACKWARD_IF_NOT_NONE": "POP_JUMP_IF_NOT_NONE",
}


@dataclasses.dataclass
class Instr:
    opname: str
    arg: int | None
    argval: object
    offset: int
    lineno: int | None
    target: int | None = None        # index of the jump target in the normalized list
    kw_names: tuple = ()             # CALL: names of keyword arguments (from KW_NAMES)
    push_null: bool = False          # LOAD_GLOBAL / LOAD_ATTR(3.12): also push NULL

    def __repr__(self) -> str:
        t = f" ->{self.target}" if self.target is not None else ""
        return f"{self.opname}({self.argval!r}){t}"


@dataclasses.dataclass(frozen=True)
class ExceptionEntry:
    start: int      # first covered instruction index
    end: int        # last covered instruction index (inclusive)
    target: int     # handler instruction index
    depth: int
    lasti: bool


def exception_table_entries(table: bytes) -> list[list[int]]:
    """co_exceptiontable's entries as [start, length, target, depth_lasti] in code units."""
    out, it = [], iter(table)

    def varint(b):
        val = b & 63
        while b & 64:
            b = next(it)
            val = (val << 6) | (b & 63)
        return val
    for b in it:
        out.append([varint(b), varint(next(it)), varint(next(it)), varint(next(it))])
    return out


def _parse_exception_table(code: CodeType) -> list[tuple[int, int, int, int, bool]]:
    """(start_off, end_off, target_off, depth, lasti) in bytes."""
    return [(2 * start, 2 * (start + length) - 2, 2 * target, dl >> 1, bool(dl & 1))
            for start, length, target, dl in
            exception_table_entries(getattr(code, "co_exceptiontable", b""))]


_DECODE_CACHE: dict[CodeType, tuple[list[Instr], list[ExceptionEntry]]] = {}


def decode(code: CodeType) -> tuple[list[Instr], list[ExceptionEntry]]:
    """Normalized instructions and exception entries of `code` (cached per code object)."""
    hit = _DECODE_CACHE.get(code)
    if hit is not None:
        return hit
    raw = list(dis.get_instructions(code))
    out: list[Instr] = []
    off_to_idx: dict[int, int] = {}
    pending_kw: tuple = ()
    jump_offsets: list[tuple[Instr, int]] = []
    for ins in raw:
        name, arg, argval = ins.opname, ins.arg, ins.argval
        lineno = ins.positions.lineno if ins.positions else None
        if name in ("CACHE", "EXTENDED_ARG"):
            off_to_idx.setdefault(ins.offset, len(out))
            continue
        if name == "PRECALL":          # 3.11 only: folded into CALL
            off_to_idx[ins.offset] = len(out)
            continue
        if name == "KW_NAMES":
            off_to_idx[ins.offset] = len(out)
            pending_kw = code.co_consts[arg]
            continue
        new = Instr(_JUMP_ALIASES.get(name, name), arg, argval, ins.offset, lineno)
        if name == "LOAD_GLOBAL":
            new.push_null = bool(arg & 1)
        elif name == "LOAD_ATTR" and PY >= (3, 12) and arg & 1:
            new.opname = "LOAD_METHOD"
        elif name == "LOAD_SUPER_ATTR":
            new.argval = (argval, bool(arg & 1), bool(arg & 2))
        elif name == "CALL":
            new.kw_names, pending_kw = pending_kw, ()
        if ins.opcode in dis.hasjrel or ins.opcode in dis.hasjabs:
            jump_offsets.append((new, ins.argval))
        off_to_idx[ins.offset] = len(out)
        out.append(new)
    for new, target_off in jump_offsets:
        idx = off_to_idx[target_off]
        if new.opname == "FOR_ITER" and PY >= (3, 12) and out[idx].opname == "END_FOR":
            idx += 1
        if new.opname == "SEND" and PY >= (3, 12) and out[idx].opname == "END_SEND":
            pass
        new.target = idx
    entries = []
    for s, e, t, depth, lasti in _parse_exception_table(code):
        si = _idx_at_or_after(off_to_idx, s)
        ei = _idx_at_or_before(off_to_idx, e)
        entries.append(ExceptionEntry(si, ei, off_to_idx[t], depth, lasti))
    _DECODE_CACHE[code] = (out, entries)
    return out, entries


def _idx_at_or_after(m: dict[int, int], off: int) -> int:
    while off not in m:
        off += 2
    return m[off]


def _idx_at_or_before(m: dict[int, int], off: int) -> int:
    while off not in m and off > 0:
        off -= 2
    return m.get(off, 0)


def assemble(code: CodeType) -> CodeType:
    """Decode `code` with the bytecode package and assemble it back (identity round trip)."""
    import bytecode
    return bytecode.Bytecode.from_code(code).to_code()


def code_equal(a: CodeType, b: CodeType) -> bool:
    """Same program: equal normalized instruction streams (opcode, argument value, jump target,
    keyword names), equal exception tables and signatures. Constant-table order and line-table
    encoding may differ (the bytecode package renumbers constants)."""
    fields = ("co_argcount", "co_kwonlyargcount", "co_posonlyargcount", "co_flags",
              "co_freevars", "co_cellvars", "co_name")
    if any(getattr(a, f) != getattr(b, f) for f in fields):
        return False
    n = a.co_argcount + a.co_kwonlyargcount + bool(a.co_flags & 4) + bool(a.co_flags & 8)
    if a.co_varnames[:n] != b.co_varnames[:n]:        # names of locals compared by use below
        return False
    ia, ta = decode(a)
    ib, tb = decode(b)
    if len(ia) != len(ib) or ta != tb:
        return False
    for x, y in zip(ia, ib):
        if (x.opname, x.target, x.kw_names, x.push_null) != (y.opname, y.target, y.kw_names,
                                                             y.push_null):
            return False
        if x.opname in ("JUMP", "FOR_ITER", "SEND") or x.opname.startswith("POP_JUMP") or \
                x.opname.startswith("JUMP_IF"):
            continue                 # targets compared by index above
        if isinstance(x.argval, CodeType):
            if not (isinstance(y.argval, CodeType) and code_equal(x.argval, y.argval)):
                return False
        elif type(x.argval) is not type(y.argval) or (
                x.argval != y.argval and not (x.argval != x.argval and y.argval != y.argval)):
            return False
    return True
