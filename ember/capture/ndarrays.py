"""Capture, NumPy: arrays made from tensors are traced as torch._numpy calls, as Dynamo does.

Consumes the tracer's values; produces graph nodes. `x.numpy()` (or a tensor handed to a NumPy
function) is an `NdarrayV` over the same tensor value; `np.mean(a, 1)`, `a.T`, `a.reshape(..)`,
`a + a`, `a[1:]` become one node each whose target is a small function below: it wraps its
tensor arguments as `torch._numpy.ndarray` (NumPy's API written in torch ops), calls the NumPy
name, and unwraps the result to tensors. The backends trace those nodes like any other torch
code. An array leaving the frame is made again as `tensor.numpy()`, which shares the tensor's
memory as eager `x.numpy()` does.

Not traced (Unsupported, so the code runs eagerly): in-place NumPy (`a += 1`, `a[i] = v`,
`out=`, `np.copyto`), `np.random` (NumPy's generator, not torch's), data-dependent results
(`a.item()`, `a.tolist()`, `if a.any():`), arrays passed in by the caller, tensors that require
grad or live off the CPU (`x.numpy()` fails there eagerly).
"""
from __future__ import annotations

import operator

import torch

from ..errors import Unsupported
from .values import BuiltinMethodV, ListV, NdarrayV, ObjV, TensorV, TupleV, V, holds, peek

# ---- what runs in the graph (targets of call_function nodes) ---------------------------------


def _tnp():
    import torch._numpy as tnp       # NumPy's API on torch tensors (no Dynamo involved)
    return tnp


def _wrap(x):
    if isinstance(x, torch.Tensor):
        return _tnp().ndarray(x)
    if type(x) in (list, tuple):
        return type(x)(_wrap(i) for i in x)
    if type(x) is dict:
        return {k: _wrap(i) for k, i in x.items()}
    return x


def _unwrap(x):
    tnp = _tnp()
    if isinstance(x, tnp.ndarray):
        return x.tensor
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(i) for i in x)
    if isinstance(x, tnp.DType):
        import numpy
        return numpy.dtype(x.name)
    return x


def np_call(name: str, *args, **kwargs):
    """`numpy.<name>(*args, **kwargs)` on tensors, through torch._numpy."""
    fn = _tnp()
    for part in name.split("."):
        fn = getattr(fn, part)
    return _unwrap(fn(*_wrap(args), **_wrap(kwargs)))


def np_method(t: torch.Tensor, name: str, *args, **kwargs):
    return _unwrap(getattr(_tnp().ndarray(t), name)(*_wrap(args), **_wrap(kwargs)))


def np_attr(t: torch.Tensor, name: str):
    return _unwrap(getattr(_tnp().ndarray(t), name))


def np_binary(op: str, a, b):
    """`operator.<op>(a, b)` on arrays (the op by name: FX cannot print a builtin argument)."""
    return _unwrap(getattr(operator, op)(_wrap(a), _wrap(b)))


def np_unary(op: str, a):
    return _unwrap(getattr(operator, op)(_wrap(a)))


def np_getitem(t: torch.Tensor, index):
    return _unwrap(_tnp().ndarray(t)[_wrap(index)])


# ---- tracing --------------------------------------------------------------------------------
_CONST_ATTRS = ("shape", "ndim", "size", "itemsize", "strides", "nbytes")
_ARRAY_ATTRS = ("T", "real", "imag", "mT")
# methods that return new arrays (never write into their receiver)
_METHODS = frozenset((
    "copy", "transpose", "reshape", "max", "min", "sum", "mean", "prod", "all", "any", "argmax",
    "argmin", "astype", "clip", "cumsum", "cumprod", "flatten", "ravel", "squeeze", "std", "var",
    "round", "dot", "diagonal", "swapaxes", "repeat", "take", "trace", "conj", "conjugate",
    "ptp", "argsort", "nonzero", "view", "__abs__", "__neg__", "__pos__", "__invert__"))
_MUTATING_FUNCTIONS = frozenset(("copyto", "put", "place", "putmask", "fill_diagonal",
                                 "put_along_axis"))
_INPLACE = frozenset((operator.iadd, operator.isub, operator.imul, operator.itruediv,
                      operator.ifloordiv, operator.imod, operator.ipow, operator.imatmul,
                      operator.iand, operator.ior, operator.ixor, operator.ilshift,
                      operator.irshift))
# NumPy classes and functions that only compute a constant from constants
_CONST_CALLS = ("dtype", "finfo", "iinfo", "result_type", "promote_types", "can_cast")


