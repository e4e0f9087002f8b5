"""Capture, module backward hooks: a submodule's full backward hooks (and pre-hooks) traced into
the graph, with the user's hooks run per backward as opaque ops of the backward graph (and the
same for a `Tensor.register_hook` hook with Python side effects: `opaque_tensor_hook`).

Consumes a module call with `register_full_backward_hook` / `register_full_backward_pre_hook`
hooks (its own and the global ones), met while tracing (hooks.hooked_call calls the two
`setup_*_hook` methods of a `TracedBackwardHook` where eager calls torch's BackwardHook's);
produces two identity autograd.Function nodes, as eager's BackwardHook puts two
BackwardHookFunction nodes around the module:
  inputs:  `_HookInputs.apply(site, *tensors) -> (*views, token)` on the module's tensor
           arguments that require grad;
  outputs: `_HookOutputs.apply(site, token, *tensors) -> views` on its outputs.
Their backward (run by aot while it traces the joint graph, or per backward by the "eager"
backend) calls two custom ops, `ember::module_backward_pre_hooks(grad_outputs)` on the output
side and `ember::module_backward_hooks(grad_inputs, grad_outputs)` on the input side. The ops are
opaque in the backward graph: their kernels call the user's hooks with real gradients on every
backward, so call order, counts, values, replaced gradients and Python side effects are eager's.
The output side hands its (pre-hooked) grad_outputs to the input side through the input
Function's ctx, which it finds as `token.grad_fn` (the token is an extra, otherwise unused
output of the input Function: no user op can rebind its grad_fn); the token edge also makes the
input side's backward wait for the output side's, as eager's hook does. In aot's trace that
hand-over is a data edge between the two op nodes; at runtime nothing is shared between calls.

The hooks (and which arguments/outputs are tensors requiring grad) are fixed when traced: the
module's hook dicts are module tables whose version the module-state snapshot checks, and the
global dicts are guarded (hooks.global_hooks), so adding or removing a hook recompiles.
Differences from eager, by design: a hook sees a gradient that is None at trace time as None,
and returning a tensor in its place is refused (RuntimeError) rather than honoured; a hook
returning None for a gradient that exists passes zeros on.
"""
from __future__ import annotations

import itertools
import warnings
import weakref
from typing import Optional

import torch

from .autograd_fn import apply_node_target
from .values import ObjV, TensorV, TupleV

_SITES: dict[int, "TracedBackwardHook"] = {}
_KEYS = itertools.count()


class TracedBackwardHook:
    """One traced module call's backward hooks (eager makes a BackwardHook per call): the
    hooks, and where the tensors are among the call's arguments and outputs."""

    def __init__(self, module: torch.nn.Module, full: list, pre: list):
        self.module = weakref.ref(module)
        self.full, self.pre = list(full), list(pre)
        self.key = next(_KEYS)
        self.n_inputs = self.n_outputs = 0
        self.input_idx: list | None = None       # positions of hooked arguments (None: none)
        self.output_idx: list | None = None
        self.token = None
        _SITES[self.key] = self
        weakref.finalize(module, _SITES.pop, self.key, None)

    # -- capture (the interpreter calls these for hooks.hooked_call's bw_hook.setup_*_hook) --
    def setup_input_hook(self, args):
        raise AssertionError("traced only")       # what runs is _trace_setup_input

    def setup_output_hook(self, result):
        raise AssertionError("traced only")

    # -- runtime: the kernels of the two ops ---------------------------------------------------
    def run_pre_hooks(self, grad_outputs: list) -> tuple:
        """The output side: pre-hooks may replace grad_outputs; with no hooked input, the full
        hooks run here with grad_input all None (BackwardHook's special case)."""
        module = self.module()
        go = _chain(self.pre, lambda hook, g: hook(module, g), tuple(grad_outputs),
                    "pre hook returned an invalid number of grad_output")
        if self.input_idx is None and self.full:
            warnings.warn("Full backward hook is firing when gradients are computed with respect "
                          "to module outputs since no inputs require gradients.", stacklevel=2)
            gi = (None,) * self.n_inputs
            for hook in self.full:
                r = hook(module, gi, go)
                if r is not None and not all(x is None for x in r):
                    raise RuntimeError("Backward hook for Modules where no input requires gradient "
                                       "should always return None or None for all gradients.")
        return go

    def run_full_hooks(self, grad_inputs: list, grad_outputs: list) -> tuple:
        module, go = self.module(), tuple(grad_outputs)
        return _chain(self.full, lambda hook, g: hook(module, g, go), tuple(grad_inputs),
                      "hook returned an invalid number of grad_input")


