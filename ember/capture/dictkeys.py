"""Capture, dict keys: the real hashable key a value stands for, and back; defaultdict.

Python hashes a tensor by identity, so a tensor (a parameter, an input, an intermediate) can key
a dict; so can any hashable object (a function, a class, a TypeVar, an op). A dict value (DictV)
holds real keys: constants and objects as themselves, the caller's tensors as the real tensor
(the same identity eager uses), a tensor made in the trace as its `TensorKey` (one per tensor
value; the residual code writes the tensor itself). `key_value` turns a key back into the value
iteration yields. An object used as a key is guarded by identity where it was read.

`defaultdict(factory, ...)` made in the trace, and a caller's defaultdict, call their factory on
a missing key (`__missing__`): the factory's value is inserted, as eagerly.
"""
from __future__ import annotations

import collections

import torch

from .values import DictV, ListV, ObjV, TensorV, TupleV, V, is_literal


class TensorKey:
    """A dict key for a tensor made in the trace: hashed and compared by identity, as a tensor."""
    __slots__ = ("tv",)

    def __init__(self, tv: TensorV):
        self.tv = tv

    def __repr__(self):
        return f"TensorKey({self.tv!r})"


def dict_key(tr, v: V):
    """The real key `v` stands for (dict item, `in`, lookup); TypeError as eager on unhashables."""
    if isinstance(v, TensorV):
        real = next((r for _, t, r in tr.inputs if t is v), None)
        if real is not None:
            return real
        k = tr.tensor_keys.get(id(v))
        if k is None:
            k = tr.tensor_keys[id(v)] = TensorKey(v)
            tr.keepalive.append(v)
        return k
    if isinstance(v, TupleV) and v.cls is tuple:
        return tuple(dict_key(tr, i) for i in v.items)
    if isinstance(v, ObjV) and not is_literal(v.value) and v.value is not None:
        x = v.value
        try:
            hash(x)
        except TypeError as e:
            from .interpreter import TracedRaise
            raise TracedRaise(e) from None
        if v.source is not None:
            tr.guard("ID", v.source, x)        # which object it is decides the lookup
        return x
    if isinstance(v, ListV) or isinstance(v, DictV):
        from .interpreter import TracedRaise
        raise TracedRaise(TypeError(f"unhashable type: '{v.python_type().__name__}'"))
    from .builtins import real
    return real(tr, v)


def key_value(tr, k) -> V:
    """The value iterating a dict yields for its real key `k`."""
    if isinstance(k, TensorKey):
        return k.tv
    if isinstance(k, torch.Tensor):
        return tr.wrap_tensor(k, None)       # the caller's tensor (its value when already read)
    if type(k) is tuple and any(isinstance(i, (TensorKey, torch.Tensor)) for i in k):
        return TupleV([key_value(tr, i) for i in k])
    return ObjV(k)


def has_traced_keys(keys) -> bool:
    """Keys that only exist in the trace (a TensorKey, or a tuple holding one)."""
    return any(isinstance(k, TensorKey) or type(k) is tuple and has_traced_keys(k) for k in keys)


def same_keys(d, expected: list) -> bool:
    """KEYS guard for keys that are objects: the same objects (constants equal) in order."""
    if len(d) != len(expected):
        return False
    for a, b in zip(d, expected):
        if a is not b and not (is_literal(b) and type(a) is type(b) and a == b):
            return False
    return True


def missing(tr, d: DictV, k) -> V | None:
    """`d[k]` for a key not in `d`: a defaultdict's factory value (inserted), else None."""
    if d.cls is not collections.defaultdict and not (
            isinstance(d.cls, type) and issubclass(d.cls, collections.defaultdict)):
        return None
    factory = d.factory
    if factory is None or isinstance(factory, ObjV) and factory.value is None:
        return None
    from .builtins import _mutate
    value = tr.call(factory, [], {})
    _mutate(tr, d)
    d.items[k] = value
    return value


def new_defaultdict(tr, args, kwargs) -> DictV:
    """`collections.defaultdict(factory=None, mapping_or_pairs=(), **kw)` made in the trace."""
    from .builtins import BUILTINS
    factory = args[0] if args else ObjV(None)
    d = BUILTINS[dict](tr, list(args[1:2]), kwargs)
    d.cls, d.factory = collections.defaultdict, factory
    return d


def ordered_dict_method(tr, d: DictV, name: str, args, kwargs) -> V:
    """`popitem()` (an OrderedDict's with `last=`) and OrderedDict's `move_to_end(key, last=True)`."""
    from .builtins import _mutate, real
    from .interpreter import TracedRaise
    ordered = isinstance(d.cls, type) and issubclass(d.cls, collections.OrderedDict)
    if name == "popitem":
        last = real(tr, kwargs.get("last", args[0] if args else ObjV(True)))
        if (args or kwargs) and not ordered:
            raise TracedRaise(TypeError("dict.popitem() takes no arguments"))
        if not d.items:
            raise TracedRaise(KeyError("popitem(): dictionary is empty"))
        _mutate(tr, d)
        k = next(reversed(d.items)) if last else next(iter(d.items))
        return TupleV([key_value(tr, k), d.items.pop(k)])
    if not ordered or not args:
        raise tr.unsupported(f"{d.cls.__name__}.{name} with these arguments")
    k = dict_key(tr, args[0])
    last = real(tr, kwargs.get("last", args[1] if len(args) > 1 else ObjV(True)))
    if k not in d.items:
        raise TracedRaise(KeyError(k))
    _mutate(tr, d)
    x = d.items.pop(k)
    if last:
        d.items[k] = x
    else:                                   # in place: the items dict may be shared
        rest = dict(d.items)
        d.items.clear()
        d.items[k] = x
        d.items.update(rest)
    return ObjV(None)
