"""Stage 3, decomp: complex values as real pairs.

Kernels are written for real dtypes. A complex tensor z of shape S is computed through its
`view_as_real` layout, a real tensor of shape S + (2,) (re, im interleaved; complex64 →
float32, complex128 → float64). `COMPLEX[aten_op] = fn` rewrites one op with complex operands
or result into aten ops on those real pairs, with `view_as_real` on each complex operand and
`view_as_complex` on the result:

    mul(z, w)  →  view_as_complex(cat([(zr*wr - zi*wi)[..., None], (zr*wi + zi*wr)[..., None]], -1))

Views of a complex tensor (view, permute, expand, slice, select, ...) are the same view of the
pair with the pair dim kept last, so they stay views. `fold_pairs` then cancels each
`view_as_real(view_as_complex(x))` into `x`: between rewritten ops no complex value is left,
only at the graph's edges (a complex input: one free `view_as_real`; a complex output: one
`view_as_complex` of a dense pair) and around an op without a rule here (FFT, linalg, complex
matmul), which keeps its complex operands and stays an aten extern, exactly as before.

Where it runs: the kernel backend re-traces an aten graph that holds a complex value through
the aot tracer with `table()` (backends/ember.py); the graph is functional by then, so a view
op written here as a computation (`_conj`, `_neg_view`) cannot lose a write through it. A rule
returns NotImplemented for an input it does not cover (complex32, a complex `alpha`, a
conjugate- or negative-bit operand) and the op stays complex.

Consumes: aten ops on complex tensors. Produces: aten PRIMS on real tensors + the two views.
"""
from __future__ import annotations

import functools

import torch
import torch.fx as fx

from ._util import canonical_dim, canonical_dims, promote, to
from . import shapes
from .registry import DECOMPS

aten = torch.ops.aten
COMPLEX: dict = {}
_PAIR_VIEWS = (aten.view_as_real.default, aten.view_as_complex.default)
_REAL = {torch.complex64: torch.float32, torch.complex128: torch.float64}
_COMPLEX = {v: k for k, v in _REAL.items()}


class _Decline(Exception):
    """An input this table does not cover: the op keeps its complex operands."""


def rule(*ops):
    def deco(fn):
        @functools.wraps(fn)
        def entry(*args, **kwargs):
            if not _involves_complex(args, kwargs):
                return NotImplemented
            try:
                return fn(*args, **kwargs)
            except _Decline:
                return NotImplemented
        for op in ops:
            COMPLEX[op] = entry
        return fn
    return deco


def table() -> dict:
    """The decomposition table for the re-trace: complex rules first, then the real ones (the
    real ops a rule emits decompose to PRIMS as usual)."""
    out = dict(DECOMPS)
    for op, fn in DECOMPS.items():
        if fn.decomposition.__module__ == shapes.__name__:
            # data movement (stack, repeat, flip, roll, tril, ...): written for any dtype, its
            # views and copies land on the rules below
            out[op] = fn.decomposition
    for op, fn in COMPLEX.items():
        real = DECOMPS.get(op)
        out[op] = fn if real is None else _first(fn, real)
    return out


def _first(a, b):
    def entry(*args, **kwargs):
        out = a(*args, **kwargs)
        return b(*args, **kwargs) if out is NotImplemented else out
    return entry


def has_complex(gm: fx.GraphModule) -> bool:
    """Does any value of the graph (or a neg-bit view, made only from a complex one) hold a
    complex dtype?"""
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        for t in (v if isinstance(v, (tuple, list)) else (v,)):
            if isinstance(t, torch.Tensor) and t.is_complex():
                return True
    return False


