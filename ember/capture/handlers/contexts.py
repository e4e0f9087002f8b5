"""Handlers: with-statements over the context managers the tracer understands.

Grad mode (no_grad / enable_grad / set_grad_enabled), inference_mode and autocast are entered
for real during the trace (so meta execution and `torch.is_grad_enabled()` see them) and recorded
in the graph as calls (`torch._C._set_grad_enabled`, `_enter_autocast`/`_exit_autocast`, ...).
Objects with Python `__enter__`/`__exit__` are inlined.
"""
from __future__ import annotations

import types

import torch

from ..values import BuiltinMethodV, ContextV, NewObjV, ObjV
from . import handler


def _node(tr, fn, args):
    n = tr.graph.call_function(fn, args)
    n.meta["example_value"] = None
    return n


def set_grad(tr, mode: bool):
    _node(tr, torch._C._set_grad_enabled, (mode,))
    torch._C._set_grad_enabled(mode)


def context_method(tr, ctx: ContextV, name: str, args):
    k = ctx.ctx_kind
    if name == "__enter__":
        if k == "grad":
            ctx.state = torch.is_grad_enabled()
            set_grad(tr, ctx.args[0])
        elif k == "inference":
            node = _node(tr, torch.autograd.grad_mode._enter_inference_mode, (ctx.args[0],))
            real = torch.inference_mode(ctx.args[0])
            real.__enter__()
            tr.real_contexts.append(real)
            ctx.state = (node, real)
        elif k == "autocast":
            node = _node(tr, torch.amp.autocast_mode._enter_autocast, ctx.args)
            dev, dtype, enabled, cache = ctx.args
            real = torch.autocast(dev, dtype=dtype, enabled=enabled)
            real.__enter__()
            tr.real_contexts.append(real)
            ctx.state = (node, real, dict(tr.autocast))
            if enabled:
                tr.autocast[dev] = dtype
            else:
                tr.autocast.pop(dev, None)
        elif k == "null":
            return ctx.args[0]
        return ObjV(None)
    if name == "__exit__":
        if k == "grad" or k == "grad_set":
            set_grad(tr, ctx.state)
        elif k == "inference":
            node, real = ctx.state
            _node(tr, torch.autograd.grad_mode._exit_inference_mode, (node,))
            real.__exit__(None, None, None)
            tr.real_contexts.remove(real)
        elif k == "autocast":
            node, real, prev = ctx.state
            _node(tr, torch.amp.autocast_mode._exit_autocast, (node,))
            real.__exit__(None, None, None)
            tr.real_contexts.remove(real)
            tr.autocast = prev
        return ObjV(None)
    if name == "clone":
        return ContextV(ctx.ctx_kind, ctx.args)
    raise tr.unsupported(f"context manager method {name}")


@handler("BEFORE_WITH")
def before_with(tr, f, ins):
    ctx = f.pop()
    if isinstance(ctx, ContextV):
        f.push(BuiltinMethodV(ctx, "__exit__"))
        f.push(context_method(tr, ctx, "__enter__", []))
        return
    cls = ctx.cls if isinstance(ctx, NewObjV) else type(ctx.value) if isinstance(ctx, ObjV) else None
    enter = getattr(cls, "__enter__", None)
    exit_ = getattr(cls, "__exit__", None)
    if isinstance(enter, types.FunctionType) and isinstance(exit_, types.FunctionType):
        from ..values import MethodV
        f.push(MethodV(ObjV(exit_), ctx))
        f.push(tr.call(ObjV(enter), [ctx], {}))
        return
    raise tr.unsupported(f"with-statement over {getattr(cls, '__qualname__', cls)}",
                         hint="supported: no_grad, enable_grad, set_grad_enabled, inference_mode, "
                              "autocast, nullcontext and Python context managers")
