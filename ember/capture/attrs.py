"""Capture, attribute access on values: LOAD_ATTR / LOAD_METHOD / STORE_ATTR semantics.

Consumes a value and a name; produces a value (and guards / recorded writes). nn.Module
attributes follow Module.__getattr__ (instance dict, then _parameters/_buffers/_modules);
properties written in Python are inlined; tensors expose metadata as constants.
"""
from __future__ import annotations

import functools
import types

import torch

from . import module_casts, ndarrays, stdlib  # noqa: F401 - they register rewrites
from .sources import MODULE_TABLES, AttrSource, DictEntrySource
from .subclasses import flatten_meta, is_traceable_subclass
from .values import (BuiltinMethodV, DictV, FuncV, ListV, MethodV, NdarrayV, NewObjV, ObjV,
                     PartialV, SuperV, TensorV, TupleV, V, is_literal)


_PARTIAL_PROBE = functools.partial(print)


class TraceAttributeError(Exception):
    """The traced attribute does not exist (getattr/hasattr with a default catch this)."""


def _type_lookup(cls, name):
    for k in cls.__mro__:
        if name in k.__dict__:
            return k.__dict__[name], k
    return None, None


_TENSOR_CONST_ATTRS = {"shape", "dtype", "ndim", "requires_grad", "is_leaf", "layout",
                       "is_sparse", "is_quantized", "is_meta", "is_mkldnn", "is_nested",
                       "itemsize", "nbytes"}
_TENSOR_NODE_ATTRS = {"T": lambda x: torch.Tensor.permute(x, *reversed(range(x.dim()))),
                      "mT": None, "mH": None, "H": None, "real": None, "imag": None}


def load_attr(tr, v: V, name: str) -> V:
    if name == "__class__" and not isinstance(v, ObjV):
        return ObjV(v.python_type())
    if isinstance(v, TensorV):
        return _tensor_attr(tr, v, name)
    if isinstance(v, NdarrayV):
        return ndarrays.load_attr(tr, v, name)
    if isinstance(v, ObjV):
        return _obj_attr(tr, v, name)
    if isinstance(v, NewObjV):
        if name in v.attrs:
            return v.attrs[name]
        if name == "__dict__" and not v.dataclass:
            d = DictV({})
            d.items = v.attrs               # the same dict: writes through it are the object's
            return d
        cls_attr, _ = _type_lookup(v.cls, name)
        if cls_attr is None:
            hook = user_hook(v.cls, "__getattr__")
            if hook is not None:
                return tr.call(ObjV(hook), [v, ObjV(name)], {})
            raise TraceAttributeError(name)
        return _bind_class_attr(tr, cls_attr, v, name, v.cls)
    if isinstance(v, SuperV):
        if isinstance(v.self_v, ObjV):
            s = v.self_v.value       # super() in a classmethod binds the class itself
            mro = s.__mro__ if isinstance(s, type) and issubclass(s, v.cls) else type(s).__mro__
        else:
            mro = v.self_v.python_type().__mro__
        start = mro.index(v.cls) + 1
        for k in mro[start:]:
            if name in k.__dict__:
                return _bind_class_attr(tr, k.__dict__[name], v.self_v, name, k)
        raise TraceAttributeError(name)
    if isinstance(v, (ListV, TupleV, DictV)):
        if isinstance(v, TupleV) and v.cls is not tuple and name in getattr(v.cls, "_fields", ()):
            return v.items[v.cls._fields.index(name)]
        if isinstance(v, TupleV) and v.cls is not tuple and hasattr(v.cls, "n_fields"):
            # torch.return_types structseq: field order from a dummy instance
            fields = _structseq_fields(v.cls)
            if name in fields:
                return v.items[fields.index(name)]
        if hasattr(v.cls, name):
            if v.cls.__module__ not in ("builtins",):
                cls_attr, owner = _type_lookup(v.cls, name)
                if isinstance(cls_attr, (types.FunctionType, property, classmethod,
                                         staticmethod)) or not callable(cls_attr):
                    return _bind_class_attr(tr, cls_attr, v, name, owner)   # also `_fields`
            return BuiltinMethodV(v, name)
        raise TraceAttributeError(name)
    if isinstance(v, FuncV):
        if name == "__name__":
            return ObjV(v.name)
        if name == "__qualname__":
            return ObjV(v.qualname)
        raise tr.unsupported(f"attribute {name!r} of a traced function")
    if isinstance(v, PartialV):
        if name in ("func", "args", "keywords"):
            return v.func if name == "func" else TupleV(v.args) if name == "args" else \
                DictV(v.kwargs)
        if name == "__dict__":          # empty: attributes written on a partial are refused
            return ObjV(types.MappingProxyType({}))
        probe = _PARTIAL_PROBE          # what any partial object has (hasattr(p, "__call__"))
        if not hasattr(probe, name):
            raise TraceAttributeError(name)
        value = getattr(probe, name)
        if is_literal(value) or value is None:
            return ObjV(value)
        if callable(value) and not isinstance(value, type):
            return BuiltinMethodV(v, name)
        raise tr.unsupported(f"attribute {name!r} of a functools.partial made in the trace")
    if isinstance(v, MethodV):
        if name == "__self__":
            return v.self_v
        if name == "__func__":
            return v.func
    raise tr.unsupported(f"attribute {name!r} of {type(v).__name__}")


