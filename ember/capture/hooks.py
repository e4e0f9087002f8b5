"""Capture, module hooks: a module call with hooks is traced like eager's `nn.Module._call_impl`
runs it.

Consumes a module value with hooks and the call's arguments (calls.call_module, and the root
module's runner in entry.py); produces the traced output. The hook loop is the plain Python
function `hooked_call` below, which the interpreter inlines like user code: each hook (a user
function) is inlined in turn, global hooks first, then the module's, in the order of the hook
dicts, so values, call order and side effects are eager's. The module's hook dicts are module
tables (sources.MODULE_TABLES) whose version tags the module-state snapshot records; the global
dicts (`register_module_forward_hook` & co.) are guarded by `global_hooks` (their keys, or one
cheap "none registered" check), so a hook added or removed after compilation recompiles.
Full backward hooks (and pre-hooks) of a submodule: bwhooks.py, through the `bw_hook` argument.
Not traced (Unsupported: the module runs eagerly, loudly): legacy `register_backward_hook`
hooks and hooks that torch itself registers (FSDP's, parametrizations). The compiled root
module's own backward hooks run eagerly around its compiled forward (root_eager_call). An
always_call hook is an ordinary hook here: when forward raises, the trace raises and the frame
runs eagerly, which runs it as eager does.
`Tensor.register_hook` inside the traced code: register_tensor_hook below.
"""
from __future__ import annotations

import types
import weakref

import torch
from torch.nn.utils.weight_norm import WeightNorm

from .controls import global_hooks_present

_mm = torch.nn.modules.module
_GLOBAL_DICTS = ("_global_forward_pre_hooks", "_global_forward_hooks",
                 "_global_backward_pre_hooks", "_global_backward_hooks")


def has_hooks(m: torch.nn.Module) -> bool:
    return bool(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or
                m._backward_pre_hooks)


def has_backward_hooks(m: torch.nn.Module) -> bool:
    return bool(m._backward_hooks or m._backward_pre_hooks or _mm._global_backward_hooks or
                _mm._global_backward_pre_hooks)


def untraceable_hooks(m: torch.nn.Module) -> str | None:
    """Why `m`'s hooks (its own and the global ones) cannot be traced (they run eagerly), or
    None."""
    if m._get_backward_hooks()[1]:
        return f"{type(m).__name__} has a non-full backward hook (register_backward_hook)"
    for hook in (*m._forward_pre_hooks.values(), *m._forward_hooks.values(),
                 *_mm._global_forward_pre_hooks.values(), *_mm._global_forward_hooks.values()):
        if (getattr(hook, "__module__", None) or "").startswith("torch.") and \
                not isinstance(hook, _TRACED_TORCH_HOOKS):
            # torch's own (FSDP's all-gather/reshard, parametrizations, ModuleTracker)
            return f"{type(m).__name__} has a forward hook from torch ({_qualname(hook)})"
    return None


#: torch's hooks that are traced like a user's: `nn.utils.weight_norm`'s pre-hook only sets
#: the module's weight to a function of its parameters (`_weight_norm(v, g, dim)`), in Python
_TRACED_TORCH_HOOKS = (WeightNorm,)


def _qualname(f) -> str:
    return getattr(f, "__qualname__", None) or type(f).__name__


def root_eager_call(m: torch.nn.Module, forward, args, kwargs):
    """A compiled root module with backward hooks or torch's own forward hooks: `_call_impl`'s
    steps run eagerly around the compiled `forward` (a graph's inputs and outputs are real
    tensors, so BackwardHook wraps them as eager does). None when eager `_call_impl` must run
    (legacy backward hooks)."""
    full, non_full = m._get_backward_hooks()
    if non_full:
        return None
    from torch.utils.hooks import BackwardHook
    pre = m._get_backward_pre_hooks()
    bw = BackwardHook(m, full, pre) if full or pre else None
    return lambda: hooked_call(m, forward, args, kwargs, *global_hooks(), bw)


