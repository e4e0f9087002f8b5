"""Capture, resume functions: the rest of a frame after a graph break, as a new code object.

Consumes a code object, a raw bytecode offset and the stack layout at that offset (per slot:
NULL, a value, or the `__exit__` of an open `with`, given as a zero-argument factory of the
context manager); produces a function whose positional parameters are the frame's locals (in
`co_varnames` order) followed by the value slots. Its bytecode is a short prologue
(COPY_FREE_VARS, RESUME, push the stack back — re-entering each open context with
`factory()` + BEFORE_WITH, so the resumed code runs inside it and exits it as the original
would — delete locals that were unbound, jump) followed by
the original bytecode unchanged: jumps in 3.11+ are relative, so only the exception table, the
line table and the closure-variable indices (which follow the locals) need shifting. The
frame's own cells (variables its inner functions capture) become free variables of the resume
code, ahead of the original ones: the caller passes the live cell objects, so closures made
before the break and the resumed frame share them.
Resume code objects are deduplicated by (code, offset, stack layout, unbound locals).
"""
from __future__ import annotations

import dis
import sys
import types

import bytecode as bc

from ..errors import Unsupported
from .bytecode import exception_table_entries

_OP = dis.opmap
_DEREF_OPS = {_OP[n] for n in ("LOAD_DEREF", "STORE_DEREF", "DELETE_DEREF", "LOAD_CLOSURE",
                               "LOAD_CLASSDEREF", "LOAD_FROM_DICT_OR_DEREF", "MAKE_CELL")
              if n in _OP}
_CODE_CACHE: dict = {}
STACK_PREFIX = "__ember_stack"
CELL_PREFIX = "__ember_cellarg_"


class UnboundLocal:
    """Passed for a local that is unbound at the break; the prologue deletes it again."""

    def __repr__(self):
        return "<unbound>"


UNBOUND = UnboundLocal()


NULL, VALUE = "null", "value"       # stack-slot kinds; anything else is a context factory


def _emit(op: int, arg: int = 0) -> bytes:
    out = b""
    ext = [(arg >> s) & 0xFF for s in (24, 16, 8) if arg >> s]
    for e in ext:
        out += bytes((_OP["EXTENDED_ARG"], e))
    return out + bytes((op, arg & 0xFF)) + b"\0\0" * dis._inline_cache_entries[op]


def _enter_context(const_index: int) -> bytes:
    """factory() then BEFORE_WITH, keeping `__exit__` on the stack."""
    out = _emit(_OP["PUSH_NULL"]) + _emit(_OP["LOAD_CONST"], const_index)
    if sys.version_info < (3, 12):
        out += _emit(_OP["PRECALL"], 0)
    return out + _emit(_OP["CALL"], 0) + _emit(_OP["BEFORE_WITH"]) + _emit(_OP["POP_TOP"])


def _varint(val: int, first: bool) -> bytes:
    chunks = [val & 63]
    val >>= 6
    while val:
        chunks.append(val & 63)
        val >>= 6
    chunks.reverse()
    out = [c | 64 for c in chunks[:-1]] + [chunks[-1]]
    if first:
        out[0] |= 128
    return bytes(out)


def _shift_table(table: bytes, units: int) -> bytes:
    out = b""
    for start, length, target, dl in exception_table_entries(table):
        out += _varint(start + units, True) + _varint(length, False) + \
            _varint(target + units, False) + _varint(dl, False)
    return out


def _no_location(units: int) -> bytes:
    """Line-table entries that give `units` code units no source location (code 15)."""
    out = b""
    while units:
        n = min(units, 8)
        out += bytes((0x80 | (15 << 3) | (n - 1),))
        units -= n
    return out


def _remap_derefs(co_code: bytes, code: types.CodeType, index_of: dict) -> bytes:
    """Closure-variable operands index the fast locals (locals, then cells, then free
    variables): point each at its name's slot in the resume code's layout."""
    raw = bytearray(co_code)
    prev_op = None
    for i in range(0, len(raw), 2):
        op, arg = raw[i], raw[i + 1]
        if op in _DEREF_OPS:
            new = index_of[code._varname_from_oparg(arg)]
            if prev_op == _OP["EXTENDED_ARG"] or new > 255:
                raise Unsupported("graph break in a function with more than 255 locals and "
                                  "closure variables")
            raw[i + 1] = new
        prev_op = op
    return bytes(raw)


