"""Capture, torch.func: functorch's transforms inside compiled code, and compiled code under them.

Inside a compiled frame, `torch.func.grad/grad_and_value/vmap/jacrev/jacfwd/hessian(f, ...)`
makes a `TransformV` (nothing runs); calling it (and `torch.func.functional_call(m, params, args)`
called directly) becomes ONE graph node whose target rebuilds the user function and applies the
transforms to it (`_target`). Its tensor arguments are the call's tensors plus the tensors in
the function's closure cells (a closure over a frame tensor reads the current one, never a stale
copy); everything else it reads is baked in and guarded (ID on objects, the globals its code
reads). aot's dispatch-mode tracer runs the node on meta tensors, and functorch's transforms
run above it, so the graph holds the aten ops of the transformed function (its backward, its
batched form). The node runs only at trace time, so the function must be free of Python side
effects (autograd_fn's bytecode check) and may read tensors only through its arguments and
closure: a module parameter or global tensor it reads directly would be baked as a constant
(no gradient, stale when replaced), so the capture-time meta run refuses any non-meta tensor.
`out, vjp_fn = torch.func.vjp(f, *primals)` makes two values: `out`, one node computing f
(`f(*primals)`), and a `VjpFnV`; calling it later in the frame is one node computing
`vjp(f, *primals)[1](*cotangents)` (f recomputed inside the node, from the primals' nodes).
Recomputing reads the primals as they are at the call, so an in-place op in between (on any
tensor: views are not followed) is refused; so is a vjp_fn that leaves the frame.
What is refused is a graph break with one warning naming file:line (`warn_break`); so are
a transform applied to a function that is neither a plain Python function nor a torch
function, and calls of the wrappers torch.func made outside the frame.

A compiled frame called under a transform (its arguments are BatchedTensors or grad-tracking
wrappers, which no kernel can read) runs eagerly: the GLOBAL_STATE guard records whether a
transform is active (guards.global_state), and entry.Runner.miss runs such a call eagerly,
warning once.
"""
from __future__ import annotations

import inspect
import operator
import types

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..errors import Unsupported
from ..logging import warn_once
from .controls import global_hooks_present
from .autograd_fn import _check_code, _check_pure, _guard_globals
from .values import CellV, DictV, FuncV, ListV, ObjV, TensorV, TupleV, V, is_literal, peek


def is_functorch(f) -> bool:
    """torch.func's transforms and the functions they return: inlining them would run
    functorch's interpreter stack at trace time."""
    mod = getattr(f, "__module__", None) or ""
    code = getattr(f, "__code__", None)
    return mod == "torch.func" or mod.startswith("torch._functorch") or \
        code is not None and "/torch/_functorch/" in code.co_filename.replace("\\", "/")


TRANSFORMS = {getattr(torch.func, n): n for n in
              ("grad", "grad_and_value", "vmap", "jacrev", "jacfwd", "hessian")}


class TransformV(V):
    """`torch.func.<name>(func, **opts)` made in the trace: applied when called. `made_at`: the
    root frame's instruction (index, visit) and location that made it, where a graph break
    goes when the call is refused (the residual code cannot rebuild a TransformV)."""
    __slots__ = ("name", "func", "opts", "made_at")
    kind = "transform"

    def __init__(self, name: str, func: V, opts: dict, made_at=None):
        self.name, self.func, self.opts, self.source, self.made_at = name, func, opts, None, made_at

    def python_type(self):
        return types.FunctionType


class VjpFnV(V):
    """The vjp_fn of `torch.func.vjp(func, *primals)` made in the trace; `mark`: the graph's last
    node when it was made (in-place ops after it are refused when it is called)."""
    __slots__ = ("func", "primals", "has_aux", "mark", "made_at")
    kind = "vjp_fn"

    def __init__(self, func: V, primals: list, has_aux: bool, mark, made_at):
        self.func, self.primals, self.has_aux, self.mark, self.made_at, self.source = \
            func, primals, has_aux, mark, made_at, None

    def python_type(self):
        return types.FunctionType


def traceable(f) -> bool:
    return f in TRANSFORMS or f is torch.func.functional_call or f is torch.func.vjp


def make_transform(tr, f, args: list, kwargs: dict) -> V:
    """`torch.func.grad(fn, argnums=..)` in the trace, a direct functional_call, or vjp."""
    if f is torch.func.functional_call:
        return call_opaque(tr, "functional_call", _Const(torch.func.functional_call), args, kwargs)
    name = "vjp" if f is torch.func.vjp else TRANSFORMS[f]
    if not args or not isinstance(args[0], (FuncV, ObjV, TransformV)):
        raise tr.unsupported(f"torch.func.{name} of a {type(args[0]).__name__ if args else 'no'} "
                             "function")
    if f is torch.func.vjp:
        return make_vjp(tr, args[0], list(args[1:]), kwargs)
    params = list(inspect.signature(f).parameters)[1:]
    opts = dict(zip(params, args[1:]))
    opts.update(kwargs)
    return TransformV(name, args[0], {k: _plain(tr, v, f"torch.func.{name}'s {k}")
                                      for k, v in opts.items()}, tr.site())


