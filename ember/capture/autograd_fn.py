"""Stage capture: a user `torch.autograd.Function` (`MyFn.apply(x, ...)`) as one graph node.

Consumes the `.apply` call the interpreter meets; produces one `call_function` node whose target is
the bound `MyFn.apply`, its example value computed by running the Function on the meta copies.
Nothing of the Function is inlined here: aot's dispatch-mode tracer runs the node, so the user's
forward ops are recorded, and while it traces the joint backward (`torch.autograd.grad`) autograd
calls the user's backward, whose ops are recorded too (docs/design/001-stage-contracts.md). Both
`ctx` methods then run only at trace time, never per call, so the Function's code must be free of
Python side effects: `_check_pure` reads its bytecode (forward, backward, setup_context and the
plain functions they call) and refuses, as a graph break naming the culprit, anything that could
write outside `ctx` or the frame (print, a global, a closure cell, an attribute of another object,
a call to a function it cannot read), and guards the globals they read (a rebound constant or
helper recompiles; class attributes read through a global class are not guarded). Data-dependent code (`.item()` on a meta tensor) fails in
the trace: in forward as a break here, in backward as aot's loud fallback to the captured graph.
Under no_grad (inference) apply runs only forward and records nothing: the forward is inlined
instead (`_inline_forward`), a plain traced call with a ctx that drops what it saves.
"""
from __future__ import annotations

import builtins
import math
import operator
import types
import weakref

import torch

# builtins that neither write state nor do I/O
_PURE_BUILTINS = frozenset({
    "len", "range", "isinstance", "issubclass", "tuple", "list", "dict", "set", "frozenset",
    "int", "float", "bool", "str", "max", "min", "abs", "sum", "any", "all", "zip", "enumerate",
    "reversed", "sorted", "getattr", "hasattr", "type", "super", "slice", "divmod", "round", "map",
    "filter", "iter", "next", "repr", "NotImplemented", "None", "True", "False", "Ellipsis",
    "ValueError", "TypeError", "RuntimeError", "AssertionError", "NotImplementedError",
})
_WRITES = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL", "STORE_DEREF", "DELETE_DEREF", "DELETE_ATTR",
                     "STORE_NAME", "DELETE_NAME"})
_PURE_MODULES = (math, operator)
_MAX_DEPTH = 4


class _NoGradCtx:
    """The ctx an inlined no-grad forward sees: what it may record for a backward is dropped."""

    def save_for_backward(self, *tensors):
        pass

    def save_for_forward(self, *tensors):
        pass

    def mark_dirty(self, *args):
        pass

    def mark_non_differentiable(self, *args):
        pass

    def set_materialize_grads(self, value):
        pass


def _inline_forward(tr, cls, args, kwargs):
    """Under no_grad apply runs only `forward` (no graph is recorded): its code is traced as
    the caller's own, with the capture's usual rules for side effects and breaks, so it may take
    modules, lists and user objects (Reformer's reversible layers take all three)."""
    from .values import NewObjV, ObjV
    fwd = _own_method(cls, "forward")
    if fwd is None:
        return None
    if _own_method(cls, "setup_context") is not None:        # forward(*args): no ctx
        return tr.call(ObjV(fwd), list(args), kwargs)
    ctx = NewObjV(_NoGradCtx, {"needs_input_grad": ObjV(tuple(False for _ in args))},
                  dataclass=False)
    return tr.call(ObjV(fwd), [ctx, *args], kwargs)


def call_function_apply(tr, f, args, kwargs):
    cls = f.__self__
    if not torch.is_grad_enabled() and (out := _inline_forward(tr, cls, args, kwargs)) is not None:
        return out
    reads: list = []
    for name in ("forward", "backward", "setup_context", "vjp"):
        meth = _own_method(cls, name)
        if meth is not None:
            why = _check_pure(meth, is_ctx_method=True, depth=0, reads=reads)
            if why is not None:
                raise tr.unsupported(
                    f"autograd.Function {cls.__qualname__}.{name} {why}",
                    hint="its forward and backward are traced once into the graph, so Python "
                         "side effects there would not run per call; it runs eagerly")
    _guard_globals(tr, reads)
    return tr.call_graph(apply_node_target(cls), args, kwargs)


def _guard_globals(tr, reads):
    """The traced forward/backward bake in the globals they read: guard each (a rebound
    constant or helper recompiles), as if the user's code had read it in the frame."""
    from .sources import GlobalSource
    seen = set()
    for globs, name in reads:
        if (id(globs), name) in seen or name not in globs or \
                str(globs.get("__name__", "")).startswith("torch"):
            continue
        seen.add((id(globs), name))
        value = globs[name]
        if isinstance(value, types.ModuleType):
            continue
        src = GlobalSource(tr.gid_for(globs), name)
        tr.wrap(value, src)
        if type(value) in (float, str):          # wrap guards these lazily, on use
            tr.guard("EQ", src, value)


