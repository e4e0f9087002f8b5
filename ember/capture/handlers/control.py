"""Handlers: jumps, return, generators (paused at each yield, see Tracer.resume_generator),
`yield from`, raise/assert, match statements.

Exception-handling blocks (3.11+ zero-cost exception table) are never entered: a traced raise is
Unsupported, so only the normal path of try/with is interpreted.
"""
from __future__ import annotations

from ..bytecode import PY
from ..interpreter import Return, TracedRaise, Yield
from ..values import STOP, DictV, GenV, IterV, ListV, NewObjV, ObjV, TupleV
from . import handler


@handler("JUMP")
def jump(tr, f, ins):
    f.pc = ins.target


@handler("POP_JUMP_IF_FALSE")
def pop_jump_if_false(tr, f, ins):
    if not tr.truth(f.pop()):
        f.pc = ins.target


@handler("POP_JUMP_IF_TRUE")
def pop_jump_if_true(tr, f, ins):
    if tr.truth(f.pop()):
        f.pc = ins.target


def _is_none(v):
    return isinstance(v, ObjV) and v.value is None


@handler("POP_JUMP_IF_NONE")
def pop_jump_if_none(tr, f, ins):
    if _is_none(f.pop()):
        f.pc = ins.target


@handler("POP_JUMP_IF_NOT_NONE")
def pop_jump_if_not_none(tr, f, ins):
    if not _is_none(f.pop()):
        f.pc = ins.target


@handler("JUMP_IF_FALSE_OR_POP", until=(3, 12))
def jump_if_false_or_pop(tr, f, ins):
    if not tr.truth(f.stack[-1]):
        f.pc = ins.target
    else:
        f.pop()


@handler("JUMP_IF_TRUE_OR_POP", until=(3, 12))
def jump_if_true_or_pop(tr, f, ins):
    if tr.truth(f.stack[-1]):
        f.pc = ins.target
    else:
        f.pop()


@handler("RETURN_VALUE")
def return_value(tr, f, ins):
    return Return(f.pop())


@handler("RETURN_CONST", since=(3, 12))
def return_const(tr, f, ins):
    return Return(ObjV(ins.argval))


@handler("RETURN_GENERATOR")
def return_generator(tr, f, ins):
    if not f.generator:
        raise tr.unsupported("generator outside an inlined call")
    f.push(ObjV(None))          # the first resume's sent value, popped by the next POP_TOP


@handler("YIELD_VALUE")
def yield_value(tr, f, ins):
    if not f.generator:
        raise tr.unsupported("yield in the compiled frame")
    return Yield(f.pop())       # paused here; Tracer.resume_generator pushes the sent None


@handler("GET_YIELD_FROM_ITER")
def get_yield_from_iter(tr, f, ins):
    from ..builtins import as_iter
    f.push(as_iter(tr, f.pop()))


@handler("SEND")
def send(tr, f, ins):
    """`yield from` / `await` step: [receiver, sent] → [receiver, next value], or at the end the
    receiver's return value (3.11: instead of the receiver; 3.12: above it, END_SEND drops it)."""
    from ..builtins import step
    sent, recv = f.pop(), f.stack[-1]
    if not (isinstance(sent, ObjV) and sent.value is None) or \
            not isinstance(recv, (IterV, GenV)):
        raise tr.unsupported("send() into a delegated iterator")
    x = step(tr, recv)
    if x is not STOP:
        f.push(x)
        return
    ret = recv.ret if isinstance(recv, GenV) else ObjV(None)
    if PY < (3, 12):
        f.pop()
    f.push(ret)
    f.pc = ins.target


@handler("END_SEND", since=(3, 12))
def end_send(tr, f, ins):
    v = f.pop()
    f.pop()
    f.push(v)


@handler("RAISE_VARARGS")
def raise_varargs(tr, f, ins):
    if ins.arg == 2:
        f.pop()                       # `raise X from Y`: the cause does not change control flow
    exc = f.pop() if ins.arg else None
    if isinstance(exc, ObjV):
        e = exc.value
        if isinstance(e, type) and issubclass(e, BaseException):
            e = e()
        if isinstance(e, BaseException):
            raise TracedRaise(e)
    raise tr.unsupported("re-raise or raise of a non-constant exception in traced code")


@handler("PUSH_EXC_INFO")
def push_exc_info(tr, f, ins):
    v = f.pop()
    f.push(ObjV(None))
    f.push(v)


@handler("POP_EXCEPT")
def pop_except(tr, f, ins):
    f.pop()


@handler("CHECK_EXC_MATCH")
def check_exc_match(tr, f, ins):
    typ = f.pop()
    exc = f.stack[-1]
    if isinstance(typ, TupleV):         # `except (A, B):` builds the tuple on the stack
        if not all(isinstance(t, ObjV) for t in typ.items):
            raise tr.unsupported("an except clause whose exception types are not constants")
        types_ = tuple(t.value for t in typ.items)
    else:
        types_ = typ.value
    f.push(ObjV(isinstance(exc.value, types_)))


@handler("RERAISE")
def reraise(tr, f, ins):
    exc = f.pop()
    if ins.arg:
        f.pop()
    raise TracedRaise(exc.value)


@handler("WITH_EXCEPT_START")
def with_except_start(tr, f, ins):
    exc = f.stack[-1]
    exit_fn = f.stack[-4]
    e = exc.value
    f.push(tr.call(exit_fn, [ObjV(type(e)), ObjV(e), ObjV(None)], {}))


@handler("LOAD_ASSERTION_ERROR")
def load_assertion_error(tr, f, ins):
    f.push(ObjV(AssertionError))


@handler("MATCH_SEQUENCE")
def match_sequence(tr, f, ins):
    v = f.stack[-1]
    ok = isinstance(v, (ListV, TupleV)) or isinstance(v, ObjV) and isinstance(
        v.value, (list, tuple, range))
    f.push(ObjV(ok))


@handler("MATCH_MAPPING")
def match_mapping(tr, f, ins):
    v = f.stack[-1]
    f.push(ObjV(isinstance(v, DictV) or isinstance(v, ObjV) and isinstance(v.value, dict)))


@handler("MATCH_KEYS")
def match_keys(tr, f, ins):
    keys, subject = f.stack[-1], f.stack[-2]
    from ..builtins import real
    ks = real(tr, keys)
    if isinstance(subject, DictV) and all(k in subject.items for k in ks):
        f.push(TupleV([subject.items[k] for k in ks]))
    else:
        f.push(ObjV(None))


@handler("MATCH_CLASS")
def match_class(tr, f, ins):
    from ..builtins import pytype, real
    from ..attrs import load_attr
    names, cls, subject = f.pop(), f.pop(), f.pop()
    c = real(tr, cls)
    t = pytype(subject)
    if not issubclass(t, c):
        f.push(ObjV(None))
        return
    attrs = []
    match_args = getattr(c, "__match_args__", ())
    for i in range(ins.arg):
        attrs.append(load_attr(tr, subject, match_args[i]))
    for n in real(tr, names):
        attrs.append(load_attr(tr, subject, n))
    f.push(TupleV(attrs))


__all__ = ["NewObjV"]
