"""Stage 4, lower: one lowering rule per aten overload, in the table `RULES`.

A rule is `rule(ctx: GraphLowering, node, *args, **kwargs) -> value` where tensor args are
`TensorValue`s and the node's `meta["val"]` gives the result's shape and dtype. Pointwise rules
return `Pending` values built from `ops`; reductions store a `Reduction` buffer; views return
`View` (strided, when expressible) or `Reindex`; compute-bound ops become externs. A rule may
return NotImplemented to fall back to an aten extern for an argument combination it lacks.

Views, indexing and externs are in rules_data.py (same table).

Consumes: GraphLowering helpers (ctx). Produces: RULES.
"""
from __future__ import annotations

import itertools
from typing import Callable

import sympy
import torch

from ..logging import get_logger
from ..loopir.index import numel
from ..loopir.ops import compute_dtype, ops
from ..loopir.nodes import Pointwise, Reduction, Scan
from .ir import Pending, Reindex, TensorValue, View, as_sizes, view_impl

aten = torch.ops.aten
perf_log = get_logger("perf")
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
    if isinstance(x, sympy.Basic):      # a size expression (a SymInt/SymFloat in the graph)
        return 1 if x.is_integer else 1.0
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
    size = as_sizes(out.shape) if size is None else tuple(size)
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
            # eager's pow(tensor, scalar) special cases, in its rounding order; std::pow would
            # also keep the loop from vectorizing (GPT-2's gelu: 1.3 ms instead of ~0.2)
            if b == 2:
                return pointwise(node, lambda x: ops.mul(x, x), a)
            if b == 3:
                return pointwise(node, lambda x: ops.mul(ops.mul(x, x), x), a)
            if b == -2 and out_meta(node).dtype.is_floating_point:
                return pointwise(node, lambda x: ops.reciprocal(ops.mul(x, x)), a)
            if b == -0.5:
                return pointwise(node, ops.rsqrt, a)
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
    size = as_sizes(out.shape)
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
    size = as_sizes(out.shape)
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
    size = as_sizes(out.shape)
    lx, lm = broadcast_loader(x, size, cd), broadcast_loader(mask, size, torch.bool)
    lv = broadcast_loader(value, size, cd)
    return Pending(Pointwise(size, out.dtype, lambda i: ops.where(lm(i), lv(i), lx(i))))


@rule(aten.threshold_backward.default)
def threshold_backward(ctx, node, grad, x, threshold):
    out = out_meta(node)
    cd = compute_dtype(out.dtype)
    size = as_sizes(out.shape)
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

def _cast(x, dtype):
    if not isinstance(x, TensorValue):
        return NotImplemented
    load = x.loader()
    return Pending(Pointwise(x.size, dtype, lambda i: ops.to_dtype(load(i), dtype)))


@rule(prims.convert_element_type.default)
def convert_element_type(ctx, node, x, dtype):
    return _cast(x, dtype)


@rule(aten._to_copy.default)
def to_copy(ctx, node, x, dtype=None, layout=None, device=None, pin_memory=None,
            non_blocking=False, memory_format=None):
    if device is not None and torch.device(device).type != "cpu":
        return NotImplemented
    return _cast(x, dtype or x.dtype)


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
    return const_pending(as_sizes(out.shape), out.dtype, value)


@rule(aten.scalar_tensor.default)
def scalar_tensor(ctx, node, value, **kw):
    out = out_meta(node)
    return const_pending((), out.dtype, value)


@rule(aten.full_like.default)
def full_like(ctx, node, x, value, **kw):
    out = out_meta(node)
    return const_pending(as_sizes(out.shape), out.dtype, value)


@rule(aten.zeros.default, aten.zeros_like.default, aten.empty.memory_format,
      aten.empty_like.default, aten.new_zeros.default, aten.new_empty.default)
def zeros(ctx, node, *a, **kw):
    out = out_meta(node)
    return const_pending(as_sizes(out.shape), out.dtype, 0)


