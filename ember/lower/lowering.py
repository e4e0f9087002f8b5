"""Stage 4, lower: interpret an aten-prim FX graph into loop IR.

`GraphLowering(gm, example_inputs).run()` walks the graph once. Each call_function node is
looked up in `rules.RULES` (one function per aten overload); an op without a rule becomes an
aten extern call ("fallback op", listed under EMBER_LOGS=perf). Pointwise results stay
`Pending` and are inlined into their users; `maybe_realize` stores them in a buffer when several
users would recompute an expensive body or re-read more than storing it costs (recompute.py),
or when the body grew large. Externs and outputs force realization.

Consumes: fx.GraphModule (aten graph contract, docs/design/001). Produces: `self.inputs`
(InputBuffer), `self.nodes` (ComputedBuffer/ExternBuffer in topological order), `self.outputs`.
"""
from __future__ import annotations

import operator
from typing import Any

import sympy
import torch
import torch.fx

from .. import shapes
from ..loopir.index import FloorDiv, ModularIndexing, contiguous_strides, simplify_index, \
    strided_index
from ..loopir.ops import OpsHandler, count_body, set_handler
from ..errors import InternalError
from ..logging import get_logger
from ..loopir.nodes import (Buffer, ComputedBuffer, ExternBuffer, InputBuffer, MultiOutput,
                           Pointwise, TensorArg)
from .recompute import feeds_reduction, recompute_is_cheaper
from .ir import (Pending, Reindex, TensorValue, View, dense_permutation, dense_view, meta_strided,
                 SHAPE_ENV, as_size, as_sizes, view_chain)

aten = torch.ops.aten
perf_log = get_logger("perf")

# Realize a multiply-used pending value when its body is at least this heavy (reads: full-size
# loads; broadcast loads such as a row's mean are re-read from cache by each user, so
# LayerNorm's (x - mean) * rstd is recomputed by its users, but not a body with a transcendental).
REALIZE_READS = 2
REALIZE_OPS = 6
MAX_INLINE_OPS = 120
# Realize a pending value that a user reads broadcast over at least AMPLIFY times its own
# elements, when its body has a transcendental or REALIZE_OPS ops: inlined, the body would be
# recomputed for every element of the user (Swin v2's 16 * sigmoid(table[index]) position bias,
# 3 x 64 x 64, added to each of the 98 windows' attention scores). Values under AMPLIFY_NUMEL
# elements (per-channel scales such as BatchNorm's rsqrt(var + eps)) stay inlined where they do
# not change along the user's innermost dim (NCHW: the simd loop hoists them); along it
# (channels-last) they are realized when the user has AMPLIFY_OUT elements or more and the body
# does any arithmetic (SMALL_LANE_OPS): each op would run once per element of the user, while
# the stored value costs one load from cache (BatchNorm backward's sum(dy)/N, sum(dy*xmu)/N *
# invstd^2, invstd * weight; the forward's rsqrt(var / N + eps)). See docs/design/059.
AMPLIFY = 8
AMPLIFY_NUMEL = 4096
AMPLIFY_OUT = 65536     # (a small user recomputes less than a kernel launch costs)
SMALL_LANE_OPS = 1
# A body that gathers (an indirect index, or a div/mod index left after simplification) makes
# its user's loop scalar wherever it is inlined: realized once it is read twice over (Swin's
# relative position bias table[index] and shifted-window mask, inlined into each window's
# softmax, ran at ~23 ns an element).
IRREGULAR_AMPLIFY = 2
# ROW_GATHERS: a value read by several users at a div/mod of its last dim's index, feeding a
# reduction, is stored (docs/design/074). Inlined, every pass of the row kernel recomputes it
# with the gathers (MViTv2's softmax over rel_h[v // kw] + rel_w[v % kw]: the max and the exp
# pass, 0.3-0.7x eager), and a reduction pass cannot split the dim (design 055: a split by kw
# changes the lanes of a sum). Stored, the row kernel computes it once into a row scratch in a
# pointwise stage that splits (design 048), and its passes read that row (1.6-2.8x eager).


