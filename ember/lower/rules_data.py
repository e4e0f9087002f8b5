"""Stage 4, lower: rules for views, data movement (cat/pad/gather/index/max-pool) and externs.

Same contract as `rules.py` (this file registers into the same `RULES` table): views return a
strided `View` when the layout allows (computed by applying the op to a meta tensor) and a
`Reindex` otherwise; indexing ops are pointwise bodies with masked or indirect loads.

Consumes: GraphLowering helpers (ctx). Produces: entries in rules.RULES.
"""
from __future__ import annotations

import functools
import itertools
import math

import sympy
import torch

from ..loopir.index import contiguous_strides, is_symbolic, numel
from ..loopir.ops import compute_dtype, ops
from ..loopir.nodes import InputBuffer, Pointwise, scatter_body
from .index_prop import constant_value, static_index, window_preimage
from .ir import (Pending, Reindex, SHAPE_ENV, TensorValue, View, as_size, as_sizes, dense_permutation,
                 meta_strided, meta_view, view_chain, view_impl)
from .rules import RULES, broadcast_loader, out_meta, rule
from ..errors import Unsupported

aten = torch.ops.aten
prims = torch.ops.prims

def broadcast_sizes(*sizes) -> tuple:
    """torch.broadcast_shapes for IR sizes (ints or sympy expressions; the meta trace checked
    that they broadcast)."""
    n = max((len(s) for s in sizes), default=0)
    out = []
    for i in range(n):
        dims = [s[len(s) - n + i] for s in sizes if len(s) - n + i >= 0]
        out.append(next((d for d in dims if d != 1), 1))
    return tuple(out)


# --- views -----------------------------------------------------------------------------------