@rule(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def ones(ctx, node, *a, **kw):
    out = out_meta(node)
    return const_pending(as_sizes(out.shape), out.dtype, 1)


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
        return Pending(Pointwise(as_sizes(out.shape), out.dtype, lambda i: ops.add(
            ops.constant(start, cd), ops.mul(ops.index_expr(i[0], cd), ops.constant(step, cd)))))
    if not (isinstance(start, int) and isinstance(step, int)):
        return NotImplemented
    return Pending(Pointwise(as_sizes(out.shape), out.dtype,
                             lambda i: ops.index_expr(start + i[0] * step, cd)))


@rule(prims.iota.default)
def iota(ctx, node, length, *, start, step, dtype, device, requires_grad):
    cd = compute_dtype(dtype)
    return Pending(Pointwise((length,), dtype, lambda i: ops.index_expr(start + i[0] * step, cd)))


# --- reductions ------------------------------------------------------------------------------

def _dims(x, dims):
    n = len(x.size)
    if n == 0:          # a 0-d tensor reduced over dim 0 or -1 (as eager allows) is itself
        return []
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(n))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % n for d in dims})


#: a reduction over at most this many elements (ResNeSt's sum over 2 radix splits, a pair of
#: heads) is a pointwise sum of loads, as Inductor unrolls them: as a reduction loop, its simd
#: loop ran over those 2 elements and every output was a scalar iteration
UNROLL_REDUCTION = 8
_COMBINE = {"sum": "add", "prod": "mul", "max": "maximum", "min": "minimum", "any": "logical_or"}


def reduce(ctx, x, dims, keepdim, rtype, dtype, src_dtype=None, pre=None):
    """A Reduction of x over dims (output shaped as eager: keepdim or not): stored, or a pending
    value of unrolled loads when it reduces at most UNROLL_REDUCTION elements."""
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
    if rtype in _COMBINE and all(isinstance(r, int) for r in rsize) and \
            0 < numel(rsize) <= UNROLL_REDUCTION:
        return Pending(Pointwise(osize, dtype, lambda index: _unrolled(
            inner, index, rsize, rtype, src_dtype, dtype)))
    buf = ctx.add_computed(Reduction(osize, rsize, rtype, dtype, src_dtype, inner))
    return View(buf, buf.size, buf.stride, 0)


def _unrolled(inner, index, rsize, rtype, src_dtype, dtype):
    acc = None
    for rindex in itertools.product(*(range(r) for r in rsize)):
        v = inner(index, [sympy.Integer(r) for r in rindex])
        acc = v if acc is None else getattr(ops, _COMBINE[rtype])(acc, v)
    cd = compute_dtype(dtype)
    return acc if rtype == "any" or src_dtype == cd else ops.to_dtype(acc, cd)


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
        x, dim = view_impl(x, (numel(x.size),)), 0
    d = _dims(x, [dim])
    # over the last dim (a row); over other dims the column form keeps per-lane indices already
    if d == [len(x.size) - 1] and not (isinstance(x.size[-1], int) and x.size[-1] <= UNROLL_REDUCTION):
        return _first_extremum(ctx, x, dim, keepdim, rtype[3:])
    return reduce(ctx, x, [dim], keepdim, rtype, torch.int64, compute_dtype(x.dtype))


def _first_extremum(ctx, x, dim, keepdim, rtype):
    """argmax/argmin as two reductions that vectorize: the extremum m (max/min, NaN if the row
    has one), then the smallest position k with x == m or x NaN, a min over
    `hit ? k : size` (the first maximum, or the first NaN: eager's rule). The compare-and-branch
    of a one-pass arg reduction runs scalar: 512 rows of 8000 floats took 8x a row max."""
    d = _dims(x, [dim])[0]
    size, cd = x.size, compute_dtype(x.dtype)
    m = reduce(ctx, x, [d], True, rtype, x.dtype)
    lx, lm = broadcast_loader(x, size, cd), broadcast_loader(m, size, cd)

    def position(index):
        v = lx(index)
        hit = ops.eq(v, lm(index))
        if x.dtype.is_floating_point:
            hit = ops.logical_or(hit, ops.isnan(v))
        return ops.where(hit, ops.index_expr(index[d], torch.int64),
                         ops.index_expr(sympy.sympify(size[d]), torch.int64))
    return reduce(ctx, Pending(Pointwise(size, torch.int64, position)), [d], keepdim, "min",
                  torch.int64)