def _varies_innermost(arg, out: torch.Tensor) -> bool:
    """Whether `arg`, broadcast against the output `out`, changes along out's innermost (stride
    1) dim: inlined there, its body is recomputed for each element instead of once per row
    (an SE block's sigmoid(mean(x)) in channels-last: 0.3x eager)."""
    dims = [d for d in range(out.dim()) if out.shape[d] != 1]
    if not dims:
        return False
    k = min(dims, key=lambda d: out.stride()[d]) - (out.dim() - len(arg.size))
    return k >= 0 and arg.size[k] != 1


def meta_of(x):
    if isinstance(x, torch.fx.Node):
        return x.meta.get("val", x.meta.get("example_value"))
    return x


class GraphLowering:
    def __init__(self, gm: torch.fx.GraphModule, example_inputs=None, *, cpp: bool = True,
                 onednn_gemm=None):
        self.gm = gm
        #: `(m, k, n) -> bool`: which float32 CPU mm/addmm run on oneDNN's linear instead of
        #: aten (backends/gemmroute.py; None: all on aten); the (m, k, n) of those that did
        self.onednn_gemm, self.onednn_gemms = onednn_gemm, []
        #: C++ kernels: float var_mean accumulates its two sums in double (rules.var_mean);
        #: Triton's have no Scan (its cumsum stays an extern)
        self.cpp = cpp
        self.example_inputs = list(example_inputs or [])
        self.inputs: list[InputBuffer] = []
        self.nodes: list[Buffer] = []
        self.outputs: list[Any] = []
        self.env: dict[torch.fx.Node, Any] = {}
        self.fallbacks: list[str] = []
        self._count = 0
        self.current_node = None

    # --- naming and buffers -----------------------------------------------------------------
    def new_name(self, prefix="buf") -> str:
        self._count += 1
        return f"{prefix}{self._count - 1}"

    def add_computed(self, body, dtype=None, stride=None) -> ComputedBuffer:
        size = as_sizes(body.size)
        stride = tuple(stride) if stride is not None else contiguous_strides(size)
        buf = ComputedBuffer(self.new_name(), dtype or body.dtype, size, stride, body=body,
                             origin=getattr(self.current_node, "name", ""))
        self.nodes.append(buf)
        return buf

    # --- realization --------------------------------------------------------------------------
    def realize(self, value: TensorValue, stride=None) -> View:
        """A strided View of a buffer holding `value` (storing it if needed)."""
        if isinstance(value, View):
            return value
        stride = stride or value.preferred_stride
        if isinstance(value, Pending):
            if value.realized is None:
                buf = self.add_computed(value.node, stride=stride)
                value.realized = dense_view(buf)
            return value.realized
        if isinstance(value, Reindex):
            if value.realized is None:
                value.realized = self._realize_as_view(value, stride)
            if value.realized is None:
                body = Pointwise(value.size, value.dtype, value.loader())
                value.realized = dense_view(self.add_computed(body, stride=stride))
            return value.realized
        raise InternalError(f"cannot realize {type(value).__name__}")

    def _realize_as_view(self, value: Reindex, stride) -> View | None:
        """Reshapes/permutes of a pending value: store the value once in its own dense layout
        and view that storage, instead of a copy per view (and one more per user)."""
        base, fns = view_chain(value)
        if not fns or not isinstance(base, (Pending, View)):
            return None
        layout = base if isinstance(base, View) else base.realized
        # not stored yet: it will be in the layout realize() gives it (a graph output's or a
        # channels-last region's preferred stride), and the view's strides must be of that one
        size, st, off = ((layout.size, layout.stride, layout.offset) if layout is not None
                         else (base.size, base.preferred_stride or contiguous_strides(base.size), 0))
        t = meta_strided(size, st, off)
        try:
            for fn in fns:
                t = fn(t)
        except RuntimeError:
            return None     # not expressible as a view of that layout: copy
        if stride is not None and as_sizes(t.stride()) != tuple(stride):
            return None
        buf = self.realize(base)
        if (buf.stride, buf.offset) != (tuple(st), off):
            raise InternalError(f"view of a value stored as {buf.stride}+{buf.offset}, computed "
                                f"for {tuple(st)}+{off}")
        return View(buf.buffer, as_sizes(t.shape), as_sizes(t.stride()), as_size(t.storage_offset()))

    def to_arg(self, value) -> TensorArg:
        return self.realize(value).arg()

    def maybe_realize(self, node: torch.fx.Node, value) -> None:
        users = 1 if _disjoint_slices(node) else len(node.users)
        if users > 1 and isinstance(value, (Pending, Reindex)) and _divides_last(value) \
                and feeds_reduction(self.env, node):
            # see ROW_GATHERS: stored in the users' shape (a view's rows, not its base's dims),
            # which the row kernel keeps as a row scratch
            self.env[node] = dense_view(self.add_computed(
                Pointwise(value.size, value.dtype, value.loader())))
            return
        if isinstance(value, Reindex):
            # a reshape/permute of a pending value: its users inline the value through the view
            # (OPT's residual stream, reshaped to 2-D between blocks, was recomputed from the
            # embedding onwards by every LayerNorm), so decide for the value as if they read it
            base, fns = view_chain(value)
            if fns and isinstance(base, Pending):
                value = base
        if not isinstance(value, Pending) or value.realized is not None:
            return
        index = [sympy.Symbol(f"i{d}", integer=True, nonnegative=True)
                 for d in range(len(value.size))]
        dims = [v for v, n in zip(index, value.size) if n != 1]
        counts = count_body(value.node.inner_fn, index, dims=dims)
        compute = counts.ops - counts.constants >= REALIZE_OPS or (
            counts.loads >= REALIZE_READS and counts.transcendental)   # softmax's exp(x - max)
        if counts.ops > MAX_INLINE_OPS or users > 1 and (compute or (
                counts.full_loads >= REALIZE_READS and
                not recompute_is_cheaper(self.env, node, counts.full_names))):
            self.realize(value)

    def realize_broadcast_inputs(self, node: torch.fx.Node, args) -> None:
        """See AMPLIFY: realize the pending inputs `node` would recompute many times over. A
        constant pad reads as many elements as its input has, however many zeros it adds (a pad
        backward's folded edge rows, 3 of 56, were stored by a kernel of their own)."""
        out = meta_of(node)
        if node.target is aten.constant_pad_nd.default:
            out = meta_of(node.args[0])
        outs = [t for t in (out if isinstance(out, (list, tuple)) else (out,))
                if isinstance(t, torch.Tensor)]
        if not outs or any(shapes.is_symbolic(t) for t in outs):
            return
        n_out = max(t.numel() for t in outs)
        for a in args:
            base = view_chain(a)[0] if isinstance(a, TensorValue) else None
            if not isinstance(base, Pending) or base.realized is not None or \
                    any(not isinstance(s, (int, sympy.Integer)) for s in base.size):
                continue
            n_in = 1
            for s in base.size:
                n_in *= int(s)
            small = n_in < AMPLIFY_NUMEL
            if small and n_out < AMPLIFY_OUT or n_out < min(AMPLIFY, IRREGULAR_AMPLIFY) * n_in:
                continue
            index = [sympy.Symbol(f"i{d}", integer=True, nonnegative=True)
                     for d in range(len(base.size))]
            counts = count_body(base.node.inner_fn, index)
            gathers = _gathers(counts, dict(zip(index, base.size)))
            # a small value stays inlined where the user's inner loop hoists it, unless its
            # body gathers: the layout the loop runs in may differ from the meta one (a conv
            # output stored channels-last), and a per-element division stops vectorization
            if small and not (gathers or _varies_innermost(a, outs[0])):
                continue
            heavy = counts.transcendental or counts.ops >= REALIZE_OPS or (
                small and counts.ops - counts.constants >= SMALL_LANE_OPS)
            if heavy and n_out >= AMPLIFY * n_in or n_out >= IRREGULAR_AMPLIFY * n_in and gathers:
                self.realize(base)

    # --- externs --------------------------------------------------------------------------------
    def extern(self, op, args, kwargs, val, *, out_variant=None, fallback=False):
        """An aten call on realized tensors. `val` is the node's meta value (layout of results)."""
        def conv(a):
            if isinstance(a, TensorValue):
                return self.to_arg(a)
            if isinstance(a, (list, tuple)):
                return type(a)(conv(x) for x in a)
            return a
        args = tuple(conv(a) for a in args)
        kwargs = {k: conv(v) for k, v in kwargs.items()}
        name = self.new_name()
        if isinstance(val, torch.Tensor):
            buf = ExternBuffer(name, val.dtype, as_sizes(val.shape), as_sizes(val.stride()), op=op,
                               args=args, kwargs=kwargs, out_variant=out_variant,
                               fallback=fallback)
            self.nodes.append(buf)
            return View(buf, buf.size, buf.stride, 0)
        buf = ExternBuffer(name, None, None, None, op=op, args=args, kwargs=kwargs,
                           fallback=fallback)
        self.nodes.append(buf)

        def wrap(v, path):
            if isinstance(v, torch.Tensor):
                out = MultiOutput(f"{name}_{'_'.join(map(str, path))}", v.dtype, as_sizes(v.shape),
                                  as_sizes(v.stride()), parent=buf, path=path)
                buf.outputs.append(out)
                return View(out, out.size, out.stride, 0)
            if isinstance(v, (list, tuple)):
                return tuple(wrap(x, path + (i,)) for i, x in enumerate(v))
            return v
        return wrap(val, ())

    def fallback(self, node: torch.fx.Node, args, kwargs):
        name = str(node.target)
        if name not in self.fallbacks:
            self.fallbacks.append(name)
            perf_log.info("fallback op %s (no ember lowering; runs as an aten extern)", name)
        return self.extern(node.target, args, kwargs, meta_of(node), fallback=True)

    # --- the interpreter ------------------------------------------------------------------------
    def run(self):
        env = shapes.env_of(*[meta_of(n) for n in self.gm.graph.find_nodes(op="placeholder")])
        token = SHAPE_ENV.set(env)
        try:
            return self._run()
        finally:
            SHAPE_ENV.reset(token)

    def _run(self):
        from . import rules_data  # noqa: F401 - registers view/indexing/extern rules
        from .rules import RULES
        placeholders = 0
        out_strides = self._output_strides()
        for node in self.gm.graph.nodes:
            self.current_node = node
            if node.op == "placeholder":
                val = meta_of(node)
                if val is None and placeholders < len(self.example_inputs):
                    val = self.example_inputs[placeholders]
                if isinstance(val, torch.Tensor):
                    buf = InputBuffer(f"arg{placeholders}", val.dtype, as_sizes(val.shape),
                                      as_sizes(val.stride()), position=placeholders)
                    self.inputs.append(buf)
                    self.env[node] = dense_view(buf)
                else:
                    value = as_size(val) if isinstance(val, torch.SymInt) else val
                    self.inputs.append(InputBuffer(
                        f"arg{placeholders}", None, None, None, position=placeholders,
                        symbol=value if isinstance(value, sympy.Symbol) else None))
                    self.env[node] = value
                placeholders += 1
            elif node.op == "get_attr":
                t = getattr(self.gm, node.target)
                if isinstance(t, torch.Tensor):
                    buf = InputBuffer(self.new_name("const"), t.dtype, as_sizes(t.shape),
                                      as_sizes(t.stride()), constant=t)
                    self.inputs.append(buf)
                    self.env[node] = dense_view(buf)
                else:
                    self.env[node] = t
            elif node.op == "call_function" and isinstance(meta_of(node), (torch.SymInt,
                                                                              torch.SymFloat)):
                self.env[node] = shapes.expr_of(meta_of(node))   # size arithmetic: an expression
            elif node.op == "call_function":
                args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), self.env.__getitem__)
                if node.target is operator.getitem:
                    value = args[0][args[1]]
                else:
                    # complex values: kernels are written for real dtypes; the backend has
                    # rewritten complex math to real pairs (decomp/complex.py), so what still
                    # reads or makes one (FFT, edge views) runs as an aten extern
                    rule = None if _touches_complex(node) else RULES.get(node.target)
                    self.realize_broadcast_inputs(node, args)
                    value = rule(self, node, *args, **kwargs) if rule is not None else None
                    if value is NotImplemented or rule is None:
                        value = self.fallback(node, args, kwargs)
                self.env[node] = value
                if node in out_strides and isinstance(value, (Pending, Reindex)):
                    value.preferred_stride = out_strides[node]   # store it once, in that layout
                elif isinstance(value, Pending) and node.target is torch.ops.aten._to_copy.default \
                        and _output_stride(meta_of(node)) is not None:
                    # a cast keeps its input's dense layout (eager's preserve_format): the int8
                    # weight dequantized before an mm stays transposed, read and written linearly
                    value.preferred_stride = _output_stride(meta_of(node))
                elif isinstance(value, Pending) and _channels_last_meta(meta_of(node)):
                    # a channels-last region (backends/layout.py): keep it NHWC when stored
                    value.preferred_stride = as_sizes(meta_of(node).stride())
                self.maybe_realize(node, value)
            elif node.op == "output":
                outs = torch.fx.node.map_arg(node.args[0], self.env.__getitem__)
                metas = torch.fx.node.map_arg(node.args[0], meta_of)
                if not isinstance(outs, (list, tuple)):
                    outs, metas = (outs,), (metas,)
                self.outputs = self._outputs(outs, metas)
            else:
                raise InternalError(f"unexpected node {node.op} {node.target}")
        return self

    def _output_strides(self) -> dict:
        """Output nodes whose meta layout is a dense permutation → that stride."""
        out = {}
        for node in self.gm.graph.find_nodes(op="output"):
            outs = node.args[0] if isinstance(node.args[0], (list, tuple)) else (node.args[0],)
            for o in outs:
                stride = _output_stride(meta_of(o)) if isinstance(o, torch.fx.Node) else None
                if stride is not None:
                    out[o] = stride
        return out

    def _outputs(self, outs, metas) -> list:
        """The graph's outputs. One that only copies a stored buffer element for element (the
        gradient of a cumsum: flip(reverse scan) flipped back) is that buffer, unless another
        output returns it too (two outputs never share storage)."""
        copied = [self._copied_buffer(v) for v in outs]
        names = [c.name if c is not None else v.buffer.name if isinstance(v, View) else None
                 for v, c in zip(outs, copied)]
        result = []
        for v, m, c in zip(outs, metas, copied):
            want = _output_stride(m) if c is not None else None
            if c is not None and names.count(c.name) == 1 and c.stride == (
                    want if want is not None else _gapped_stride(m) or c.stride):
                result.append(dense_view(c).arg())
            else:
                result.append(self._output(v, m))
        return result

    def _copied_buffer(self, value) -> ComputedBuffer | None:
        """The stored buffer an unrealized value loads at each element's own position, or None."""
        if not isinstance(value, (Pending, Reindex)) or value.realized is not None or any(
                not isinstance(s, int) for s in value.size):
            return None
        index = [sympy.Integer(0) if s == 1 else sympy.Symbol(f"q{i}", integer=True,
                                                             nonnegative=True)
                 for i, s in enumerate(value.size)]
        with set_handler(_LoadOnly()):
            got = value.loader()(index)
        if not isinstance(got, tuple):
            return None
        buf = next((b for b in self.nodes if b.name == got[0]), None)
        if not isinstance(buf, ComputedBuffer) or tuple(buf.size) != tuple(value.size) \
                or buf.dtype != value.dtype \
                or sympy.expand(got[1] - strided_index(index, buf.stride)) != 0:
            return None
        return buf

    def _output(self, value, meta):
        if not isinstance(value, TensorValue):
            return value
        stride = _output_stride(meta)
        want = stride if stride is not None else _gapped_stride(meta)
        if isinstance(value, View):
            # a view of an input aliases it (aot rebuilds such outputs); an extern's result
            # in another layout than its meta (a channels-last conv) is copied to the meta one
            if isinstance(value.buffer, InputBuffer) or want is None or value.stride == want:
                return value.arg()
        out = self.realize(value, stride=stride)
        if want is not None and out.stride != want:
            # realized earlier (for a user inside the graph) in another layout, or a view with
            # gaps (one head of a qkv projection): the next graph (a backward taking this as a
            # saved activation) was traced with the meta layout. A view of the stored base
            # when it has that layout; else a copy stored with exactly those strides.
            view = self._realize_as_view(value, want) if isinstance(value, Reindex) else None
            out = view if view is not None else dense_view(self.add_computed(
                Pointwise(out.size, out.dtype, out.loader()), stride=want))
        return out.arg()


