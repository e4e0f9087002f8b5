"""Stage aot, tensor subclasses at the graph boundary.

Consumes a torch-level graph whose inputs include traceable wrapper subclasses (the
`__tensor_flatten__` / `__tensor_unflatten__` protocol; capture/subclasses.py guards their type
and flatten metadata). Produces a program over plain tensors: each subclass input is flattened
into its inner tensors (recursively), the traced function rebuilds it with `__tensor_unflatten__`
around the tracer's meta tensors, so the subclass's own `__torch_function__` /
`__torch_dispatch__` run under the tracer and the graph holds the aten ops they call on the inner
tensors. Subclass outputs are flattened the same way and rebuilt at run time (`SubclassRuntime`).

Gradients flow through plain inputs (activations, LoRA weights beside a frozen quantized one); a
subclass input or output that requires grad is refused (Unsupported: the graph runs eagerly):
its gradient would need a subclass tangent, which is not built here.
"""
from __future__ import annotations

import dataclasses

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..errors import Unsupported

PLAIN = (torch.Tensor, torch.nn.Parameter)


def is_subclass(x) -> bool:
    return isinstance(x, torch.Tensor) and type(x) not in PLAIN and \
        is_traceable_wrapper_subclass(x)


@dataclasses.dataclass(frozen=True)
class Layout:
    """How one subclass tensor flattens: its class, context, outer geometry and, per inner
    attribute, None (a plain tensor) or the inner subclass's own Layout."""
    cls: type
    ctx: object
    attrs: tuple
    inner: tuple
    size: tuple
    stride: tuple

    @staticmethod
    def of(t: torch.Tensor) -> "Layout | None":
        if not is_subclass(t):
            return None
        attrs, ctx = t.__tensor_flatten__()
        return Layout(type(t), ctx, tuple(attrs), tuple(Layout.of(getattr(t, a)) for a in attrs),
                      tuple(t.shape), tuple(t.stride()))

    def flatten(self, t, out: list) -> None:
        for a, lay in zip(self.attrs, self.inner):
            x = getattr(t, a)
            out.append(x) if lay is None else lay.flatten(x, out)

    def unflatten(self, it):
        inner = {a: next(it) if lay is None else lay.unflatten(it)
                 for a, lay in zip(self.attrs, self.inner)}
        return self.cls.__tensor_unflatten__(inner, self.ctx, self.size, self.stride)


def flatten_all(values, layouts) -> list:
    out: list = []
    for v, lay in zip(values, layouts):
        out.append(v) if lay is None else lay.flatten(v, out)
    return out


def unflatten_all(flat, layouts) -> list:
    it = iter(flat)
    return [next(it) if lay is None else lay.unflatten(it) for lay in layouts]


class Desugared:
    """`gm` as a function of plain tensors: `fn(*flat_inputs) -> flat outputs`. Tracing it fills
    `out_layouts` and `treespec` (the structure of gm's own outputs)."""

    def __init__(self, gm, in_layouts: list):
        self.gm, self.in_layouts = gm, in_layouts
        self.out_layouts: list = []
        self.treespec = None

    def __call__(self, *flat):
        args = unflatten_all(flat, self.in_layouts)
        grad = torch.is_grad_enabled()
        outs, self.treespec = tree_flatten(self.gm(*args))
        self.out_layouts = [Layout.of(o) for o in outs]
        if grad and any(lay is not None and o.requires_grad
                        for o, lay in zip(outs, self.out_layouts)):
            raise Unsupported("ember.aot: a tensor-subclass output that requires grad")
        return tuple(flatten_all(outs, self.out_layouts))


class SubclassRuntime:
    """Flattens subclass arguments, runs the plain-tensor program, rebuilds subclass outputs."""

    def __init__(self, inner, prog: Desugared):
        self.inner, self.prog = inner, prog

    def __call__(self, *args):
        flat = self.inner(*flatten_all(args, self.prog.in_layouts))
        if not isinstance(flat, (tuple, list)):
            flat = (flat,)
        return tree_unflatten(unflatten_all(flat, self.prog.out_layouts), self.prog.treespec)


def desugar(gm, example_inputs):
    """(Desugared program, flat example inputs), or None when no input is a subclass."""
    layouts = [Layout.of(x) for x in example_inputs]
    if all(lay is None for lay in layouts):
        return None
    if torch.is_grad_enabled() and any(lay is not None and x.requires_grad
                                       for x, lay in zip(example_inputs, layouts)):
        # its inner tensors carry no autograd history: compiled, its gradient would be lost
        raise Unsupported("ember.aot: a tensor-subclass input that requires grad (its "
                          "gradient would be a subclass tangent, not built)")
    return Desugared(gm, layouts), flatten_all(example_inputs, layouts)