def fold_pairs(gm: fx.GraphModule) -> fx.GraphModule:
    """`view_as_real(view_as_complex(x))` → x and `view_as_complex(view_as_real(z))` → z (each
    pair is the identity on sizes, strides and storage); then the ops nothing reads any more
    (pairs a rule re-split, see _join) are removed, but never a random or mutating one."""
    g = gm.graph
    for n in list(g.nodes):
        if n.op == "call_function" and n.target in _PAIR_VIEWS:
            src = n.args[0]
            if isinstance(src, fx.Node) and src.op == "call_function" and \
                    src.target in _PAIR_VIEWS and src.target is not n.target:
                n.replace_all_uses_with(src.args[0])
    for n in reversed(list(g.nodes)):
        if n.op == "call_function" and not n.users and isinstance(n.target, torch._ops.OpOverload) \
                and not n.target._schema.is_mutable \
                and torch.Tag.nondeterministic_seeded not in n.target.tags:
            g.erase_node(n)
    g.lint()
    gm.recompile()
    return gm


def keep_layout(t: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
    """t (a re-traced graph output) stored with the strides of `meta` (the output as the graph
    first had it, which the runtime and the next graph were traced with): a real pair result
    is dense, a complex output of a permuted value was not."""
    same = all(a == b for n, a, b in zip(t.shape, t.stride(), meta.stride()) if n != 1)
    if same or t.shape != meta.shape or t.is_complex() and t.dtype not in _REAL:
        return t
    if not t.is_complex():
        return aten.copy.default(aten.empty_strided.default(
            list(meta.shape), list(meta.stride()), dtype=t.dtype, device=t.device), t)
    rd = _real_dtype(t.dtype)
    dst = aten.empty_strided.default(list(meta.shape) + [2], [2 * s for s in meta.stride()] + [1],
                                     dtype=rd, device=t.device)
    return _complex(aten.copy.default(dst, _pair(t)))


# ---------------------------------------------------------------------- operands and results

def _involves_complex(args, kwargs) -> bool:
    def cplx(a):
        if isinstance(a, torch.Tensor):
            return a.is_complex()
        if isinstance(a, (list, tuple)):
            return any(cplx(x) for x in a)
        if isinstance(a, torch.dtype):
            return a.is_complex
        return isinstance(a, complex)
    return any(cplx(a) for a in args) or any(cplx(v) for v in kwargs.values())


def _real_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype not in _REAL:
        raise _Decline(dtype)        # complex32
    return _REAL[dtype]


def _pair(z: torch.Tensor) -> torch.Tensor:
    """The real (..., 2) view of complex z."""
    if z.is_conj() or z.is_neg():
        raise _Decline("conjugate or negative bit")
    _real_dtype(z.dtype)
    r = getattr(z, "_ember_pair", None)
    if r is None:               # one view per complex value (the graph is functional)
        r = z._ember_pair = aten.view_as_real.default(z)
    return r


def _complex(r: torch.Tensor) -> torch.Tensor:
    return aten.view_as_complex.default(r)


def _parts(x, rd):
    """(re, im) of an operand in real dtype rd; im is None for a real operand (zero)."""
    if isinstance(x, torch.Tensor):
        made = getattr(x, "_ember_parts", None)
        if made is not None:        # made by _join in this trace: its parts, not a re-split
            return to(made[0], rd), to(made[1], rd)
        if x.is_complex():
            r = _pair(x)
            return to(aten.select.int(r, -1, 0), rd), to(aten.select.int(r, -1, 1), rd)
        if x.is_neg():
            raise _Decline("negative bit")
        return to(x, rd), None
    if isinstance(x, complex):
        return x.real, x.imag
    return float(x), None


def _join(re, im, shape, rd, device) -> torch.Tensor:
    """The complex tensor of `shape` with real part re and imaginary part im (tensors
    broadcastable to shape, Python numbers, or None for zero): a dense (..., 2) pair."""
    def side(v):
        if not isinstance(v, torch.Tensor):
            v = aten.full.default([], 0.0 if v is None else v, dtype=rd, device=device)
        v = to(v, rd)
        if tuple(v.shape) != tuple(shape):
            v = aten.expand.default(v, list(shape))
        return v
    re, im = side(re), side(im)
    z = _complex(aten.cat.default([aten.unsqueeze.default(re, -1),
                                   aten.unsqueeze.default(im, -1)], -1))
    # the next rule reading z takes (re, im) as they are; the cat feeds only what still needs
    # the pair (an output, a view of z, an op without a rule) and is removed otherwise
    z._ember_parts = (re, im)
    return z


def _as(x, rd):
    """x as a complex tensor of real dtype rd's complex type."""
    if x.is_complex() and x.dtype == _COMPLEX[rd]:
        return x
    re, im = _parts(x, rd)
    return _join(re, im, x.shape, rd, x.device)


def _shape(*xs):
    return tuple(torch.broadcast_shapes(*[tuple(x.shape) for x in xs
                                          if isinstance(x, torch.Tensor)]))


def _device(*xs):
    return next(x.device for x in xs if isinstance(x, torch.Tensor))


def _combine(higher, lower):
    """ATen's combine_categories: a dimensioned tensor's dtype wins over a 0-dim one's and a
    Python number's unless theirs is a higher category."""
    if higher is None:
        return lower
    if lower is None or higher.is_complex:
        return higher
    if lower.is_complex:
        return {torch.float64: torch.complex128}.get(higher, torch.complex64) \
            if higher.is_floating_point else lower
    if higher.is_floating_point:
        return higher
    if higher == torch.bool or lower.is_floating_point:
        return promote(higher, lower)
    return higher


def result_dtype(*xs) -> torch.dtype:
    """Eager's result dtype of a pointwise op on tensors and Python numbers (torch.result_type
    is itself an aten op and would be traced)."""
    tiers = [None, None, None]          # dimensioned tensors, 0-dim tensors, Python numbers
    for x in xs:
        if isinstance(x, torch.Tensor):
            tier, d = (0 if x.dim() else 1), x.dtype
        elif isinstance(x, bool):
            tier, d = 2, torch.bool
        elif isinstance(x, int):
            tier, d = 2, torch.int64
        elif isinstance(x, float):
            tier, d = 2, torch.get_default_dtype()
        elif isinstance(x, complex):
            tier, d = 2, (torch.complex128 if torch.get_default_dtype() == torch.float64
                          else torch.complex64)
        else:
            continue
        try:
            tiers[tier] = d if tiers[tier] is None else promote(tiers[tier], d)
        except KeyError:            # complex32, uint16, float8: not in the promotion table
            raise _Decline(d) from None
    return _combine(tiers[0], _combine(tiers[1], tiers[2]))


# ----------------------------------------------------------------------- real-pair arithmetic

def _add(a, b):
    if a is None:
        return b
    if b is None:
        return a
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        return a + b
    if not isinstance(a, torch.Tensor):
        a, b = b, a
    return aten.add.Tensor(a, b)


def _neg(a):
    if a is None:
        return None
    return aten.neg.default(a) if isinstance(a, torch.Tensor) else -a


def _mul(a, b):
    if a is None or b is None:
        return None
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        return a * b
    if not isinstance(a, torch.Tensor):
        a, b = b, a
    return aten.mul.Tensor(a, b)


def _sub(a, b):
    return _add(a, _neg(b))


def _binary(a, b, alpha=1):
    """(out dtype, real dtype, parts of a, parts of b scaled by alpha)."""
    if isinstance(alpha, complex):
        raise _Decline("complex alpha")
    out = result_dtype(a, b)
    rd = _real_dtype(out)
    (ar, ai), (br, bi) = _parts(a, rd), _parts(b, rd)
    if alpha != 1:
        br, bi = _mul(br, alpha), _mul(bi, alpha)
    return rd, ar, ai, br, bi


@rule(aten.add.Tensor, aten.add.Scalar)
def add(a, b, alpha=1):
    rd, ar, ai, br, bi = _binary(a, b, alpha)
    return _join(_add(ar, br), _add(ai, bi), _shape(a, b), rd, _device(a, b))


@rule(aten.sub.Tensor, aten.sub.Scalar)
def sub(a, b, alpha=1):
    rd, ar, ai, br, bi = _binary(a, b, alpha)
    return _join(_sub(ar, br), _sub(ai, bi), _shape(a, b), rd, _device(a, b))


@rule(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(a, b, alpha=1):
    return sub(b, a) if alpha == 1 else sub(b, mul(a, alpha))


@rule(aten.mul.Tensor, aten.mul.Scalar)
def mul(a, b):
    rd, ar, ai, br, bi = _binary(a, b)
    re = _sub(_mul(ar, br), _mul(ai, bi))
    im = _add(_mul(ar, bi), _mul(ai, br))
    return _join(re, im, _shape(a, b), rd, _device(a, b))


@rule(aten.div.Tensor, aten.div.Scalar)
def div(a, b):
    rd, ar, ai, br, bi = _binary(a, b)
    if bi is None:                      # by a real divisor: each part
        return _join(_div(ar, br), _div(ai, br), _shape(a, b), rd, _device(a, b))
    if not isinstance(br, torch.Tensor):
        br = aten.full.default([], br, dtype=rd, device=_device(a, b))
    if not isinstance(bi, torch.Tensor):
        bi = aten.full.default([], bi, dtype=rd, device=_device(a, b))
    if ai is None:
        ai = 0.0
    # Smith's algorithm, as c10::complex's operator/ (no overflow of |b|^2 for large b)
    small = aten.ge.Tensor(aten.abs.default(br), aten.abs.default(bi))
    rat = aten.where.self(small, aten.div.Tensor(bi, br), aten.div.Tensor(br, bi))
    den = aten.where.self(small, _add(br, _mul(bi, rat)), _add(bi, _mul(br, rat)))
    re = aten.where.self(small, _add(ar, _mul(ai, rat)), _add(_mul(ar, rat), ai))
    im = aten.where.self(small, _sub(ai, _mul(ar, rat)), _sub(_mul(ai, rat), ar))
    re, im = _div(re, den), _div(im, den)
    # by 0 + 0j: each part divided by zero (inf or nan), as c10::complex's operator/
    zero = aten.bitwise_and.Tensor(aten.eq.Scalar(br, 0), aten.eq.Scalar(bi, 0))
    re = aten.where.self(zero, _div(ar, aten.abs.default(br)), re)
    im = aten.where.self(zero, _div(ai, aten.abs.default(bi)), im)
    return _join(re, im, _shape(a, b), rd, _device(a, b))


def _div(a, b):
    if a is None:
        return None
    if not isinstance(a, torch.Tensor):
        return aten.mul.Tensor(aten.reciprocal.default(b), a)
    return aten.div.Tensor(a, b)


@rule(aten.reciprocal.default)
def reciprocal(z):
    return div(1.0, z)


@rule(aten.neg.default)
def neg(z):
    re, im = _parts(z, _real_dtype(z.dtype))
    return _join(_neg(re), _neg(im), z.shape, re.dtype, z.device)


@rule(aten._conj.default, aten.conj_physical.default, aten._conj_physical.default)
def conj(z):
    re, im = _parts(z, _real_dtype(z.dtype))
    return _join(re, _neg(im), z.shape, re.dtype, z.device)


@rule(aten.clone.default, aten.resolve_conj.default, aten.resolve_neg.default,
      aten.alias.default)
def clone(z, memory_format=None):
    re, im = _parts(z, _real_dtype(z.dtype))
    return _join(re, im, z.shape, re.dtype, z.device)


@rule(aten.copy.default)
def copy(dst, src, non_blocking=False):
    if dst.device != src.device:
        raise _Decline("device copy")
    if not dst.is_complex():
        return to(aten.expand.default(_parts(src, _real_dtype(src.dtype))[0],
                                      list(dst.shape)), dst.dtype)
    rd = _real_dtype(dst.dtype)
    re, im = _parts(src, rd)
    return _join(re, im, dst.shape, rd, dst.device)


@rule(aten._to_copy.default)
def to_copy(z, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None):
    if device is not None and torch.device(device) != z.device or \
            layout not in (None, torch.strided):
        raise _Decline("device or layout")
    dtype = dtype or z.dtype
    if not dtype.is_complex:            # complex → real drops the imaginary part (eager warns)
        return to(_parts(z, _real_dtype(z.dtype))[0], dtype)
    rd = _real_dtype(dtype)
    re, im = _parts(z, rd)
    return _join(re, im, z.shape, rd, z.device)


@rule(aten.abs.default)
def abs_(z):
    re, im = _parts(z, _real_dtype(z.dtype))
    # |z| = m * sqrt((re/m)^2 + (im/m)^2), m = max(|re|, |im|): re^2 would overflow for
    # |re| > 1.8e19 in float32 where eager's hypot does not
    m = aten.maximum.default(aten.abs.default(re), aten.abs.default(im))
    safe = aten.where.self(aten.eq.Scalar(m, 0), aten.full.default([], 1.0, dtype=m.dtype,
                                                                  device=m.device), m)
    s = aten.add.Tensor(aten.mul.Tensor(_div(re, safe), _div(re, safe)),
                        aten.mul.Tensor(_div(im, safe), _div(im, safe)))
    out = aten.mul.Tensor(m, aten.sqrt.default(s))
    # an infinite part makes |z| infinite even when the other is NaN (hypot's rule)
    inf = aten.bitwise_or.Tensor(aten.eq.Scalar(aten.abs.default(re), float("inf")),
                                 aten.eq.Scalar(aten.abs.default(im), float("inf")))
    return aten.where.self(inf, aten.full.default([], float("inf"), dtype=m.dtype,
                                                  device=m.device), out)


@rule(aten.angle.default)
def angle(z):
    re, im = _parts(z, _real_dtype(z.dtype))
    return aten.atan2.default(im, re)


@rule(aten.sgn.default)
def sgn(z):
    rd = _real_dtype(z.dtype)
    re, im = _parts(z, rd)
    a = abs_(z)
    zero = aten.eq.Scalar(a, 0)
    safe = aten.where.self(zero, aten.full.default([], 1.0, dtype=rd, device=z.device), a)
    zf = aten.full.default([], 0.0, dtype=rd, device=z.device)
    return _join(aten.where.self(zero, zf, _div(re, safe)),
                 aten.where.self(zero, zf, _div(im, safe)), z.shape, rd, z.device)


@rule(aten.exp.default)
def exp(z):
    re, im = _parts(z, _real_dtype(z.dtype))
    e = aten.exp.default(re)
    # a zero imaginary part stays zero (exp(inf + 0j) = inf + 0j, not inf * sin(0) = nan)
    sin = aten.where.self(aten.eq.Scalar(im, 0), im, aten.mul.Tensor(e, aten.sin.default(im)))
    return _join(aten.mul.Tensor(e, aten.cos.default(im)), sin, z.shape, re.dtype, z.device)


def _real_operands_rule(fn):
    """polar/complex take real tensors and make a complex one: not found by _involves_complex."""
    def entry(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except _Decline:
            return NotImplemented
    return entry


def polar(r, theta):
    rd = r.dtype
    _real_dtype(torch.complex128 if rd == torch.float64 else torch.complex64)
    shape = _shape(r, theta)
    return _join(aten.mul.Tensor(r, aten.cos.default(theta)),
                 aten.mul.Tensor(r, aten.sin.default(theta)), shape, rd, r.device)


def complex_(re, im):
    if re.dtype not in (torch.float32, torch.float64):
        raise _Decline("complex32")
    return _join(re, im, _shape(re, im), re.dtype, re.device)


COMPLEX[aten.polar.default] = _real_operands_rule(polar)
# a real tensor with the negative bit (imag of a conjugate) is read negated
COMPLEX[aten._neg_view.default] = _real_operands_rule(
    lambda x: neg(x) if x.is_complex() else aten.neg.default(x))
COMPLEX[aten.complex.default] = _real_operands_rule(complex_)


def _compare(a, b, eq):
    out = result_dtype(a, b)
    if not out.is_complex:
        raise _Decline("real compare")
    rd = _real_dtype(out)
    (ar, ai), (br, bi) = _parts(a, rd), _parts(b, rd)
    dev = _device(a, b)

    def side(x, y):
        x = 0.0 if x is None else x
        y = 0.0 if y is None else y
        if not isinstance(x, torch.Tensor):
            x, y = y, x
        if not isinstance(x, torch.Tensor):
            x = aten.full.default([], x, dtype=rd, device=dev)
        return (aten.eq.Tensor if eq else aten.ne.Tensor)(x, y) if isinstance(y, torch.Tensor) \
            else (aten.eq.Scalar if eq else aten.ne.Scalar)(x, y)
    both = aten.bitwise_and.Tensor if eq else aten.bitwise_or.Tensor
    out = both(side(ar, br), side(ai, bi))
    shape = _shape(a, b)
    return out if tuple(out.shape) == shape else aten.expand.default(out, list(shape))


@rule(aten.eq.Tensor, aten.eq.Scalar)
def eq(a, b):
    return _compare(a, b, True)


@rule(aten.ne.Tensor, aten.ne.Scalar)
def ne(a, b):
    return _compare(a, b, False)


@rule(aten.where.self)
def where(cond, a, b):
    rd, ar, ai, br, bi = _binary(a, b)
    dev = _device(a, b)

    def tensor(v):
        return v if isinstance(v, torch.Tensor) else \
            aten.full.default([], 0.0 if v is None else v, dtype=rd, device=dev)
    return _join(aten.where.self(cond, tensor(ar), tensor(br)),
                 aten.where.self(cond, tensor(ai), tensor(bi)), _shape(cond, a, b), rd, dev)


# --------------------------------------------------------------------------------- reductions

def _reduce(mean, z, dim, keepdim, dtype):
    if dtype is not None:
        z = to_copy(z, dtype)
    r = _pair(z)
    dims = canonical_dims(dim, z.dim()) if z.dim() else []
    if not dims:
        return clone(z)
    out = aten.sum.dim_IntList(r, dims, keepdim)
    if mean:
        n = 1
        for d in dims:
            n *= z.shape[d]
        out = aten.div.Tensor(out, n)
    return _complex(out)


@rule(aten.sum.dim_IntList)
def sum_(z, dim=None, keepdim=False, dtype=None):
    return _reduce(False, z, dim, keepdim, dtype)


@rule(aten.sum.default)
def sum_all(z, dtype=None):
    return _reduce(False, z, None, False, dtype)


@rule(aten.mean.dim)
def mean(z, dim=None, keepdim=False, dtype=None):
    return _reduce(True, z, dim, keepdim, dtype)


# ---------------------------------------------------------------------------------- creation

def _creation(size, value, dtype, device, stride=None):
    rd = _real_dtype(dtype)
    if stride is not None:
        # empty_strided: the pair with the complex strides doubled, the pair dim dense
        return _complex(aten.empty_strided.default(list(size) + [2], [2 * s for s in stride] + [1],
                                                   dtype=rd, device=device))
    if value is None:
        return _complex(aten.empty.memory_format(list(size) + [2], dtype=rd, device=device))
    value = complex(value)
    return _join(value.real, value.imag, tuple(size), rd, device)


@rule(aten.full.default)
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    if dtype is None and isinstance(fill_value, complex):
        dtype = result_dtype(fill_value)
    if dtype is None or not dtype.is_complex:
        raise _Decline("real full")
    return _creation(size, fill_value, dtype, device)


@rule(aten.scalar_tensor.default)
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    if dtype is None or not dtype.is_complex:
        raise _Decline("real scalar_tensor")
    return _creation([], s, dtype, device)


@rule(aten.empty.memory_format)
def empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    if dtype is None or not dtype.is_complex:
        raise _Decline("real empty")
    return _creation(size, None, dtype, device)


@rule(aten.empty_strided.default)
def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    if dtype is None or not dtype.is_complex:
        raise _Decline("real empty_strided")
    return _creation(size, None, dtype, device, stride)


@rule(aten.fill.Scalar)
def fill(z, value):
    return _creation(z.shape, value, z.dtype, z.device)


# -------------------------------------------------------------------------------------- views
# the same view of the pair, its (re, im) dim kept last

def _view(op, z, *args):
    return _complex(op(_pair(z), *args))


@rule(aten.view.default, aten._unsafe_view.default)
def view(z, size):
    return _view(aten.view.default, z, list(size) + [2])


@rule(aten.expand.default)
def expand(z, size, implicit=False):
    return _view(aten.expand.default, z, list(size) + [2])


@rule(aten.permute.default)
def permute(z, dims):
    return _view(aten.permute.default, z, canonical_dims(dims, z.dim()) + [z.dim()])


@rule(aten.transpose.int)
def transpose(z, d0, d1):
    dims = list(range(z.dim()))
    a, b = canonical_dim(d0, z.dim()), canonical_dim(d1, z.dim())
    dims[a], dims[b] = dims[b], dims[a]
    return permute(z, dims)


@rule(aten.t.default)
def t(z):
    return transpose(z, 0, 1) if z.dim() == 2 else alias_view(z)


def alias_view(z):
    return _view(aten.alias.default, z)


@rule(aten.squeeze.dims, aten.squeeze.dim, aten.squeeze.default)
def squeeze(z, dims=None):
    dims = [d for d in canonical_dims(dims, z.dim()) if z.shape[d] == 1] if z.dim() else []
    return _view(aten.squeeze.dims, z, dims) if dims else alias_view(z)


@rule(aten.unsqueeze.default)
def unsqueeze(z, dim):
    return _view(aten.unsqueeze.default, z, canonical_dim(dim, z.dim() + 1))


@rule(aten.slice.Tensor)
def slice_(z, dim=0, start=None, end=None, step=1):
    return _view(aten.slice.Tensor, z, canonical_dim(dim, z.dim()), start, end, step)


@rule(aten.select.int)
def select(z, dim, index):
    return _view(aten.select.int, z, canonical_dim(dim, z.dim()), index)


@rule(aten.as_strided.default)
def as_strided(z, size, stride, storage_offset=None):
    off = None if storage_offset is None else 2 * storage_offset
    return _view(aten.as_strided.default, z, list(size) + [2], [2 * s for s in stride] + [1], off)


@rule(aten.unbind.int)
def unbind(z, dim=0):
    d = canonical_dim(dim, z.dim())
    return [select(z, d, i) for i in range(z.shape[d])]


@rule(aten.split.Tensor)
def split(z, split_size, dim=0):
    d = canonical_dim(dim, z.dim())
    n = z.shape[d]
    return [slice_(z, d, s, min(s + split_size, n)) for s in range(0, max(n, 1), split_size)]


@rule(aten.split_with_sizes.default)
def split_with_sizes(z, split_sizes, dim=0):
    d = canonical_dim(dim, z.dim())
    out, s = [], 0
    for n in split_sizes:
        out.append(slice_(z, d, s, s + n))
        s += n
    return out


@rule(aten.cat.default)
def cat(tensors, dim=0):
    out = result_dtype(*[t for t in tensors])
    if any(t.dim() != tensors[0].dim() for t in tensors) or tensors[0].dim() == 0:
        raise _Decline("cat of tensors of different ranks (legacy empty)")
    rd = _real_dtype(out)
    pairs = []
    for t in tensors:
        if t.dtype != out:
            re, im = _parts(t, rd)
            t = _join(re, im, t.shape, rd, t.device)
        pairs.append(_pair(t))
    return _complex(aten.cat.default(pairs, canonical_dim(dim, tensors[0].dim())))


# --------------------------------------------------------------------------- data movement
# the same op on the pair: index lists and pads never reach its trailing (re, im) dim

@rule(aten.constant_pad_nd.default)
def constant_pad_nd(z, pad, value=0):
    if value != 0:
        raise _Decline("a nonzero pad value")
    return _view(aten.constant_pad_nd.default, z, [0, 0] + list(pad), 0.0)


@rule(aten.index.Tensor, aten._unsafe_index.Tensor)
def index(z, indices):
    if not z.is_complex():
        raise _Decline("real values")
    return _view(aten.index.Tensor, z, list(indices))


@rule(aten.slice_scatter.default)
def slice_scatter(z, src, dim=0, start=None, end=None, step=1):
    rd = _real_dtype(z.dtype)
    return _view(aten.slice_scatter.default, z, _pair(_as(src, rd)), canonical_dim(dim, z.dim()),
                 start, end, step)


@rule(aten.select_scatter.default)
def select_scatter(z, src, dim, index):
    rd = _real_dtype(z.dtype)
    return _view(aten.select_scatter.default, z, _pair(_as(src, rd)),
                 canonical_dim(dim, z.dim()), index)