def make_vjp(tr, func: V, primals: list, kwargs: dict) -> V:
    """`torch.func.vjp(func, *primals, has_aux=...)`: (out, vjp_fn) or (out, vjp_fn, aux)."""
    if set(kwargs) - {"has_aux"}:
        raise tr.unsupported(f"torch.func.vjp with {sorted(kwargs)}")
    has_aux = bool(_plain(tr, kwargs["has_aux"], "has_aux")) if "has_aux" in kwargs else False
    made_at = tr.site()
    try:
        out = call_opaque(tr, "vjp_primal_out", func, primals, {})
    except Unsupported as e:
        if e.break_at is None:
            e.break_at, e.break_location = made_at
        raise warn_break(e)
    fn = VjpFnV(func, primals, has_aux, next(iter(reversed(tr.graph.nodes)), None), made_at)
    if not has_aux:
        return TupleV([out, fn])
    if not isinstance(out, TupleV) or len(out.items) != 2:
        raise tr.unsupported("torch.func.vjp(has_aux=True) of a function that does not return "
                             "a pair (output, aux)")
    return TupleV([out.items[0], fn, out.items[1]])


def call_vjp_fn(tr, fn: VjpFnV, args: list, kwargs: dict) -> V:
    """`vjp_fn(*cotangents)`: one node, vjp recomputed from the primals' nodes."""
    nodes = list(tr.graph.nodes)
    after = nodes[nodes.index(fn.mark) + 1:] if fn.mark in nodes else nodes
    for node in after:
        if _mutates(node):
            e = tr.unsupported(f"the vjp_fn of torch.func.vjp is called after an in-place op "
                               f"({node.format_node()})", hint="vjp runs eagerly")
            e.break_at, e.break_location = fn.made_at
            raise warn_break(e)
    try:
        return call_opaque(tr, "vjp", _VjpOf(fn.func, len(fn.primals), fn.has_aux),
                           [*fn.primals, *args], kwargs)
    except Unsupported as e:
        if e.break_at is None:
            e.break_at, e.break_location = fn.made_at
        raise warn_break(e)


def _mutates(node) -> bool:
    """A capture-graph node that may write a tensor (conservative: any trailing-underscore
    callable, setitem, inplace=True, out=)."""
    name = getattr(node.target, "__name__", "") or ""
    return node.op == "call_function" and (
        name.endswith("_") and not name.endswith("__") or node.target is operator.setitem or
        node.kwargs.get("inplace") is True or "out" in node.kwargs)


class _VjpOf:
    """What a vjp_fn call runs: `vjp(func, *args[:n], has_aux=...)[1](*args[n:])`."""
    def __init__(self, func: V, n: int, has_aux: bool):
        self.func, self.n, self.has_aux = func, n, has_aux


def _vjp_apply(f, n: int, has_aux: bool):
    def vjp_apply(*args, **kwargs):
        return torch.func.vjp(f, *args[:n], has_aux=has_aux)[1](*args[n:], **kwargs)
    return vjp_apply


def call_transform(tr, t: TransformV, args: list, kwargs: dict) -> V:
    names = []
    fn = t
    while isinstance(fn, TransformV):
        names.append(fn.name)
        fn = fn.func
    try:
        return call_opaque(tr, "_".join(reversed(names)), t, args, kwargs)
    except Unsupported as e:
        if t.made_at is not None and e.break_at is None:
            e.break_at, e.break_location = t.made_at      # break where the transform is made
        raise warn_break(e)


def warn_break(e: Unsupported) -> Unsupported:
    """One warning per location: a torch.func call that is not traced runs eagerly."""
    warn_once(f"functorch:{e.location}", str(e))
    return e


class _Const:
    """A baked function: `build` ignores the tensors."""
    def __init__(self, fn):
        self.fn = fn


