"""Stage 4, lower: one lowering rule per aten overload, in the table `RULES`.

A rule is `rule(ctx: GraphLowering, node, *args, **kwargs) -> value` where tensor args are
`TensorValue`s and the node's `meta["val"]` gives the result's shape and dtype. Pointwise rules
return `Pending` values built from `ops`; reductions store a `Reduction` buffer; views return
`View` (strided, when expressible) or `Reindex`; compute-bound ops become externs. A rule may
return NotImplemented to fall back to an aten extern for an argument combination it lacks.

Consumes: GraphLowering helpers (ctx). Produces: RULES.
"""
from __future__ import annotations

import math
from typing import Callable

import sympy
import torch

from ..codegen.common import (FloorDiv, ModularIndexing, compute_dtype, contiguous_strides,
                              numel, ops)
from .ir import ComputedBuffer, Pending, Pointwise, Reduction, Reindex, TensorValue, View

aten = torch.ops.aten
prims = torch.ops.prims
RULES: dict = {}


def rule(*overloads):
    def deco(fn):
        for o in overloads:
            RULES[o] = fn
        return fn
    return deco


def out_meta(node):
    v = node.meta.get("val", node.meta.get("example_value"))
    return v


# --- helpers ---------------------------------------------------------------------------------

def broadcast_loader(x, size, dtype=None) -> Callable:
    """Loader of x (TensorValue or Python scalar) broadcast to `size`, cast to `dtype`."""
    if not isinstance(x, TensorValue):
        value = x
        return lambda index: ops.constant(value, dtype)
    load = x.loader()
    xs = x.size
    lead = len(size) - len(xs)

    def bload(index):
        idx = [sympy.Integer(0) if xs[i] == 1 and size[i + lead] != 1 else index[i + lead]
               for i in range(len(xs))]
        return load(idx)
    src = compute_dtype(x.dtype)
    if dtype is None or src == dtype:
        return bload
    return lambda index: ops.to_dtype(bload(index), dtype)


def _meta_arg(x):
    if isinstance(x, TensorValue):
        return torch.empty((1,) * len(x.size) if x.size else (), dtype=x.dtype, device="meta")
    return x


def promote(*xs) -> torch.dtype:
    metas = [_meta_arg(x) for x in xs if x is not None]
    dt = metas[0] if not isinstance(metas[0], torch.Tensor) else metas[0]
    if len(metas) == 1:
        return dt.dtype if isinstance(dt, torch.Tensor) else torch.tensor(dt).dtype
    out = torch.result_type(metas[0], metas[1])
    for m in metas[2:]:
        out = torch.promote_types(out, m.dtype if isinstance(m, torch.Tensor) else torch.result_type(
            torch.empty((), dtype=out, device="meta"), m))
    return out


def pointwise(node, fn, *inputs, in_dtype=None, size=None, dtype=None) -> Pending:
    out = out_meta(node)
    size = tuple(out.shape) if size is None else tuple(size)
    dtype = out.dtype if dtype is None else dtype
    in_dtype = compute_dtype(in_dtype or dtype)
    loaders = [broadcast_loader(x, size, in_dtype) for x in inputs]

    def inner(index):
        return fn(*[load(index) for load in loaders])
    return Pending(Pointwise(size, dtype, inner))


def const_pending(size, dtype, value) -> Pending:
    cd = compute_dtype(dtype)
    return Pending(Pointwise(tuple(size), dtype, lambda index: ops.constant(value, cd)))


# --- pointwise ops ---------------------------------------------------------------------------

UNARY_RULES = {
    aten.neg.default: "neg", aten.abs.default: "abs", aten.exp.default: "exp",
    aten.exp2.default: "exp2", aten.expm1.default: "expm1", aten.log.default: "log",
    aten.log2.default: "log2", aten.log10.default: "log10", aten.log1p.default: "log1p",
    aten.sqrt.default: "sqrt", aten.rsqrt.default: "rsqrt", aten.sin.default: "sin",
    aten.cos.default: "cos", aten.tan.default: "tan", aten.asin.default: "asin",
    aten.acos.default: "acos", aten.atan.default: "atan", aten.sinh.default: "sinh",
    aten.cosh.default: "cosh", aten.tanh.default: "tanh", aten.asinh.default: "asinh",
    aten.acosh.default: "acosh", aten.atanh.default: "atanh", aten.sigmoid.default: "sigmoid",
    aten.erf.default: "erf", aten.erfc.default: "erfc", aten.reciprocal.default: "reciprocal",
    aten.relu.default: "relu", aten.floor.default: "floor", aten.ceil.default: "ceil",
    aten.round.default: "round", aten.trunc.default: "trunc", aten.sign.default: "sign",
    aten.bitwise_not.default: "bitwise_not", aten.lgamma.default: "lgamma",
    aten.square.default: "square",
}
PREDICATE_RULES = {aten.isnan.default: "isnan", aten.isinf.default: "isinf",
                   aten.isfinite.default: "isfinite", aten.signbit.default: "signbit",
                   aten.logical_not.default: "logical_not"}