def _chain(hooks, call, grads: tuple, what: str) -> tuple:
    """BackwardHook's rule: each hook in turn; a result other than None replaces `grads`."""
    for hook in hooks:
        r = call(hook, grads)
        if r is None:
            continue
        if len(r) != len(grads):
            raise RuntimeError(f"Backward {what}, got {len(r)}, but expected {len(grads)}")
        grads = tuple(r)
    return grads


def _defined(new: tuple, old: list) -> list:
    """The op's result: `new` at the positions where `old` holds a gradient, as fresh tensors
    (an op's outputs must not alias its inputs)."""
    out = []
    for n, o in zip(new, old):
        if o is None:
            if n is not None:
                raise RuntimeError("ember: a module backward hook returned a gradient where it "
                                   "was given None, which the compiled graph cannot pass on")
            continue
        if n is None:
            n = torch.zeros_like(o)
        elif n.shape != o.shape or n.dtype != o.dtype or n.device != o.device:
            raise RuntimeError(f"module backward hook returned a gradient of shape "
                               f"{tuple(n.shape)}, {n.dtype} where {tuple(o.shape)}, {o.dtype} "
                               "is expected")
        elif any(n.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
                 for x in old if x is not None):
            n = n.clone()
        out.append(n)
    return out


@torch.library.custom_op("ember::module_backward_pre_hooks", mutates_args=())
def _pre_hooks_op(grad_outputs: list[Optional[torch.Tensor]], site: int) -> list[torch.Tensor]:
    return _defined(_SITES[site].run_pre_hooks(grad_outputs), grad_outputs)


@_pre_hooks_op.register_fake
def _(grad_outputs, site):
    return [torch.empty_like(g) for g in grad_outputs if g is not None]


@torch.library.custom_op("ember::module_backward_hooks", mutates_args=())
def _full_hooks_op(grad_inputs: list[Optional[torch.Tensor]],
                   grad_outputs: list[Optional[torch.Tensor]], site: int) -> list[torch.Tensor]:
    return _defined(_SITES[site].run_full_hooks(grad_inputs, grad_outputs), grad_inputs)


@_full_hooks_op.register_fake
def _(grad_inputs, grad_outputs, site):
    return [torch.empty_like(g) for g in grad_inputs if g is not None]


# ---- Tensor.register_hook with a hook that has Python side effects (hooks.register_tensor_hook)
_TENSOR_HOOKS: dict[int, object] = {}


@torch.library.custom_op("ember::tensor_hook", mutates_args=())
def _tensor_hook_op(grad: torch.Tensor, key: int) -> torch.Tensor:
    r = _TENSOR_HOOKS[key](grad)
    return grad.clone() if r is None else _defined((r,), [grad])[0]


@_tensor_hook_op.register_fake
def _(grad, key):
    return torch.empty_like(grad)


class _TensorHook(torch.autograd.Function):
    @staticmethod
    def forward(ctx, key, x):
        ctx.key = key
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return None, torch.ops.ember.tensor_hook(g, ctx.key)


def opaque_tensor_hook(tr, hook, t: TensorV) -> TensorV:
    """`t` through an identity Function whose backward runs `hook` per backward, as an opaque
    op of the backward graph (the hook's side effects happen then, as eager's)."""
    key = next(_KEYS)
    _TENSOR_HOOKS[key] = hook
    return tr.call_graph(apply_node_target(_TensorHook), [ObjV(key), t], {})


def _pack(idx: list, values, n: int) -> list:
    res = [None] * n
    for i, v in zip(idx, values):
        res[i] = v
    return res


def _refill(old, new: list) -> list:
    """`old` (some None) with its defined entries replaced, in order, by `new`."""
    it = iter(new)
    return [None if o is None else next(it) for o in old]