def numpy_name(f) -> str | None:
    """`f`'s name under numpy (`mean`, `linalg.norm`) when it is a public NumPy function."""
    mod = getattr(f, "__module__", None) or ""
    tmod = type(f).__module__
    if not (mod == "numpy" or mod.startswith("numpy.") or tmod == "numpy"):
        return None
    import numpy
    name = getattr(f, "__name__", None)
    if not isinstance(name, str):
        return None
    for sub in ("", "linalg.", "fft.", "random."):
        owner = numpy
        for part in sub.split(".")[:-1]:
            owner = getattr(owner, part)
        if getattr(owner, name, None) is f:
            return sub + name
    return None


def _constant(vals) -> bool:
    return all(isinstance(v, ObjV) or isinstance(v, (ListV, TupleV)) and _constant(v.items)
               for v in vals)


def from_tensor(tr, t: TensorV, force: bool = False) -> NdarrayV:
    """`t.numpy()`: an array over the same tensor (eager shares the memory too)."""
    if t.cls is not torch.Tensor:
        raise tr.unsupported(f"numpy() of a {t.cls.__name__} tensor subclass")
    if t.device.type != "cpu" and not force:
        raise tr.unsupported(f"numpy() of a tensor on {t.device}", hint="fails eagerly")
    if t.meta.requires_grad:
        if not force:
            raise tr.unsupported("numpy() of a tensor that requires grad", hint="fails eagerly")
        t = tr.call_graph(torch.Tensor.detach, [t], {})
    return NdarrayV(t)


def _arg(tr, v: V) -> V:
    """A value as the graph passes it to torch._numpy: arrays as their tensors, NumPy dtypes as
    torch dtypes; any other NumPy object is refused (FX cannot spell it, and its type matters)."""
    import numpy
    if isinstance(v, NdarrayV):
        return v.t
    if isinstance(v, TensorV):
        return from_tensor(tr, v).t      # NumPy reads a tensor as an array (np.asarray(x))
    if isinstance(v, ListV):
        return ListV([_arg(tr, i) for i in v.items])
    if isinstance(v, TupleV):
        return TupleV([_arg(tr, i) for i in v.items])
    if isinstance(v, ObjV):
        x = peek(v)
        if isinstance(x, numpy.dtype) or isinstance(x, type) and issubclass(x, numpy.generic):
            return ObjV(torch.from_numpy(numpy.empty(0, dtype=x)).dtype)
        if isinstance(x, numpy.generic) and x.dtype.kind in "biuf":
            # a NumPy scalar (np.sum of constants) keeps its own dtype, as a 0-d array does
            return _node(tr, np_call, [ObjV("array"), ObjV(x.item())], {"dtype": ObjV(x.dtype)},
                         "numpy.array").t
        if type(x).__module__ == "numpy" or type(x).__module__.startswith("numpy."):
            raise tr.unsupported(f"a NumPy {type(x).__name__} in a traced NumPy call",
                                 hint="NumPy objects from outside the frame are not traced")
        return v
    raise tr.unsupported(f"passing a {type(v).__name__} to a traced NumPy call")


def _arrays(v: V) -> V:
    """A graph result as NumPy sees it: tensors are arrays."""
    if isinstance(v, TensorV):
        return NdarrayV(v)
    if isinstance(v, ListV):
        return ListV([_arrays(i) for i in v.items])
    if isinstance(v, TupleV):
        return TupleV([_arrays(i) for i in v.items])
    return v


def _node(tr, target, args, kwargs, what: str) -> V:
    try:
        out = tr.call_graph(target, [_arg(tr, a) for a in args],
                            {k: _arg(tr, x) for k, x in kwargs.items()})
    except Unsupported:
        raise
    except (AttributeError, KeyError, AssertionError, NotImplementedError) as e:
        raise tr.unsupported(f"{what} is not traced: {type(e).__name__}: {e}") from None
    return _arrays(out)


def call_numpy(tr, f, name: str, args, kwargs) -> V | None:
    """A call of NumPy function `f` (public name `name`); None: not NumPy's to trace."""
    import numpy
    base = name.rsplit(".", 1)[-1]
    if name.startswith("random."):
        raise tr.unsupported(f"numpy.{name} draws from NumPy's generator",
                             hint="it runs eagerly (a graph break)")
    consts = _constant([*args, *kwargs.values()])
    if consts and (base in _CONST_CALLS or isinstance(f, type) and issubclass(f, numpy.generic)):
        from .builtins import fold
        return fold(tr, f, list(args), dict(kwargs))
    if consts and not isinstance(f, type) and base not in _MUTATING_FUNCTIONS and \
            "out" not in kwargs:
        return _from_constants(tr, f, name, args, kwargs)
    if isinstance(f, type) or not consts and not holds(args, (NdarrayV, TensorV)) and \
            not holds(kwargs.values(), (NdarrayV, TensorV)):
        return None
        # a factory (np.ones(3)): an array made in the graph, new on each call
    if base in _MUTATING_FUNCTIONS or "out" in kwargs:
        raise tr.unsupported(f"numpy.{name} writes into an array", hint="it runs eagerly")
    tnp = _tnp()
    owner = tnp
    for part in name.split("."):
        owner = getattr(owner, part, None)
    if owner is None:
        raise tr.unsupported(f"numpy.{name} has no torch._numpy counterpart to trace")
    return _node(tr, np_call, [ObjV(name), *args], kwargs, f"numpy.{name}")