BINARY_RULES = {
    "add": "add", "sub": "sub", "mul": "mul", "div": "truediv", "maximum": "maximum",
    "minimum": "minimum", "pow": "pow", "remainder": "remainder", "fmod": "fmod",
    "atan2": "atan2", "bitwise_and": "bitwise_and", "bitwise_or": "bitwise_or",
    "bitwise_xor": "bitwise_xor", "floor_divide": "floordiv", "hypot": "hypot",
    "copysign": "copysign", "nextafter": "nextafter",
    "bitwise_left_shift": "lshift", "bitwise_right_shift": "rshift",
}
COMPARE_RULES = {"eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge",
                 "logical_and": "logical_and", "logical_or": "logical_or",
                 "logical_xor": "logical_xor"}


def _unary(opname):
    def lower(ctx, node, x):
        out = out_meta(node)
        in_dtype = out.dtype if out.dtype.is_floating_point or opname in (
            "neg", "abs", "bitwise_not", "sign", "relu", "square", "floor", "ceil", "round",
            "trunc") else torch.float32
        return pointwise(node, getattr(ops, opname), x, in_dtype=in_dtype)
    return lower


def _predicate(opname):
    def lower(ctx, node, x):
        return pointwise(node, getattr(ops, opname), x, in_dtype=x.dtype)
    return lower


for _op, _name in UNARY_RULES.items():
    RULES[_op] = _unary(_name)
for _op, _name in PREDICATE_RULES.items():
    RULES[_op] = _predicate(_name)


def _binary(opname, with_alpha=False):
    def lower(ctx, node, a, b, alpha=None, **kw):
        if kw.get("rounding_mode") is not None:
            return _div_mode(node, a, b, kw["rounding_mode"])
        fn = getattr(ops, opname)
        if opname == "pow" and not isinstance(b, TensorValue):
            if b == 2:
                return pointwise(node, lambda x: ops.mul(x, x), a)
            if b == 0.5:
                return pointwise(node, ops.sqrt, a)
            if b == 1:
                return pointwise(node, lambda x: x, a)
            if b == -1:
                return pointwise(node, ops.reciprocal, a)
        if alpha is not None and alpha != 1:
            cd = compute_dtype(out_meta(node).dtype)
            return pointwise(node, lambda x, y: fn(x, ops.mul(y, ops.constant(alpha, cd))), a, b)
        return pointwise(node, fn, a, b)
    return lower


def _div_mode(node, a, b, mode):
    dtype = out_meta(node).dtype
    if mode == "trunc":
        fn = (lambda x, y: ops.trunc(ops.truediv(x, y))) if dtype.is_floating_point else ops.truncdiv
    else:
        fn = (lambda x, y: ops.floor(ops.truediv(x, y))) if dtype.is_floating_point else ops.floordiv
    return pointwise(node, fn, a, b)


for _name, _opname in BINARY_RULES.items():
    for _ov in ("Tensor", "Scalar", "default", "Tensor_Tensor", "Tensor_Scalar", "Scalar_Tensor",
                "Scalar_Scalar"):
        _packet = getattr(aten, _name, None)
        if _packet is not None and _ov in _packet.overloads():
            RULES[getattr(_packet, _ov)] = _binary(_opname)
RULES[aten.div.Tensor_mode] = _binary("truediv")
RULES[aten.div.Scalar_mode] = _binary("truediv")


def _compare(opname):
    def lower(ctx, node, a, b):
        return pointwise(node, getattr(ops, opname), a, b, in_dtype=promote(a, b))
    return lower


for _name, _opname in COMPARE_RULES.items():
    for _ov in ("Tensor", "Scalar", "default"):
        _packet = getattr(aten, _name)
        if _ov in _packet.overloads():
            RULES[getattr(_packet, _ov)] = _compare(_opname)