def _structseq_fields(cls):
    return tuple(getattr(cls, "__match_args__", ()))


def _tensor_attr(tr, v: TensorV, name: str) -> V:
    ov = tr.overlay.get((id(v), name))
    if ov is not None:                  # written in the trace (store_tensor_attr)
        return ov
    if name in _TENSOR_CONST_ATTRS:
        return ObjV(getattr(v.meta, name))
    if name == "device":
        return ObjV(v.device)
    if name == "is_cuda":
        return ObjV(v.device.type == "cuda")
    if name == "is_cpu":
        return ObjV(v.device.type == "cpu")
    if name == "data":
        return tr.call_graph(torch.Tensor.detach, [v], {})
    if name == "T":
        return tr.call_graph(torch.Tensor.permute, [v] + [ObjV(i) for i in
                                                          reversed(range(v.meta.dim()))], {})
    if name == "mT":
        return tr.call_graph(torch.Tensor.transpose, [v, ObjV(-2), ObjV(-1)], {})
    if name in ("real", "imag"):
        return tr.call_graph(getattr(torch, name), [v], {})
    if name in ("grad", "grad_fn", "_version", "names", "_base", "untyped_storage"):
        raise tr.unsupported(f"Tensor.{name} is not supported inside a graph")
    attr = getattr(torch.Tensor, name, None)
    if attr is None:
        # an attribute set on the caller's tensor object (x.tag = ...): guarded present/absent
        real = next((r for _, t, r in tr.inputs if t is v), None)
        if real is None and is_traceable_subclass(v.meta) and name in flatten_meta(v.meta)[0]:
            return tr.call_graph(getattr, [v, ObjV(name)], {})    # a subclass result's inner
        if real is None:
            raise TraceAttributeError(name)
        present = name in getattr(real, "__dict__", {})
        tr.guard("HASATTR", v.source, (name, present))
        if not present:
            raise TraceAttributeError(name)
        return tr.wrap(real.__dict__[name], AttrSource(v.source, name))
    if callable(attr):
        return BuiltinMethodV(v, name)
    raise tr.unsupported(f"Tensor attribute {name!r}")


DELETED = ObjV(None)       # overlay mark: the trace ran `del obj.name`


