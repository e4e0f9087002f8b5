"""Handlers: BUILD_* containers, list/set/dict updates, unpacking, iteration, f-strings."""
from __future__ import annotations

from ..dictkeys import dict_key
from ..values import STOP, DictV, GenV, IterV, ListV, ObjV, TensorV, TupleV
from . import handler


@handler("BUILD_TUPLE")
def build_tuple(tr, f, ins):
    f.push(TupleV(f.popn(ins.arg)))


@handler("BUILD_LIST")
def build_list(tr, f, ins):
    f.push(ListV(f.popn(ins.arg)))


@handler("BUILD_SET")
def build_set(tr, f, ins):
    from ..aggregates import new_set
    f.push(new_set(tr, f.popn(ins.arg)))


@handler("BUILD_MAP")
def build_map(tr, f, ins):
    items = f.popn(2 * ins.arg)
    f.push(DictV({dict_key(tr, items[i]): items[i + 1] for i in range(0, len(items), 2)}))


@handler("BUILD_CONST_KEY_MAP")
def build_const_key_map(tr, f, ins):
    keys = f.pop().value
    vals = f.popn(ins.arg)
    f.push(DictV(dict(zip(keys, vals))))


@handler("BUILD_STRING")
def build_string(tr, f, ins):
    from ..builtins import fold
    f.push(fold(tr, _concat, f.popn(ins.arg), {}))


def _concat(*parts):
    return "".join(parts)


@handler("LIST_APPEND")
def list_append(tr, f, ins):
    v = f.pop()
    f.stack[-ins.arg].items.append(v)


@handler("SET_ADD")
def set_add(tr, f, ins):
    from ..builtins import real
    v = f.pop()
    s = f.stack[-ins.arg]
    f.stack[-ins.arg] = ObjV(s.value | {real(tr, v)})


@handler("MAP_ADD")
def map_add(tr, f, ins):
    v, k = f.pop(), f.pop()
    f.stack[-ins.arg].items[dict_key(tr, k)] = v


@handler("LIST_EXTEND")
def list_extend(tr, f, ins):
    v = f.pop()
    f.stack[-ins.arg].items.extend(tr.iterate(v))


@handler("SET_UPDATE")
def set_update(tr, f, ins):
    from ..builtins import real
    v = f.pop()
    s = f.stack[-ins.arg]
    f.stack[-ins.arg] = ObjV(s.value | {real(tr, x) for x in tr.iterate(v)})


@handler("DICT_UPDATE", "DICT_MERGE")
def dict_update(tr, f, ins):
    from ..builtins import real
    v = f.pop()
    d = f.stack[-ins.arg]
    if isinstance(v, DictV):
        d.items.update(v.items)
    elif isinstance(v, ObjV) and isinstance(v.value, dict):
        d.items.update({k: tr.wrap(x, None) for k, x in v.value.items()})
    else:
        from ..values import NewObjV
        if isinstance(v, NewObjV) and v.dataclass:
            d.items.update({k: x for k, x in v.attrs.items()
                            if not (isinstance(x, ObjV) and x.value is None)})
        else:
            for k in tr.iterate(v):
                d.items[dict_key(tr, k)] = tr.getitem(v, k)


@handler("LIST_TO_TUPLE", until=(3, 12))
def list_to_tuple(tr, f, ins):
    f.push(TupleV(f.pop().items))


@handler("CALL_INTRINSIC_1", since=(3, 12))
def call_intrinsic_1(tr, f, ins):
    import operator
    kind = ins.arg
    if kind == 6:     # INTRINSIC_LIST_TO_TUPLE
        f.push(TupleV(f.pop().items))
    elif kind == 5:   # INTRINSIC_UNARY_POSITIVE
        f.push(tr.unary(operator.pos, f.pop()))
    elif kind == 3:   # INTRINSIC_STOPITERATION_ERROR: an exception leaving a generator
        e = f.pop().value
        if isinstance(e, StopIteration):
            e = RuntimeError("generator raised StopIteration")
        f.push(ObjV(e))
    else:
        raise tr.unsupported(f"CALL_INTRINSIC_1 {ins.argval}")


@handler("UNPACK_SEQUENCE")
def unpack_sequence(tr, f, ins):
    items = tr.iterate(f.pop())
    if len(items) != ins.arg:
        raise tr.unsupported(f"cannot unpack {len(items)} values into {ins.arg}",
                             hint="fails eagerly")
    f.stack.extend(reversed(items))


@handler("UNPACK_EX")
def unpack_ex(tr, f, ins):
    items = tr.iterate(f.pop())
    before, after = ins.arg & 0xFF, ins.arg >> 8
    if len(items) < before + after:
        raise tr.unsupported("not enough values to unpack", hint="fails eagerly")
    mid = ListV(items[before:len(items) - after])
    out = items[:before] + [mid] + items[len(items) - after:]
    f.stack.extend(reversed(out))


@handler("GET_ITER")
def get_iter(tr, f, ins):
    from ..builtins import as_iter
    f.push(as_iter(tr, f.pop()))


@handler("FOR_ITER")
def for_iter(tr, f, ins):
    from ..builtins import step
    it = f.stack[-1]
    if not isinstance(it, (IterV, GenV)):   # a real iterator passed in (a comprehension's `.0`)
        raise tr.unsupported(f"iterating a {type(it.value).__name__ if isinstance(it, ObjV) else type(it).__name__} "
                             "passed in from the caller")
    x = step(tr, it)
    if x is not STOP:
        f.push(x)
    else:
        f.pop()
        f.pc = ins.target


@handler("GET_LEN")
def get_len(tr, f, ins):
    from ..builtins import BUILTINS
    f.push(BUILTINS[len](tr, [f.stack[-1]], {}))


@handler("FORMAT_VALUE")
def format_value(tr, f, ins):
    spec = f.pop().value if ins.arg & 4 else ""
    v = f.pop()
    if isinstance(v, TensorV):
        raise tr.unsupported("formatting a tensor needs its data", hint="format outside the graph")
    from ..builtins import fold
    f.push(fold(tr, _FORMATS[ins.arg & 3], [v, ObjV(spec)], {}))


def _format_as(convert):
    def fmt(x, spec):
        return format(convert(x), spec)
    return fmt


# FORMAT_VALUE's conversion bits: none, !s, !r, !a
_FORMATS = {0: format, 1: _format_as(str), 2: _format_as(repr), 3: _format_as(ascii)}