def _from_constants(tr, f, name: str, args, kwargs) -> V:
    """NumPy over trace-time constants (BigBird's `np.zeros((n, np.sum(plan[:k])))`): NumPy
    computes it at trace time, as eagerly. A scalar is immutable: a constant. An array is
    mutable and new on every call: it is made in the graph from its values (a traced array
    with a 0-d shape entry failed, torch._numpy wants ints)."""
    import numpy
    from .builtins import fold
    out = fold(tr, f, list(args), dict(kwargs))
    x = peek(out) if isinstance(out, ObjV) else None
    if isinstance(x, numpy.ndarray) and x.dtype.kind in "biuf" and x.size <= _MAX_FOLDED:
        return _node(tr, np_call, [ObjV("array"), tr.const_value(x.tolist())],
                     {"dtype": ObjV(x.dtype)}, f"numpy.{name}")
    if isinstance(x, numpy.ndarray):
        raise tr.unsupported(f"numpy.{name} of constants made a {x.dtype} array of {x.size} "
                             "elements", hint="it runs eagerly")
    return out


_MAX_FOLDED = 4096


def to_tensor(tr, f, args, kwargs) -> V | None:
    """`torch.from_numpy(a)` / `torch.as_tensor(a)` of a traced array: its tensor (shared);
    `torch.tensor(a)`: a copy."""
    if f in (torch.from_numpy, torch.as_tensor) and len(args) == 1 and not kwargs and \
            isinstance(args[0], NdarrayV):
        return args[0].t
    if f in (torch.tensor, torch.as_tensor) and len(args) == 1 and \
            isinstance(args[0], NdarrayV) and set(kwargs) <= {"dtype", "device"}:
        # torch.tensor copies (BigBird's torch.tensor(np.stack(...), device=, dtype=long));
        # as_tensor converts only where dtype or device differ, as .to does
        return tr.call_graph(torch.Tensor.to, [args[0].t], {
            **kwargs, "copy": ObjV(f is torch.tensor)})
    return None


def load_attr(tr, v: NdarrayV, name: str) -> V:
    if name in _CONST_ATTRS or name == "dtype":
        return tr.const_value(np_attr(v.t.meta, name))
    if name in _ARRAY_ATTRS:
        return _node(tr, np_attr, [v, ObjV(name)], {}, f"ndarray.{name}")
    if name in _METHODS:
        return BuiltinMethodV(v, name)
    raise tr.unsupported(f"ndarray.{name} is not traced",
                         hint="it needs the array's data or changes it in place")


def call_method(tr, v: NdarrayV, name: str, args, kwargs) -> V:
    if "out" in kwargs:
        raise tr.unsupported(f"ndarray.{name}(out=...) writes into an array")
    return _node(tr, np_method, [v, ObjV(name), *args], kwargs, f"ndarray.{name}")


def binary(tr, op, a: V, b: V) -> V:
    for x in (a, b):
        if not isinstance(x, NdarrayV) and not (
                isinstance(x, ObjV) and type(peek(x)) in (int, float, bool, complex)):
            raise tr.unsupported(f"operator {op.__name__} on an ndarray and a "
                                 f"{type(x).__name__}")
    if op in _INPLACE:
        raise tr.unsupported(f"in-place {op.__name__} on an ndarray", hint="it runs eagerly")
    return _node(tr, np_binary, [ObjV(op.__name__), a, b], {},
                 f"operator {op.__name__} on ndarrays")


def unary(tr, op, a: NdarrayV) -> V:
    if op is operator.not_:
        raise tr.unsupported("`not array` needs the array's data (data-dependent)")
    return _node(tr, np_unary, [ObjV(op.__name__), a], {}, f"operator {op.__name__} on an ndarray")


def getitem(tr, a: NdarrayV, index: V) -> V:
    return _node(tr, np_getitem, [a, index], {}, "ndarray indexing")