@rule(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def view(ctx, node, x, size):
    return view_impl(x, size)


@rule(prims.collapse_view.default)
def collapse_view(ctx, node, x, start, end):
    return view_impl(x, as_sizes(out_meta(node).shape))


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
    return Reindex(x, tuple(x.size[d] for d in dims), reindex, view_fn=lambda t: t.permute(dims))


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
    size = as_sizes(out_meta(node).shape)
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
    if tuple(xs) == tuple(size):
        return x        # matmul's expand to its own size: the value stays a view chain
    lead = len(size) - len(xs)
    return Reindex(x, size, lambda index: [sympy.Integer(0) if xs[i] == 1 else index[i + lead]
                                           for i in range(len(xs))])


@rule(aten.unsqueeze.default)
def unsqueeze(ctx, node, x, dim):
    return view_impl(x, as_sizes(out_meta(node).shape)) if not isinstance(x, View) else meta_view(
        x, lambda t: t.unsqueeze(dim))


@rule(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def squeeze(ctx, node, x, dims=None):
    return view_impl(x, as_sizes(out_meta(node).shape))


def known(rel):
    """A comparison of sizes: True/False, or None when symbolic sizes leave it open."""
    return bool(rel) if isinstance(rel, bool) or not rel.free_symbols else \
        SHAPE_ENV.get().static(rel)


def may_hold(rel) -> bool:
    """Whether a comparison of sizes can be true: a bounds check it guards is needed unless the
    sizes decide it false for every allowed value (a kept check is always correct; a size hint
    never decides what the kernel computes)."""
    return known(rel) is not False


def _slice_start(start, s):
    """torch's clamp of a slice start into [0, s]; None when symbolic sizes leave it open."""
    neg = known(sympy.sympify(start) < 0)
    if neg:
        start = start + s
        neg = known(sympy.sympify(start) < 0)
    over = known(sympy.sympify(start) > s)
    if neg is None or over is None:
        return None
    return 0 if neg else (s if over else start)


@rule(aten.slice.Tensor)
def slice_(ctx, node, x, dim=0, start=None, end=None, step=1):
    n = len(x.size)
    dim = dim % n
    size = as_sizes(out_meta(node).shape)
    s = x.size[dim]
    start = _slice_start(0 if start is None else start, s)
    if start is None:
        return NotImplemented              # symbolic sizes the bounds cannot order: an extern
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
    size = as_sizes(out_meta(node).shape)
    if isinstance(x, View):
        return View(x.buffer, size, x.stride[:dim] + x.stride[dim + 1:],
                    x.offset + idx * x.stride[dim])
    return Reindex(x, size, lambda index: list(index[:dim]) + [sympy.sympify(idx)] + list(index[dim:]))


@rule(aten.as_strided.default)
def as_strided(ctx, node, x, size, stride, storage_offset=None):
    """as_strided indexes x's *storage*, so x must be stored exactly as eager stores it: the
    traced layout of the argument (a channels-last x + 1 is channels-last storage). A value
    realized in another layout is copied into that one; a layout ember cannot own (a view with
    an offset into a computed base, overlapping strides) is refused loudly, never guessed."""
    if isinstance(x, View) and getattr(x, "exact_storage", False):
        # as_strided of as_strided: the first one checked that x.buffer is eager's storage
        off = x.offset if storage_offset is None else as_size(storage_offset)
        out = View(x.buffer, as_sizes(size), as_sizes(stride), off)
        out.exact_storage = True
        return out
    if isinstance(x, Reindex) or (isinstance(x, View) and not isinstance(x.buffer, InputBuffer)
                                  and not x.arg().is_whole):
        out = _within_footprint(ctx, node, x, size, stride, storage_offset)
        if out is None:
            raise Unsupported("as_strided of a view of a computed value reading outside that "
                              "view's own elements (its base's storage is not known)")
        return out
    if isinstance(x, View) and isinstance(x.buffer, InputBuffer):
        off = x.offset if storage_offset is None else as_size(storage_offset)
        return View(x.buffer, as_sizes(size), as_sizes(stride), off)
    m = out_meta(node.args[0])
    want, want_off = as_sizes(m.stride()), as_size(m.storage_offset())
    fresh = want_off == 0 and dense_permutation(m)
    v = ctx.realize(x, stride=want if fresh else None)
    if not _same_layout(v, want, want_off):
        if not fresh:
            raise Unsupported(f"as_strided of a value stored as {v.stride}+{v.offset}, traced "
                              f"as {want}+{want_off}")
        v = ctx.realize(Pending(Pointwise(v.size, v.dtype, v.loader())), stride=want)
    off = want_off if storage_offset is None else as_size(storage_offset)
    out = View(v.buffer, as_sizes(size), as_sizes(stride), off)
    out.exact_storage = True
    return out


#: view ops a traced value's storage layout is replayed through (_base_layout)
_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.slice.Tensor, aten.select.int,
          aten.permute.default, aten.transpose.int, aten.t.default, aten.unsqueeze.default,
          aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.expand.default,
          aten.alias.default, aten.diagonal.default, aten.unfold.default, aten.as_strided.default}


def _base_layout(node):
    """A meta tensor with the layout eager gives `node`'s value inside the storage of the value
    its chain of view ops starts from. The traced metas are not views of one another (a slice's
    meta has storage offset 0), so the views are replayed on the base's traced layout."""
    chain = []
    while isinstance(node, torch.fx.Node) and node.target in _VIEWS:
        chain.append(node)
        node = node.args[0]
    base = out_meta(node)
    t = meta_strided(as_sizes(base.shape), as_sizes(base.stride()), as_size(base.storage_offset()))
    for v in reversed(chain):
        t = v.target(t, *v.args[1:], **v.kwargs)
    return t


def _within_footprint(ctx, node, x, size, stride, storage_offset):
    """as_strided of a view of a computed value (Longformer's chunking: a reshape that eager
    returned as a view, then as_strided with strides derived from it). Eager reads the storage of
    x's base, which ember may not hold. When x's layout in that storage is dense (contiguous up
    to a permutation, at some offset) and every position the as_strided reads is one of x's own,
    those positions hold x's elements in that layout: view ember's buffer of x where ember stores
    x exactly so, else copy x once into that layout. None when the reads may leave x."""
    try:
        m = _base_layout(node.args[0])
        size, stride = [int(s) for s in size], [int(s) for s in stride]
        want, want_off = [int(s) for s in m.stride()], int(m.storage_offset())
        off = want_off if storage_offset is None else int(storage_offset)
        numel = int(m.numel())
    except (TypeError, RuntimeError):
        return None         # symbolic bounds (not proven inside), or a view that did not replay
    if not dense_permutation(m) or 0 in size or min(stride, default=0) < 0:
        return None
    last = off + sum((s - 1) * st for s, st in zip(size, stride))
    if off < want_off or last >= want_off + numel:
        return None
    if isinstance(x, View) and _same_layout(x, want, want_off):
        return View(x.buffer, tuple(size), tuple(stride), off)
    v = ctx.realize(Pending(Pointwise(x.size, x.dtype, x.loader())), stride=tuple(want))
    return View(v.buffer, tuple(size), tuple(stride), off - want_off)


def _same_layout(v, stride, offset) -> bool:
    return v.offset == offset and all(a == b for s, a, b in zip(v.size, v.stride, stride) if s != 1)


@rule(aten.split.Tensor, aten.split_with_sizes.default)
def split(ctx, node, x, split, dim=0):
    dim = dim % len(x.size)
    outs, start = [], 0
    metas = out_meta(node)
    for m in metas:
        length = as_size(m.shape[dim])
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
    return Reindex(x, size, lambda index: list(index[:dim]) + [sympy.sympify(i)] + list(index[dim:]))


# --- cat / pad / gather ----------------------------------------------------------------------

#: a cat of more parts is an aten.cat extern (as Inductor's max_pointwise_cat_inputs): as a loop,
#: each element would test every part's range (DenseNet's 32-way cats, whose channels-last
#: channel dim is the simd dim, ran scalar at ~20 ns an element; the extern is a memcpy per part)
POINTWISE_CAT_PARTS = 8


@rule(aten.cat.default)
def cat(ctx, node, tensors, dim=0):
    out = out_meta(node)
    size = as_sizes(out.shape)
    dim = dim % len(size)
    # legacy empty 1-D parts take no part in a cat; when all are empty, the (empty) result
    # reads the first
    parts = [t for t in tensors if not (len(t.size) == 1 and t.size[0] == 0)] or list(tensors[:1])
    if len(parts) > POINTWISE_CAT_PARTS:
        return ctx.extern(aten.cat.default, (list(tensors), dim), {}, out,
                          out_variant=aten.cat.out)
    cd = compute_dtype(out.dtype)
    offsets, acc = [], 0
    for t in parts:
        offsets.append(acc)
        acc += t.size[dim]
    loaders = [t.loader() for t in parts]

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
    size = as_sizes(out.shape)
    n = len(size)
    cd = compute_dtype(out.dtype)
    lows = [0] * n
    for k in range(len(pad) // 2):
        lows[n - 1 - k] = pad[2 * k]
    load = x.loader()
    # which bounds checks each dim needs, decided here while the graph's shape env is current
    low_check = [may_hold(sympy.sympify(lo) > 0) for lo in lows]
    crop = [may_hold(sympy.sympify(lo) < 0) for lo in lows]
    high_check = [may_hold(sympy.sympify(lo + xs) < s) or c for lo, xs, s, c in zip(lows, x.size, size, crop)]

    def inner(index):
        idx = [i - lo for i, lo in zip(index, lows)]
        conds = []
        for d in range(n):
            if low_check[d]:
                conds.append(ops.ge(ops.index_expr(idx[d], torch.int64), ops.constant(0, torch.int64)))
            if high_check[d]:
                conds.append(ops.lt(ops.index_expr(idx[d], torch.int64),
                                    ops.constant(x.size[d], torch.int64)))
            if crop[d]:
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
    size = as_sizes(out.shape)
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
    size = as_sizes(out.shape)
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
    size = as_sizes(out.shape)
    lw, li = weight.loader(), indices.loader()
    nidx = len(indices.size)
    rows = weight.size[0]

    def inner(idx):
        j = ops.indirect_indexing(li(idx[:nidx]), rows)
        return lw([j] + list(idx[nidx:]))
    return Pending(Pointwise(size, out.dtype, inner))


@rule(aten.index.Tensor)
def index(ctx, node, x, indices, check=True):
    out = out_meta(node)
    size = as_sizes(out.shape)
    if any(t is not None and (not isinstance(t, TensorValue) or t.dtype in (torch.bool, torch.uint8))
           for t in indices):
        return NotImplemented
    pos = [i for i, t in enumerate(indices) if t is not None]
    bshape = broadcast_sizes(*[indices[i].size for i in pos])
    nb = len(bshape)
    start = pos[0] if pos == list(range(pos[0], pos[-1] + 1)) else 0
    lx = x.loader()
    loaders = {i: broadcast_loader(indices[i], bshape) for i in pos}
    direct = {i: static_index(loaders[i], bshape, x.size[i]) for i in pos}
    for i in pos:
        if direct[i] is None and _index_table(ctx, indices[i], size):
            loaders[i] = broadcast_loader(indices[i], bshape)

    def inner(idx):
        bidx = list(idx[start:start + nb])
        rest = iter(list(idx[:start]) + list(idx[start + nb:]))
        full = []
        for d in range(len(x.size)):
            if direct.get(d) is not None:       # computed from the index alone (upsampling)
                expr, syms = direct[d]
                full.append(expr.xreplace(dict(zip(syms, bidx))))
            elif d in loaders:
                full.append(ops.indirect_indexing(loaders[d](bidx), x.size[d], check))
            else:
                full.append(next(rest))
        return lx(full)
    return Pending(Pointwise(size, out.dtype, inner))


def _index_table(ctx, index, out_size) -> bool:
    """Realize a computed index tensor (an interpolation's source positions, cast from float math
    of an arange) that the gather reads broadcast, at least twice per element: inlined, its body
    ran per gathered element, and g++ does not vectorize a float -> int64 cast next to a gather
    (bilinear upsampling at 0.7x eager). Stored once, it is an int64 table like ATen's
    per-output index/weight tables. Returns whether it realized one."""
    base = view_chain(index)[0] if isinstance(index, Reindex) else index
    if not isinstance(base, Pending) or base.realized is not None or \
            any(is_symbolic(s) for s in tuple(base.size) + tuple(out_size)):
        return False
    if math.prod(int(s) for s in out_size) < 2 * math.prod(int(s) for s in base.size):
        return False
    ctx.realize(base)
    return True


@rule(aten._unsafe_index.Tensor)
def unsafe_index(ctx, node, x, indices):
    """Indices a decomposition computed in range (upsampling, flip): no bounds check."""
    return index(ctx, node, x, indices, check=False)


@rule(aten.scatter.value, aten.scatter.src, aten.scatter_add.default)
def scatter_one_per_row(ctx, node, x, dim, index, src):
    """A scatter whose index holds one position per row along `dim` (index.size[dim] == 1, the
    other dims equal to x's: one-hot targets, nll_loss's backward) is pointwise: out[.., j, ..]
    = j == index[.., 0, ..] ? src : x (scatter_add: x + that or 0). No row writes twice, so this
    is eager's result; as an extern it cloned x (a zero fill) and scattered serially. An index
    >= n raises like eager (the bounds check); a negative one wraps as in ember's gather (eager
    raises: remapping it out of range made g++ 12 miscompile the checked simd loop, a segfault
    in nll_loss2d's backward). Other scatters are Scatter kernels (_scatter_rows) or aten
    externs."""
    if not x.size or len(index.size) != len(x.size):           # 0-d: the extern
        return extern_functional(ctx, node, x, dim, index, src)
    dim = dim % len(x.size)
    n = x.size[dim]
    ssize = src.size if isinstance(src, TensorValue) else ()
    if (any(map(is_symbolic, (*x.size, *index.size, *ssize)))
            or any(index.size[d] != x.size[d] for d in range(len(x.size)) if d != dim)
            or (isinstance(src, TensorValue) and any(src.size[d] < index.size[d]
                                                     for d in range(len(index.size))))):
        return extern_functional(ctx, node, x, dim, index, src)
    if index.size[dim] != 1:
        return _scatter_rows(ctx, node, x, dim, index, src)
    out = out_meta(node)
    lx, li = x.loader(), index.loader()
    ls = src.loader() if isinstance(src, TensorValue) else None
    cd = compute_dtype(out.dtype)
    add = node.target is aten.scatter_add.default

    def inner(idx):
        row = list(idx)
        row[dim] = sympy.Integer(0)
        j = ops.indirect_indexing(li(row), n)
        hit = ops.eq(ops.index_expr(idx[dim], torch.int64), ops.index_expr(j, torch.int64))
        value = (ops.to_dtype(ls(row), cd) if ls is not None
                 else ops.constant(torch.tensor(src).to(cd).item(), cd))
        old = ops.to_dtype(lx(idx), cd)
        if add:
            return ops.add(old, ops.where(hit, value, ops.constant(0, cd)))
        return ops.where(hit, value, old)
    return Pending(Pointwise(as_sizes(out.shape), out.dtype, inner))


def _scatter_rows(ctx, node, x, dim, index, src):
    """A scatter whose index has x's size in every dim but `dim` (gather's backward, a
    scatter_add of log-prob gradients): a Scatter kernel (codegen/cpp_scatter.py), rows in
    parallel, each row's sources in index order, so the sums are eager's bit for bit; the zero
    fill or copy of x and the producers of src are read in its loops. float32/float64 only
    (ints and 16-bit floats stay aten), C++ only (Triton: the extern), and not empty."""
    out = out_meta(node)
    if (not ctx.cpp or out.dtype not in (torch.float32, torch.float64) or out.numel() == 0
            or index.dtype != torch.int64
            or (isinstance(src, TensorValue) and src.dtype != out.dtype)):
        return extern_functional(ctx, node, x, dim, index, src)
    cd = compute_dtype(out.dtype)
    lx, li = x.loader(), index.loader()
    if isinstance(src, TensorValue):
        ls = src.loader()
        src_fn = (lambda p: ops.to_dtype(ls(p), cd))
    else:
        value = torch.tensor(src).to(cd).item()
        src_fn = (lambda p: ops.constant(value, cd))
    body = scatter_body(as_sizes(out.shape), out.dtype, dim, index.size[dim],
                        node.target is aten.scatter_add.default,
                        lambda i: ops.to_dtype(lx(i), cd), li, src_fn)
    buf = ctx.add_computed(body)
    return View(buf, buf.size, buf.stride, 0)


@rule(aten.index_put.default)
def index_put(ctx, node, x, indices, values, accumulate=False):
    """An accumulating index_put whose (adjacent) index tensors are static functions of one
    broadcast dim each, with window preimages (window_preimage: nearest upsampling's backward),
    is a gather-sum: out[x] = self[x] + the values of x's window, added in eager's order. As an
    extern it cloned self and accumulated serially (7x slower than eager's nearest backward).
    Everything else stays an aten extern."""
    plan = _window_plan(x, indices, values) if accumulate else None
    if plan is None:
        if accumulate and _row_accumulate(x, indices, values):
            return _index_add_rows(ctx, node, x, indices[0], values)
        return extern_functional(ctx, node, x, indices, values, accumulate)
    p0, wins, vshape, qsize = plan
    lx, lv = x.loader(), broadcast_loader(values, vshape)
    cd = compute_dtype(x.dtype)
    npos = len(wins)
    # whether window offset t of position n may leave [0, Q), decided while the shape env is current
    leaves = {(n, t): may_hold(sympy.sympify(c + t) < 0) or
              may_hold(sympy.sympify(a * (x.size[p0 + n] - 1) + c + t) >= qsize[j])
              for n, (j, a, c, k) in enumerate(wins) for t in range(k)}

    def inner(idx):
        acc = ops.to_dtype(lx(idx), cd)
        for ts in itertools.product(*[range(k) for _, _, _, k in wins]):
            q = [None] * npos
            conds = []
            for n, ((j, a, c, _), t) in enumerate(zip(wins, ts)):
                q[j] = a * idx[p0 + n] + c + t
                if leaves[n, t]:
                    e = ops.index_expr(q[j], torch.int64)
                    conds.append(ops.logical_and(ops.ge(e, ops.constant(0, torch.int64)),
                                                 ops.lt(e, ops.constant(qsize[j], torch.int64))))
            vidx = list(idx[:p0]) + q + list(idx[p0 + npos:])
            load = (lambda vidx=vidx: ops.to_dtype(lv(vidx), cd))
            if conds:
                mask = functools.reduce(ops.logical_and, conds)
                acc = ops.add(acc, ops.masked(mask, load, 0.0))
            else:
                acc = ops.add(acc, load())
        return acc
    return Pending(Pointwise(x.size, x.dtype, inner))


def _row_accumulate(x, indices, values) -> bool:
    """index_put(x, [idx], values, accumulate=True) with values of idx.shape + x.shape[1:]:
    embedding's backward, index_add over dim 0, a row segment-sum. float32/64 only: for 16-bit
    floats eager's index_put rounds after each add and index_add does not (other sums)."""
    idx = indices[0] if len(indices) == 1 else None
    return (isinstance(idx, TensorValue) and idx.dtype in (torch.int64, torch.int32)
            and len(idx.size) >= 1 and len(x.size) >= 1
            and x.dtype in (torch.float32, torch.float64)
            and values.dtype == x.dtype and tuple(values.size) == (*idx.size, *x.size[1:]))


def _index_add_rows(ctx, node, x, idx, values):
    """As aten.index_add(x, 0, idx, values), which adds whole rows through one reused iterator
    in index order (the sums of index_put's serial accumulate, bit for bit). index_put's
    accumulate walks elements with a per-element offset table (1.6x slower on 65536 rows of 128)
    and embedding_dense_backward does the rows of index_add with more overhead per row (1.2-1.5x);
    a destination of ours that dies here (a zero fill) is added into in place, no clone
    (Wrapper._extern_in_place). Negative indices are wrapped first (index_put's meaning;
    index_add rejects them); one out of range still raises."""
    n = x.size[0]
    li = idx.loader()

    def wrap(i):
        v = li(i)
        return ops.where(ops.lt(v, ops.constant(0, idx.dtype)), ops.add(v, ops.constant(n, idx.dtype)), v)
    rows = numel(idx.size)
    wrapped = ctx.realize(Pending(Pointwise(idx.size, idx.dtype, wrap)),
                          stride=contiguous_strides(idx.size))
    flat = View(wrapped.buffer, (rows,), (1,), wrapped.offset)
    return ctx.extern(aten.index_add.default, (x, 0, flat, view_impl(values, (rows, *x.size[1:]))),
                      {}, out_meta(node))


def _window_plan(x, indices, values):
    pos = [d for d, t in enumerate(indices) if t is not None]
    if (not pos or pos != list(range(pos[0], pos[-1] + 1)) or not x.dtype.is_floating_point
            or any(not isinstance(indices[d], TensorValue) or indices[d].dtype not in
                   (torch.int64, torch.int32) for d in pos)
            or any(map(is_symbolic, x.size))):
        return None
    bshape = broadcast_sizes(*[indices[d].size for d in pos])
    if len(bshape) != len(pos) or any(map(is_symbolic, bshape)):
        return None
    wins = []
    for d in pos:
        got = static_index(broadcast_loader(indices[d], bshape), bshape, x.size[d])
        if got is None:
            return None
        expr, syms = got
        used = [j for j, s_ in enumerate(syms) if s_ in expr.free_symbols]
        if len(used) != 1:
            return None
        w = window_preimage(expr, syms[used[0]], int(bshape[used[0]]), int(x.size[d]))
        if w is None:
            return None
        wins.append((used[0], *w))
    if sorted(j for j, *_ in wins) != list(range(len(pos))):
        return None            # a broadcast dim no index moves along: several sources per target
    if math.prod(k for *_, k in wins) > 16:
        return None
    p0 = pos[0]
    vshape = tuple(x.size[:p0]) + tuple(bshape) + tuple(x.size[p0 + len(pos):])
    return p0, wins, vshape, [int(b) for b in bshape]


@rule(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(ctx, node, x, kernel_size, stride=(), padding=0, dilation=1,
                            ceil_mode=False):
    """Window max as an unrolled pointwise body: values and indices are separate Pending
    values, so in inference the unused indices are never computed. Window positions and
    indices are int32 when the plane is small enough (and widened once at the end): the
    selects then have as many lanes as the float compares that drive them."""
    pair = lambda v: (v, v) if isinstance(v, int) else (tuple(v) * 2 if len(v) == 1 else tuple(v))  # noqa: E731
    (kh, kw), (ph, pw), (dh, dw) = pair(kernel_size), pair(padding), pair(dilation)
    sh, sw = pair(stride) if stride else (kh, kw)
    if not x.dtype.is_floating_point or len(x.size) not in (3, 4) or kh * kw > 49:
        return NotImplemented
    vmeta, imeta = out_meta(node)
    size = as_sizes(vmeta.shape)
    H, W = x.size[-2:]
    Ho, Wo = size[-2:]
    lx = x.loader()
    cd = compute_dtype(x.dtype)
    small = not any(map(is_symbolic, (H, W))) and (H + 2 * ph) * (W + 2 * pw) < 2 ** 31
    it = torch.int32 if small else torch.int64

    # which taps can fall before / past the plane, decided now (the shape env is the
    # lowering's); a bound symbolic sizes leave open is checked (recompiled at a second size,
    # H is a symbol: the last window may or may not reach past it)
    checks = {}
    for i, j in itertools.product(range(kh), range(kw)):
        for lo_, hi_, n in ((i * dh - ph, (Ho - 1) * sh - ph + i * dh, H),
                            (j * dw - pw, (Wo - 1) * sw - pw + j * dw, W)):
            checks[lo_, hi_, n] = (known(sympy.sympify(lo_) < 0) is not False,
                                   known(sympy.sympify(hi_) >= n) is not False)

    def window(index):
        """Eager's loop: the index starts at the window's first in-bounds tap, the value at
        -inf; a tap is taken when it is greater or NaN (padding taps never are)."""
        *lead, oh, ow = index
        taps = []       # (in-bounds mask or None, value, flat index) in row-major order
        for i in range(kh):
            for j in range(kw):
                h, w = oh * sh - ph + i * dh, ow * sw - pw + j * dw
                conds = []
                for e, lo_, hi_, n in ((h, i * dh - ph, (Ho - 1) * sh - ph + i * dh, H),
                                       (w, j * dw - pw, (Wo - 1) * sw - pw + j * dw, W)):
                    if checks[lo_, hi_, n][0]:
                        conds.append(ops.ge(ops.index_expr(e, it), ops.constant(0, it)))
                    if checks[lo_, hi_, n][1]:
                        conds.append(ops.lt(ops.index_expr(e, it), ops.index_expr(n, it)))
                idx = list(lead) + [h, w]
                m = None
                if conds:
                    m = conds[0]
                    for c in conds[1:]:
                        m = ops.logical_and(m, c)
                    v = ops.masked(m, lambda idx=idx: lx(idx), float("-inf"))
                else:
                    v = lx(idx)
                taps.append((m, v, ops.index_expr(h * W + w, it)))
        if taps[0][0] is None:          # no padding in the first tap: it is the start
            best, bidx = taps[0][1], taps[0][2]
            rest = taps[1:]
        else:                           # the first tap that is in bounds (one always is)
            first = next((k for k, t in enumerate(taps) if t[0] is None), len(taps) - 1)
            bidx = taps[first][2]
            for m, _, flat in reversed(taps[:first]):
                bidx = ops.where(m, flat, bidx)
            best, rest = ops.constant(float("-inf"), x.dtype), taps
        for _, v, flat in rest:
            take = ops.logical_or(ops.gt(v, best), ops.isnan(v))
            best, bidx = ops.where(take, v, best), ops.where(take, flat, bidx)
        return best, ops.to_dtype(bidx, torch.int64)
    vals = Pending(Pointwise(size, x.dtype, lambda i: window(i)[0]))
    inds = Pending(Pointwise(size, torch.int64, lambda i: window(i)[1]))
    return (vals, inds)


# --- externs ---------------------------------------------------------------------------------

@rule(aten.mm.default)
def mm(ctx, node, a, b):
    return (_onednn_gemm(ctx, node, a, b) or
            ctx.extern(aten.mm.default, (a, b), {}, out_meta(node), out_variant=aten.mm.out))


@rule(aten.bmm.default)
def bmm(ctx, node, a, b):
    return ctx.extern(aten.bmm.default, (a, b), {}, out_meta(node), out_variant=aten.bmm.out)


@rule(aten.addmm.default)
def addmm(ctx, node, bias, a, b, *, beta=1, alpha=1):
    return (beta == 1 and alpha == 1 and _onednn_gemm(ctx, node, a, b, bias) or
            ctx.extern(aten.addmm.default, (bias, a, b), {"beta": beta, "alpha": alpha},
                       out_meta(node), out_variant=aten.addmm.out))


ONEDNN_LINEAR = torch.ops.mkldnn._linear_pointwise.default


def _onednn_gemm(ctx, node, a, b, bias=None):
    """`a @ b (+ bias)` as oneDNN's linear on the plain operands, `_linear_pointwise(a, b.t(),
    bias)`, where ctx.onednn_gemm says oneDNN is the faster library for its size (backends/
    gemmroute.py, docs/design/076, 081); else None (aten). oneDNN reads the weight `b.t()` in
    either orientation in place, but copies a first operand stored column-major (the weight
    gradient's `g.t() @ x`): that one goes only where the rule says the copy pays (`transposed`,
    a wide output). A bias other than one float per output column stays on aten."""
    val = out_meta(node)                # (ctx.onednn_gemm is None unless the graph is on the CPU)
    if ctx.onednn_gemm is None or val.dtype != torch.float32:
        return None
    (m, k), n = a.size, b.size[1]
    if not all(isinstance(s, int) for s in (m, k, n)):
        return None
    if bias is not None and (tuple(bias.size) != (n,) or bias.dtype != torch.float32):
        return None
    if not ctx.onednn_gemm(m, k, n):
        return None
    a, b = ctx.realize(a), ctx.realize(b)
    if b.stride not in ((n, 1), (1, k)):                            # dense, either way for b
        return None
    if a.stride != (k, 1) and (a.stride != (1, m) or not ctx.onednn_gemm(m, k, n, True)):
        return None
    if bias is not None:
        bias = ctx.realize(bias)
        if bias.stride != (1,):
            return None
    ctx.onednn_gemms.append((m, k, n))
    weight = View(b.buffer, (n, k), b.stride[::-1], b.offset)
    return ctx.extern(ONEDNN_LINEAR, (a, weight, bias, "none", [], ""), {}, val)


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
    "sort.default", "sort.stable", "rand.default", "randn.default",
    "empty_strided.default",
)


def extern_functional(ctx, node, *args, **kwargs):
    return ctx.extern(node.target, args, kwargs, out_meta(node))


for _name in EXTERNS:
    _packet, _, _ov = _name.rpartition(".")
    if hasattr(aten, _packet) and _ov in getattr(aten, _packet).overloads():
        RULES[getattr(getattr(aten, _packet), _ov)] = extern_functional


@rule(aten.convolution.default)
def convolution(ctx, node, x, *args):
    """An extern whose output layout is the one the CPU kernel returns: channels-last when its
    input is stored channels-last (ConvNeXt's blocks permute around a LayerNorm), where the
    meta kernel says contiguous. Downstream kernels then read it in place instead of the wrapper
    copying each conv output to the meta layout (the wrapper still copies if a run disagrees)."""
    val = out_meta(node)
    if _cpu_channels_last_input(ctx, x):
        val = _as_channels_last(val)
    return ctx.extern(node.target, (x, *args), {}, val)


@rule(aten.convolution_backward.default)
def convolution_backward(ctx, node, grad_out, x, *args):
    """The same for the input gradient: channels-last when the forward input is. A grad_output
    not stored yet (and with no layout of its own) is stored channels-last too, so the call
    gets one layout: a channel slice of a concat's channels-last gradient (densenet121's last
    conv of each dense block) was stored NCHW, its meta being neither layout. oneDNN takes the
    mixed call at about the same cost (3x3 128->32 b2 at 56x56: 6.87 vs 6.71 ms, docs 052)."""
    if _onednn_crashes(ctx, x, args[0], args[2]):
        grad_out, x = (_contiguous(ctx, t) for t in (grad_out, x))
    val = out_meta(node)
    if _cpu_channels_last_input(ctx, x) and isinstance(val, (tuple, list)):
        val = (_as_channels_last(val[0]), *val[1:])
        if isinstance(grad_out, (Pending, Reindex)) and grad_out.preferred_stride is None \
                and len(grad_out.size) == 4 and _channels_last(grad_out.size, None):
            n, c, h, w = grad_out.size
            grad_out = ctx.realize(grad_out, stride=(h * w * c, 1, w * c, c))
    return ctx.extern(node.target, (grad_out, x, *args), {}, val)


def _onednn_crashes(ctx, x, weight, stride) -> bool:
    """torch 2.14's CPU (oneDNN) backward of a 1x1 conv with stride > 1 and 2-7 input channels
    segfaults on channels-last inputs, in eager too (Conv2d(3, 48, 1, stride=2) on an 8x3x224x224
    channels-last input, .sum().backward()). ember's training layout pass makes such inputs
    channels-last (timm mobileone_s0's and fastvit_t8's stems): give that call NCHW copies."""
    if not isinstance(weight, TensorValue) or len(weight.size) != 4:
        return False
    cin, kh, kw = weight.size[1:]
    return (kh == 1 and kw == 1 and isinstance(cin, int) and cin < 8
            and any(s != 1 for s in stride) and _cpu_channels_last_input(ctx, x))


def _contiguous(ctx, t):
    return ctx.realize(Pending(Pointwise(t.size, t.dtype, t.loader())),
                       stride=contiguous_strides(t.size))


def _cpu_channels_last_input(ctx, x) -> bool:
    device = ctx.gm.meta.get("device")
    if not isinstance(x, TensorValue) or len(x.size) != 4 or device is None or \
            torch.device(device).type != "cpu":
        return False
    xv = ctx.realize(x)
    return _channels_last(xv.size, xv.stride)


def _as_channels_last(val):
    if not isinstance(val, torch.Tensor) or val.dim() != 4 or \
            not _channels_last(tuple(val.shape), None):
        return val
    n, c, h, w = val.shape
    return torch.empty_strided(val.shape, (h * w * c, 1, w * c, c), dtype=val.dtype, device="meta")


def _channels_last(size, stride) -> bool:
    """Dense channels-last strides, with channels and a spatial extent to tell it apart (None
    stride: whether the sizes could be told apart)."""
    if any(not isinstance(s, int) for s in (*size, *(stride or ()))):
        return False
    n, c, h, w = size
    if c == 1 or h * w == 1:
        return False
    return stride is None or tuple(stride) == (h * w * c, 1, w * c, c)
