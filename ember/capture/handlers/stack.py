"""Handlers: constants, locals, cells, globals, imports and plain stack manipulation."""
from __future__ import annotations

from ..values import NULL, CellV, ObjV
from . import handler


@handler("NOP", "RESUME", "CACHE", "COPY_FREE_VARS", "EXTENDED_ARG")
def nop(tr, f, ins):
    return None


@handler("PUSH_NULL")
def push_null(tr, f, ins):
    f.push(NULL)


@handler("POP_TOP")
def pop_top(tr, f, ins):
    f.pop()


@handler("END_FOR", since=(3, 12))
def end_for(tr, f, ins):
    f.pop()
    f.pop()


@handler("COPY")
def copy(tr, f, ins):
    f.push(f.stack[-ins.arg])


@handler("SWAP")
def swap(tr, f, ins):
    s = f.stack
    s[-1], s[-ins.arg] = s[-ins.arg], s[-1]


@handler("LOAD_CONST")
def load_const(tr, f, ins):
    f.push(ObjV(ins.argval))


@handler("LOAD_FAST", "LOAD_FAST_CHECK")
def load_fast(tr, f, ins):
    try:
        f.push(f.locals[ins.argval])
    except KeyError:
        raise tr.unsupported(f"local variable {ins.argval!r} referenced before assignment",
                             hint="the same code raises UnboundLocalError eagerly") from None


@handler("LOAD_FAST_AND_CLEAR", since=(3, 12))
def load_fast_and_clear(tr, f, ins):
    f.push(f.locals.pop(ins.argval, NULL))


@handler("STORE_FAST")
def store_fast(tr, f, ins):
    v = f.pop()
    if v is NULL:
        f.locals.pop(ins.argval, None)
    else:
        f.locals[ins.argval] = v


@handler("DELETE_FAST")
def delete_fast(tr, f, ins):
    f.locals.pop(ins.argval, None)


@handler("MAKE_CELL")
def make_cell(tr, f, ins):
    name = ins.argval
    f.cells[name] = CellV(contents=f.locals.pop(name, None))


@handler("LOAD_CLOSURE")
def load_closure(tr, f, ins):
    f.push(f.cells[ins.argval])


@handler("LOAD_DEREF")
def load_deref(tr, f, ins):
    f.push(tr.cell_get(f.cells[ins.argval]))


@handler("STORE_DEREF")
def store_deref(tr, f, ins):
    cell = f.cells[ins.argval]
    cell.contents = f.pop()
    tr.writes += 1
    if cell.real is not None:       # the caller's cell: written back after the graph
        tr.effects.append(("cell", cell, cell.contents))


@handler("LOAD_GLOBAL")
def load_global(tr, f, ins):
    if ins.push_null:
        f.push(NULL)
    f.push(tr.load_global(f, ins.argval))


@handler("STORE_GLOBAL")
def store_global(tr, f, ins):
    v = f.pop()
    tr.writes += 1
    tr.overlay[(id(f.globals), ins.argval)] = v
    tr.effects.append(("global", f.gid, ins.argval, v))


@handler("IMPORT_NAME")
def import_name(tr, f, ins):
    fromlist, level = f.pop(), f.pop()
    mod = __import__(ins.argval, f.globals, None, fromlist.value, level.value)
    f.push(ObjV(mod))


@handler("IMPORT_FROM")
def import_from(tr, f, ins):
    from ..attrs import load_attr
    f.push(load_attr(tr, f.stack[-1], ins.argval))