@rule(aten.cumsum.default)
def cumsum(ctx, node, x, dim, *, dtype=None):
    """A Scan (codegen/cpp_scan.py) in C++ kernels with static sizes; else ATen's kernel (an
    extern).
    cumsum(flip(y)) along the scanned dim, what a cumsum's gradient is (flip, cumsum, flip), is
    flip(the reverse scan of y): y is read in place and the outer flip cancels this one."""
    out = out_meta(node)
    size = tuple(x.size)

    def aten_call():
        return ctx.extern(node.target, (x, dim), {"dtype": dtype} if dtype is not None else {},
                          out)
    if not ctx.cpp or not size or not all(isinstance(s, int) for s in size):
        return aten_call()
    d = dim % len(size)
    cd = compute_dtype(out.dtype)
    if size[d] == 1:
        return Pending(Pointwise(size, out.dtype, broadcast_loader(x, size, cd)))
    y = _flipped(node.args[0], d)
    src = ctx.env.get(y) if y is not None else None
    reverse = isinstance(src, TensorValue) and tuple(src.size) == size
    if not reverse and isinstance(x, View) and all(s == 1 for s in size[d + 1:]) and \
            numel(size) * out.dtype.itemsize > SCAN_STREAM_BYTES:
        # a plain stored input scanned along its rows, larger than the cache: ATen's one row at
        # a time streams it as fast as our rows in parallel (0.8-0.9x measured: design 064)
        perf_log.info("cumsum over the last dim of %s stays aten (%.1f MB from memory, nothing "
                      "to fuse)", list(size), numel(size) * out.dtype.itemsize / 2 ** 20)
        return aten_call()
    buf = ctx.add_computed(Scan(size, out.dtype, broadcast_loader(src if reverse else x, size, cd),
                                dim=d, reverse=reverse))
    value = View(buf, buf.size, buf.stride, 0)
    if not reverse:
        return value
    last = size[d] - 1
    return Reindex(value, size, lambda index: [*index[:d], last - index[d], *index[d + 1:]])


#: a forward scan along the innermost dim of a stored input larger than this stays ATen's
SCAN_STREAM_BYTES = 8 << 20


def _flipped(arg, d):
    """The fx node `arg` flips along dim d (decomp/shapes.py flip: an _unsafe_index by
    arange(n - 1, -1, -1) at d), or None."""
    if not (isinstance(arg, torch.fx.Node) and arg.target is aten._unsafe_index.Tensor):
        return None
    src, indices = arg.args[0], list(arg.args[1])
    if len(indices) != d + 1 or any(i is not None for i in indices[:d]):
        return None
    idx = indices[d]
    n = src.meta["val"].shape[d] if isinstance(src, torch.fx.Node) and "val" in src.meta else None
    if not (isinstance(idx, torch.fx.Node) and idx.target is aten.arange.start_step
            and isinstance(n, int) and tuple(idx.args[:3]) == (n - 1, -1, -1)):
        return None
    return src


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
    denom = max(n - corr, 0)
    if cd == torch.float32 and ctx.cpp:
        var_k, mean_k = _var_mean_double(ctx, x, d, n, denom, dtype)
    else:
        var_k, mean_k = _var_mean_shifted(ctx, x, d, n, denom, dtype, cd)
    if not keepdim:
        var_k, mean_k = _squeeze_dims(var_k, d), _squeeze_dims(mean_k, d)
    if node.target is aten.var.correction:
        return var_k
    return (var_k, mean_k)