def call_opaque(tr, name: str, fn, args: list, kwargs: dict) -> V:
    tensors: list[TensorV] = []
    build = _builder(tr, fn, tensors)
    n_cells = len(tensors)
    call_leaves = [_leaf(tr, v, tensors) for v in _flat_values(tr, (list(args), dict(kwargs)))]
    in_spec = tree_flatten(_shape(tr, (list(args), dict(kwargs))))[1]
    out_spec: list = []

    def target(*flat):
        f = build(flat[:n_cells])
        vals = [flat[x[1]] if x[0] == "t" else x[1] for x in call_leaves]
        a, kw = tree_unflatten(vals, in_spec)
        out, s = tree_flatten(f(*a, **kw))
        out_spec[:] = [s]
        return tuple(out)
    target.__name__ = target.__qualname__ = f"torch_func_{name}"
    target.__module__ = __name__
    metas = [t.meta for t in tensors]
    try:
        with _MetaOnly(name), torch.device("meta"):      # factories inside: on meta too
            out = target(*metas)
    except Unsupported as e:
        raise tr.unsupported(str(e.args[0]) if e.args else str(e)) from None
    except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError) as e:
        raise tr.unsupported(f"torch.func.{name} raised at trace time: "
                             f"{str(e).splitlines()[0] if str(e) else type(e).__name__}")
    if not all(isinstance(o, torch.Tensor) for o in out):
        raise tr.unsupported(f"torch.func.{name} returns something other than tensors")
    node = tr.graph.call_function(target, tuple(t.node for t in tensors))
    node.meta["example_value"] = out
    device = tensors[0].device if tensors else torch.device("cpu")
    items = []
    for i, o in enumerate(out):
        g = tr.graph.call_function(operator.getitem, (node, i))
        g.meta["example_value"] = o
        items.append(TensorV(g, o, device))
    return _to_value(tree_unflatten(items, out_spec[0]))


class _MetaOnly(TorchDispatchMode):
    """The capture-time run: every tensor an op sees must come from the node's arguments."""

    def __init__(self, name):
        super().__init__()
        self.name = name

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for x in tree_flatten((args, kwargs))[0]:
            if isinstance(x, torch.Tensor) and x.device.type != "meta":
                raise Unsupported(f"torch.func.{self.name}: the function reads a tensor that is "
                                  "neither an argument nor a closure variable (a module's "
                                  "parameter or buffer, a global): it would be baked in")
        return func(*args, **(kwargs or {}))


def _flat_values(tr, v) -> list:
    """The leaves of a structure of values (containers of the trace: lists, tuples, dicts)."""
    if isinstance(v, (list, tuple)):
        return [x for i in v for x in _flat_values(tr, i)]
    if isinstance(v, dict):
        return [x for i in v.values() for x in _flat_values(tr, i)]
    if isinstance(v, (ListV, TupleV)):
        return _flat_values(tr, list(v.items))
    if isinstance(v, DictV):
        return _flat_values(tr, dict(v.items))
    return [v]


def _shape(tr, v):
    """The same structure with placeholders for leaves (for its pytree spec)."""
    if isinstance(v, (list, tuple)):
        return type(v)(_shape(tr, i) for i in v)
    if isinstance(v, dict):
        return {k: _shape(tr, i) for k, i in v.items()}
    if isinstance(v, TupleV) and v.cls is tuple:
        return tuple(_shape(tr, i) for i in v.items)
    if isinstance(v, ListV):
        return [_shape(tr, i) for i in v.items]
    if isinstance(v, DictV) and v.cls is dict:
        return {k: _shape(tr, i) for k, i in v.items.items()}
    if isinstance(v, (TupleV, DictV)):
        raise tr.unsupported(f"a {v.cls.__name__} argument to a torch.func transform")
    return 0


def _leaf(tr, v, tensors: list):
    if isinstance(v, TensorV):
        tensors.append(v)
        return ("t", len(tensors) - 1)
    return ("c", _plain(tr, v, "an argument"))


def _plain(tr, v, what: str):
    """A baked Python value, guarded: literals by value, objects by identity; a tuple or list
    of those (vmap's in_dims=(0, None, 0), built in the traced code by HF Mamba's scan)."""
    if isinstance(v, (TupleV, ListV)) and v.cls in (tuple, list):
        return v.cls(_plain(tr, i, what) for i in v.items)
    if not isinstance(v, ObjV):
        raise tr.unsupported(f"torch.func: {what} is a {type(v).__name__}, not a constant")
    x = peek(v)
    if is_literal(x) or isinstance(x, (torch.dtype, torch.device)):
        return v.value                      # a use: installs its guard
    if v.source is None:
        raise tr.unsupported(f"torch.func: {what} is a {type(x).__name__} made in the trace")
    tr.guard("ID", v.source, x)
    return x


