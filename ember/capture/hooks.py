"""Capture, module hooks: a module call with forward pre/post hooks is traced like eager's
`nn.Module._call_impl` runs it.

Consumes a module value with hooks and the call's arguments (calls.call_module, and the root
module's runner in entry.py); produces the traced output. The hook loop is the plain Python
function `hooked_call` below, which the interpreter inlines like user code: each hook (a user
function) is inlined in turn, in the order of the module's hook dicts, so values, call order and
side effects are eager's. The hook dicts are module tables (sources.MODULE_TABLES) whose version
tags the module-state snapshot records, so a hook added or removed after compilation is seen.
Not traced (Unsupported: the module runs eagerly, loudly): backward hooks
(register_full_backward_hook and its pre form) and global hooks (`register_module_forward_hook`,
checked by the callers). An always_call hook is an ordinary hook here: when forward raises, the
trace raises and the frame runs eagerly, which runs it as eager does.
"""
from __future__ import annotations

import torch

_mm = torch.nn.modules.module


def global_hooks_present() -> bool:
    return bool(_mm._global_forward_hooks or _mm._global_forward_pre_hooks or
                _mm._global_backward_hooks or _mm._global_backward_pre_hooks or
                getattr(_mm, "_global_forward_hooks_always_called", None))


def has_hooks(m: torch.nn.Module) -> bool:
    return bool(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or
                m._backward_pre_hooks)


def untraceable_hooks(m: torch.nn.Module) -> str | None:
    """Why `m`'s hooks cannot be traced (they run eagerly), or None."""
    if m._backward_hooks or m._backward_pre_hooks:
        return f"{type(m).__name__} has backward hooks (not traced yet)"
    return None


def root_eager_call(m: torch.nn.Module, forward, args, kwargs):
    """A compiled root module with full backward hooks: `_call_impl`'s steps run eagerly around
    the compiled `forward` (a graph's inputs and outputs are real tensors, so BackwardHook wraps
    them as eager does). None when eager `_call_impl` must run (legacy or global hooks)."""
    full, non_full = m._get_backward_hooks()
    if non_full or global_hooks_present():
        return None
    from torch.utils.hooks import BackwardHook
    pre = m._get_backward_pre_hooks()
    return lambda: hooked_call(m, forward, args, kwargs, BackwardHook(m, full, pre))


def hooked_call(module, forward, args, kwargs, bw_hook=None):
    """`nn.Module._call_impl`'s hook path (torch 2.x). Traced (the interpreter inlines it) with
    bw_hook None; run eagerly around a compiled forward with a BackwardHook (root_eager_call)."""
    for hook_id, hook in module._forward_pre_hooks.items():
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
    for hook_id, hook in module._forward_hooks.items():
        if hook_id in module._forward_hooks_with_kwargs:
            hook_result = hook(module, args, kwargs, result)
        else:
            hook_result = hook(module, args, result)
        if hook_result is not None:
            result = hook_result
    if bw_hook is not None:
        result = bw_hook.setup_output_hook(result)
    return result


def root_call(self, *args, **kwargs):
    """What a compiled module with forward hooks runs (entry.ModuleRunner): its hooks and forward,
    traced as one frame."""
    return hooked_call(self, self.forward, args, kwargs)


def root_call_for(cls: type):
    """`root_call` with a code object of its own per module class: the capture cache is keyed by
    code object, so classes do not share one recompile budget (instances of a class do, as their
    forward does)."""
    code = root_call.__code__
    code = code.replace(co_name=f"{cls.__name__}_with_hooks",
                        co_qualname=f"{cls.__qualname__}.<forward with hooks>")
    return type(root_call)(code, root_call.__globals__, code.co_name)