def _obj_attr(tr, v: ObjV, name: str) -> V:
    obj = v.value
    ov = tr.overlay.get((id(obj), name))
    if ov is DELETED:
        cls_attr, owner = _type_lookup(type(obj), name)
        if cls_attr is None or isinstance(obj, type):
            raise TraceAttributeError(name)
        return _bind_class_attr(tr, cls_attr, v, name, owner)
    if ov is not None:
        return ov
    src = v.source
    if isinstance(obj, torch.nn.Module):
        return _module_attr(tr, v, name)
    if isinstance(obj, types.ModuleType):
        try:
            value = getattr(obj, name)
        except AttributeError:
            raise TraceAttributeError(name) from None
        from .interpreter import _is_library
        if _is_library(obj.__name__) and not isinstance(value, torch.Tensor):
            return tr.wrap(value, None, guard_obj=False) if not is_literal(value) else ObjV(value)
        return tr.wrap(value, AttrSource(src, name) if src else None)
    if isinstance(obj, type):
        cls_attr, owner = _type_lookup(obj, name)
        if isinstance(cls_attr, classmethod):
            return MethodV(ObjV(cls_attr.__func__), v)
        if isinstance(cls_attr, staticmethod):
            return ObjV(cls_attr.__func__)
        try:
            value = getattr(obj, name)
        except AttributeError:
            raise TraceAttributeError(name) from None
        if isinstance(value, torch.Tensor):
            return tr.wrap(value, AttrSource(src, name) if src else None)
        if is_literal(value) and not obj.__module__.startswith(("torch", "builtins")):
            from .sources import ConstSource
            base = src if src is not None else ConstSource(tr.bind_const(obj, "c"))
            return tr.wrap(value, AttrSource(base, name))
        return ObjV(value)
    cls = type(obj)
    if cls is set and name in stdlib.SET_WRITES:
        obj = stdlib.writable_set(tr, v)
    cls_attr, owner = _type_lookup(cls, name)
    if isinstance(cls_attr, property) and isinstance(cls_attr.fget, types.FunctionType):
        return tr.call(ObjV(cls_attr.fget), [v], {})
    try:
        d = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        d = None
    if d is not None and name in d and not _is_data_descriptor(cls_attr):
        value = d[name]
        if src is None:
            return tr.wrap(value, None)
        if cls.__getattribute__ is not object.__getattribute__:
            if getattr(obj, name) is not value:
                return tr.wrap(getattr(obj, name), AttrSource(src, name))
            from .sources import InstanceDictSource
            return tr.wrap(value, InstanceDictSource(src, name))
        return tr.wrap(value, AttrSource(src, name))
    if cls_attr is not None and not _is_data_descriptor(cls_attr) or cls_attr is None and \
            not hasattr(cls, "__getattr__") and cls.__getattribute__ is object.__getattribute__:
        if cls_attr is None:
            raise TraceAttributeError(name)
        return _bind_class_attr(tr, cls_attr, v, name, owner)
    hook = user_hook(cls, "__getattr__")
    if cls_attr is None and hook is not None and cls.__getattribute__ is object.__getattribute__:
        if d is not None and src is not None:   # guarded absent: the hook's answer is traced
            tr.guard("ABSENT", AttrSource(src, name), None)
        return tr.call(ObjV(hook), [v, ObjV(name)], {})
    try:
        value = getattr(obj, name)
    except AttributeError:
        raise TraceAttributeError(name) from None
    if isinstance(value, types.MethodType) and value.__self__ is obj:
        return MethodV(ObjV(value.__func__), v)
    if callable(value) and type(value).__name__ == "builtin_function_or_method" and \
            getattr(value, "__self__", None) is obj:
        return ObjV(value)
    return tr.wrap(value, AttrSource(src, name) if src else None)


def _is_data_descriptor(a) -> bool:
    return a is not None and (hasattr(type(a), "__set__") or hasattr(type(a), "__delete__"))