def _builder(tr, fn, tensors: list):
    """A function `cells -> the callable to run`, where `cells` are the values of `tensors`
    (the closure tensors found here, appended in order)."""
    if isinstance(fn, _Const):
        return lambda cells: fn.fn
    if isinstance(fn, _VjpOf):
        inner = _builder(tr, fn.func, tensors)
        return lambda cells: _vjp_apply(inner(cells), fn.n, fn.has_aux)
    if isinstance(fn, TransformV):
        inner = _builder(tr, fn.func, tensors)
        t = getattr(torch.func, fn.name)
        return lambda cells: t(inner(cells), **fn.opts)
    if isinstance(fn, ObjV):
        f = fn.value
        if _torch_function(f):
            tr.guard("ID", fn.source, f)
            return lambda cells: f
        if not isinstance(f, types.FunctionType):
            raise tr.unsupported(f"a torch.func transform of a {type(f).__name__}")
        reads: list = []
        why = _check_pure(f, is_ctx_method=False, depth=0, reads=reads)
        if why is not None:
            raise tr.unsupported(f"the function {f.__qualname__} under a torch.func transform {why}")
        _guard_globals(tr, reads)
        return lambda cells: f
    if not isinstance(fn, FuncV):
        raise tr.unsupported(f"a torch.func transform of a {type(fn).__name__}")
    return _func_builder(tr, fn, tensors)


def _func_builder(tr, fn: FuncV, tensors: list):
    """A function made in the frame: its closure cells become tensors, nested builders or
    baked (guarded) constants; its code is checked for side effects."""
    if fn.defaults and not all(isinstance(d, ObjV) and is_literal(peek(d)) for d in fn.defaults) \
            or fn.kwdefaults:
        raise tr.unsupported(f"{fn.qualname} under a torch.func transform has non-literal "
                             "defaults")
    defaults = tuple(d.value for d in fn.defaults) or None
    parts, check_cells = [], {}
    for name, cell in zip(fn.code.co_freevars, fn.closure):
        v = cell.contents if isinstance(cell, CellV) else None
        if isinstance(v, TensorV):
            tensors.append(v)
            parts.append(("t", len(tensors) - 1))
        elif isinstance(v, (FuncV, TransformV)):
            parts.append(("f", _builder(tr, v, tensors)))
        elif isinstance(v, ObjV):
            x = _plain(tr, v, f"closure variable {name!r}")
            if isinstance(x, torch.nn.Module):
                _check_module(tr, x)
            elif isinstance(x, (types.FunctionType, type)):
                check_cells[name] = _cell(x)
            parts.append(("c", x))
        else:
            raise tr.unsupported(f"{fn.qualname} under a torch.func transform closes over "
                                 f"{name!r}, a {type(v).__name__}")
    reads: list = []
    why = _check_code(fn.code, fn.globals, check_cells, False, 0, reads)
    if why is not None:
        raise tr.unsupported(f"{fn.qualname} under a torch.func transform {why}",
                             hint="it is traced once into the graph; it runs eagerly")
    _guard_globals(tr, reads)
    code, globs, name = fn.code, fn.globals, fn.name

    def build(cells):
        closure = tuple(_cell(cells[p[1]] if p[0] == "t" else p[1](cells) if p[0] == "f"
                              else p[1]) for p in parts)
        return types.FunctionType(code, globs, name, defaults, closure or None)
    return build


def _torch_function(f) -> bool:
    """torch.sin, F.gelu, ...: functions of torch's op namespaces (no Python side effects)."""
    return callable(f) and not isinstance(f, (type, torch.nn.Module)) and \
        getattr(f, "__module__", None) in ("torch", "torch.nn.functional", "torch.special",
                                           "torch.linalg", "torch.fft", "torch._C._nn",
                                           "torch._C._special", "torch._C._linalg")


def _cell(x):
    return types.CellType(x)


def _check_module(tr, m: torch.nn.Module) -> None:
    from .hooks import trace_global_hooks
    if global_hooks_present():
        raise tr.unsupported("a module under a torch.func transform while global module hooks "
                             "are registered")
    trace_global_hooks(tr, [], {})        # guarded: registering one later recompiles
    for sub in m.modules():
        if sub._forward_hooks or sub._forward_pre_hooks or sub._backward_hooks:
            raise tr.unsupported("a module with hooks under a torch.func transform")
        fwd = type(sub).forward
        if isinstance(fwd, types.FunctionType) and not type(sub).__module__.startswith("torch."):
            why = _check_pure(fwd, is_ctx_method=False, depth=0, reads=[])
            if why is not None:
                raise tr.unsupported(f"{type(sub).__qualname__}.forward under a torch.func "
                                     f"transform {why}")


def _to_value(x) -> V:
    if isinstance(x, tuple):
        return TupleV([_to_value(i) for i in x])
    if isinstance(x, list):
        return ListV([_to_value(i) for i in x])
    if isinstance(x, dict):
        return DictV({k: _to_value(i) for k, i in x.items()})
    return x
