"""Stage aot, functionalization tables: how a mutating aten op becomes a functional one, and how a
new value written through a view is scattered back into the view's base.

Consumes: OpOverloads as the tracer (tracer.py) sees them. Produces: nothing by itself; the tracer
looks ops up here by key:
  - `functional_variant(op)` → the out-of-place OpOverload (`add_.Tensor` → `add.Tensor`,
    `bernoulli_.float` → `bernoulli.p`, `_native_batch_norm_legit` → `..._functional`) and which
    of its outputs are the new values of which mutated arguments;
  - `SCATTER[view_op](tracer, base, src, *view_args)` → the new base after writing `src` into
    `view_op(base, *view_args)` (`slice` → `slice_scatter`, `select` → `select_scatter`, ...).
Mutation semantics live in tracer.py; this module holds only per-op rules.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import re

import torch

from ..errors import Unsupported

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class FunctionalForm:
    """`op` (functional) computes what the mutating op computes. `mutated` are the argument names
    written by the original op; the functional op returns `n_orig` original results followed by
    one new value per mutated argument (in-place `foo_` ops: n_orig=0, mutated=("self",))."""

    op: torch._ops.OpOverload
    mutated: tuple[str, ...]
    n_orig: int


def mutated_args(op: torch._ops.OpOverload) -> tuple[str, ...]:
    return tuple(a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write)


def _signature(schema, skip=()) -> tuple:
    return tuple((a.name, str(a.type)) for a in schema.arguments if a.name not in skip)


def _find_overload(packet_name: str, want: tuple):
    packet = getattr(aten, packet_name, None)
    if packet is None:
        return None
    for name in packet.overloads():
        cand = getattr(packet, name)
        if cand._schema.is_mutable:
            continue
        if _signature(cand._schema) == want:
            return cand
    return None


@functools.lru_cache(maxsize=None)
def functional_variant(op: torch._ops.OpOverload) -> FunctionalForm:
    schema = op._schema
    mutated = mutated_args(op)
    base_name = schema.name.split("::")[-1]
    out_args = tuple(a.name for a in schema.arguments if a.is_out)
    if out_args:                                   # foo.out(..., *, out) → foo(...)
        want = _signature(schema, skip=out_args)
        form = _find_overload(base_name, want)
        if form is not None:
            return FunctionalForm(form, out_args, 0)
    elif base_name.endswith("_") and mutated == ("self",):   # foo_(self, ...) → foo(self, ...)
        want = _signature(schema)
        form = _find_overload(base_name[:-1], want)
        if form is not None:
            return FunctionalForm(form, ("self",), 0)
    elif mutated:                                  # foo(Tensor(a!) x, ...) → foo_functional(...)
        form = _find_overload(base_name + "_functional", _signature(schema))
        if form is not None:
            return FunctionalForm(form, mutated, len(schema.returns))
    if mutated and op.namespace != "aten":
        return FunctionalForm(_custom_functional(op), mutated, len(schema.returns))
    raise Unsupported(f"ember.aot: no functional form for the mutating op {op}")


# --- functional forms of mutating custom ops ------------------------------------------------
# A torch.library op that writes its arguments (`mylib::copy_(Tensor(a!) dst, Tensor src)`)
# has no out-of-place twin, so ember defines one, `ember_functional::mylib__copy__default`:
# same arguments without the write annotations; it clones the written tensors, runs the
# original op on the clones and returns its own results followed by the clones (as
# torch.compile's auto_functionalized does). Its one CompositeExplicitAutograd kernel serves
# meta (the tracer's shapes) and real tensors (the kernel backend calls it as an extern).

_FUNCTIONAL_LIB = None


def _custom_functional(op: torch._ops.OpOverload) -> torch._ops.OpOverload:
    global _FUNCTIONAL_LIB
    schema = op._schema
    written = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if any(str(a.type) != "Tensor" for a in written) or \
            any(r.alias_info is not None for r in schema.returns):
        raise Unsupported(f"ember.aot: the mutating op {op} writes a list or optional tensor or "
                          "returns an alias; only plain written Tensor arguments are "
                          "functionalized")
    # the op is looked up by name at each call (a scoped test library redefines it; a new
    # schema under the same name gets a functional form of its own, keyed by the schema's hash)
    short = schema.name.split("::")[-1]
    digest = hashlib.sha1(str(schema).encode()).hexdigest()[:8]
    name = f"{op.namespace}__{short}_{op._overloadname}_{digest}"
    if _FUNCTIONAL_LIB is None:
        _FUNCTIONAL_LIB = torch.library.Library("ember_functional", "FRAGMENT")
    if not hasattr(torch.ops.ember_functional, name):
        text = str(schema)
        args = re.sub(r"Tensor\(\w+!?\)", "Tensor", text[text.index("(") + 1:text.rindex(") -> ")])
        rets = [str(r.type) for r in schema.returns] + ["Tensor"] * len(written)
        _FUNCTIONAL_LIB.define(f"{name}({args}) -> ({', '.join(rets)})")
        _FUNCTIONAL_LIB.impl(name, functools.partial(
            _run_cloned, op.namespace, short, op._overloadname), "CompositeExplicitAutograd")
    return getattr(torch.ops.ember_functional, name).default


def _run_cloned(namespace, name, overload, *args, **kwargs):
    op = getattr(getattr(getattr(torch.ops, namespace), name), overload)
    names = [a.name for a in op._schema.arguments]
    args, kwargs = list(args), dict(kwargs)
    clones = []
    for a in op._schema.arguments:
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        i = names.index(a.name)
        if i < len(args):
            args[i] = args[i].clone()
            clones.append(args[i])
        else:
            kwargs[a.name] = kwargs[a.name].clone()
            clones.append(kwargs[a.name])
    out = op(*args, **kwargs)
    outs = () if out is None else tuple(out) if isinstance(out, (tuple, list)) else (out,)
    results = (*outs, *clones)
    return results[0] if len(results) == 1 else results


# --- scatter rules: write src into view(base) and return the new base -----------------------
# Each rule gets (call, base, src, *view_args, **view_kwargs) where `call(op, *args)` records an
# aten op through the tracer (so decompositions apply) and returns the traced tensor.

def _slice(call, base, src, dim=0, start=None, end=None, step=1):
    return call(aten.slice_scatter.default, base, src, dim, start, end, step)


def _select(call, base, src, dim, index):
    return call(aten.select_scatter.default, base, src, dim, index)


def _diagonal(call, base, src, offset=0, dim1=0, dim2=1):
    return call(aten.diagonal_scatter.default, base, src, offset, dim1, dim2)


def _as_strided(call, base, src, size, stride, storage_offset=None):
    return call(aten.as_strided_scatter.default, base, src, size, stride, storage_offset)


def _reshape_back(call, base, src, *args, **kwargs):
    # pure relabelings of the same elements in row-major order: view the new value back
    if tuple(src.shape) == tuple(base.shape):
        return src
    if not src.is_contiguous():
        src = call(aten.clone.default, src, memory_format=torch.contiguous_format)
    return call(aten.view.default, src, list(base.shape))


def _identity(call, base, src, *args, **kwargs):
    return src


def _transpose(call, base, src, dim0, dim1):
    return call(aten.transpose.int, src, dim0, dim1)


def _t(call, base, src):
    return call(aten.t.default, src) if src.dim() == 2 else src


def _permute(call, base, src, dims):
    inverse = [0] * len(dims)
    for i, d in enumerate(dims):
        inverse[d % len(dims)] = i
    return call(aten.permute.default, src, inverse)


def _split(call, base, src, split_size, dim=0, *, index):
    start = index * split_size
    return call(aten.slice_scatter.default, base, src, dim, start, start + src.shape[dim], 1)


def _split_with_sizes(call, base, src, split_sizes, dim=0, *, index):
    start = sum(split_sizes[:index])
    return call(aten.slice_scatter.default, base, src, dim, start, start + split_sizes[index], 1)


def _unbind(call, base, src, dim=0, *, index):
    return call(aten.select_scatter.default, base, src, dim, index)


SCATTER = {
    aten.slice.Tensor: _slice,
    aten.select.int: _select,
    aten.diagonal.default: _diagonal,
    aten.as_strided.default: _as_strided,
    aten.view.default: _reshape_back,
    aten._unsafe_view.default: _reshape_back,
    aten._reshape_alias.default: _reshape_back,
    aten.unsqueeze.default: _reshape_back,
    aten.squeeze.default: _reshape_back,
    aten.squeeze.dim: _reshape_back,
    aten.squeeze.dims: _reshape_back,
    aten.unflatten.int: _reshape_back,
    aten.alias.default: _identity,
    aten.detach.default: _identity,
    aten.lift_fresh.default: _identity,
    aten.transpose.int: _transpose,
    aten.t.default: _t,
    aten.permute.default: _permute,
}

# multi-output views: the rule also gets the output's position as `index`
SCATTER_MULTI = {
    aten.split.Tensor: _split,
    aten.split_with_sizes.default: _split_with_sizes,
    aten.unbind.int: _unbind,
}

# identity views that a functional graph does not need (dropped after tracing)
IDENTITY_VIEWS = frozenset({aten.alias.default, aten.detach.default, aten.lift_fresh.default})