class _LoadOnly(OpsHandler):
    """A body that is one load answers (buffer, index); any other op answers None."""

    def default(self, name, *args, **kwargs):
        return None

    def load(self, name, index):
        return (name, index)

    def indirect_indexing(self, value, size, check=True):
        return sympy.Symbol("gathered", integer=True)    # an index no plain copy has


def _disjoint_slices(node: torch.fx.Node) -> bool:
    """Are all of node's users slices of disjoint ranges of one dim (a cat's backward, a split),
    each read once? Inlined, they compute each element once between them, as one user would:
    realizing the value stored and re-read all of it (cat16's backward: 2 kernels, 1.3x eager's
    time)."""
    users = list(node.users)
    meta = meta_of(node)
    if len(users) < 2 or not isinstance(meta, torch.Tensor) or shapes.is_symbolic(meta):
        return False
    spans, dims = [], set()
    for u in users:
        if (u.op != "call_function" or u.target is not aten.slice.Tensor or u.args[0] is not node
                or len(u.users) != 1):      # a slice read twice would compute its part twice
            return False
        a = {**dict(zip(("dim", "start", "end", "step"), u.args[1:])), **u.kwargs}
        dim, start, end, step = a.get("dim", 0), a.get("start"), a.get("end"), a.get("step", 1)
        if not all(isinstance(v, int) for v in (dim, step)) or step != 1:
            return False
        dims.add(dim % meta.dim())
        n = meta.shape[dim % meta.dim()]
        lo, hi = (0 if start is None else start), (n if end is None else end)
        if not isinstance(lo, int) or not isinstance(hi, int):
            return False
        lo, hi = (min(max(v + n if v < 0 else v, 0), n) for v in (lo, hi))
        spans.append((lo, hi))
    spans.sort()
    return len(dims) == 1 and all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