def instruction_starts(code: types.CodeType) -> list[int]:
    """Raw offset where each normalized instruction (bytecode.decode) begins, prefixes
    (EXTENDED_ARG, 3.11 KW_NAMES/PRECALL) included; one extra entry for the end."""
    starts, pending = [], None
    for ins in dis.get_instructions(code):
        if ins.opname == "CACHE":
            continue
        if pending is None:
            pending = ins.offset
        if ins.opname in ("EXTENDED_ARG", "PRECALL", "KW_NAMES"):
            continue
        starts.append(pending)
        pending = None
    starts.append(len(code.co_code))
    return starts


def resume_code(code: types.CodeType, offset: int, layout: tuple, unbound: tuple) -> types.CodeType:
    """A code object that continues `code` at raw `offset` with the stack `layout`
    (NULL / VALUE / context factory per slot); `unbound` lists locals to delete."""
    key = (code, offset, layout, unbound)
    hit = _CODE_CACHE.get(key)
    if hit is not None:
        return hit
    if code.co_flags & (0x20 | 0x80 | 0x100 | 0x200):
        raise Unsupported("graph break in a generator or coroutine")
    varnames, consts = code.co_varnames, code.co_consts
    n_stack = sum(1 for s in layout if s is VALUE)
    first = sum(1 for v in varnames if v.startswith(STACK_PREFIX))     # a resume of a resume
    new_names = tuple(f"{STACK_PREFIX}{first + i}" for i in range(n_stack))
    # the frame's cells arrive in the closure, ahead of its free variables; a parameter that
    # is also a cell keeps its slot under another name (MAKE_CELL, skipped, emptied it)
    freevars = code.co_cellvars + code.co_freevars
    names = tuple(f"{CELL_PREFIX}{v}" if v in code.co_cellvars else v for v in varnames) + new_names
    index_of = {v: i for i, v in enumerate(names)} | \
        {v: len(names) + j for j, v in enumerate(freevars)}
    pro = b""
    if freevars:
        pro += _emit(_OP["COPY_FREE_VARS"], len(freevars))
    pro += _emit(_OP["RESUME"], 0)
    k = 0
    for slot in layout:
        if slot is NULL:
            pro += _emit(_OP["PUSH_NULL"])
        elif slot is VALUE:
            pro += _emit(_OP["LOAD_FAST"], len(varnames) + k)
            k += 1
        else:
            consts += (slot,)
            pro += _enter_context(len(consts) - 1)
    for name in unbound:
        pro += _emit(_OP["DELETE_FAST"], varnames.index(name))
    pro += _emit(_OP["JUMP_FORWARD"], offset // 2)
    units = len(pro) // 2
    body = _remap_derefs(code.co_code, code, index_of)
    flags = code.co_flags & ~(0x04 | 0x08)
    new = code.replace(
        co_code=pro + body, co_consts=consts, co_argcount=len(names), co_posonlyargcount=0,
        co_kwonlyargcount=0, co_nlocals=len(names), co_varnames=names, co_flags=flags,
        co_cellvars=(), co_freevars=freevars,
        co_name=f"__resume_{code.co_name}_at_{offset}",
        co_qualname=f"{code.co_qualname}.<resume at {offset}>",
        co_exceptiontable=_shift_table(code.co_exceptiontable, units),
        co_linetable=_no_location(units) + code.co_linetable,
        co_stacksize=max(code.co_stacksize, len(layout)) + 2)
    _CODE_CACHE[key] = new
    return new


def resume_function(fn: types.FunctionType, offset: int, layout: tuple, unbound: tuple,
                    route=None, cells: tuple = ()) -> types.FunctionType:
    """The resume function over the frame's `cells` (one per `co_cellvars`) and `fn`'s
    closure; with `route`, every call it makes goes through `route(callable)` first
    (route_calls)."""
    code = resume_code(fn.__code__, offset, layout, unbound)
    if route is not None:
        code = route_calls(code, route)
    return with_closure(code, fn, cells)


def with_closure(code: types.CodeType, fn: types.FunctionType, cells: tuple) -> types.FunctionType:
    closure = tuple(cells) + (fn.__closure__ or ())
    return types.FunctionType(code, fn.__globals__, code.co_name, None, closure or None)


def _route(route, loc) -> list:
    """TOS -> route(TOS): a method-form call of `route` with TOS as its self argument."""
    out = [bc.Instr("LOAD_CONST", route, location=loc), bc.Instr("SWAP", 2, location=loc)]
    if sys.version_info < (3, 12):
        out.append(bc.Instr("PRECALL", 0, location=loc))
    return out + [bc.Instr("CALL", 0, location=loc)]


_NO_PUSH = ("POP_", "STORE_", "DELETE_", "JUMP", "RETURN", "RAISE", "RERAISE", "NOP", "KW_NAMES",
            "PRECALL", "RESUME", "END_FOR", "SETUP_", "PRINT_EXPR", "COPY_FREE_VARS", "MAKE_CELL")
_MOVES = ("SWAP", "ROT_", "UNPACK_", "BEFORE_", "PUSH_EXC_INFO", "CHECK_EG_MATCH", "SEND")


def _pushes(ins) -> int | None:
    """How many stack slots `ins` writes (None: it moves or reorders slots)."""
    name = ins.name
    if name.startswith(_MOVES):
        return None
    if name == "LOAD_METHOD" or (name in ("LOAD_ATTR", "LOAD_SUPER_ATTR", "LOAD_GLOBAL") and
                                 isinstance(ins.arg, tuple) and ins.arg[0] is True):
        return 2
    return 0 if name.startswith(_NO_PUSH) else 1


def _depths(items) -> list:
    """Stack depth after each item (None where no path of known depth reaches it: code after a
    jump or return up to a label no known jump or handler targets). Passes repeat until the
    depths at labels settle, so a loop head learns its depth from the jump back."""
    at_label: dict = {}
    while True:
        seen = len(at_label)
        out, depth = [], 0
        for it in items:
            if isinstance(it, bc.Label):
                depth = at_label.get(it, depth)
            elif isinstance(it, bc.TryBegin) and isinstance(it.stack_depth, int):
                # the handler starts with the block's stack, lasti, and the exception
                at_label.setdefault(it.target, it.stack_depth + it.push_lasti + 1)
            elif isinstance(it, bc.Instr) and depth is not None:
                if it.has_jump() and isinstance(it.arg, bc.Label):
                    at_label.setdefault(it.arg, depth + it.stack_effect(jump=True))
                depth += it.stack_effect(jump=it.is_uncond_jump())
                if it.is_final():         # what follows is reached by a label, or not at all
                    out.append(depth)
                    depth = None
                    continue
            out.append(depth)
        if len(at_label) == seen:
            return out


def route_calls(code: types.CodeType, route) -> types.CodeType:
    """`code` with each call's callable passed through `route` just before its arguments are
    pushed. A frame's eager rest (a break in a loop, a try block, an unknown `with`) so still
    sends user functions and modules through the dispatcher (entry.dispatch), which compiles
    them as their own roots.

    The callable's slot is found by stack depth, walking back along every path that reaches
    the call: on each, the last instruction that leaves the stack at the callable's depth with
    everything after it above (on the resumed entry path that is the prologue's load of the
    saved slot). A method load ([method, self]) becomes an attribute load plus NULL; any other
    producer must sit on a NULL, or its value could be a method's `self`. A call whose callable
    cannot be found for sure (a depth unknown, a stack move in its arguments, a `super()`
    method load, no NULL below) is left as it is."""
    b = bc.Bytecode.from_code(code, conserve_exception_block_stackdepth=True)
    items = list(b)
    depths = _depths(items)
    sources: dict = {}                    # label -> indices of the jumps to it
    for i, it in enumerate(items):
        if isinstance(it, bc.Instr) and it.has_jump() and isinstance(it.arg, bc.Label):
            sources.setdefault(it.arg, []).append(i)
    wrap: dict[int, bool] = {}            # index of a callable's producer -> a method load?
    for i, it in enumerate(items):
        if not isinstance(it, bc.Instr):
            continue
        if it.name == ("CALL" if sys.version_info >= (3, 12) else "PRECALL"):
            n = it.arg
        elif it.name == "CALL_FUNCTION_EX":
            n = 1 + (it.arg & 1)
        else:
            continue
        before = depths[i - 1] if i else 0
        want = None if before is None else before - n
        found = want and _producers(items, depths, sources, i, want)
        if not found or any(depths[k] != want or items[k].name == "LOAD_SUPER_ATTR"
                            for k in found):
            continue
        kinds = {k: _pushes(items[k]) == 2 and items[k].name != "LOAD_GLOBAL" for k in found}
        if all(method or _pushes(items[k]) == 2 or _null_below(items, depths, sources, k, want)
               for k, method in kinds.items()):
            wrap.update(kinds)
    out = []
    for k, it in enumerate(items):
        method = wrap.get(k)
        if method is None:
            out.append(it)
        elif method:                      # [method, self] -> [NULL, route(bound method)]
            loc = it.location
            arg = (False, it.arg[1]) if isinstance(it.arg, tuple) else it.arg
            out += [bc.Instr("LOAD_ATTR", arg, location=loc), *_route(route, loc),
                    bc.Instr("PUSH_NULL", location=loc), bc.Instr("SWAP", 2, location=loc)]
        else:
            out += [it, *_route(route, it.location)]
    b[:] = out
    # the handlers keep their depths (each routing is stack-neutral, one slot above at most);
    # recomputing them would fail on a try block that starts in the unreachable original prefix
    return b.to_code(stacksize=code.co_stacksize + 1, compute_exception_stack_depths=False)


def _null_below(items, depths, sources, k: int, want: int) -> bool:
    """Whether the slot under the callable that items[k] pushed (depth `want`) holds NULL."""
    below = _producers(items, depths, sources, k, want - 1)
    return bool(below) and all(
        items[z].name == "PUSH_NULL" or
        items[z].name == "LOAD_GLOBAL" and depths[z] == want and items[z].arg[0] is True
        for z in below)


def _producers(items, depths, sources, start: int, want: int, seen=None) -> set | None:
    """The indices of the instructions that, on the paths reaching items[start], wrote the slot
    at depth `want` (one of the slots they push), with nothing after them touching it; None if
    unsure on any path."""
    seen = set() if seen is None else seen
    found: set = set()
    for k in range(start - 1, -1, -1):
        it, d = items[k], depths[k]
        if isinstance(it, bc.Label):
            for j in sources.get(it, ()):
                if j in seen:
                    continue
                seen.add(j)
                jump_depth = depths[j - 1] if j else 0
                if jump_depth is None or min(jump_depth, d if d is not None else -1) < want:
                    return None
                more = _producers(items, depths, sources, j, want, seen)
                if more is None:
                    return None
                found |= more
            if k and depths[k - 1] is None:
                return found or None      # no fall-through: dead code above (a resume prologue)
            continue
        if not isinstance(it, bc.Instr):
            continue                      # TryBegin / TryEnd markers
        if it.is_final():
            return found or None          # reached only by the labels already walked
        if d is None or (pushes := _pushes(it)) is None:
            return None
        if d - pushes >= want:            # everything it touched lies above the slot
            continue
        return found | {k} if d >= want else None
    return None



def _line_entries(units: int) -> bytes:
    """Line-table entries giving `units` code units the code's first line (no columns)."""
    out = b""
    while units:
        n = min(units, 8)
        out += bytes((0x80 | (13 << 3) | (n - 1), 0))
        units -= n
    return out


def call_trampoline(code: types.CodeType, start: int, end: int, nulls: tuple,
                    lineno: int, statement: bool = False) -> types.FunctionType:
    """A function that runs the one call instruction code.co_code[start:end] (with its
    KW_NAMES/PRECALL prefix) on its arguments (the call's stack slots; `nulls` marks NULL ones)
    and returns the result. It carries the user's file, line and function name, so a warning
    or log record the call emits names the same place as in eager. `statement`: the
    instruction leaves nothing (STORE_SUBSCR, STORE_ATTR, DELETE_*): it returns its first
    argument, pushed once more beneath the slots."""
    key = (code, start, nulls, "statement" if statement else "call")
    hit = _CODE_CACHE.get(key)
    if hit is None:
        pro = _emit(_OP["LOAD_FAST"], 0) if statement else b""
        k = 0
        for is_null in nulls:
            if is_null:
                pro += _emit(_OP["PUSH_NULL"])
            else:
                pro += _emit(_OP["LOAD_FAST"], k)
                k += 1
        pro = _emit(_OP["RESUME"], 0) + pro
        call = code.co_code[start:end]
        ret = _emit(_OP["RETURN_VALUE"])
        names = tuple(f"{STACK_PREFIX}{i}" for i in range(k))
        hit = _CODE_CACHE[key] = code.replace(
            co_code=pro + call + ret, co_argcount=k, co_posonlyargcount=0, co_kwonlyargcount=0,
            co_nlocals=k, co_varnames=names, co_cellvars=(), co_freevars=(), co_flags=0x3,
            co_firstlineno=lineno, co_exceptiontable=b"", co_stacksize=len(nulls) + 2,
            co_linetable=_no_location(len(pro) // 2) + _line_entries(len(call) // 2) +
            _no_location(len(ret) // 2))
    return types.FunctionType(hit, {"__builtins__": __builtins__}, code.co_name)