def global_hooks():
    """(global forward pre-hooks, global forward hooks), each None when empty. In a trace the
    interpreter calls `trace_global_hooks` instead, which guards them."""
    return _mm._global_forward_pre_hooks or None, _mm._global_forward_hooks or None


def trace_global_hooks(tr, args, kwargs):
    """`global_hooks()` in a trace: with none registered, one NO_GLOBAL_HOOKS guard; else the
    four global dicts read through guarded sources (their keys: a hook added or removed
    recompiles; a hook's closure is read per call like a module hook's)."""
    from .sources import GlobalSource
    from .values import ObjV, TupleV
    gid = tr.gid_for(vars(_mm))
    if not global_hooks_present():
        tr.guard("NO_GLOBAL_HOOKS", GlobalSource(gid, _GLOBAL_DICTS[0]), _GLOBAL_DICTS)
        return TupleV([ObjV(None), ObjV(None)])
    vals = [tr.wrap(getattr(_mm, name), GlobalSource(gid, name)) for name in _GLOBAL_DICTS]
    return TupleV([vals[0] if _mm._global_forward_pre_hooks else ObjV(None),
                   vals[1] if _mm._global_forward_hooks else ObjV(None)])


global_hooks._ember_trace = trace_global_hooks


def _forward_kwargs(module, hook_id) -> bool:
    return hook_id in module._forward_hooks_with_kwargs or \
        hook_id in _mm._global_forward_hooks_with_kwargs


def hooked_call(module, forward, args, kwargs, global_pre=None, global_post=None, bw_hook=None):
    """`nn.Module._call_impl`'s hook path (torch 2.x). Traced (the interpreter inlines it) with
    a bwhooks.TracedBackwardHook or None as bw_hook; run eagerly around a compiled forward with
    torch's BackwardHook (root_eager_call)."""
    pre_hooks = module._forward_pre_hooks.items() if global_pre is None else \
        (*global_pre.items(), *module._forward_pre_hooks.items())
    for hook_id, hook in pre_hooks:
        if hook_id in module._forward_pre_hooks_with_kwargs:
            args_kwargs_result = hook(module, args, kwargs)
            if args_kwargs_result is not None:
                if isinstance(args_kwargs_result, tuple) and len(args_kwargs_result) == 2:
                    args, kwargs = args_kwargs_result
                else:
                    raise RuntimeError("forward pre-hook must return None or a tuple of "
                                       f"(new_args, new_kwargs), but got {args_kwargs_result}.")
        else:
            args_result = hook(module, args)
            if args_result is not None:
                if not isinstance(args_result, tuple):
                    args_result = (args_result,)
                args = args_result
    if bw_hook is not None:
        args = bw_hook.setup_input_hook(args)
    result = forward(*args, **kwargs)
    post_hooks = module._forward_hooks.items() if global_post is None else \
        (*global_post.items(), *module._forward_hooks.items())
    for hook_id, hook in post_hooks:
        if _forward_kwargs(module, hook_id):
            hook_result = hook(module, args, kwargs, result)
        else:
            hook_result = hook(module, args, result)
        if hook_result is not None:
            result = hook_result
    if bw_hook is not None:
        result = bw_hook.setup_output_hook(result)
    return result


def root_call(self, *args, **kwargs):
    """What a compiled module with forward hooks (its own or global ones) runs
    (entry.ModuleRunner): the hooks and forward, traced as one frame."""
    global_pre, global_post = global_hooks()
    return hooked_call(self, self.forward, args, kwargs, global_pre, global_post)


def root_call_for(cls: type):
    """`root_call` with a code object of its own per module class: the capture cache is keyed by
    code object, so classes do not share one recompile budget (instances of a class do, as their
    forward does)."""
    code = root_call.__code__
    code = code.replace(co_name=f"{cls.__name__}_with_hooks",
                        co_qualname=f"{cls.__qualname__}.<forward with hooks>")
    return type(root_call)(code, root_call.__globals__, code.co_name)