def _bind_class_attr(tr, cls_attr, self_v: V, name: str, owner) -> V:
    if isinstance(cls_attr, types.FunctionType):
        return MethodV(ObjV(cls_attr), self_v)
    if isinstance(cls_attr, classmethod):
        cls = self_v.python_type() if not isinstance(self_v, ObjV) or not isinstance(
            self_v.value, type) else self_v.value
        return MethodV(ObjV(cls_attr.__func__), ObjV(cls))
    if isinstance(cls_attr, staticmethod):
        return ObjV(cls_attr.__func__)
    if isinstance(cls_attr, property):
        if isinstance(cls_attr.fget, types.FunctionType):
            return tr.call(ObjV(cls_attr.fget), [self_v], {})
        raise tr.unsupported(f"property {name!r} without a Python getter")
    if cls_attr is object.__setattr__:         # what a user __setattr__ ends in: traced
        return MethodV(ObjV(cls_attr), self_v)
    if isinstance(cls_attr, types.WrapperDescriptorType) or isinstance(
            cls_attr, types.MethodDescriptorType) or isinstance(cls_attr, types.BuiltinFunctionType):
        if isinstance(self_v, ObjV):
            # bind the descriptor found in the MRO (super() must not re-dispatch to overrides)
            return ObjV(cls_attr.__get__(self_v.value, owner) if hasattr(cls_attr, "__get__")
                        else getattr(self_v.value, name))
        return BuiltinMethodV(self_v, name)
    if isinstance(cls_attr, torch.Tensor):
        return tr.wrap(cls_attr, None)
    if hasattr(type(cls_attr), "__get__") and not isinstance(cls_attr, type):
        if isinstance(self_v, ObjV):
            return tr.wrap(getattr(self_v.value, name), None)
        raise tr.unsupported(f"descriptor {name!r} on a traced object")
    if is_literal(cls_attr) and isinstance(owner, type):
        # class attributes can be rebound (Cls.flag = ...): guard the value on the owner class
        from .sources import ConstSource
        src = AttrSource(ConstSource(tr.bind_const(owner, "c")), name)
        tr.guard("EQ" if cls_attr is not None else "NONE", src, cls_attr)
        return ObjV(cls_attr, src)
    return tr.wrap(cls_attr, None, guard_obj=False) if not is_literal(cls_attr) else ObjV(cls_attr)


def _module_attr(tr, v: ObjV, name: str) -> V:
    m = v.value
    src = v.source
    cls = type(m)
    if name == "__call__" and "__call__" not in m.__dict__:
        return v             # m.__call__(x) is m(x): the module call, hooks included
    cls_attr, owner = _type_lookup(cls, name)
    if isinstance(cls_attr, property):
        return _bind_class_attr(tr, cls_attr, v, name, owner)
    d = m.__dict__
    if name in d:
        value = d[name]
        # a list/dict/set attribute can change in place, which no module-state snapshot sees:
        # its guards run on every call (the module's own tables are snapshotted)
        structural = not isinstance(value, (list, dict, set)) or name in MODULE_TABLES
        return tr.wrap(value, AttrSource(src, name, structural=structural) if src else None)
    if owner is not None:
        # Python finds a class attribute before Module.__getattr__ reads the tables: a
        # method named like a submodule set by `self.name = Module()` wins, as eagerly.
        # Guarded not shadowed: `m.forward = other` later must not reuse the class's forward
        if src is not None and isinstance(cls_attr, types.FunctionType):
            tr.guard("ABSENT", AttrSource(src, name, structural=src.structural), None)
        return _bind_class_attr(tr, cls_attr, v, name, owner)
    for table in ("_parameters", "_buffers", "_modules"):
        t = d.get(table)
        traced = tr.by_real_id.get(id(t)) if t is not None else None
        if isinstance(traced, DictV):
            # the trace read this table as a dict and may have written it
            # (`self._buffers[k] = y`, register_buffer): its items are the current ones
            if name in traced.items:
                return traced.items[name]
            continue
        if t is not None and name in t:
            value = t[name]
            s = DictEntrySource(src, table, name) if src else None
            if value is None:
                if s is not None:
                    tr.guard("NONE", s, None)
                return ObjV(None, s)
            return tr.wrap(value, s)
    if "__getattr__" in cls.__dict__ and cls.__getattr__ is not torch.nn.Module.__getattr__:
        return tr.call(ObjV(cls.__dict__["__getattr__"]), [v, ObjV(name)], {})
    raise TraceAttributeError(name)


def user_hook(cls, name: str):
    """A user class's own `__setattr__`/`__getattr__` (Python code to trace), else None."""
    f = getattr(cls, name, None)
    if not isinstance(f, types.FunctionType) or issubclass(cls, torch.nn.Module) or \
            (f.__module__ or "").startswith("torch"):
        return None
    return f


