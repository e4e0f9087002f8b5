"""Handlers: CALL, CALL_FUNCTION_EX, MAKE_FUNCTION, LOAD_ATTR/LOAD_METHOD/STORE_ATTR/DELETE_ATTR,
super."""
from __future__ import annotations

from ..attrs import TraceAttributeError, delete_attr, load_attr, store_attr
from ..values import NULL, DictV, FuncV, ObjV, SuperV, TupleV
from . import handler


@handler("CALL")
def call(tr, f, ins):
    argc = ins.arg
    args = f.popn(argc)
    b = f.pop()
    a = f.pop()
    if a is NULL:
        fn = b
    else:
        fn, args = a, [b] + args
    kwargs = {}
    if ins.kw_names:
        n = len(ins.kw_names)
        kwargs = dict(zip(ins.kw_names, args[len(args) - n:]))
        args = args[:len(args) - n]
    f.push(tr.call(fn, args, kwargs))


@handler("CALL_FUNCTION_EX")
def call_function_ex(tr, f, ins):
    from ..builtins import real
    kwargs = {}
    if ins.arg & 1:
        kw = f.pop()
        if isinstance(kw, DictV):
            kwargs = dict(kw.items)
        else:
            kwargs = {k: tr.wrap(x, None) for k, x in real(tr, kw).items()}
    args = tr.iterate(f.pop())
    fn = f.pop()
    null = f.pop()
    if null is not NULL:
        fn, args = null, [fn] + args
    f.push(tr.call(fn, list(args), kwargs))


@handler("MAKE_FUNCTION")
def make_function(tr, f, ins):
    code = f.pop().value
    flags = ins.arg
    closure = tuple(tr.iterate(f.pop())) if flags & 0x08 else ()
    if flags & 0x04:
        f.pop()
    kwdefaults = {}
    if flags & 0x02:
        kw = f.pop()
        kwdefaults = dict(kw.items) if isinstance(kw, DictV) else {k: ObjV(x) for k, x in kw.value.items()}
    defaults = tuple(tr.iterate(f.pop())) if flags & 0x01 else ()
    f.push(FuncV(code, f.globals, code.co_name, code.co_qualname, defaults, kwdefaults, closure))


def _load(tr, v, name):
    try:
        return load_attr(tr, v, name)
    except TraceAttributeError:
        from ..interpreter import TracedRaise
        raise TracedRaise(AttributeError(f"{_what(v)} has no attribute {name!r}")) from None


def _what(v):
    if isinstance(v, ObjV):
        return f"{type(v.value).__qualname__} object"
    return type(v).__name__


@handler("LOAD_ATTR")
def load_attr_h(tr, f, ins):
    v = f.pop()
    if ins.push_null:
        f.push(NULL)
    f.push(_load(tr, v, ins.argval))


@handler("LOAD_METHOD")
def load_method(tr, f, ins):
    v = f.pop()
    f.push(NULL)
    f.push(_load(tr, v, ins.argval))


@handler("STORE_ATTR")
def store_attr_h(tr, f, ins):
    obj = f.pop()
    value = f.pop()
    store_attr(tr, obj, ins.argval, value)


@handler("DELETE_ATTR")
def delete_attr_h(tr, f, ins):
    delete_attr(tr, f.pop(), ins.argval)


@handler("LOAD_SUPER_ATTR", since=(3, 12))
def load_super_attr(tr, f, ins):
    from ..builtins import real
    name, is_method, two_arg = ins.argval
    self_v, cls_v, _super = f.pop(), f.pop(), f.pop()
    sv = SuperV(real(tr, cls_v), self_v)
    if is_method:
        f.push(NULL)
    f.push(_load(tr, sv, name))


__all__ = ["call", "TupleV"]