# ---- Tensor.register_hook inside the traced code ----------------------------------------------
_HOOK_FUNCTIONS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def register_tensor_hook(tr, t, args: list, kwargs: dict):
    """`t.register_hook(hook)` on a tensor the graph computes: from here on `t` is the output of
    an identity autograd.Function whose backward is `return hook(g)` (or g), traced into the joint
    graph like a user Function's (autograd_fn.py) when the hook is free of Python side effects;
    with side effects (a list it appends to, a print), the backward calls the hook per backward
    through an opaque op instead (bwhooks.opaque_tensor_hook).
    Equal to eager only when the hook sees all of t's gradient, so `t` must have no use yet, and
    the returned handle must be discarded (its `remove()` could not be honoured); otherwise, and
    for graph inputs (the hook would stay on the caller's tensor), Unsupported: a graph break,
    where `t` is a real tensor when the hook is registered. With earlier uses of an intermediate
    `t` no break is correct (their gradients reach t's producer inside the first graph's
    backward, not through t), so the whole frame runs eagerly."""
    from .autograd_fn import _check_pure, call_function_apply
    from .bwhooks import opaque_tensor_hook
    from .values import FuncV, ObjV, peek
    hook = args[0] if args else kwargs.get("hook")
    if len(args) + len(kwargs) != 1 or hook is None:
        raise tr.unsupported("Tensor.register_hook with unexpected arguments")
    if t.source is not None or t.node.op == "placeholder":
        raise tr.unsupported("Tensor.register_hook on a graph input",
                             hint="the hook stays on the caller's tensor; it runs eagerly")
    if not t.meta.requires_grad:
        raise tr.unsupported("Tensor.register_hook on a tensor that does not require grad")
    if t.node.users:
        # a graph break is wrong here too: the earlier uses' gradients flow inside the first
        # graph's backward, past the real tensor the hook would be registered on
        err = tr.unsupported("Tensor.register_hook on a tensor already used in the graph",
                             hint="the hook must see the gradient of earlier uses too; the "
                                  "function runs eagerly")
        err.break_at, err.no_break = (), "a break would hide earlier uses' gradients from the hook"
        raise err
    f = tr.frames[-1] if tr.frames else None
    if f is None or f.pc >= len(f.instrs) or f.instrs[f.pc].opname != "POP_TOP":
        raise tr.unsupported("the handle Tensor.register_hook returns is used",
                             hint="only `t.register_hook(fn)` as a statement is traced")
    if isinstance(hook, FuncV) and not hook.closure and not hook.kwdefaults and \
            hook.fn_obj is None and all(isinstance(d, ObjV) for d in hook.defaults):
        # `lambda g, log=log: ...`: defaults are the caller's objects (guarded by their reads)
        fn = types.FunctionType(hook.code, hook.globals, hook.name,
                                tuple(d.value for d in hook.defaults) or None)
    elif isinstance(hook, ObjV) and isinstance(peek(hook), types.FunctionType):
        fn = hook.value          # the graph holds this object: guarded by identity
    else:
        raise tr.unsupported("Tensor.register_hook with a hook that is not a plain function")
    if _check_pure(fn, is_ctx_method=False, depth=0, reads=[]) is None:
        out = call_function_apply(tr, _hook_function(fn).apply, [t], {})
    else:
        out = opaque_tensor_hook(tr, fn, t)
    t.node, t.meta = out.node, out.meta        # every later use of t sees the hooked tensor
    return ObjV(None)


def _hook_function(hook):
    cls = _HOOK_FUNCTIONS.get(hook)
    if cls is None:
        class TensorHook(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.view_as(x)

            @staticmethod
            def backward(ctx, g):
                r = hook(g)
                return g if r is None else r
        TensorHook.__qualname__ = f"register_hook({getattr(hook, '__qualname__', 'hook')})"
        cls = _HOOK_FUNCTIONS[hook] = TensorHook
    return cls