@rule(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(ctx, node, cond, a, b):
    out = out_meta(node)
    cd = compute_dtype(out.dtype)
    size = tuple(out.shape)
    lc = broadcast_loader(cond, size, torch.bool)
    la, lb = broadcast_loader(a, size, cd), broadcast_loader(b, size, cd)
    return Pending(Pointwise(size, out.dtype, lambda i: ops.where(lc(i), la(i), lb(i))))


@rule(aten.clamp.default, aten.clamp.Tensor)
def clamp(ctx, node, x, min=None, max=None):
    def fn(v, lo, hi):
        if lo is not None:
            v = ops.maximum(v, lo)
        if hi is not None:
            v = ops.minimum(v, hi)
        return v
    out = out_meta(node)
    cd = compute_dtype(out.dtype)
    size = tuple(out.shape)
    lx = broadcast_loader(x, size, cd)
    llo = broadcast_loader(min, size, cd) if min is not None else None
    lhi = broadcast_loader(max, size, cd) if max is not None else None
    return Pending(Pointwise(size, out.dtype, lambda i: fn(
        lx(i), llo(i) if llo else None, lhi(i) if lhi else None)))


@rule(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(ctx, node, x, lo):
    return pointwise(node, ops.maximum, x, lo)


@rule(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(ctx, node, x, hi):
    return pointwise(node, ops.minimum, x, hi)


@rule(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(ctx, node, x, mask, value):
    out = out_meta(node)
    cd = compute_dtype(out.dtype)
    size = tuple(out.shape)
    lx, lm = broadcast_loader(x, size, cd), broadcast_loader(mask, size, torch.bool)
    lv = broadcast_loader(value, size, cd)
    return Pending(Pointwise(size, out.dtype, lambda i: ops.where(lm(i), lv(i), lx(i))))


@rule(aten.threshold_backward.default)
def threshold_backward(ctx, node, grad, x, threshold):
    out = out_meta(node)
    cd = compute_dtype(out.dtype)
    size = tuple(out.shape)
    lg, lx = broadcast_loader(grad, size, cd), broadcast_loader(x, size, compute_dtype(x.dtype))
    xd = compute_dtype(x.dtype)
    return Pending(Pointwise(size, out.dtype, lambda i: ops.where(
        ops.le(lx(i), ops.constant(threshold, xd)), ops.constant(0, cd), lg(i))))


@rule(aten.sigmoid_backward.default)
def sigmoid_backward(ctx, node, grad, y):
    one = 1.0
    return pointwise(node, lambda g, s: ops.mul(g, ops.mul(s, ops.sub(ops.constant(one, _cd(node)), s))),
                     grad, y)


@rule(aten.tanh_backward.default)
def tanh_backward(ctx, node, grad, y):
    return pointwise(node, lambda g, t: ops.mul(g, ops.sub(ops.constant(1.0, _cd(node)), ops.mul(t, t))),
                     grad, y)


def _cd(node):
    return compute_dtype(out_meta(node).dtype)


@rule(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(ctx, node, a, b, w):
    return pointwise(node, lambda x, y, t: ops.add(x, ops.mul(t, ops.sub(y, x))), a, b, w)


# --- casts, copies, factories ----------------------------------------------------------------

def _cast(ctx, node, x, dtype):
    if not isinstance(x, TensorValue):
        return NotImplemented
    load = x.loader()
    return Pending(Pointwise(x.size, dtype, lambda i: ops.to_dtype(load(i), dtype)))


@rule(prims.convert_element_type.default)
def convert_element_type(ctx, node, x, dtype):
    return _cast(ctx, node, x, dtype)


@rule(aten._to_copy.default)
def to_copy(ctx, node, x, dtype=None, layout=None, device=None, pin_memory=None,
            non_blocking=False, memory_format=None):
    if device is not None and torch.device(device).type != "cpu":
        return NotImplemented
    return _cast(ctx, node, x, dtype or x.dtype)


@rule(aten.clone.default, aten.lift_fresh_copy.default, aten.contiguous.default)
def clone(ctx, node, x, memory_format=None):
    load = x.loader()
    return Pending(Pointwise(x.size, x.dtype, load))


@rule(aten.alias.default, aten.detach.default, aten.lift_fresh.default)
def alias(ctx, node, x, *a):
    return x


@rule(aten.copy.default)
def copy(ctx, node, dst, src, non_blocking=False):
    return pointwise(node, lambda v: v, src)


@rule(aten.full.default)
def full(ctx, node, size, value, **kw):
    out = out_meta(node)
    return const_pending(tuple(out.shape), out.dtype, value)


@rule(aten.scalar_tensor.default)
def scalar_tensor(ctx, node, value, **kw):
    out = out_meta(node)
    return const_pending((), out.dtype, value)


@rule(aten.full_like.default)
def full_like(ctx, node, x, value, **kw):
    out = out_meta(node)
    return const_pending(tuple(out.shape), out.dtype, value)


@rule(aten.zeros.default, aten.zeros_like.default, aten.empty.memory_format,
      aten.empty_like.default, aten.new_zeros.default, aten.new_empty.default)
def zeros(ctx, node, *a, **kw):
    out = out_meta(node)
    return const_pending(tuple(out.shape), out.dtype, 0)


@rule(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def ones(ctx, node, *a, **kw):
    out = out_meta(node)
    return const_pending(tuple(out.shape), out.dtype, 1)


@rule(aten.arange.start_step, aten.arange.default, aten.arange.start)
def arange(ctx, node, *a, **kw):
    out = out_meta(node)
    args = [x for x in a]
    if node.target is aten.arange.default:
        start, step = 0, 1
    elif node.target is aten.arange.start:
        start, step = args[0], 1
    else:
        start, step = args[0], args[2] if len(args) > 2 else kw.get("step", 1)
    cd = compute_dtype(out.dtype)
    if cd.is_floating_point:
        return Pending(Pointwise(tuple(out.shape), out.dtype, lambda i: ops.add(
            ops.constant(start, cd), ops.mul(ops.index_expr(i[0], cd), ops.constant(step, cd)))))
    if not (isinstance(start, int) and isinstance(step, int)):
        return NotImplemented
    return Pending(Pointwise(tuple(out.shape), out.dtype,
                             lambda i: ops.index_expr(start + i[0] * step, cd)))


@rule(prims.iota.default)
def iota(ctx, node, length, *, start, step, dtype, device, requires_grad):
    cd = compute_dtype(dtype)
    return Pending(Pointwise((length,), dtype, lambda i: ops.index_expr(start + i[0] * step, cd)))


# --- reductions ------------------------------------------------------------------------------

def _dims(x, dims):
    n = len(x.size)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(n))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % n if n else 0 for d in dims})


def reduce(ctx, x, dims, keepdim, rtype, dtype, src_dtype=None, pre=None) -> View:
    """Store a Reduction of x over dims (output shaped as eager: keepdim or not)."""
    dims = _dims(x, dims)
    size = x.size
    keep = [d for d in range(len(size)) if d not in dims]
    osize = tuple(1 if d in dims else s for d, s in enumerate(size)) if keepdim else tuple(
        size[d] for d in keep)
    rsize = tuple(size[d] for d in dims)
    src_dtype = src_dtype or compute_dtype(dtype)
    load = broadcast_loader(x, size, torch.bool if rtype == "any" else src_dtype)

    def inner(index, rindex):
        full = [None] * len(size)
        for k, d in enumerate(keep):
            full[d] = index[d] if keepdim else index[k]
        for d, r in zip(dims, rindex):
            full[d] = r
        v = load(full)
        return pre(v) if pre is not None else v
    buf = ctx.add_computed(Reduction(osize, rsize, rtype, dtype, src_dtype, inner))
    return View(buf, buf.size, buf.stride, 0)


@rule(aten.sum.dim_IntList, aten.sum.default)
def sum_(ctx, node, x, dims=None, keepdim=False, *, dtype=None):
    out = out_meta(node)
    return reduce(ctx, x, dims, keepdim, "sum", out.dtype)


@rule(aten.prod.dim_int, aten.prod.default)
def prod(ctx, node, x, dim=None, keepdim=False, *, dtype=None):
    out = out_meta(node)
    return reduce(ctx, x, dim, keepdim, "prod", out.dtype)


@rule(aten.amax.default, aten.amin.default)
def amax(ctx, node, x, dims=(), keepdim=False):
    out = out_meta(node)
    rtype = "max" if node.target is aten.amax.default else "min"
    return reduce(ctx, x, dims, keepdim, rtype, out.dtype)


@rule(aten.argmax.default, aten.argmin.default)
def argmax(ctx, node, x, dim=None, keepdim=False):
    rtype = "argmax" if node.target is aten.argmax.default else "argmin"
    if dim is None:
        if keepdim:
            return NotImplemented
        flat = view_impl(x, (numel(x.size),))
        return reduce(ctx, flat, [0], False, rtype, torch.int64, compute_dtype(x.dtype))
    return reduce(ctx, x, [dim], keepdim, rtype, torch.int64, compute_dtype(x.dtype))


@rule(aten.any.default, aten.any.dim, aten.any.dims)
def any_(ctx, node, x, dim=None, keepdim=False):
    return reduce(ctx, x, dim, keepdim, "any", torch.bool, torch.bool)


@rule(aten.mean.dim, aten.mean.default)
def mean(ctx, node, x, dims=None, keepdim=False, *, dtype=None):
    out = out_meta(node)
    if not out.dtype.is_floating_point:
        return NotImplemented
    d = _dims(x, dims)
    n = numel([x.size[i] for i in d])
    s = reduce(ctx, x, d, keepdim, "sum", out.dtype)
    cd = compute_dtype(out.dtype)
    return pointwise(node, lambda v: ops.truediv(v, ops.constant(float(n), cd)), s)


@rule(aten.var_mean.correction, aten.var.correction)
def var_mean(ctx, node, x, dims=None, *, correction=None, keepdim=False):
    dtype = x.dtype
    if not dtype.is_floating_point:
        return NotImplemented
    cd = compute_dtype(dtype)
    d = _dims(x, dims)
    n = numel([x.size[i] for i in d])
    corr = 1 if correction is None else correction
    s = reduce(ctx, x, d, True, "sum", dtype)
    ksize = s.size
    mean_k = Pending(Pointwise(ksize, dtype, _scale(s.loader(), 1.0 / n if n else float("nan"), cd)))
    lx = broadcast_loader(x, x.size, cd)
    lm = broadcast_loader(mean_k, x.size, cd)

    def sq(index):
        diff = ops.sub(lx(index), lm(index))
        return ops.mul(diff, diff)
    sq_val = Pending(Pointwise(x.size, dtype, sq))
    ss = reduce(ctx, sq_val, d, True, "sum", dtype)
    denom = max(n - corr, 0)
    var_k = Pending(Pointwise(ksize, dtype, _scale(ss.loader(), 1.0 / denom if denom else float("inf"), cd)))
    if denom == 0:
        var_k = Pending(Pointwise(ksize, dtype, _div_const(ss.loader(), 0.0, cd)))
    keep = [i for i in range(len(x.size)) if i not in d]
    if not keepdim:
        var_k, mean_k = _squeeze_dims(var_k, d), _squeeze_dims(mean_k, d)
    if node.target is aten.var.correction:
        return var_k
    return (var_k, mean_k)


def _scale(load, factor, cd):
    return lambda i: ops.mul(load(i), ops.constant(factor, cd))


def _div_const(load, c, cd):
    return lambda i: ops.truediv(load(i), ops.constant(c, cd))


def _squeeze_dims(x, dims):
    keep = [i for i in range(len(x.size)) if i not in dims]
    size = tuple(x.size[i] for i in keep)

    def reindex(index):
        full = [sympy.Integer(0)] * len(x.size)
        for k, i in zip(keep, index):
            full[k] = i
        return full
    return Reindex(x, size, reindex)


# --- views -----------------------------------------------------------------------------------

_META_BASE = None


def _meta_view(x: View, fn):
    """Apply a view op to a meta tensor with x's layout; the resulting (size, stride, offset)."""
    global _META_BASE
    if _META_BASE is None:
        _META_BASE = torch.empty(2 ** 62, dtype=torch.int8, device="meta")
    t = _META_BASE.as_strided(x.size, x.stride, x.offset)
    r = fn(t)
    return View(x.buffer, tuple(r.shape), tuple(r.stride()), r.storage_offset())


def view_impl(x, size):
    size = tuple(int(s) for s in size)
    if -1 in size:
        known = numel([s for s in size if s != -1])
        size = tuple(numel(x.size) // known if s == -1 else s for s in size)
    if tuple(x.size) == size:
        return x
    if isinstance(x, View):
        try:
            return _meta_view(x, lambda t: t.view(size))
        except RuntimeError:
            pass
    return Reindex(x, size, _reshape_index(tuple(x.size), size))


def _reshape_index(old, new):
    """index over `new` → index over `old` via matching dimension groups."""
    groups, i, j = [], 0, 0
    while i < len(old) or j < len(new):
        gi, gj = [], []
        pi = pj = 1
        while True:
            if pi == pj and (gi or gj) and (i >= len(old) or old[i] != 1 or pi != 1) and (
                    j >= len(new) or new[j] != 1 or pj != 1):
                break
            if (pi <= pj or j >= len(new)) and i < len(old):
                gi.append(i); pi *= old[i]; i += 1
            elif j < len(new):
                gj.append(j); pj *= new[j]; j += 1
            else:
                break
        groups.append((gi, gj))

    def reindex(index):
        out = [sympy.Integer(0)] * len(old)
        for gi, gj in groups:
            flat = sympy.Integer(0)
            for jj, st in zip(gj, contiguous_strides([new[k] for k in gj])):
                flat = flat + index[jj] * st
            sts = contiguous_strides([old[k] for k in gi])
            for n, (ii, st) in enumerate(zip(gi, sts)):
                if old[ii] == 1:
                    continue
                if len(gi) == 1:
                    out[ii] = flat
                elif n == 0:
                    out[ii] = FloorDiv(flat, sympy.Integer(st))
                else:
                    out[ii] = ModularIndexing(flat, sympy.Integer(st), sympy.Integer(old[ii]))
        return out
    return reindex


@rule(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def view(ctx, node, x, size):
    return view_impl(x, size)


@rule(prims.collapse_view.default)
def collapse_view(ctx, node, x, start, end):
    return view_impl(x, tuple(out_meta(node).shape))


@rule(aten.permute.default)
def permute(ctx, node, x, dims):
    n = len(x.size)
    dims = [d % n for d in dims]
    if isinstance(x, View):
        return View(x.buffer, tuple(x.size[d] for d in dims), tuple(x.stride[d] for d in dims),
                    x.offset)

    def reindex(index):
        out = [None] * n
        for k, d in enumerate(dims):
            out[d] = index[k]
        return out
    return Reindex(x, tuple(x.size[d] for d in dims), reindex)


@rule(aten.t.default)
def t(ctx, node, x):
    if len(x.size) < 2:
        return x
    return permute(ctx, node, x, [1, 0])


@rule(aten.transpose.int)
def transpose(ctx, node, x, a, b):
    n = len(x.size)
    if n == 0:
        return x
    dims = list(range(n))
    dims[a % n], dims[b % n] = dims[b % n], dims[a % n]
    return permute(ctx, node, x, dims)


@rule(aten.expand.default, prims.broadcast_in_dim.default)
def expand(ctx, node, x, size, *rest):
    size = tuple(out_meta(node).shape)
    if node.target is prims.broadcast_in_dim.default:
        bdims = rest[0]
        inter = [1] * len(size)
        for k, d in enumerate(bdims):
            inter[d] = x.size[k]
        x = view_impl(x, tuple(inter))
    if isinstance(x, View):
        lead = len(size) - len(x.size)
        stride = [0] * lead + [0 if (xs == 1 and s != 1) else st
                               for xs, st, s in zip(x.size, x.stride, size[lead:])]
        return View(x.buffer, size, tuple(stride), x.offset)
    xs = x.size
    lead = len(size) - len(xs)
    return Reindex(x, size, lambda index: [sympy.Integer(0) if xs[i] == 1 else index[i + lead]
                                           for i in range(len(xs))])


@rule(aten.unsqueeze.default)
def unsqueeze(ctx, node, x, dim):
    return view_impl(x, tuple(out_meta(node).shape)) if not isinstance(x, View) else _meta_view(
        x, lambda t: t.unsqueeze(dim))


@rule(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def squeeze(ctx, node, x, dims=None):
    return view_impl(x, tuple(out_meta(node).shape))


@rule(aten.slice.Tensor)
def slice_(ctx, node, x, dim=0, start=None, end=None, step=1):
    n = len(x.size)
    dim = dim % n
    size = tuple(out_meta(node).shape)
    s = x.size[dim]
    start = 0 if start is None else start
    start = max(0, min(s, start + s if start < 0 else start))
    if isinstance(x, View):
        stride = list(x.stride)
        stride[dim] *= step
        return View(x.buffer, size, tuple(stride), x.offset + start * x.stride[dim])

    def reindex(index):
        out = list(index)
        out[dim] = start + index[dim] * step
        return out
    return Reindex(x, size, reindex)


@rule(aten.select.int)
def select(ctx, node, x, dim, idx):
    n = len(x.size)
    dim = dim % n
    idx = idx + x.size[dim] if idx < 0 else idx
    size = tuple(out_meta(node).shape)
    if isinstance(x, View):
        return View(x.buffer, size, x.stride[:dim] + x.stride[dim + 1:],
                    x.offset + idx * x.stride[dim])
    return Reindex(x, size, lambda index: list(index[:dim]) + [sympy.Integer(idx)] + list(index[dim:]))


@rule(aten.as_strided.default)
def as_strided(ctx, node, x, size, stride, storage_offset=None):
    v = ctx.realize(x)
    if not (isinstance(x, View) and x.buffer is v.buffer) and not v.arg().is_whole:
        return NotImplemented
    off = v.offset if storage_offset is None else storage_offset
    return View(v.buffer, tuple(size), tuple(stride), off)


@rule(aten.split.Tensor, aten.split_with_sizes.default)
def split(ctx, node, x, split, dim=0):
    dim = dim % len(x.size)
    outs, start = [], 0
    metas = out_meta(node)
    for m in metas:
        length = m.shape[dim]
        outs.append(_slice_plain(x, dim, start, length))
        start += length
    return tuple(outs)


def _slice_plain(x, dim, start, length):
    size = list(x.size)
    size[dim] = length
    if isinstance(x, View):
        return View(x.buffer, tuple(size), x.stride, x.offset + start * x.stride[dim])

    def reindex(index):
        out = list(index)
        out[dim] = index[dim] + start
        return out
    return Reindex(x, tuple(size), reindex)


@rule(aten.unbind.int)
def unbind(ctx, node, x, dim=0):
    dim = dim % len(x.size)
    return tuple(_select_plain(x, dim, i) for i in range(x.size[dim]))


def _select_plain(x, dim, i):
    size = x.size[:dim] + x.size[dim + 1:]
    if isinstance(x, View):
        return View(x.buffer, size, x.stride[:dim] + x.stride[dim + 1:], x.offset + i * x.stride[dim])
    return Reindex(x, size, lambda index: list(index[:dim]) + [sympy.Integer(i)] + list(index[dim:]))


# --- cat / pad / gather ----------------------------------------------------------------------

@rule(aten.cat.default)
def cat(ctx, node, tensors, dim=0):
    out = out_meta(node)
    size = tuple(out.shape)
    dim = dim % len(size)
    parts = [t for t in tensors if not (len(t.size) == 1 and t.size[0] == 0)]
    cd = compute_dtype(out.dtype)
    offsets, acc = [], 0
    for t in parts:
        offsets.append(acc)
        acc += t.size[dim]
    loaders = [t.loader() for t in parts]

    def inner(index):
        def load_part(k):
            idx = list(index)
            idx[dim] = index[dim] - offsets[k]
            return lambda: _cast_to(loaders[k](idx), parts[k].dtype, cd)
        value = load_part(len(parts) - 1)()
        for k in range(len(parts) - 2, -1, -1):
            lim = offsets[k + 1]
            mask = ops.lt(ops.index_expr(index[dim], torch.int64), ops.constant(lim, torch.int64))
            value = ops.where(mask, ops.masked(mask, load_part(k), 0.0), value)
        return value
    if len(parts) > 1:
        # every part but the last is read under a mask; the last is safe only above its offset
        def inner2(index):
            idx_last = list(index)
            last = len(parts) - 1
            idx_last[dim] = index[dim] - offsets[last]
            ge = ops.ge(ops.index_expr(index[dim], torch.int64), ops.constant(offsets[last], torch.int64))
            value = ops.masked(ge, lambda: _cast_to(loaders[last](idx_last), parts[last].dtype, cd), 0)
            for k in range(last - 1, -1, -1):
                idx = list(index)
                idx[dim] = index[dim] - offsets[k]
                lo = ops.ge(ops.index_expr(index[dim], torch.int64), ops.constant(offsets[k], torch.int64))
                hi = ops.lt(ops.index_expr(index[dim], torch.int64), ops.constant(offsets[k + 1], torch.int64))
                m = ops.logical_and(lo, hi)
                value = ops.where(m, ops.masked(m, (lambda k=k, idx=idx: _cast_to(
                    loaders[k](idx), parts[k].dtype, cd)), 0), value)
            return value
        return Pending(Pointwise(size, out.dtype, inner2))
    return Pending(Pointwise(size, out.dtype, lambda i: _cast_to(loaders[0](i), parts[0].dtype, cd)))


def _cast_to(v, src, cd):
    return v if compute_dtype(src) == cd else ops.to_dtype(v, cd)


@rule(aten.constant_pad_nd.default)
def constant_pad_nd(ctx, node, x, pad, value=0):
    out = out_meta(node)
    size = tuple(out.shape)
    n = len(size)
    cd = compute_dtype(out.dtype)
    lows = [0] * n
    for k in range(len(pad) // 2):
        lows[n - 1 - k] = pad[2 * k]
    load = x.loader()

    def inner(index):
        idx = [i - lo for i, lo in zip(index, lows)]
        conds = []
        for d in range(n):
            if lows[d] > 0:
                conds.append(ops.ge(ops.index_expr(idx[d], torch.int64), ops.constant(0, torch.int64)))
            if lows[d] + x.size[d] < size[d] or lows[d] < 0:
                conds.append(ops.lt(ops.index_expr(idx[d], torch.int64),
                                    ops.constant(x.size[d], torch.int64)))
            if lows[d] < 0:
                conds.append(ops.ge(ops.index_expr(idx[d], torch.int64), ops.constant(0, torch.int64)))
        if not conds:
            return load(idx)
        m = conds[0]
        for c in conds[1:]:
            m = ops.logical_and(m, c)
        return ops.masked(m, lambda: load(idx), value)
    return Pending(Pointwise(size, out.dtype, inner))


@rule(aten.gather.default)
def gather(ctx, node, x, dim, index, sparse_grad=False):
    out = out_meta(node)
    size = tuple(out.shape)
    dim = dim % max(len(x.size), 1)
    lx, li = x.loader(), index.loader()
    xsize = x.size[dim]

    def inner(idx):
        j = ops.indirect_indexing(li(idx), xsize)
        full = list(idx)
        full[dim] = j
        return lx(full)
    return Pending(Pointwise(size, out.dtype, inner))


@rule(aten.index_select.default)
def index_select(ctx, node, x, dim, index):
    out = out_meta(node)
    size = tuple(out.shape)
    dim = dim % len(x.size)
    lx, li = x.loader(), index.loader()
    xsize = x.size[dim]

    def inner(idx):
        j = ops.indirect_indexing(li([idx[dim]] if index.size else []), xsize)
        full = list(idx)
        full[dim] = j
        return lx(full)
    return Pending(Pointwise(size, out.dtype, inner))


@rule(aten.embedding.default)
def embedding(ctx, node, weight, indices, padding_idx=-1, scale_grad=False, sparse=False):
    out = out_meta(node)
    size = tuple(out.shape)
    lw, li = weight.loader(), indices.loader()
    nidx = len(indices.size)
    rows = weight.size[0]

    def inner(idx):
        j = ops.indirect_indexing(li(idx[:nidx]), rows)
        return lw([j] + list(idx[nidx:]))
    return Pending(Pointwise(size, out.dtype, inner))


@rule(aten.index.Tensor)
def index(ctx, node, x, indices):
    out = out_meta(node)
    size = tuple(out.shape)
    if any(t is not None and (not isinstance(t, TensorValue) or t.dtype in (torch.bool, torch.uint8))
           for t in indices):
        return NotImplemented
    pos = [i for i, t in enumerate(indices) if t is not None]
    bshape = tuple(torch.broadcast_shapes(*[indices[i].size for i in pos]))
    nb = len(bshape)
    start = pos[0] if pos == list(range(pos[0], pos[-1] + 1)) else 0
    lx = x.loader()
    loaders = {i: broadcast_loader(indices[i], bshape) for i in pos}

    def inner(idx):
        bidx = list(idx[start:start + nb])
        rest = iter(list(idx[:start]) + list(idx[start + nb:]))
        full = []
        for d in range(len(x.size)):
            if d in loaders:
                full.append(ops.indirect_indexing(loaders[d](bidx), x.size[d]))
            else:
                full.append(next(rest))
        return lx(full)
    return Pending(Pointwise(size, out.dtype, inner))


@rule(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(ctx, node, x, kernel_size, stride=(), padding=0, dilation=1,
                            ceil_mode=False):
    """Window max as an unrolled pointwise body: values and indices are separate Pending
    values, so in inference the unused indices are never computed."""
    pair = lambda v: (v, v) if isinstance(v, int) else (tuple(v) * 2 if len(v) == 1 else tuple(v))  # noqa: E731
    (kh, kw), (ph, pw), (dh, dw) = pair(kernel_size), pair(padding), pair(dilation)
    sh, sw = pair(stride) if stride else (kh, kw)
    if not x.dtype.is_floating_point or len(x.size) not in (3, 4) or kh * kw > 49:
        return NotImplemented
    vmeta, imeta = out_meta(node)
    size = tuple(vmeta.shape)
    H, W = x.size[-2:]
    Ho, Wo = size[-2:]
    lx = x.loader()
    cd = compute_dtype(x.dtype)

    def window(index):
        *lead, oh, ow = index
        best = bidx = None
        for i in range(kh):
            for j in range(kw):
                h, w = oh * sh - ph + i * dh, ow * sw - pw + j * dw
                conds = []
                for e, lo_, hi_, n in ((h, i * dh - ph, (Ho - 1) * sh - ph + i * dh, H),
                                       (w, j * dw - pw, (Wo - 1) * sw - pw + j * dw, W)):
                    if lo_ < 0:
                        conds.append(ops.ge(ops.index_expr(e, torch.int64), ops.constant(0, torch.int64)))
                    if hi_ >= n:
                        conds.append(ops.lt(ops.index_expr(e, torch.int64), ops.constant(n, torch.int64)))
                idx = list(lead) + [h, w]
                if conds:
                    m = conds[0]
                    for c in conds[1:]:
                        m = ops.logical_and(m, c)
                    v = ops.masked(m, lambda idx=idx: lx(idx), float("-inf"))
                else:
                    v = lx(idx)
                flat = ops.index_expr(h * W + w, torch.int64)
                if best is None:
                    best, bidx = v, flat
                else:
                    take = ops.logical_or(ops.gt(v, best), ops.isnan(v))
                    best, bidx = ops.where(take, v, best), ops.where(take, flat, bidx)
        return best, bidx
    vals = Pending(Pointwise(size, x.dtype, lambda i: window(i)[0]))
    inds = Pending(Pointwise(size, torch.int64, lambda i: window(i)[1]))
    return (vals, inds)


# --- externs ---------------------------------------------------------------------------------

@rule(aten.mm.default)
def mm(ctx, node, a, b):
    return ctx.extern(aten.mm.default, (a, b), {}, out_meta(node), out_variant=aten.mm.out)


@rule(aten.bmm.default)
def bmm(ctx, node, a, b):
    return ctx.extern(aten.bmm.default, (a, b), {}, out_meta(node), out_variant=aten.bmm.out)


@rule(aten.addmm.default)
def addmm(ctx, node, bias, a, b, *, beta=1, alpha=1):
    return ctx.extern(aten.addmm.default, (bias, a, b), {"beta": beta, "alpha": alpha},
                      out_meta(node), out_variant=aten.addmm.out)


# Compute-bound / library ops the decomp contract (ember.decomp.prims, "extern" kind) leaves to
# the backend: called functionally, not reported as fallbacks.
EXTERNS = (
    "convolution.default", "convolution_backward.default",
    "_scaled_dot_product_flash_attention_for_cpu.default",
    "_scaled_dot_product_flash_attention_for_cpu_backward.default",
    "_scaled_dot_product_efficient_attention.default",
    "_scaled_dot_product_efficient_attention_backward.default",
    "_scaled_dot_product_flash_attention.default",
    "_scaled_dot_product_flash_attention_backward.default",
    "scaled_dot_product_attention.default",
    "max_pool2d_with_indices_backward.default",
    "sort.default", "sort.stable", "cumsum.default", "rand.default", "randn.default",
    "empty_strided.default", "index_put.default", "scatter.src", "scatter.value",
    "scatter_add.default",
)


def extern_functional(ctx, node, *args, **kwargs):
    return ctx.extern(node.target, args, kwargs, out_meta(node))


for _name in EXTERNS:
    _packet, _, _ov = _name.rpartition(".")
    if hasattr(aten, _packet) and _ov in getattr(aten, _packet).overloads():
        RULES[getattr(getattr(aten, _packet), _ov)] = extern_functional