class _HookInputs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, site, *tensors):
        ctx.set_materialize_grads(False)
        ctx.site = site
        return (*(t.view_as(t) for t in tensors), tensors[0].new_empty(0))

    @staticmethod
    def backward(ctx, *grads):
        grads = list(grads[:-1])
        go = getattr(ctx, "grad_outputs", None)     # set by _HookOutputs.backward
        if go is None:      # the gradient did not pass through the module's outputs (as eager)
            return (None, *grads)
        ctx.grad_outputs = None
        s = _SITES[ctx.site]
        gi = _pack(s.input_idx, grads, s.n_inputs)
        new = torch.ops.ember.module_backward_hooks(gi, go, ctx.site)
        return (None, *(_refill(gi, new)[i] for i in s.input_idx))


class _HookOutputs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, site, token, *tensors):
        ctx.set_materialize_grads(False)
        ctx.site = site
        ctx.inputs_ctx = token.grad_fn if token is not None else None
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        s = _SITES[ctx.site]
        go = _pack(s.output_idx, grads, s.n_outputs)
        if s.pre or s.input_idx is None and s.full:
            go = _refill(go, torch.ops.ember.module_backward_pre_hooks(go, ctx.site))
        if ctx.inputs_ctx is not None:
            ctx.inputs_ctx.grad_outputs = go
        return (None, None, *(go[i] for i in s.output_idx))


def _hooked_positions(items) -> list | None:
    """BackwardHook._apply_on_tensors' test: the tensor arguments that require grad, when grad
    mode is on; None when there are none."""
    idx = [i for i, v in enumerate(items) if isinstance(v, TensorV) and v.meta.requires_grad]
    return idx if idx and torch.is_grad_enabled() else None


def _trace_setup_input(tr, args, kwargs):
    site, items = args[0].value, tr.iterate(args[1])
    site.n_inputs = len(items)
    site.input_idx = idx = _hooked_positions(items)
    if idx is None or not site.full:     # pre-hooks alone need nothing on the input side
        return args[1]
    out = tr.iterate(tr.call_graph(apply_node_target(_HookInputs),
                                   [ObjV(site.key), *(items[i] for i in idx)], {}))
    site.token = out[-1]
    new = list(items)
    for i, o in zip(idx, out):
        new[i] = o
    return TupleV(new)


def _trace_setup_output(tr, args, kwargs):
    site, result = args[0].value, args[1]
    if isinstance(result, TensorV):
        items = [result]
    elif isinstance(result, TupleV) and result.cls is tuple:
        items = list(result.items)
    elif isinstance(result, TupleV):
        raise tr.unsupported(f"a module with backward hooks returned a {result.cls.__name__}")
    else:       # eager hooks no output then, so its hooks never run (and it warns)
        warnings.warn("For backward hooks to be called, module output should be a Tensor or a "
                      f"tuple of Tensors but received {result.python_type()}", stacklevel=2)
        return result
    idx = _hooked_positions(items)
    if idx is None:
        return result
    site.n_outputs, site.output_idx = len(items), idx
    token = site.token if site.token is not None else ObjV(None)
    out = tr.iterate(tr.call_graph(apply_node_target(_HookOutputs),
                                   [ObjV(site.key), token, *(items[i] for i in idx)], {}))
    new = list(items)
    for i, o in zip(idx, out):
        new[i] = o
    return new[0] if isinstance(result, TensorV) else TupleV(new)


TracedBackwardHook.setup_input_hook._ember_trace = _trace_setup_input
TracedBackwardHook.setup_output_hook._ember_trace = _trace_setup_output


def traced_backward_hook(tr, mv: ObjV):
    """The bw_hook value hooks.hooked_call gets for module `mv` in a trace, or ObjV(None)."""
    from .attrs import load_attr
    m = mv.value
    for name in ("_backward_hooks", "_backward_pre_hooks", "_is_full_backward_hook"):
        load_attr(tr, mv, name)       # guards the keys of the hook dicts (the global ones: hooks.py)
    full, non_full = m._get_backward_hooks()
    pre = m._get_backward_pre_hooks()
    if non_full:
        raise tr.unsupported(f"{type(m).__name__} has a non-full backward hook "
                             "(register_backward_hook)", hint="that module runs eagerly; "
                             "register_full_backward_hook is traced")
    return ObjV(TracedBackwardHook(m, full, pre) if full or pre else None)