_TARGETS: "weakref.WeakKeyDictionary[type, types.FunctionType]" = weakref.WeakKeyDictionary()


def apply_node_target(cls):
    """One plain function per Function class calling `cls.apply`: the node's target (FX prints
    a function by module and name; `cls.apply` is a builtin method bound to the class)."""
    fn = _TARGETS.get(cls)
    if fn is None:
        ref = weakref.ref(cls)        # the table holds classes weakly

        def fn(*args, **kwargs):
            return ref().apply(*args, **kwargs)
        fn.__name__ = f"{cls.__name__}_apply"
        fn.__qualname__ = f"{cls.__qualname__}.apply"
        fn.__module__ = __name__
        fn._ember_autograd_function = cls
        _TARGETS[cls] = fn
    return fn


def _own_method(cls, name):
    """`cls.name` as a plain function, when the user's classes define it (not torch's base)."""
    for k in cls.__mro__:
        if k.__module__.startswith("torch.autograd") or k is object:
            return None
        if name in k.__dict__:
            m = k.__dict__[name]
            m = getattr(m, "__func__", m)
            while hasattr(m, "__wrapped__"):     # once_differentiable and similar wrappers
                m = m.__wrapped__
            return m if isinstance(m, types.FunctionType) else None
    return None


def _check_pure(fn: types.FunctionType, *, is_ctx_method: bool, depth: int,
                reads: list) -> str | None:
    """None when `fn` cannot have a Python side effect outside its ctx; else the reason."""
    if depth > _MAX_DEPTH:
        return f"calls {fn.__qualname__} too deeply to check"
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    return _check_code(fn.__code__, fn.__globals__, cells, is_ctx_method, depth, reads)


def _check_code(code, globs, cells, is_ctx_method, depth, reads) -> str | None:
    import dis
    ctx_name = code.co_varnames[0] if is_ctx_method and code.co_argcount else None
    prev = None
    for ins in dis.get_instructions(code):
        op = ins.opname
        if op in _WRITES:
            return f"writes {ins.argval!r} ({op})"
        if op == "STORE_ATTR" and not (ctx_name and prev is not None and
                                       prev.opname == "LOAD_FAST" and prev.argval == ctx_name):
            return f"sets attribute {ins.argval!r} on an object other than ctx"
        if op in ("LOAD_GLOBAL", "LOAD_NAME"):
            reads.append((globs, ins.argval))
            why = _check_global(ins.argval, globs, depth, reads)
            if why is not None:
                return why
        if op in ("LOAD_DEREF", "LOAD_CLASSDEREF") and ins.argval != "__class__":
            cell = cells.get(ins.argval)
            if cell is not None:
                try:
                    val = cell.cell_contents
                except ValueError:
                    val = None
                if not isinstance(val, (types.ModuleType, types.FunctionType, type)):
                    return f"reads closure variable {ins.argval!r} (not guarded)"
                why = _check_value(ins.argval, val, depth, reads)
                if why is not None:
                    return why
        prev = ins
    for c in code.co_consts:
        if isinstance(c, types.CodeType):        # comprehensions, lambdas, nested functions
            why = _check_code(c, globs, cells, False, depth, reads)
            if why is not None:
                return why
    return None


def _check_global(name, globs, depth, reads) -> str | None:
    if name in globs:
        return _check_value(name, globs[name], depth, reads)
    if name in _PURE_BUILTINS:
        return None
    if hasattr(builtins, name):
        return f"calls {name}(), a Python side effect" if name in ("print", "input", "open", "exec",
                                                                  "eval", "setattr", "delattr") \
            else f"uses builtin {name!r}"
    return None          # an undefined name raises NameError in the trace as it would eagerly


def _check_value(name, v, depth, reads) -> str | None:
    if v is None or isinstance(v, (bool, int, float, complex, str, bytes, torch.dtype,
                                   torch.device, torch.Size)):
        return None
    if isinstance(v, tuple) and all(_check_value(name, x, depth, reads) is None for x in v):
        return None
    if isinstance(v, types.ModuleType):
        return None
    if isinstance(v, type):
        return None if (v.__module__ or "").startswith(("torch", "builtins")) or \
            issubclass(v, torch.autograd.Function) else f"uses class {v.__qualname__}"
    mod = getattr(v, "__module__", None) or ""
    if mod.startswith("torch") or mod in ("math", "operator", "_operator") or \
            isinstance(v, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return None
    if isinstance(v, types.FunctionType):
        why = _check_pure(v, is_ctx_method=False, depth=depth + 1, reads=reads)
        return None if why is None else f"calls {v.__qualname__}, which {why}"
    return f"uses {type(v).__name__} {name!r} (mutable state it may change per call)"