def store_attr(tr, obj_v: V, name: str, value: V, plain: bool = False) -> None:
    """`obj.name = value`; `plain` is object.__setattr__ (what a user __setattr__ ends in)."""
    if not plain and isinstance(obj_v, (NewObjV, ObjV)) and \
            not isinstance(getattr(obj_v, "value", None), type):
        hook = user_hook(obj_v.python_type(), "__setattr__")
        if hook is not None:
            tr.call(ObjV(hook), [obj_v, ObjV(name), value], {})
            return
    tr.writes += 1
    if isinstance(obj_v, NewObjV):
        refuse_input_write(tr, obj_v, f"attribute {name!r}")
        obj_v.attrs[name] = value
        return
    if isinstance(obj_v, TensorV):
        _store_tensor_attr(tr, obj_v, name, value)
        return
    if isinstance(obj_v, ObjV) and obj_v.source is not None and not isinstance(obj_v.value, type):
        obj = obj_v.value
        if isinstance(obj, torch.nn.Module) and (id(obj), name) not in tr.overlay and \
                isinstance(value, ObjV) and value.value is obj._modules.get(name, _MISSING):
            return              # `self.sub = self.sub` (after a no-op cast) changes nothing
        if isinstance(obj, torch.nn.Module) and not _module_store_ok(obj, name, value):
            raise tr.unsupported(f"assigning module attribute {name!r} inside the graph")
        tr.overlay[(id(obj), name)] = value
        tr.effects.append(("setattr", obj_v, name, value, plain))
        return
    raise tr.unsupported(f"attribute write {name!r} on {type(obj_v).__name__}")


_MISSING = object()


def refuse_input_write(tr, obj_v: NewObjV, what: str) -> None:
    """A ModelOutput the frame received (inputs._wrap_model_output) is read as the trace's
    own value; a write would change only that value, not the caller's object: refused."""
    if obj_v.source is not None:
        raise tr.unsupported(f"writing {what} of a {obj_v.cls.__name__} the compiled frame "
                             "received", hint="the write runs eagerly")


def _module_store_ok(obj: torch.nn.Module, name: str, value: V) -> bool:
    """Whether `module.name = value`, replayed after the graph through Module.__setattr__, is
    what eager does: a plain tensor attribute (`self.cache = y`, a __dict__ write) or a new
    tensor (or None) for a registered buffer (`self.rel_indices = ...`, a lazily rebuilt cache
    as timm's ConViT and rotary-embedding caches keep). A tensor subclass (a Parameter would be
    registered), a parameter or a submodule slot changes the module's structure: refused."""
    if name in obj._parameters or name in obj._modules:
        return False
    if isinstance(value, TensorV):
        return value.cls is torch.Tensor
    return name not in obj._buffers or isinstance(value, ObjV) and value.value is None


def _store_tensor_attr(tr, t: TensorV, name: str, value: V) -> None:
    """`x.name = value` on a tensor: a Python attribute of the tensor object (not one of
    torch.Tensor's), or `.grad` set to a tensor of the same shape and dtype (eager checks
    them). Replayed on the real tensor after the graph; later reads in the trace see it."""
    if name == "grad":
        ok = isinstance(value, ObjV) and value.value is None or isinstance(value, TensorV) and \
            value.meta.shape == t.meta.shape and value.meta.dtype == t.meta.dtype and \
            value.device == t.device
        if not ok:
            raise tr.unsupported("assigning a .grad of another shape, dtype or device",
                                 hint="fails eagerly")
    elif name == "requires_grad" and isinstance(value, ObjV) and isinstance(value.value, bool):
        set_requires_grad(tr, t, value.value, "attribute write 'requires_grad'")
        return
    elif hasattr(torch.Tensor, name):
        raise tr.unsupported(f"attribute write {name!r} on a tensor (a torch.Tensor attribute)")
    tr.overlay[(id(t), name)] = value
    tr.keepalive.append(t)
    tr.effects.append(("setattr", t, name, value, False))