def _var_mean_double(ctx, x, d, n, denom, dtype):
    """(var, mean) of float data as precisely as ATen's CPU kernels (Welford in double), in one
    pass: y = x - c in double with c each slice's first element, S = sum(y), Q = sum(y^2) over
    the same loop, mean = c + S / n, var = (Q - S * S / n) / denom (clamped at 0), each rounded
    once to `dtype`. Every x converts exactly and y is exact or off by one double rounding, so
    neither a mean far from 0 (x + 1000) nor one far below the spread (a zero-mean row, a conv
    filter) cancels float digits (docs/design/061). The shift bounds the cancellation in Q's
    correction for every input: (c - mean)^2 <= n * var (c is one of the n terms), so it costs
    at most log2(n) of double's 53 bits (docs/design/067). n equal values give exactly c and
    exactly 0 (y = 0). A non-finite c shifts by 0 (an inf first element keeps mean inf, as the
    unshifted sum). Two passes in double (S, then Q around S / n) ran at 0.8x eager's LayerNorm
    and GroupNorm on Zen 4, where a 512-bit double op issues as two halves."""
    f64 = torch.float64
    lx = broadcast_loader(x, x.size, f64)
    first = _slice_first(lx, d, n, f64, finite=True)

    def shifted(index):
        return ops.sub(lx(index), first(index))

    def squared(index):
        y = shifted(index)
        return ops.mul(y, y)
    s = reduce(ctx, Pending(Pointwise(x.size, f64, shifted)), d, True, "sum", f64, src_dtype=f64)
    q = reduce(ctx, Pending(Pointwise(x.size, f64, squared)), d, True, "sum", f64, src_dtype=f64)
    ls, lq = s.loader(), q.loader()
    zero = lambda: ops.constant(0.0, f64)  # noqa: E731

    def mean(index):
        return ops.add(first(index), ops.truediv(ls(index), ops.constant(n, f64)))

    def var(index):     # Q - S^2 / n >= 0 exactly; rounding may leave a tiny negative (nan stays)
        t = ops.sub(lq(index), ops.mul(ls(index), ops.truediv(ls(index), ops.constant(n, f64))))
        t = ops.where(ops.lt(t, zero()), zero(), t)
        return ops.truediv(t, ops.constant(denom, f64))
    return (_cast(Pending(Pointwise(s.size, f64, var)), dtype),
            _cast(Pending(Pointwise(s.size, f64, mean)), dtype))


def _var_mean_shifted(ctx, x, d, n, denom, dtype, cd):
    """(var, mean) with sums in the compute dtype (Triton; double data), of the data shifted by
    each slice's first element c."""
    lx = broadcast_loader(x, x.size, cd)
    first = _slice_first(lx, d, n, cd)
    # the data shifted by c, y = x - c: mean c + sum(y) / n, variance sum((y - sum(y)/n)^2)/n'.
    # n equal values give exactly c and exactly 0, as eager's Welford does (sum(x) / n rounds,
    # and a std of 3e-8 flipped a `std > 0` test), and a mean far from 0 cancels fewer digits.
    # (Triton's find_welford matches the two sums in this form: the second reads the first's y.)
    def shifted(index):
        return ops.sub(lx(index), first(index))
    s = reduce(ctx, Pending(Pointwise(x.size, dtype, shifted)), d, True, "sum", dtype)
    ksize = s.size
    shift_k = Pending(Pointwise(ksize, dtype,
                                _scale(s.loader(), 1.0 / n if n else float("nan"), cd)))
    lshift = shift_k.loader()
    mean_k = Pending(Pointwise(ksize, dtype, lambda i: ops.add(first(i), lshift(i))))
    lsh = broadcast_loader(shift_k, x.size, cd)

    def sq(index):
        diff = ops.sub(shifted(index), lsh(index))
        return ops.mul(diff, diff)
    sq_val = Pending(Pointwise(x.size, dtype, sq))
    ss = reduce(ctx, sq_val, d, True, "sum", dtype)
    var_k = Pending(Pointwise(ksize, dtype, _scale(ss.loader(), 1.0 / denom if denom else float("inf"), cd)))
    if denom == 0:
        var_k = Pending(Pointwise(ksize, dtype, _div_const(ss.loader(), 0.0, cd)))
    return var_k, mean_k


def _slice_first(lx, d, n, dtype, finite=False):
    """c(index): the first element of each slice reduced over dims d (the index at 0 there),
    0 for an empty slice (it has none; with a symbolic n, read under an `n > 0` mask);
    `finite`: 0 also where that element is not finite."""
    def first(index):
        at0 = [sympy.Integer(0) if i in d else v for i, v in enumerate(index)]

        def load():
            c = lx(at0)
            return ops.where(ops.isfinite(c), c, ops.constant(0.0, dtype)) if finite else c
        if isinstance(n, (int, sympy.Integer)):
            return load() if n > 0 else ops.constant(0.0, dtype)
        nonempty = ops.gt(ops.index_expr(n, torch.int64), ops.constant(0, torch.int64))
        return ops.masked(nonempty, load, 0.0)
    return first


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