def _divides_last(value) -> bool:
    """Does `value`, read as its users index it, load at a div/mod of its last dim's index (a
    view merging dims of a broadcast value: MViTv2's rel_h[..., None] + rel_w[..., None, :]
    viewed as one kh*kw row)?"""
    size = list(value.size)
    if not size or any(not isinstance(s, (int, sympy.Integer)) for s in size) or int(size[-1]) == 1:
        return False
    index = [sympy.Symbol(f"i{d}", integer=True, nonnegative=True) for d in range(len(size))]
    counts = count_body(value.loader(), index)
    last, ranges = index[-1], dict(zip(index, size))
    return any(any(last in a.free_symbols for a in simplify_index(e, ranges).atoms(
        FloorDiv, ModularIndexing)) for e in counts.indices if isinstance(e, sympy.Expr))


def _gathers(counts, ranges: dict) -> bool:
    """Does a body (its `count_body` counts) load at an indirect index, or at a div/mod index
    that simplification over its loop `ranges` leaves?"""
    return bool(counts.gathers) or any(
        simplify_index(e, ranges).has(FloorDiv, ModularIndexing) for e in counts.indices
        if isinstance(e, sympy.Expr))


def _touches_complex(node: torch.fx.Node) -> bool:
    vals = [meta_of(a) for a in node.all_input_nodes]
    out = meta_of(node)
    vals += list(out) if isinstance(out, (list, tuple)) else [out]
    return any(isinstance(v, torch.Tensor) and v.is_complex() for v in vals)