def set_requires_grad(tr, t: TensorV, flag: bool, what: str) -> None:
    """`t.requires_grad = flag` / `t.requires_grad_(flag)`. The flag already so: nothing to do
    (an input's flag is guarded; HF re-freezes frozen weights). A floating tensor made in the
    trace (it requires no grad, so it is a leaf) becomes a leaf that requires grad: while grad
    mode is off nothing downstream records autograd, so only the flag changes, set on the real
    tensor after the graph (HF MRA's `torch.zeros_like(q).requires_grad_()` at inference); while
    it is on, the graph continues from `new_leaf(t)` and records autograd from there, as eager
    does (HF wav2vec2-family feature encoders' `hidden_states.requires_grad = True` in training).
    The leaf's own `.grad` is eager's only if it stays inside the graph: one that leaves it
    (returned, stored, live at a break) breaks there instead (effects.graph_module). Anything else (an input's flag, a leaf that stops needing grad)
    changes autograd state the caller sees: a graph break, as in Dynamo."""
    current = _tensor_attr(tr, t, "requires_grad")
    if isinstance(current, ObjV) and current.value == flag:
        return
    if not (flag and t.source is None and (t.meta.is_floating_point() or t.meta.is_complex())):
        raise tr.unsupported(f"{what} on a tensor: it changes the autograd graph mid-trace",
                             hint="the write runs eagerly, between two graphs")
    if torch.is_grad_enabled():
        leaf = tr.call_graph(new_leaf, [t], {})
        t.node, t.meta = leaf.node, leaf.meta      # every reference to `t` now sees the leaf
        tr.new_leaves[leaf.node] = tr.site()
        return
    tr.overlay[(id(t), "requires_grad")] = ObjV(True)
    tr.keepalive.append(t)
    tr.effects.append(("setattr", t, "requires_grad", ObjV(True), False))


def new_leaf(t: torch.Tensor) -> torch.Tensor:
    """A graph node: `t` (a tensor that requires no grad) as a new autograd leaf that does."""
    return t.detach().requires_grad_(True)


new_leaf.ember_pure = True      # no user Python: the speed check may run it twice (speed.py)


def delete_attr(tr, obj_v: V, name: str) -> None:
    """`del obj.name`: on an object made in the trace, applied to its value; on the caller's
    object, replayed after the graph (reads in the trace then see the class attribute)."""
    from .interpreter import TracedRaise
    tr.writes += 1
    if isinstance(obj_v, NewObjV):
        refuse_input_write(tr, obj_v, f"attribute {name!r}")
        if name not in obj_v.attrs:
            raise TracedRaise(AttributeError(name))
        del obj_v.attrs[name]
        return
    if not (isinstance(obj_v, ObjV) and obj_v.source is not None and
            not isinstance(obj_v.value, (type, types.ModuleType))):
        raise tr.unsupported(f"del of attribute {name!r} on {type(obj_v).__name__}")
    obj = obj_v.value
    cls = type(obj)
    if isinstance(obj, torch.nn.Module):
        if any(name in obj.__dict__.get(t, ()) for t in ("_parameters", "_buffers", "_modules")):
            raise tr.unsupported(f"deleting module attribute {name!r} inside the graph")
    elif cls.__delattr__ is not object.__delattr__:
        raise tr.unsupported(f"del on a {cls.__qualname__}, which has its own __delattr__")
    key = (id(obj), name)
    if tr.overlay.get(key) is DELETED:
        raise TracedRaise(AttributeError(name))
    if key not in tr.overlay:
        try:
            d = object.__getattribute__(obj, "__dict__")
        except AttributeError:
            d = {}
        if name not in d or _is_data_descriptor(_type_lookup(cls, name)[0]):
            raise tr.unsupported(f"del of {name!r}, not an instance attribute of "
                                 f"{cls.__qualname__}")
        load_attr(tr, obj_v, name)          # guards the value, so that it exists
    tr.overlay[key] = DELETED
    tr.effects.append(("delattr", obj_v, name))
