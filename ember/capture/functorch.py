"""Capture, torch.func: what compiled code does with functorch's transforms.

torch.func's transforms (vmap, grad, vjp, jacrev, functional_call, ...) are not traced: a call to
one, or to a function one returned, is a graph break with one warning (calls.call_obj), and such
functions are never compiled as frames of their own (breaks.dispatch) nor guarded by identity
(a new wrapper per `torch.func.grad(f)` call; interpreter.wrap guards its code instead). A compiled
frame called under a transform (its arguments are BatchedTensors or grad-tracking wrappers, which
no kernel can read) runs eagerly: the GLOBAL_STATE guard records whether a transform is active
(guards.global_state), and entry.Runner.miss runs such a call eagerly, warning once.
"""
from __future__ import annotations


def is_functorch(f) -> bool:
    """torch.func's transforms and the functions they return: inlining them would run
    functorch's interpreter stack at trace time."""
    mod = getattr(f, "__module__", None) or ""
    code = getattr(f, "__code__", None)
    return mod == "torch.func" or mod.startswith("torch._functorch") or \
        code is not None and "/torch/_functorch/" in code.co_filename.replace("\\", "/")