def _output_stride(meta):
    """The layout an output is stored in: its meta stride when that is a dense permutation."""
    if isinstance(meta, torch.Tensor) and dense_permutation(meta):
        return as_sizes(meta.stride())
    return None


def _channels_last_meta(meta) -> bool:
    """A dense channels-last 4-D meta whose channels and spatial extent tell it apart."""
    if not isinstance(meta, torch.Tensor) or meta.dim() != 4 or \
            any(isinstance(x, torch.SymInt) for x in (*meta.shape, *meta.stride())):
        return False
    n, c, h, w = meta.shape
    return c > 1 and h * w > 1 and meta.stride() == (h * w * c, 1, w * c, c)


def _gapped_stride(meta):
    """The meta stride of an output whose layout skips elements (not dense, not overlapping)."""
    if not isinstance(meta, torch.Tensor) or meta.dim() == 0 or any(
            isinstance(x, torch.SymInt) for x in (*meta.shape, *meta.stride())):
        return None
    dims = sorted((st, s) for s, st in zip(meta.shape, meta.stride()) if s != 1)
    reach = 1
    for st, s in dims:
        if st < reach:          # overlapping (an expand) or not ordered: not ours to store
            return None
        reach = st * s
    return as_sizes(meta.stride())


def as_value(x) -> Any:
    return x
