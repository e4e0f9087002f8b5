"""Capture, calls: what `CALL` does with each kind of callee.

Consumes a callee value, positional and keyword argument values; produces the result value.
  torch functions, Tensor methods, F.*  → a graph node (run on meta for the example value)
  user Python functions / methods       → inlined (their bytecode is interpreted)
  nn.Module instances                   → inlined forward, forward hooks inlined around it (hooks.py)
  dataclasses / namedtuples / classes   → objects created in the trace, rebuilt after the graph
  builtins                              → the BUILTINS table (builtins.py), folded on constants
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import operator
import types
import weakref

import torch
import torch.utils._pytree as pytree
from torch.nn.modules.lazy import LazyModuleMixin
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import Unsupported
from ..logging import warn_once
from . import functorch, ndarrays, numbers
from .bwhooks import traced_backward_hook
from .checkpoint import call_checkpoint, is_checkpoint
from .cond import call_cond, is_cond
from .flex import call_flex, is_flex_attention
from .while_loop import call_while_loop, is_while_loop
from .scalar_args import REWRITES
from .controls import fullgraph, global_hooks_present
from .functorch import is_functorch
from .values import (NULL, BuiltinMethodV, CellV, ContextV, DecoratedV, DictV, FuncV, GenV, IterV,
                     ListV, NdarrayV, NewModuleV, MethodV, NewObjV, ObjV, PartialV, SuperV, TensorV,
                     TupleV, V,
                     holds, is_literal, is_model_output, peek)

_TORCH_MODULES = ("torch", "torch.nn.functional", "torch.linalg", "torch.fft", "torch.special",
                  "torch._C._nn", "torch._C._VariableFunctions", "torch._C._linalg",
                  "torch._C._fft", "torch._C._special", "torch.functional", "torch.nn.init")
_BLOCKED_PREFIXES = ("set_", "manual_seed", "seed", "initial_seed", "save", "load", "compile",
                     "use_deterministic", "get_rng_state", "_dynamo", "cuda", "backends",
                     "autograd", "jit", "vmap", "func", "cond", "export", "library", "_assert",
                     "is_grad_enabled_", "get_num_threads", "set_num_threads")
_TORCH_FNS: dict[int, object] | None = None


def torch_functions() -> dict[int, object]:
    global _TORCH_FNS
    if _TORCH_FNS is None:
        import importlib
        out = {}
        for modname in _TORCH_MODULES:
            try:
                mod = importlib.import_module(modname)
            except ImportError:
                continue
            for k, v in vars(mod).items():
                if k.startswith("__") or isinstance(v, (type, types.ModuleType)):
                    continue
                if not callable(v) or k.startswith(_BLOCKED_PREFIXES):
                    continue
                if modname == "torch.nn.functional" and k in ("has_torch_function",
                                                             "handle_torch_function"):
                    continue
                out[id(v)] = v
        for k, v in vars(torch.Tensor).items():
            if callable(v) and not k.startswith("__"):
                out.setdefault(id(v), v)
        _TORCH_FNS = out
    return _TORCH_FNS


_TENSOR_BLOCKED = {"item", "tolist", "numpy", "data_ptr", "storage", "untyped_storage",
                   "__bool__", "__index__", "__int__", "__float__", "backward", "register_hook",
                   "retain_grad", "requires_grad_", "share_memory_", "pin_memory", "record_stream",
                   "set_", "resize_", "resize_as_", "__array__", "storage_offset"}

# matched by name so product code never imports these modules
_IS_COMPILING = {"is_compiling": ("torch.compiler", "torch._dynamo.external_utils", "torch._utils",
                                  "torch._dynamo.eval_frame"),
                 "is_dynamo_compiling": ("torch.compiler",),
                 "is_exporting": ()}
# queries about the machine and the autograd engine, answered once at trace time (the same list
# Dynamo folds unguarded); tracing into them read os.environ and guarded all of it
_FOLDED = {torch.autograd._is_checkpoint_valid, torch.cuda.is_available, torch.mps.is_available,
           torch.xpu.is_available, torch.mtia.is_available, torch.distributed.is_available}
# "is another tracer running?": not while ember traces (as Dynamo answers; is_fx_tracing logs a
# warning eagerly, through the logging module the trace cannot follow)
_NOT_TRACING = {"is_fx_tracing": ("torch.fx._symbolic_trace",),
                "is_fx_symbolic_tracing": ("torch.fx._symbolic_trace",),
                "is_in_onnx_export": ("torch.onnx", "torch.onnx._globals", "torch.onnx.utils")}
# torch._dynamo.graph_break(): the code asks for a graph break there (also matched by name)
_GRAPH_BREAK = {"graph_break": ("torch._dynamo.decorators",)}
# torch.distributed (issue 13): a collective never goes into a graph, where it could be
# reordered or dropped; the call is Unsupported, so the frame runs eagerly with one warning.
# Matched by module name (product code does not import these modules); rank queries are fine.
_COLLECTIVE_MODULES = ("torch.distributed.distributed_c10d", "torch.distributed.c10d_logger",
                       "torch.distributed._functional_collectives", "torch._C._distributed_c10d")
_COLLECTIVE_OK = {"get_rank", "get_world_size", "is_initialized", "is_available", "get_backend"}


def _is_collective(f) -> bool:
    mods = (getattr(f, "__module__", None), type(getattr(f, "__self__", None)).__module__)
    return any(m in _COLLECTIVE_MODULES for m in mods) and \
        getattr(f, "__name__", "") not in _COLLECTIVE_OK


_READ_ONLY_METHODS = {"get", "keys", "values", "items", "copy", "index", "count", "__contains__",
                      "__getitem__", "__len__", "issubset", "issuperset", "union", "intersection",
                      "difference", "isdisjoint"}
_GRAD_CTX = {torch.no_grad: ("grad", (False,)), torch.enable_grad: ("grad", (True,))}
_AUTOCAST_CLASSES = tuple(c for c in (torch.autocast, getattr(torch.amp, "autocast", None),
                                      getattr(torch.cpu.amp, "autocast", None),
                                      getattr(torch.cuda.amp, "autocast", None)) if c is not None)


def call(tr, fn: V, args: list, kwargs: dict) -> V:
    if isinstance(fn, MethodV):
        return call(tr, fn.func, [fn.self_v] + list(args), kwargs)
    if isinstance(fn, FuncV):
        return tr.inline(fn.code, fn.globals, fn.closure, args, kwargs, fn.defaults,
                         fn.kwdefaults, fn, fn.name)
    if isinstance(fn, BuiltinMethodV):
        return call_builtin_method(tr, fn.recv, fn.name, args, kwargs)
    if isinstance(fn, PartialV):
        return call(tr, fn.func, list(fn.args) + list(args), {**fn.kwargs, **kwargs})
    if isinstance(fn, ObjV):
        return call_obj(tr, fn, args, kwargs)
    if isinstance(fn, NewObjV):
        c = getattr(fn.cls, "__call__", None)
        if isinstance(c, types.FunctionType):
            return call(tr, ObjV(c), [fn] + list(args), kwargs)
    if isinstance(fn, ContextV) and fn.ctx_kind in _DECORATOR_KINDS and len(args) == 1 and \
            not kwargs and isinstance(args[0], (FuncV, ObjV, MethodV, PartialV, DecoratedV)):
        return DecoratedV(fn, args[0])          # a context manager used as a decorator
    if isinstance(fn, functorch.TransformV):
        return functorch.call_transform(tr, fn, args, kwargs)
    if isinstance(fn, functorch.VjpFnV):
        return functorch.call_vjp_fn(tr, fn, args, kwargs)
    if isinstance(fn, DecoratedV):
        from .handlers.contexts import context_method
        ctx = ContextV(fn.ctx.ctx_kind, fn.ctx.args)   # a fresh one per call, as ContextDecorator
        context_method(tr, ctx, "__enter__", [])
        out = call(tr, fn.func, args, kwargs)
        context_method(tr, ctx, "__exit__", [])
        return out
    raise tr.unsupported(f"calling a {type(fn).__name__}")


# the contexts whose instances decorate functions (torch's _DecoratorContextManager & co.)
_DECORATOR_KINDS = ("grad", "grad_set", "inference", "autocast")


def _all_const(vals) -> bool:
    return all(isinstance(v, ObjV) for v in vals)


def _call_weakref(tr, ref, source) -> V:
    """`ref()` on a weak reference the frame reads (torch's RNN modules keep weak refs to their
    weights and check `ref() is weight` on every call): the referent, read through the call
    in the guards, which check it is the very object the trace saw (a tensor: the same one as
    the trace's other reads of it)."""
    from .sources import CallSource
    obj, src = ref(), CallSource(source)
    if obj is None:
        tr.guard("NONE", src, None)
        return ObjV(None, src)
    v = tr.wrap(obj, src)
    if isinstance(v, TensorV):
        if v.source is not None and v.source.expr() != src.expr():
            tr.guard("ALIAS", src, v.source)
    else:
        tr.guard("ID", src, obj)
    return v


def compiled_by_torch(f) -> bool:
    """A torch.compile'd function (Dynamo's wrapper) or module (OptimizedModule)."""
    return getattr(f, "_torchdynamo_orig_callable", None) is not None or \
        isinstance(f, torch.nn.Module) and type(f).__module__.startswith("torch._dynamo")


def _hashable(f) -> bool:
    try:
        hash(f)
        return True
    except TypeError:
        return False


def call_obj(tr, fn: ObjV, args: list, kwargs: dict) -> V:
    from .builtins import BUILTINS, fold
    f = peek(fn)        # a call uses what a nested function runs, not which object it is
    if getattr(f, "_ember_disabled", False):
        raise tr.unsupported(f"call to {f.__qualname__}, marked ember.disable")
    if getattr(f, "_ember_compiled", None) is not None and callable(getattr(f, "__wrapped__", None)):
        # a function ember.compile'd on its own, called from compiled code: inline what it
        # wraps (as Dynamo inlines a nested torch.compile), not ember's own runner
        return call(tr, ObjV(f.__wrapped__), args, kwargs)
    if getattr(f, "_torchdynamo_disable", False):
        # torch.compiler.disable (also torch's own lazily disabled helpers, e.g. under
        # torch.manual_seed): the user asked for no compiler here, so it runs eagerly
        raise tr.unsupported(f"call to {_name(f)}, marked torch.compiler.disable",
                             hint="it runs eagerly, outside the graph (as under Dynamo)")
    if compiled_by_torch(f):
        # its frames are Dynamo's to capture: tracing into Dynamo's wrapper would compile the
        # function with ember and trace Dynamo's own machinery
        raise tr.unsupported(f"call to {_name(f)}, compiled by torch.compile",
                             hint="it runs under torch.compile, outside the graph")
    if getattr(f, "_ember_region", False) is True and not _inline_regions(tr):
        raise tr.unsupported(f"call to {_name(f)}, an ember.nested_compile_region: it runs as "
                             "its own compiled unit, shared by every call and instance",
                             hint="intended: the region is compiled once, not inlined")
    if _is_collective(f):
        raise tr.unsupported(f"call to collective torch.distributed {getattr(f, '__name__', f)}",
                             hint="collectives are not captured; the function runs eagerly")
    if isinstance(f, torch.nn.Module):
        own_call = type(f).__call__
        if own_call is not torch.nn.Module.__call__ and isinstance(own_call, types.FunctionType):
            return call(tr, ObjV(own_call), [fn] + list(args), kwargs)    # a user __call__
        return call_module(tr, fn, args, kwargs)
    if functorch.traceable(f):
        return functorch.make_transform(tr, f, args, kwargs)
    if is_functorch(f):
        what = f"torch.func.{f.__name__}" if getattr(f, "__module__", None) == "torch.func" else \
            f"the function torch.func made of {_name(f)}"
        raise functorch.warn_break(tr.unsupported(
            f"{what} is not traced", hint="it runs eagerly (a graph break); the code before "
            "and after it is compiled"))
    if getattr(f, "__name__", None) in _IS_COMPILING and \
            getattr(f, "__module__", None) in _IS_COMPILING[f.__name__]:
        return ObjV(True)    # library code asks "am I being traced?": yes
    if getattr(f, "__module__", None) in _NOT_TRACING.get(getattr(f, "__name__", None), ()):
        return ObjV(False)
    if _hashable(f) and f in _FOLDED and not args and not kwargs:
        return ObjV(f())
    if getattr(f, "_dynamo_marked_constant", False) is True and \
            all(isinstance(a, ObjV) for a in (*args, *kwargs.values())):
        # torch._dynamo.assume_constant_result (transformers marks its install probes so): the
        # result is promised fixed for the process; called at trace time, as Dynamo does. Traced,
        # HF's audio encoders broke in importlib.metadata and ran wholly eagerly
        return fold(tr, f, list(args), dict(kwargs))
    if getattr(f, "__module__", None) in _GRAPH_BREAK.get(getattr(f, "__name__", None), ()):
        raise tr.unsupported("torch._dynamo.graph_break() called",
                             hint="the code asks for a graph break here")
    np_name = ndarrays.numpy_name(f)
    if np_name is not None:
        out = ndarrays.call_numpy(tr, f, np_name, args, kwargs)
        if out is not None:
            return out
    out = ndarrays.to_tensor(tr, f, args, kwargs)
    if out is not None:
        return out
    try:
        h, rewrite = BUILTINS.get(f), REWRITES.get(f)
    except TypeError:
        h = rewrite = None
    if rewrite is not None and (out := rewrite(tr, args, kwargs)) is not None:
        return out
    if h is not None:
        if isinstance(f, types.BuiltinFunctionType):
            _check_arguments(f, args, kwargs)
        return h(tr, args, kwargs)
    if getattr(f, "_ember_allow_in_graph", False):
        return tr.call_graph(f, args, kwargs)
    if is_checkpoint(f):
        return call_checkpoint(tr, args, kwargs)
    if is_cond(f):
        return call_cond(tr, args, kwargs)
    if is_flex_attention(f):
        return call_flex(tr, args, kwargs)
    if is_while_loop(f):
        return call_while_loop(tr, args, kwargs)
    if type(f).__name__ == "_lru_cache_wrapper" and hasattr(f, "__wrapped__"):
        # functools.lru_cache/cache: the wrapped function is traced, as Dynamo does; its cache is
        # neither read nor filled (a function whose result is mutated later would differ)
        from .sources import AttrSource
        inner = tr.wrap(f.__wrapped__, AttrSource(fn.source, "__wrapped__") if fn.source else None)
        return call(tr, inner, args, kwargs)
    if _is_function_apply(f):
        from .autograd_fn import call_function_apply
        return call_function_apply(tr, f, args, kwargs)
    if isinstance(f, _OP_TYPES) or type(f).__name__ == "CustomOpDef" and hasattr(f, "_opoverload"):
        return call_op(tr, getattr(f, "_opoverload", f), args, kwargs)
    tf = torch_functions()
    if id(f) in tf and tf[id(f)] is f:
        return call_torch(tr, f, args, kwargs)
    if isinstance(f, types.FunctionType):
        intrinsic = getattr(f, "_ember_trace", None)
        if intrinsic is not None:    # capture's own helpers that build graph nodes themselves
            return intrinsic(tr, args, kwargs)
        closure, defaults, kwd = tr.real_function_parts(f, fn)
        return tr.inline(f.__code__, f.__globals__, closure, args, kwargs, defaults, kwd, fn,
                         f.__name__)
    if isinstance(f, types.MethodType):
        self_src = None
        from .sources import AttrSource
        if fn.source is not None:
            self_src = AttrSource(fn.source, "__self__")
        self_v = tr.wrap(f.__self__, self_src)
        return call(tr, ObjV(f.__func__), [self_v] + list(args), kwargs)
    if isinstance(f, type):
        return call_class(tr, fn, args, kwargs)
    if isinstance(f, (types.BuiltinFunctionType, types.MethodWrapperType,
                      types.BuiltinMethodType)) or type(f).__name__ in ("method_descriptor",):
        mod = getattr(f, "__module__", None) or ""
        if getattr(f, "__objclass__", None) is torch._C.TensorBase and args and \
                isinstance(args[0], TensorV):       # torch.Tensor.add_(x, 1): x.add_(1)
            return call_builtin_method(tr, args[0], f.__name__, args[1:], kwargs)
        self_obj = getattr(f, "__self__", None)
        mutable = isinstance(self_obj, (dict, list, set, collections.deque, bytearray)) and not is_literal(self_obj) and \
            id(self_obj) not in tr.owned
        if mutable and getattr(f, "__name__", "") not in _READ_ONLY_METHODS:
            raise tr.unsupported(f"{type(self_obj).__name__}.{f.__name__}() on a real container "
                                 "would mutate it at trace time")
        if isinstance(self_obj, (dict, list, set)) and id(self_obj) in tr.owned and \
                getattr(f, "__name__", "") not in _READ_ONLY_METHODS:
            tr.wrote_owned(self_obj)
            if type(self_obj) is set and f.__name__ == "add" and len(args) == 1 and \
                    not isinstance(args[0], ObjV):
                # a tensor (or other value) in a set the trace made: kept by identity
                members = tr.set_members.setdefault(id(self_obj), [])
                if not any(m is args[0] for m in members):
                    members.append(args[0])
                return ObjV(None)
        if isinstance(self_obj, set) and tr.set_members.get(id(self_obj)):
            raise tr.unsupported(f"set.{f.__name__}() on a set holding traced values")
        if isinstance(self_obj, str) and f.__name__ == "join" and len(args) == 1 and \
                isinstance(args[0], (IterV, GenV, ListV, TupleV)):
            items = tr.iterate(args[0])          # ", ".join(f"{k}" for k in names)
            if _all_const(items):
                return fold(tr, f, [TupleV(items)], {})
        if _all_const(args) and _all_const(kwargs.values()) and (
                mod in ("math", "operator", "_operator", "builtins", "_functools", "itertools")
                or is_literal(self_obj) or isinstance(self_obj, (dict, list, str, tuple, set))
                and self_obj is not None):
            return fold(tr, f, args, kwargs)
        if mod.startswith("torch") or mod == "_operator" and holds(args, TensorV):
            return tr.call_graph(f, args, kwargs)
        raise tr.unsupported(f"call to builtin {getattr(f, '__qualname__', f)!r}")
    if isinstance(f, _AUTOCAST_CLASSES):
        return ContextV("autocast_obj", (f,))
    if type(f) is weakref.ReferenceType and fn.source is not None and not args and not kwargs:
        return _call_weakref(tr, f, fn.source)
    c = getattr(type(f), "__call__", None)
    if isinstance(c, types.FunctionType):
        return call(tr, ObjV(c), [fn] + list(args), kwargs)
    if type(f).__name__ == "partial" and isinstance(f, __import__("functools").partial):
        # read through the partial's own source: another partial object of the same type
        # (a new one per call) must not reuse this one's function and arguments
        from .sources import AttrSource
        src = fn.source
        inner = tr.wrap(f.func, AttrSource(src, "func") if src else None)
        pa = tr.wrap(f.args, AttrSource(src, "args") if src else None)
        pk = tr.wrap(f.keywords, AttrSource(src, "keywords") if src else None)
        return call(tr, inner, tr.iterate(pa) + list(args),
                    {**(pk.items if isinstance(pk, DictV) else {}), **kwargs})
    raise tr.unsupported(f"call to {type(f).__name__} {getattr(f, '__qualname__', f)!r:.80}")


_SIGNATURES: dict = {}


def _check_arguments(f, args, kwargs) -> None:
    """A C builtin called with arguments it does not take raises TypeError, in the trace too
    (isinstance(x, T, invalid=True)); builtins without a signature (min, getattr) are not checked."""
    sig = _SIGNATURES.get(f, _SIGNATURES)
    if sig is _SIGNATURES:
        import inspect
        try:
            sig = inspect.signature(f)
        except (TypeError, ValueError):
            sig = None
        _SIGNATURES[f] = sig
    if sig is not None:
        try:
            sig.bind(*args, **kwargs)
        except TypeError as e:
            from .interpreter import TracedRaise
            raise TracedRaise(TypeError(f"{f.__name__}(): {e}")) from None


def _is_function_apply(f) -> bool:
    """`MyFn.apply`: the classmethod of a user torch.autograd.Function subclass."""
    owner = getattr(f, "__self__", None)
    return getattr(f, "__name__", None) == "apply" and isinstance(owner, type) and \
        issubclass(owner, torch.autograd.Function) and owner is not torch.autograd.Function


_OP_TYPES = (torch._ops.OpOverload, torch._ops.OpOverloadPacket)


def call_op(tr, op, args, kwargs) -> V:
    """`torch.ops.ns.op(...)` or a `torch.library.custom_op` object: one node, its value from the
    op's fake/meta kernel; aot traces it the same way and the kernel backend calls it as an extern."""
    name = getattr(op, "_name", None) or str(op)
    ovl = op if isinstance(op, torch._ops.OpOverload) else None
    schemas = [ovl._schema] if ovl is not None else \
        [s for s in (getattr(op, o)._schema for o in op.overloads())   # out= picked by kw
         if not any(a.is_out for a in s.arguments)]
    # an op that writes only its first argument (aten.sigmoid_, a custom `copy_(dst, src)`) is
    # recorded like a Tensor in-place method; aot functionalizes it
    if any(mutated_args(s)[1:] for s in schemas) or "out" in kwargs:
        raise tr.unsupported(f"op {name} mutates arguments other than its first",
                             hint="such an op called through torch.ops is not functionalized "
                                  "yet; it runs eagerly")
    try:
        return tr.call_graph(op, args, kwargs)
    except Unsupported as e:
        if name.startswith("aten::") or "fake" not in str(e).lower() and \
                "meta" not in str(e).lower():
            raise
        raise tr.unsupported(f"custom op {name} has no fake kernel, so it cannot be traced",
                             hint=f"register one with torch.library.register_fake({name!r}) "
                                  "(or @op.register_fake)") from None


def mutated_args(schema) -> list[int]:
    return [i for i, a in enumerate(schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write]


def _inline_regions(tr) -> bool:
    """Where a graph may not split (fullgraph), a nested_compile_region is inlined."""
    return tr.settings is None or fullgraph(tr.settings)


def _name(f) -> str:
    return type(f).__name__ if isinstance(f, torch.nn.Module) else \
        getattr(f, "__qualname__", repr(f))


def call_torch(tr, f, args, kwargs) -> V:
    name = getattr(f, "__name__", "")
    if f in _GRAD_CTX:
        return ContextV(*_GRAD_CTX[f])
    if f is torch._check and len(args) + len(kwargs) >= 1:
        # the message (often a lambda) is only read when the check fails
        cond = args[0] if args else kwargs.get("cond")
        if isinstance(cond, ObjV):
            value = bool(cond.value) if isinstance(cond.value, torch.SymBool) else cond.value
            if value is True:           # a symbolic condition holds by a size guard
                return ObjV(None)
            raise tr.unsupported("torch._check on a condition that is not True",
                                 hint="it raises eagerly")
        return tr.call_graph(f, [cond], {})
    if not holds(args, TensorV) and not holds(kwargs.values(), TensorV):
        # factory functions go in the graph; metadata queries fold
        return tr.call_graph(f, args, kwargs)
    if name in _TENSOR_BLOCKED:
        raise tr.unsupported(f"torch.{name} needs tensor data")
    if f is torch._native_multi_head_attention:
        return _native_mha(tr, f, args, kwargs)
    return tr.call_graph(f, args, kwargs)


def _native_mha(tr, f, args, kwargs) -> V:
    """nn.MultiheadAttention's fast path (eval, no grad): with need_weights=False eager returns
    (out, None), the weights an undefined tensor, where the meta kernel gives a tensor; the
    traced value is None too, so `w is None` reads as it does eagerly."""
    out = tr.call_graph(f, args, kwargs)
    need = args[10] if len(args) > 10 else kwargs.get("need_weights", ObjV(True))
    if isinstance(out, TupleV) and isinstance(need, ObjV) and need.value is False:
        return TupleV([out.items[0], ObjV(None)])
    return out


def call_module(tr, mv: ObjV, args, kwargs) -> V:
    m = mv.value
    from .hooks import has_backward_hooks, has_hooks, hooked_call, trace_global_hooks, \
        untraceable_hooks
    if isinstance(m, LazyModuleMixin) and hasattr(m, "_initialize_hook"):
        _materialize_lazy(tr, m, args, kwargs)
    if isinstance(m, torch.nn.RNNBase):
        raise tr.unsupported(
            f"a torch.nn.{type(m).__name__} module: recurrent modules run eagerly, as under "
            "Dynamo (allow_rnn=False); traced, the aten op unrolls its time loop into per-step "
            "kernels, whose compile time grows with the sequence (timm's Sequencer: > 7 min)",
            hint="intended: the module runs as eager PyTorch, the code around it is compiled")
    why = untraceable_hooks(m)
    if why is not None:
        raise tr.unsupported(why, hint="that module runs eagerly; forward and full backward "
                                       "hooks are traced")
    glob = trace_global_hooks(tr, [], {})        # guarded: none, or which ones
    hooked = has_hooks(m) or global_hooks_present()
    if mv.source is not None and not hooked:
        tr.guard("NO_HOOKS", mv.source, None)
    from .attrs import load_attr
    fwd = load_attr(tr, mv, "forward")
    if hooked:        # the hook dicts' versions are in the module-state snapshot
        bw = traced_backward_hook(tr, mv) if has_backward_hooks(m) else ObjV(None)
        return call(tr, ObjV(hooked_call), [mv, fwd, TupleV(list(args)), DictV(dict(kwargs)),
                                            *glob.items, bw], {})
    return call(tr, fwd, args, kwargs)


class _ShapesOnly(TorchDispatchMode):
    """Refuses an op that mixes meta and real tensors (`param.copy_(meta_input)` copies
    nothing from an example input and would leave the parameter uninitialized)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        devs = {t.is_meta for t in pytree.tree_leaves((args, kwargs))
                if isinstance(t, torch.Tensor)}
        if len(devs) > 1:
            raise RuntimeError(f"{func} reads an example input's data")
        return func(*args, **kwargs)


def _materialize_lazy(tr, m, args, kwargs) -> None:
    """A lazy module's first call: its parameters are made now, from the shapes of the trace's
    example inputs, by the pre-hook eager runs on that call (`_infer_parameters`: initialize,
    drop the hooks, become `cls_to_become`), as Dynamo does; the frame is then traced again
    (Retrace), seeing the module it became. Only shapes are read: an initializer that reads
    data is Unsupported."""
    def example(v):         # to_meta, keeping namedtuples (an initializer reads their fields)
        if isinstance(v, TupleV) and hasattr(v.cls, "_fields"):
            return v.cls(*(example(i) for i in v.items))
        if isinstance(v, (ListV, TupleV)):
            return type(v.items)(example(i) for i in v.items)
        if isinstance(v, DictV):
            return {k: example(x) for k, x in v.items.items()}
        return tr.to_meta(v)

    margs = tuple(example(a) for a in args)
    mkw = {k: example(x) for k, x in kwargs.items()}
    # a dry run on a copy first (its random draws undone): a failure leaves the module lazy
    memo = {id(t): type(t)(requires_grad=t.requires_grad, device=t.device, dtype=t.dtype)
            if isinstance(t, torch.nn.UninitializedParameter) else
            type(t)(device=t.device, dtype=t.dtype)
            for t in (*m.parameters(), *m.buffers())
            if isinstance(t, torch.nn.parameter.UninitializedTensorMixin)}
    for target in (copy.deepcopy(m, memo), m):
        try:
            with torch.random.fork_rng(devices=[], enabled=target is not m), _ShapesOnly():
                target._infer_parameters(target, margs, mkw)
        except (NotImplementedError, RuntimeError, TypeError, ValueError) as e:
            raise tr.unsupported(f"initializing lazy module {type(m).__name__} from example "
                                 f"shapes failed: {str(e).splitlines()[0] if str(e) else e!r}",
                                 hint="call it once eagerly before compiling") from None
        if any(t.is_meta for t in (*target.parameters(), *target.buffers())):
            raise tr.unsupported(f"lazy module {type(m).__name__} made its parameters from "
                                 "input data", hint="call it once eagerly before compiling")
    from .interpreter import Retrace
    raise Retrace()


def call_class(tr, fn: ObjV, args, kwargs) -> V:
    from .builtins import BUILTINS, fold
    cls = fn.value
    if cls in _GRAD_CTX:
        return ContextV(*_GRAD_CTX[cls])
    if cls is torch.set_grad_enabled:
        mode = args[0] if args else kwargs["mode"]
        if not isinstance(mode, ObjV):
            raise tr.unsupported("set_grad_enabled with a non-constant mode")
        from .handlers.contexts import set_grad
        prev = torch.is_grad_enabled()
        set_grad(tr, bool(mode.value))
        return ContextV("grad_set", (bool(mode.value),), state=prev)
    if cls is torch.inference_mode:
        mode = args[0] if args else kwargs.get("mode", ObjV(True))
        return ContextV("inference", (bool(mode.value),))
    if _AUTOCAST_CLASSES and issubclass(cls, _AUTOCAST_CLASSES):
        return _autocast_ctx(tr, cls, args, kwargs)
    if issubclass(cls, BaseException):
        if _all_const(args):
            return ObjV(cls(*[a.value for a in args]))
        return ObjV(cls("<traced>"))
    if cls is collections.defaultdict:
        from .dictkeys import new_defaultdict
        return new_defaultdict(tr, args, kwargs)
    if cls in (dict, collections.OrderedDict) and not args \
            or (cls in (dict, collections.OrderedDict) or _plain_dict_subclass(cls)) and \
            (not args or not isinstance(args[0], ObjV)):
        from .builtins import BUILTINS as B
        d = B[dict](tr, args, kwargs)
        d.cls = cls
        return d
    if cls.__module__ == "contextlib" and cls.__name__ == "nullcontext":
        return ContextV("null", (args[0] if args else ObjV(None),))
    if cls is torch.autograd.profiler.record_function:
        # a profiler label, as Dynamo treats it: no effect on values; compiled code is not
        # labelled (the frame's own profiler events still are)
        return ContextV("null", (ObjV(None),))
    if issubclass(cls, torch.nn.Module):
        return _new_module(tr, cls, args, kwargs)
    if issubclass(cls, torch.Tensor):
        raise tr.unsupported(f"constructing {cls.__name__} directly")
    if cls in (torch.Size, torch.device, torch.dtype, torch.finfo, torch.iinfo, slice, range) \
            or cls.__module__ in ("builtins",) and _all_const(args) and _all_const(kwargs.values()):
        if _all_const(args) and _all_const(kwargs.values()):
            return fold(tr, cls, args, kwargs)
        if cls is torch.Size:
            return TupleV(tr.iterate(args[0]), cls=torch.Size)
        raise tr.unsupported(f"{cls.__name__}(...) with traced arguments")
    if isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields"):
        # namedtuple
        sig_fields = cls._fields
        vals = list(args)
        defaults = getattr(cls, "_field_defaults", {})
        for name in sig_fields[len(vals):]:
            if name in kwargs:
                vals.append(kwargs[name])
            elif name in defaults:
                vals.append(tr.wrap(defaults[name], None))
            else:
                raise tr.unsupported(f"{cls.__name__}() missing field {name}")
        return TupleV(vals, cls=cls)
    if dataclasses.is_dataclass(cls) and is_model_output(cls):
        kwargs = dict(kwargs)
        names = {f.name for f in dataclasses.fields(cls)}
        for old in ("past_key_values", "cache_params"):
            if old in kwargs and old not in names and "cache" in names:
                kwargs["cache"] = kwargs.pop(old)
        return _new_dataclass(tr, cls, args, kwargs)
    if dataclasses.is_dataclass(cls) and cls.__dict__.get("__init__") is not None and \
            getattr(cls.__init__, "__qualname__", "").endswith("__init__") and \
            _is_generated_init(cls):
        return _new_dataclass(tr, cls, args, kwargs)
    if type(cls) is type(torch.LongTensor) and not cls.is_cuda and len(args) == 1 and \
            not kwargs and (isinstance(args[0], (ListV, TupleV)) or
                            isinstance(args[0], ObjV) and isinstance(args[0].value, (list, tuple))):
        # a legacy typed constructor on data: torch.LongTensor([294]) is torch.tensor(.., int64)
        return call(tr, ObjV(torch.tensor), [args[0]], {"dtype": ObjV(cls.dtype)})
    if cls.__new__ is not object.__new__ and not (isinstance(cls, type) and issubclass(cls, dict)):
        raise tr.unsupported(f"class {cls.__qualname__} with a custom __new__")
    obj = NewObjV(cls, {}, dataclass=False)
    init = cls.__init__
    if init is not object.__init__:
        if not isinstance(init, types.FunctionType):
            raise tr.unsupported(f"class {cls.__qualname__} with a builtin __init__")
        call(tr, ObjV(init), [obj] + list(args), kwargs)
    return obj


_DICT_PROTOCOL = ("__new__", "__init__", "__getitem__", "__setitem__", "__delitem__", "__missing__",
                  "__contains__", "__iter__", "__len__", "__eq__", "get", "keys", "values", "items",
                  "update", "setdefault", "pop", "popitem", "clear", "copy", "__getattr__",
                  "__setattr__", "__getattribute__", "__post_init__")


def _plain_dict_subclass(cls) -> bool:
    """A dict/OrderedDict subclass that adds methods but overrides none of the mapping's own
    (an output container): made in the trace as a dict value of that class."""
    from .attrs import _type_lookup
    return isinstance(cls, type) and issubclass(cls, dict) and \
        all(_type_lookup(cls, n)[1] in (dict, collections.OrderedDict, object, None)
            for n in _DICT_PROTOCOL)


def _new_module(tr, cls, args, kwargs) -> V:
    """A stateless module made in the traced code (HF's `loss_fct = CrossEntropyLoss()`):
    built for real at trace time from constant arguments, so calling it inlines as usual. The
    trace cannot write its attributes (it has no source); residual code that needs it makes a
    new one with the same arguments, as eager does per call."""
    from .builtins import real
    try:     # constants, or tuples of them (HF Canine's ConstantPad1d((beg, end), 0))
        a_real = [real(tr, a) for a in args]
        k_real = {k: real(tr, v) for k, v in kwargs.items()}
    except Unsupported:
        a_real = None
    if not _torch_nn_construction(cls) or a_real is None:
        raise tr.unsupported(f"creating a {cls.__name__} module inside the traced code",
                             hint="only modules whose construction is torch.nn's own, with "
                                  "constant arguments, are built here")
    with torch.random.fork_rng(devices=[]):    # a module with weights would draw from the RNG
        m = cls(*a_real, **k_real)
    if next(m.parameters(), None) is not None or \
            any(b is not None for b in m._buffers.values()) or m._modules:
        raise tr.unsupported(f"creating a {cls.__name__} module with state inside the traced code")
    return NewModuleV(m, args, kwargs)


def _torch_nn_construction(cls) -> bool:
    """Making a `cls` runs torch.nn's code only: a torch.nn class, or a subclass that defines
    neither __init__ nor __new__ (transformers' SiLUActivation, which ACT2FN makes per call)."""
    return all(c.__module__.startswith("torch.nn.") or not {"__init__", "__new__"} & set(vars(c))
               for c in cls.__mro__ if c is not object)


def _is_generated_init(cls) -> bool:
    init = cls.__dict__["__init__"]
    return getattr(init, "__code__", None) is not None and \
        init.__code__.co_filename.startswith("<string>")


def _new_dataclass(tr, cls, args, kwargs) -> NewObjV:
    fields = [f for f in dataclasses.fields(cls) if f.init]
    attrs: dict = {}
    args = list(args)
    for f in fields:
        if args:
            attrs[f.name] = args.pop(0)
        elif f.name in kwargs:
            attrs[f.name] = kwargs.pop(f.name)
        elif f.default is not dataclasses.MISSING:
            attrs[f.name] = tr.wrap(f.default, None) if not is_literal(f.default) else ObjV(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            attrs[f.name] = tr.const_value(f.default_factory())
        else:
            raise tr.unsupported(f"{cls.__name__}() missing field {f.name}")
    if args or kwargs:
        raise tr.unsupported(f"{cls.__name__}() got unexpected arguments")
    obj = NewObjV(cls, attrs, dataclass=True)
    post = getattr(cls, "__post_init__", None)
    if post is not None and not is_model_output(cls):
        call(tr, ObjV(post), [obj], {})
    return obj


def _autocast_ctx(tr, cls, args, kwargs) -> ContextV:
    vals = {}
    import inspect
    if cls is torch.autocast or cls.__name__ == "autocast" and cls.__module__ == "torch.amp.autocast_mode":
        names = ["device_type", "dtype", "enabled", "cache_enabled"]
    else:
        names = ["enabled", "dtype", "cache_enabled"]
        vals["device_type"] = "cuda" if "cuda" in cls.__module__ else "cpu"
    for n, a in zip(names, args):
        vals[n] = a
    vals.update(kwargs)
    for k, v in list(vals.items()):
        if isinstance(v, V):
            if not isinstance(v, ObjV):
                raise tr.unsupported("autocast with traced arguments")
            vals[k] = v.value
    del inspect
    dev = vals.get("device_type", "cpu")
    dtype = vals.get("dtype") or torch.get_autocast_dtype(dev)
    return ContextV("autocast", (dev, dtype, bool(vals.get("enabled", True)),
                                 vals.get("cache_enabled")))


def _tensor_type(tr, t: TensorV, args) -> V:
    """`x.type()`: its legacy type name, for the real device; `x.type(T)` with a name, a
    tensor type or a dtype: `x.to(dtype)` (the same tensor when the type is already T)."""
    if not args:
        name = torch.empty(0, dtype=t.meta.dtype).type()
        if t.device.type != "cpu":
            name = name.replace("torch.", f"torch.{t.device.type}.", 1)
        return ObjV(name)
    want = peek(args[0]) if isinstance(args[0], ObjV) else None
    if isinstance(want, str):
        obj = torch
        for part in want.split(".")[1:] if want.startswith("torch.") else ["?"]:
            obj = getattr(obj, part, None)
        want = obj
    if isinstance(want, torch.dtype):
        dtype, cuda = want, t.device.type == "cuda"
    elif type(want).__name__ == "tensortype":
        dtype, cuda = want.dtype, want.is_cuda
    else:
        raise tr.unsupported(f"Tensor.type({args[0]!r:.40})")
    if cuda != (t.device.type == "cuda") or t.device.type not in ("cpu", "cuda"):
        raise tr.unsupported("Tensor.type() to another device", hint="use x.to(device)")
    return tr.call_graph(torch.Tensor.to, [t, ObjV(dtype)], {})


def _cpu(tr, args, kwargs):
    """`x.cpu()` (or with memory_format=torch.preserve_format) of a tensor on the CPU is `x`
    itself, as eager returns it (`x.cpu() is x`): no graph break. The device is guarded with
    the tensor (a TENSOR guard checks `is_cpu`; an intermediate's device follows from the
    inputs'). Any other `.cpu()` is traced as a call."""
    fmt = kwargs.get("memory_format", ObjV(torch.preserve_format))
    if len(args) == 1 and set(kwargs) <= {"memory_format"} and isinstance(args[0], TensorV) \
            and args[0].device.type == "cpu" and isinstance(fmt, ObjV) and \
            fmt.value is torch.preserve_format:
        return args[0]
    return None


REWRITES[torch.Tensor.cpu] = _cpu


def call_builtin_method(tr, recv: V, name: str, args, kwargs) -> V:
    from .builtins import container_method
    if isinstance(recv, TensorV):
        if name == "register_hook":
            from .hooks import register_tensor_hook
            return register_tensor_hook(tr, recv, args, kwargs)
        if name == "type" and not kwargs and len(args) <= 1:
            return _tensor_type(tr, recv, args)
        if name == "__iter__" and not args and not kwargs:
            return IterV(tr.iterate(recv))      # the rows, as iter(x)
        if name == "numpy" and not args and set(kwargs) <= {"force"}:
            force = kwargs.get("force", ObjV(False))
            return ndarrays.from_tensor(tr, recv, isinstance(force, ObjV) and bool(force.value))
        if name == "requires_grad_" and len(args) + len(kwargs) <= 1:
            from .attrs import set_requires_grad
            flag = (args or list(kwargs.values()) or [ObjV(True)])[0]
            if isinstance(flag, ObjV) and isinstance(flag.value, bool):
                set_requires_grad(tr, recv, flag.value, "Tensor.requires_grad_()")
                return recv
        if name in _TENSOR_BLOCKED and not args and not kwargs and \
                (x := numbers.value_of(tr, recv, name)) is not None:
            return tr.const_value(x)        # a tensor made from numbers (numbers.py)
        if name in _TENSOR_BLOCKED:
            raise tr.unsupported(f"Tensor.{name}() needs tensor data or mutates autograd state",
                                 hint="move it out of the compiled function")
        method = getattr(torch.Tensor, name)
        if method in REWRITES and (out := REWRITES[method](tr, [recv, *args], kwargs)) is not None:
            return out
        return tr.call_graph(method, [recv] + list(args), kwargs)
    if isinstance(recv, NdarrayV):
        return ndarrays.call_method(tr, recv, name, args, kwargs)
    if isinstance(recv, ContextV):
        from .handlers.contexts import context_method
        return context_method(tr, recv, name, args)
    return container_method(tr, recv, name, args, kwargs)


__all__ = ["call", "NULL", "CellV", "IterV", "SuperV"]
