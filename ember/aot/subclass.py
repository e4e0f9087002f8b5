"""Stage aot, tensor subclasses at the graph boundary.

Consumes a torch-level graph whose inputs include traceable wrapper subclasses (the
`__tensor_flatten__` / `__tensor_unflatten__` protocol; capture/subclasses.py guards their type
and flatten metadata). Produces a program over plain tensors: each subclass input is flattened
into its inner tensors (recursively), the traced function rebuilds it with `__tensor_unflatten__`
around the tracer's meta tensors, so the subclass's own `__torch_function__` /
`__torch_dispatch__` run under the tracer and the graph holds the aten ops they call on the inner
tensors. Subclass outputs are flattened the same way and rebuilt at run time (`SubclassRuntime`).

Gradients: a subclass's autograd lives on the outer tensor (its inner ops run below autograd),
so the boundary is crossed by two autograd.Functions, used alike when tracing and at run time:
`Unflatten` (inner tensors -> subclass; backward flattens the subclass gradient) and `Flatten`
(subclass -> inner tensors; backward rebuilds the subclass gradient). A subclass input that
requires grad is traced with its floating inner tensors requiring grad, the joint graph gives
their gradients, and at run time `Flatten` hands them back to the real subclass as one subclass
gradient. Its gradient must flatten like the input (same attributes, as torch.compile assumes
too); anything else raises, naming the class.
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

    @property
    def n(self) -> int:
        """How many plain tensors it flattens into."""
        return sum(1 if lay is None else lay.n for lay in self.inner)

    def flatten(self, t, out: list) -> None:
        for a, lay in zip(self.attrs, self.inner):
            x = getattr(t, a)
            out.append(x) if lay is None else lay.flatten(x, out)

    def unflatten(self, it):
        inner = {a: next(it) if lay is None else lay.unflatten(it)
                 for a, lay in zip(self.attrs, self.inner)}
        return self.cls.__tensor_unflatten__(inner, self.ctx, self.size, self.stride)


def _differentiable(t) -> bool:
    return t.dtype.is_floating_point or t.dtype.is_complex


class Unflatten(torch.autograd.Function):
    """(layout, *inner tensors) -> the subclass; backward: the subclass gradient's inners."""

    @staticmethod
    def forward(ctx, layout, *inner):
        ctx.layout = layout
        return layout.unflatten(iter(inner))

    @staticmethod
    def backward(ctx, grad):
        return (None, *_flat_grad(ctx.layout, grad))


class Flatten(torch.autograd.Function):
    """(layout, subclass) -> its inner tensors; backward: the inner gradients as one subclass."""

    @staticmethod
    def forward(ctx, layout, t):
        ctx.layout = layout
        out: list = []
        layout.flatten(t, out)
        # aliases: autograd marks a Function's outputs, which must not be the subclass's own
        # inner tensors (that would make a parameter's inner tensor require grad)
        out = [o.view_as(o) for o in out]
        ctx.like = [(o.shape, o.dtype, o.device) for o in out]
        ctx.mark_non_differentiable(*[o for o in out if not _differentiable(o)])
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads):
        grads = [torch.zeros(s, dtype=d, device=dev) if g is None else g
                 for g, (s, d, dev) in zip(grads, ctx.like)]
        return None, ctx.layout.unflatten(iter(grads))


class PlainGrad(torch.autograd.Function):
    """Identity on a plain input that requires grad; refuses a subclass gradient for it (a
    plain input's gradient is a plain graph output)."""

    @staticmethod
    def forward(ctx, t):
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):
        if is_subclass(grad):
            raise Unsupported(f"ember.aot: the gradient of a plain input is a "
                              f"{type(grad).__name__} (a tensor subclass)")
        return grad


def _flat_grad(layout: Layout, grad) -> list:
    if grad is None:
        return [None] * layout.n
    lay = Layout.of(grad)
    if lay is None or lay.cls is not layout.cls or lay.attrs != layout.attrs or lay.n != layout.n:
        raise Unsupported(f"ember.aot: the gradient of a {layout.cls.__name__} is a "
                          f"{type(grad).__name__} that does not flatten like it")
    out: list = []
    lay.flatten(grad, out)
    return out


def _flatten_diff(values, layouts) -> list:
    """Flatten, through `Flatten` where a subclass requires grad (its inners then carry it)."""
    out: list = []
    for v, lay in zip(values, layouts):
        if lay is None:
            out.append(v)
        elif v.requires_grad and torch.is_grad_enabled():
            out.extend(Flatten.apply(lay, v))
        else:
            lay.flatten(v, out)
    return out


def _unflatten_diff(flat, layouts, check_plain: bool = False) -> list:
    """Unflatten, through `Unflatten` where an inner tensor requires grad (and through
    `PlainGrad` for plain inputs that require grad, with `check_plain`)."""
    out, i = [], 0
    for lay in layouts:
        if lay is None:
            t = flat[i]
            grad = isinstance(t, torch.Tensor) and t.requires_grad and torch.is_grad_enabled()
            out.append(PlainGrad.apply(t) if grad and check_plain else t)
            i += 1
            continue
        inner = flat[i:i + lay.n]
        i += lay.n
        if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                           for t in inner):
            out.append(Unflatten.apply(lay, *inner))
        else:
            out.append(lay.unflatten(iter(inner)))
    return out


class Desugared:
    """`gm` as a function of plain tensors: `fn(*flat_inputs) -> flat outputs`. Tracing it fills
    `out_layouts` and `treespec` (the structure of gm's own outputs)."""

    def __init__(self, gm, in_layouts: list):
        self.gm, self.in_layouts = gm, in_layouts
        self.out_layouts: list = []
        self.treespec = None

    def __call__(self, *flat):
        args = _unflatten_diff(flat, self.in_layouts, check_plain=True)
        outs, self.treespec = tree_flatten(self.gm.forward(*args))
        self.out_layouts = [Layout.of(o) for o in outs]
        return tuple(_flatten_diff(outs, self.out_layouts))


class SubclassRuntime:
    """Flattens subclass arguments, runs the plain-tensor program, rebuilds subclass outputs."""

    def __init__(self, inner, prog: Desugared):
        self.inner, self.prog = inner, prog

    def __call__(self, *args):
        flat = self.inner(*_flatten_diff(args, self.prog.in_layouts))
        if not isinstance(flat, (tuple, list)):
            flat = (flat,)
        outs = _unflatten_diff(list(flat), self.prog.out_layouts)
        return tree_unflatten(outs, self.prog.treespec)


def desugar(gm, example_inputs):
    """(Desugared program, flat example inputs), or None when no input is a subclass. The
    floating inner tensors of a subclass that requires grad are examples that require grad."""
    layouts = [Layout.of(x) for x in example_inputs]
    if all(lay is None for lay in layouts):
        return None
    flat: list = []
    for x, lay in zip(example_inputs, layouts):
        if lay is None:
            flat.append(x)
            continue
        inner: list = []
        lay.flatten(x, inner)
        if x.requires_grad and torch.is_grad_enabled():
            inner = [t.detach().requires_grad_(_differentiable(t)) for t in inner]
        flat.extend(inner)
    return Desugared(gm, layouts), flat
