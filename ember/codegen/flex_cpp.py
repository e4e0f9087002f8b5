"""Stage 6, codegen: the fused CPU flex_attention kernels (forward and backward) as C++.

Consumes a `FlexSpec` (sizes, dtype, block-mask layout) and the score_mod / mask_mod as aten
graphs over 0-dim tensors (placeholders: score, b, h, q_idx, kv_idx, then the captured buffers;
traced by ember.backends.flex). Produces one C++ translation unit with `flex_fwd` and `flex_bwd`.

The kernel follows the FlashAttention recipe on the block mask's tiles, as Inductor's CPU flex
template does: a task is (batch, query head, RQ query rows); it walks the kv blocks the block mask
lists for its query block (partial blocks apply mask_mod per element, full blocks skip it, empty
blocks are never visited), computes the score tile Q·Kᵀ with a register-blocked micro-kernel,
applies score_mod per element, and keeps an online softmax (running max m, sum l) while it
accumulates P·V. A row that no kv position attends gives 0 and lse = -inf, as eager does.

The backward recomputes each tile from the saved lse: dP = dO·Vᵀ, dS = P ⊙ (dP - Δ) with
Δ = rowsum(dO ⊙ O) (minus the lse gradient), and the chain rule through score_mod uses its
derivative graph (`score_grad`: d score_mod / d score, traced by the backend with autograd). Query
tasks write dQ; kv tasks (walking the transposed block mask) write dK and dV, so no two threads
write the same row. Gradients of buffers score_mod reads come from its derivative with respect to
each loaded element (`joint`), added into per-thread copies of the buffer gradient.

Scalar graphs are translated node by node with the `SCALAR` table (aten op -> C++ expression);
an op outside it raises Unsupported naming the op, and capture turns that into a graph break.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from ..errors import Unsupported
from .cpp_handler import ctype, literal
from .cpp_prelude import PRELUDE

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class FlexSpec:
    dtype: torch.dtype
    B: int
    HQ: int
    HKV: int
    LQ: int
    LKV: int
    D: int
    DV: int
    scale: float
    QBS: int                      # block mask block sizes (rows, columns)
    KBS: int
    # None: no block mask; else (BM, HM, NQB, KVI, has_full, NKB, QI): the kv lists' batch and
    # head extents, query blocks, index width; whether full blocks are listed; the q lists' too
    mask: tuple | None


# --- scalar graphs -> C++ ----------------------------------------------------------------------

def _binary(fmt):
    return lambda a, t: fmt.format(*a)


def _cast_all(fmt):
    """An arithmetic op computed in the result's type (eager promotes the operands to it)."""
    return lambda a, t: fmt.format(*[f"static_cast<{t}>({x})" for x in a])


_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
SCALAR: dict = {}
for _name, _sym in _CMP.items():
    for _ovl in ("Tensor", "Scalar"):
        SCALAR[getattr(getattr(aten, _name), _ovl)] = ("cmp", _sym)
for _op, _fmt in {aten.add: "({0} + {1})", aten.sub: "({0} - {1})", aten.mul: "({0} * {1})"}.items():
    SCALAR[_op.Tensor] = SCALAR[_op.Scalar] = _cast_all(_fmt)
SCALAR.update({
    aten.div.Tensor: _cast_all("({0} / {1})"),
    aten.div.Scalar: _cast_all("({0} / {1})"),
    aten.neg.default: _cast_all("(-{0})"),
    aten.abs.default: _cast_all("ember::abs_({0})"),
    aten.exp.default: _cast_all("ember::exp({0})"),
    aten.log.default: _cast_all("ember::log({0})"),
    aten.tanh.default: _cast_all("ember::tanh({0})"),
    aten.sigmoid.default: _cast_all("ember::sigmoid({0})"),
    aten.sqrt.default: _cast_all("std::sqrt({0})"),
    aten.rsqrt.default: _cast_all("ember::rsqrt({0})"),
    aten.sin.default: _cast_all("ember::sin_({0})"),
    aten.cos.default: _cast_all("ember::cos_({0})"),
    aten.relu.default: _cast_all("ember::relu({0})"),
    aten.pow.Tensor_Scalar: _cast_all("ember::pow_({0}, {1})"),
    aten.pow.Tensor_Tensor: _cast_all("ember::pow_({0}, {1})"),
    aten.maximum.default: _cast_all("ember::maximum({0}, {1})"),
    aten.minimum.default: _cast_all("ember::minimum({0}, {1})"),
    aten.remainder.Tensor: ("intfloat", "ember::iremainder", "ember::remainder"),
    aten.remainder.Scalar: ("intfloat", "ember::iremainder", "ember::remainder"),
    aten.floor_divide.default: ("intfloat", "ember::ifloordiv", "ember::floordiv"),
    aten.logical_and.default: _binary("(static_cast<bool>({0}) && static_cast<bool>({1}))"),
    aten.logical_or.default: _binary("(static_cast<bool>({0}) || static_cast<bool>({1}))"),
    aten.logical_xor.default: _binary("(static_cast<bool>({0}) != static_cast<bool>({1}))"),
    aten.logical_not.default: _binary("(!static_cast<bool>({0}))"),
    aten.bitwise_and.Tensor: _cast_all("({0} & {1})"),
    aten.bitwise_or.Tensor: _cast_all("({0} | {1})"),
    aten.bitwise_xor.Tensor: _cast_all("({0} ^ {1})"),
    aten.bitwise_not.default: _cast_all("ember::bitwise_not({0})"),
    aten.where.self: ("where",),
    aten.clone.default: _cast_all("{0}"),
    aten.alias.default: _cast_all("{0}"),
    aten.detach.default: _cast_all("{0}"),
    aten.lift_fresh_copy.default: _cast_all("{0}"),
    aten._to_copy.default: _cast_all("{0}"),
    aten.clamp.default: ("clamp",),
    aten.scalar_tensor.default: ("const",),
    aten.full.default: ("const",),
    aten.full_like.default: ("const",),
    aten.zeros_like.default: ("fill", 0),
    aten.ones_like.default: ("fill", 1),
})


class _Scalars:
    """C++ statements for one scalar graph, inside the kernel where the buffers are in scope."""

    def __init__(self, gm: torch.fx.GraphModule, prefix: str, bufs: list[str], n_scalars=5,
                 watch=()):
        self.lines: list[str] = []
        self.env: dict = {}
        self.prefix = prefix
        self.watch = set(watch)       # buffers whose element loads are recorded (gradients)
        self.loads: list[tuple] = []  # (buffer name, offset, value name, aten node name)
        phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.params = [f"{prefix}_a{i}" for i in range(n_scalars)]
        for n, name in zip(phs[:n_scalars], self.params):
            self.env[n] = name
        for n, buf in zip(phs[n_scalars:], bufs):
            v = n.meta["val"]
            self.env[n] = (buf, "0", list(v.shape), list(v.stride()))   # a strided view
        self.param_types = [ctype(n.meta["val"].dtype) for n in phs[:n_scalars]]
        self.outputs = []
        for n in gm.graph.nodes:
            if n.op == "call_function":
                self.env[n] = self.node(n)
            elif n.op == "output":
                self.outputs = [self.env[o] for o in n.args[0]]

    def arg(self, a):
        if isinstance(a, torch.fx.Node):
            v = self.env[a]
            if isinstance(v, tuple):
                raise Unsupported(f"flex_attention: a mod uses a whole tensor ({a.name}) where "
                                  "a scalar is expected")
            return v
        if isinstance(a, (bool, int, float)):
            return literal(a, torch.float64 if isinstance(a, float) else
                           torch.bool if isinstance(a, bool) else torch.int64)
        raise Unsupported(f"flex_attention: a mod passes {type(a).__name__} to an op")

    def dtype_of(self, a):
        if isinstance(a, torch.fx.Node):
            return a.meta["val"].dtype
        return {bool: torch.bool, int: torch.int64, float: torch.float64}[type(a)]

    def node(self, n):
        val = n.meta["val"]
        if n.target in (aten.index.Tensor, aten.select.int):
            return self.index(n)
        if n.target in (aten.alias.default, aten.detach.default) and \
                isinstance(self.env.get(n.args[0]), tuple):
            return self.env[n.args[0]]
        if not isinstance(val, torch.Tensor) or val.dim() != 0:
            raise Unsupported(f"flex_attention: a mod computes a whole tensor with {n.target} "
                              "(only per-element code fuses)")
        rule = SCALAR.get(n.target)
        if rule is None:
            raise Unsupported(f"flex_attention: {n.target} in a score_mod/mask_mod has no fused "
                              "CPU translation")
        t = ctype(val.dtype)
        if callable(rule):
            if n.target is aten._to_copy.default or n.target in (aten.add.Tensor, aten.sub.Tensor) \
                    and n.kwargs.get("alpha", 1) != 1:
                if n.target is not aten._to_copy.default:
                    raise Unsupported("flex_attention: add/sub with alpha in a mod")
            expr = rule([self.arg(a) for a in n.args], t)
        elif rule[0] == "cmp":
            ct = ctype(torch.promote_types(*[self.dtype_of(a) for a in n.args[:2]]))
            a, b = (f"static_cast<{ct}>({self.arg(x)})" for x in n.args[:2])
            expr = f"({a} {rule[1]} {b})"
        elif rule[0] == "intfloat":
            f = rule[2] if val.dtype.is_floating_point else rule[1]
            a, b = (f"static_cast<{t}>({self.arg(x)})" for x in n.args[:2])
            expr = f"{f}({a}, {b})"
        elif rule[0] == "where":
            c, a, b = (self.arg(x) for x in n.args)
            expr = f"(static_cast<bool>({c}) ? static_cast<{t}>({a}) : static_cast<{t}>({b}))"
        elif rule[0] == "clamp":
            expr = f"static_cast<{t}>({self.arg(n.args[0])})"
            lo, hi = (list(n.args[1:]) + [None, None])[:2]
            if lo is not None:
                expr = f"ember::maximum({expr}, static_cast<{t}>({self.arg(lo)}))"
            if hi is not None:
                expr = f"ember::minimum({expr}, static_cast<{t}>({self.arg(hi)}))"
        elif rule[0] == "fill":
            expr = literal(rule[1], val.dtype)
        else:  # const
            value = n.args[0] if n.target is aten.scalar_tensor.default else n.args[1]
            expr = literal(value, val.dtype)
        name = f"{self.prefix}_{n.name}"
        self.lines.append(f"const {t} {name} = {expr};")
        return name

    def index(self, n):
        """select / index with 0-dim indices on a captured buffer: a strided offset."""
        base = self.env.get(n.args[0])
        if not isinstance(base, tuple):
            raise Unsupported("flex_attention: indexing a value computed in a mod")
        buf, off, sizes, strides = base
        if n.target is aten.select.int:
            dim, i = n.args[1], n.args[2]
            if not isinstance(i, int):
                raise Unsupported("flex_attention: select with a symbolic index in a mod")
            i = i + sizes[dim] if i < 0 else i
            off = f"{off} + {i * strides[dim]}"
            sizes, strides = sizes[:dim] + sizes[dim + 1:], strides[:dim] + strides[dim + 1:]
        else:
            idx = n.args[1]
            if any(i is None for i in idx) or len(idx) > len(sizes):
                raise Unsupported("flex_attention: None/Ellipsis indexing in a mod")
            for d, i in enumerate(idx):
                if i.meta["val"].dim() != 0 or i.meta["val"].dtype.is_floating_point:
                    raise Unsupported("flex_attention: a mod indexes with a non-scalar tensor")
                e = f"static_cast<int64_t>({self.arg(i)})"
                if i.meta["val"].dtype == torch.bool:
                    raise Unsupported("flex_attention: a mod indexes with a bool tensor")
                # negative indices wrap as in eager; outside the dim eager raises IndexError
                # (the kernel flags it and reads index 0: runtime/build.raise_kernel_errors)
                size = sizes[d]
                off = f"{off} + ember::bound({e} < 0 ? {e} + {size} : {e}, {size}) * {strides[d]}"
            sizes, strides = sizes[len(idx):], strides[len(idx):]
        if sizes:
            return (buf, off, sizes, strides)
        name = f"{self.prefix}_{n.name}"
        self.lines.append(f"const auto {name} = {buf}[{off}];")
        if buf in self.watch:
            self.loads.append((buf, off, name, n.name))
        return name

    def loads_function(self, name: str) -> str:
        """A lambda `name(score, b, h, q, kv, int64_t* offs, T* vals)`: where each recorded load
        reads (element offset) and what it reads."""
        params = ", ".join(f"{t} {p}" for t, p in zip(self.param_types, self.params))
        body = "\n        ".join(self.lines + [f"offs[{i}] = {off}; vals[{i}] = {v};"
                                               for i, (_, off, v, _) in enumerate(self.loads)])
        return f"auto {name} = [&]({params}, int64_t* offs, T* vals) {{\n        {body}\n    }};"

    def outputs_function(self, name: str) -> str:
        """A lambda `name(scalars..., T* outs)` writing every output."""
        params = ", ".join(f"{t} {p}" for t, p in zip(self.param_types, self.params))
        body = "\n        ".join(self.lines + [f"outs[{i}] = static_cast<T>({o});"
                                               for i, o in enumerate(self.outputs)])
        return f"auto {name} = [&]({params}, T* outs) {{\n        {body}\n    }};"

    def function(self, name: str, ret_dtype) -> str:
        """A lambda `name(score, b, h, q, kv)` returning the graph's first output."""
        params = ", ".join(f"{t} {p}" for t, p in zip(self.param_types, self.params))
        body = "\n        ".join(self.lines)
        return (f"auto {name} = [&]({params}) -> {ctype(ret_dtype)} {{\n        {body}\n"
                f"        return static_cast<{ctype(ret_dtype)}>({self.outputs[0]});\n    }};")


def translate(gm: torch.fx.GraphModule, prefix: str, bufs: list[str], n_scalars=5,
              watch=()) -> _Scalars:
    return _Scalars(gm, prefix, bufs, n_scalars, watch)


# --- the kernels --------------------------------------------------------------------------------

def _buf_decls(bufs) -> str:
    """`bufs`: [(name, dtype)]; they arrive as a void* array."""
    return "\n    ".join(f"const {ctype(dt)}* __restrict__ {name} = "
                         f"static_cast<const {ctype(dt)}*>(bufs[{i}]);"
                         for i, (name, dt) in enumerate(bufs))


def _consts(s: FlexSpec) -> str:
    t = ctype(s.dtype)
    rq = math.gcd(32, s.QBS) if s.mask else 32
    lines = [f"typedef {t} T;", f"constexpr int B = {s.B}, HQ = {s.HQ}, HKV = {s.HKV}, "
             f"G = {s.HQ // s.HKV}, LQ = {s.LQ}, LKV = {s.LKV}, D = {s.D}, DV = {s.DV};",
             f"constexpr int QBS = {s.QBS}, KBS = {s.KBS}, RQ = {rq};",
             f"constexpr T SCALE = {literal(s.scale, s.dtype)};"]
    bm, hm, nqb, kvi, has_full, nkb, qi = s.mask or (1, 1, 1, 1, False, 1, 1)
    lines.append(f"constexpr int BM = {bm}, HM = {hm}, NQBM = {nqb}, KVI = {kvi}, NKBM = {nkb}, "
                 f"QI = {qi};")
    lines.append(f"constexpr bool HAS_MASK = {'true' if s.mask else 'false'}, "
                 f"HAS_FULL = {'true' if has_full else 'false'};")
    return "\n".join(lines)


_COMMON = r"""
constexpr int W = 32 / sizeof(T);
typedef T vec __attribute__((vector_size(32)));
constexpr int NQB = (LQ + QBS - 1) / QBS, NKB = (LKV + KBS - 1) / KBS;
constexpr int KBP = (KBS + 2 * W - 1) / (2 * W) * (2 * W);
constexpr int NCH = (LQ + RQ - 1) / RQ;
constexpr T NEG_INF = -std::numeric_limits<T>::infinity();
static inline vec vload(const T* p) { vec v; std::memcpy(&v, p, sizeof(vec)); return v; }
static inline void vstore(T* p, vec v) { std::memcpy(p, &v, sizeof(vec)); }

// C[RQ][KBP] = A[RQ][N] * Bt[N][KBP]: 4 rows x 2 vectors per register tile
template <int N>
static inline void tile_abt(const T (*A)[N], const T (*Bt)[KBP], T (*C)[KBP]) {
    for (int r = 0; r < RQ; r += 4)
        for (int j = 0; j < KBP; j += 2 * W) {
            vec c[4][2] = {};
            for (int d = 0; d < N; ++d) {
                vec b0 = vload(&Bt[d][j]), b1 = vload(&Bt[d][j + W]);
                for (int i = 0; i < 4; ++i) { T a = A[r + i][d]; c[i][0] += a * b0; c[i][1] += a * b1; }
            }
            for (int i = 0; i < 4; ++i) { vstore(&C[r + i][j], c[i][0]); vstore(&C[r + i][j + W], c[i][1]); }
        }
}

// Acc[R][N] += P[R][0:n] * M[0:n][N] (row stride ldm), R rows (multiple of 4)
template <int R, int N, int LDP>
static inline void tile_pm(const T (*P)[LDP], const T* M, int ldm, int n, T (*Acc)[N]) {
    constexpr int NV = N / (2 * W) * (2 * W);
    for (int r = 0; r < R; r += 4) {
        for (int c0 = 0; c0 < NV; c0 += 2 * W) {
            vec a[4][2];
            for (int i = 0; i < 4; ++i) { a[i][0] = vload(&Acc[r + i][c0]); a[i][1] = vload(&Acc[r + i][c0 + W]); }
            for (int j = 0; j < n; ++j) {
                vec m0 = vload(M + (int64_t)j * ldm + c0), m1 = vload(M + (int64_t)j * ldm + c0 + W);
                for (int i = 0; i < 4; ++i) { T p = P[r + i][j]; a[i][0] += p * m0; a[i][1] += p * m1; }
            }
            for (int i = 0; i < 4; ++i) { vstore(&Acc[r + i][c0], a[i][0]); vstore(&Acc[r + i][c0 + W], a[i][1]); }
        }
        for (int c0 = NV; c0 < N; ++c0)
            for (int i = 0; i < 4; ++i) {
                T s = Acc[r + i][c0];
                for (int j = 0; j < n; ++j) s += P[r + i][j] * M[(int64_t)j * ldm + c0];
                Acc[r + i][c0] = s;
            }
    }
}

// Kt[d][j] = K[j][d] for j < n (rows of N), zero padding up to KBP
template <int N>
static inline void load_t(const T* K, int n, T (*Kt)[KBP]) {
    for (int d = 0; d < N; ++d) {
        for (int j = 0; j < n; ++j) Kt[d][j] = K[(int64_t)j * N + d];
        for (int j = n; j < KBP; ++j) Kt[d][j] = T(0);
    }
}
"""


def _mask_walk(kv_side: bool = True) -> str:
    """C++ that calls `visit(block, full)` for every block the block mask lists for row `blk`
    (kv blocks of a query block, or with kv_side=False query blocks of a kv block)."""
    n, nblk, w, pre = ("NKB", "NQBM", "KVI", "") if kv_side else ("NQB", "NKBM", "QI", "q")
    return f"""
        if constexpr (!HAS_MASK) {{
            for (int kb = 0; kb < {n}; ++kb) visit(kb, true);
        }} else {{
            const int64_t row = ((int64_t)(BM == 1 ? 0 : b) * HM + (HM == 1 ? 0 : h)) * {nblk} + blk;
            const int np = {pre}num[row];
            for (int i = 0; i < np; ++i) visit({pre}idx[row * {w} + i], false);
            if constexpr (HAS_FULL) {{
                const int nf = {pre}full_num[row];
                for (int i = 0; i < nf; ++i) visit({pre}full_idx[row * {w} + i], true);
            }}
        }}"""


def forward_source(spec: FlexSpec, score, mask, bufs) -> str:
    """`flex_fwd(Q, K, V, O, LSE, kv_num, kv_idx, full_num, full_idx, bufs)`."""
    sm = score.function("score_mod", spec.dtype) if score else ""
    mm = mask.function("mask_mod", torch.bool) if mask else ""
    score_loop = ("#pragma omp simd\n                for (int j = 0; j < jn; ++j) "
                  "Sr[j] = score_mod(Sr[j], b, h, qi, j0 + j);") if score else ""
    mask_loop = ("if (!full) {\n                #pragma omp simd\n                for (int j = 0; "
                 "j < jn; ++j) Sr[j] = mask_mod(T(0), b, h, qi, j0 + j) ? Sr[j] : NEG_INF;\n"
                 "                }") if mask else ""
    return PRELUDE + _consts(spec) + _COMMON + f"""
extern "C" void flex_fwd(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V,
                         T* __restrict__ O, T* __restrict__ LSE,
                         const int32_t* num, const int32_t* idx, const int32_t* full_num,
                         const int32_t* full_idx, void** bufs) {{
    {_buf_decls(bufs)}
    #pragma omp parallel
    {{
    // a task is one query block (QBS rows, as the block mask lists kv blocks per query block):
    // each kv block is transposed once and used by all its RQ-row chunks
    T (*Qs)[D] = new T[QBS][D]; T (*acc)[DV] = new T[QBS][DV]; T* m = new T[QBS]; T* l = new T[QBS];
    alignas(64) T Kt[D][KBP]; alignas(64) T S[RQ][KBP];
    {sm}
    {mm}
    #pragma omp for schedule(dynamic, 1)
    for (int t = 0; t < B * HQ * NQB; ++t) {{
        const int blk = NQB - 1 - t % NQB, h = (t / NQB) % HQ, b = t / (NQB * HQ);
        const int r0 = blk * QBS, rn = std::min(QBS, LQ - r0), hk = h / G;
        const T* Qp = Q + ((int64_t)(b * HQ + h) * LQ + r0) * D;
        for (int r = 0; r < QBS; ++r) {{
            for (int d = 0; d < D; ++d) Qs[r][d] = r < rn ? Qp[(int64_t)r * D + d] * SCALE : T(0);
            m[r] = NEG_INF; l[r] = 0;
            for (int d = 0; d < DV; ++d) acc[r][d] = 0;
        }}
        auto visit = [&](int kb, bool full) {{
            const int j0 = kb * KBS, jn = std::min(KBS, LKV - j0);
            if (jn <= 0) return;
            load_t<D>(K + ((int64_t)(b * HKV + hk) * LKV + j0) * D, jn, Kt);
            for (int c0 = 0; c0 < rn; c0 += RQ) {{
            const int cn = std::min(RQ, rn - c0);
            tile_abt<D>(Qs + c0, Kt, S);
            for (int r = 0; r < cn; ++r) {{
                const int qi = r0 + c0 + r;
                T* Sr = S[r];
                {score_loop}
                {mask_loop}
                for (int j = jn; j < KBP; ++j) Sr[j] = NEG_INF;
                T mx = m[c0 + r];
                #pragma omp simd reduction(max:mx)
                for (int j = 0; j < KBP; ++j) mx = Sr[j] > mx ? Sr[j] : mx;
                if (mx == NEG_INF) {{
                    for (int j = 0; j < KBP; ++j) Sr[j] = 0;
                    continue;
                }}
                const T alpha = ember::exp(m[c0 + r] - mx);
                T sum = 0;
                #pragma omp simd reduction(+:sum)
                for (int j = 0; j < KBP; ++j) {{ T p = ember::exp(Sr[j] - mx); Sr[j] = p; sum += p; }}
                l[c0 + r] = l[c0 + r] * alpha + sum;
                m[c0 + r] = mx;
                if (alpha != T(1))
                    for (int d = 0; d < DV; ++d) acc[c0 + r][d] *= alpha;
            }}
            for (int r = cn; r < RQ; ++r)
                for (int j = 0; j < KBP; ++j) S[r][j] = 0;
            tile_pm<RQ, DV, KBP>(S, V + ((int64_t)(b * HKV + hk) * LKV + j0) * DV, DV, jn,
                                 acc + c0);
            }}
        }};
        {_mask_walk()}
        T* Op = O + ((int64_t)(b * HQ + h) * LQ + r0) * DV;
        T* Lp = LSE + (int64_t)(b * HQ + h) * LQ + r0;
        for (int r = 0; r < rn; ++r) {{
            const T inv = l[r] > 0 ? T(1) / l[r] : T(0);
            for (int d = 0; d < DV; ++d) Op[(int64_t)r * DV + d] = acc[r][d] * inv;
            Lp[r] = l[r] > 0 ? m[r] + std::log(l[r]) : NEG_INF;
        }}
    }}
    delete[] Qs; delete[] acc; delete[] m; delete[] l;
    }}
}}
"""


def backward_source(spec: FlexSpec, score, grad, mask, bufs, joint=None, accs=()) -> str:
    """`flex_bwd(Q, K, V, dO, LSE, DELTA, dQ, dK, dV, kv lists, q lists, bufs, gouts)`; `grad`
    is d score_mod / d score (None: the identity). DELTA = rowsum(dO * O) - dLSE.

    With `joint` (score_mod's derivative with respect to the score and to each element it loads
    from a buffer that needs a gradient, `score.loads`; outputs [dS, dx...]) the query-row pass
    also adds dx into per-thread copies of those buffers' gradients (`accs`: [(buffer name,
    C++ type, extent)]), summed into `gouts` at the end; that element loop stays scalar (two
    lanes could hit one element)."""
    sm = score.function("score_mod", spec.dtype) if score else ""
    gm = grad.function("score_grad", spec.dtype) if grad else ""
    mm = mask.function("mask_mod", torch.bool) if mask else ""
    z = "score_mod(s, b, h, qi, j0 + j)" if score else "s"
    g = " * score_grad(s, b, h, qi, j0 + j)" if grad else ""
    keep = "(full || mask_mod(T(0), b, h, qi, j0 + j))" if mask else "true"
    body = f"""Gr[j] = p * (Gr[j] - dl){g};"""
    simd, acc_decl, acc_sum = "#pragma omp simd", "", ""
    if joint is not None:
        m = len(score.loads)
        which = {name: i for i, (name, _, _) in enumerate(accs)}
        adds = " ".join(f"gacc{which[buf]}[offs[{k}]] += outs[{k + 1}];"
                        for k, (buf, _, _, _) in enumerate(score.loads))
        xs = "".join(f", vals[{k}]" for k in range(m))
        sm += "\n    " + score.loads_function("score_loads") + "\n    " + \
            joint.outputs_function("score_joint")
        simd = ""
        body = f"""const T dz = p * (Gr[j] - dl);
                if (p == T(0)) {{ Gr[j] = 0; continue; }}
                int64_t offs[{max(m, 1)}]; T vals[{max(m, 1)}], outs[{m + 1}];
                score_loads(s, b, h, qi, j0 + j, offs, vals);
                score_joint(s, b, h, qi, j0 + j, dz{xs}, outs);
                Gr[j] = outs[0];
                if (accumulate) {{ {adds} }}"""
        acc_decl = "\n    ".join(f"{t}* gacc{i} = new {t}[{n}]();"
                                 for i, (_, t, n) in enumerate(accs))
        acc_sum = "#pragma omp critical\n    {\n" + "\n".join(
            f"        for (int64_t e = 0; e < {n}; ++e) static_cast<{t}*>(gouts[{i}])[e] += "
            f"gacc{i}[e];\n        delete[] gacc{i};" for i, (_, t, n) in enumerate(accs)) + \
            "\n    }"
    # P and dS of one tile from the recomputed scores S and dP = dO Vᵀ (in place)
    tile = f"""
    auto grad_tile = [&](int b, int h, int r0, int rn, int j0, int jn, bool full,
                         bool accumulate) {{
        const T* Lp = LSE + (int64_t)(b * HQ + h) * LQ;
        const T* Dp = DELTA + (int64_t)(b * HQ + h) * LQ;
        for (int r = 0; r < RQ; ++r) {{
            const int qi = r0 + r;
            T* Sr = S[r]; T* Gr = dP[r];
            if (r >= rn || Lp[qi] == NEG_INF) {{
                for (int j = 0; j < KBP; ++j) {{ Sr[j] = 0; Gr[j] = 0; }}
                continue;
            }}
            const T lse = Lp[qi], dl = Dp[qi];
            {simd}
            for (int j = 0; j < jn; ++j) {{
                const T s = Sr[j];
                const T p = {keep} ? ember::exp({z} - lse) : T(0);
                Sr[j] = p;
                {body}
            }}
            for (int j = jn; j < KBP; ++j) {{ Sr[j] = 0; Gr[j] = 0; }}
        }}
    }};"""
    load_rows = """
        auto load_rows = [&](const T* src, int r0, int rn, int n, T mul, T* dst) {
            for (int r = 0; r < RQ; ++r)
                for (int d = 0; d < n; ++d)
                    dst[r * n + d] = r < rn ? src[(int64_t)(r0 + r) * n + d] * mul : T(0);
        };"""
    return PRELUDE + _consts(spec) + _COMMON + f"""
extern "C" void flex_bwd(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V,
                         const T* __restrict__ dO, const T* __restrict__ LSE,
                         const T* __restrict__ DELTA, T* __restrict__ dQ, T* __restrict__ dK,
                         T* __restrict__ dV, const int32_t* num, const int32_t* idx,
                         const int32_t* full_num, const int32_t* full_idx, const int32_t* qnum,
                         const int32_t* qidx, const int32_t* qfull_num, const int32_t* qfull_idx,
                         void** bufs, void** gouts) {{
    {_buf_decls(bufs)}
    const bool one_pass = B * HKV >= 2 * omp_get_max_threads();
    #pragma omp parallel
    {{
    T* Qs = new T[RQ * D]; T* dOs = new T[RQ * DV]; T* acc = new T[RQ * D];
    T (*S)[KBP] = new T[RQ][KBP]; T (*dP)[KBP] = new T[RQ][KBP];
    T (*Kt)[KBP] = new T[D][KBP]; T (*Vt)[KBP] = new T[DV][KBP];
    T (*Pt)[RQ] = new T[KBP][RQ]; T (*DSt)[RQ] = new T[KBP][RQ];
    T (*dKa)[D] = new T[KBP][D]; T (*dVa)[DV] = new T[KBP][DV];
    {sm}
    {gm}
    {mm}
    {acc_decl}
    {tile}
    {load_rows}
    // dK, dV of one kv block (b, kv head, blk), walking the query blocks that attend it; with
    // with_dq also dQ += dS K into the rows of this kv head's query heads (the caller owns them)
    auto kv_block = [&](int b, int hk, int blk, bool with_dq) {{
        const int j0 = blk * KBS, jn = std::min(KBS, LKV - j0);
        const int64_t kv = (int64_t)(b * HKV + hk) * LKV + j0;
        load_t<D>(K + kv * D, jn, Kt);
        load_t<DV>(V + kv * DV, jn, Vt);
        for (int j = 0; j < KBP; ++j) {{
            for (int d = 0; d < D; ++d) dKa[j][d] = 0;
            for (int d = 0; d < DV; ++d) dVa[j][d] = 0;
        }}
        for (int h = hk * G; h < (hk + 1) * G; ++h) {{
            const int64_t bh = (int64_t)(b * HQ + h) * LQ;
            auto visit = [&](int qb, bool full) {{
                for (int r0 = qb * QBS; r0 < std::min(LQ, (qb + 1) * QBS); r0 += RQ) {{
                    const int rn = std::min(RQ, LQ - r0);
                    load_rows(Q + bh * D, r0, rn, D, SCALE, Qs);
                    load_rows(dO + bh * DV, r0, rn, DV, T(1), dOs);
                    tile_abt<D>((const T (*)[D])Qs, Kt, S);
                    tile_abt<DV>((const T (*)[DV])dOs, Vt, dP);
                    grad_tile(b, h, r0, rn, j0, jn, full, with_dq);
                    for (int r = 0; r < RQ; ++r)
                        for (int j = 0; j < KBP; ++j) {{ Pt[j][r] = S[r][j]; DSt[j][r] = dP[r][j]; }}
                    tile_pm<KBP, DV, RQ>(Pt, dOs, DV, RQ, dVa);
                    tile_pm<KBP, D, RQ>(DSt, Qs, D, RQ, dKa);   // Qs carries SCALE
                    if (with_dq) {{
                        load_rows(dQ + bh * D, r0, rn, D, T(1), acc);
                        tile_pm<RQ, D, KBP>(dP, K + kv * D, D, jn, (T (*)[D])acc);
                        for (int r = 0; r < rn; ++r)
                            for (int d = 0; d < D; ++d) dQ[(bh + r0 + r) * D + d] = acc[r * D + d];
                    }}
                }}
            }};
            {_mask_walk(kv_side=False)}
        }}
        for (int j = 0; j < jn; ++j) {{
            for (int d = 0; d < D; ++d) dK[(kv + j) * D + d] = dKa[j][d];
            for (int d = 0; d < DV; ++d) dV[(kv + j) * DV + d] = dVa[j][d];
        }}
    }};
    if (one_pass) {{
        // enough kv heads for every thread: a task per (b, kv head) owns its query heads' dQ
        // rows (dQ arrives zeroed), so S and dP are computed once
        #pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < B * HKV; ++t) {{
            const int hk = t % HKV, b = t / HKV;
            for (int blk = 0; blk < NKB; ++blk) kv_block(b, hk, blk, true);
            T* rows = dQ + (int64_t)(b * HQ + hk * G) * LQ * D;
            for (int64_t e = 0; e < (int64_t)G * LQ * D; ++e) rows[e] *= SCALE;
        }}
    }} else {{
    // dQ: tasks over (b, h, RQ query rows), walking the kv blocks of their query block
    #pragma omp for schedule(dynamic, 1)
    for (int t = 0; t < B * HQ * NCH; ++t) {{
        const int ch = NCH - 1 - t % NCH, h = (t / NCH) % HQ, b = t / (NCH * HQ);
        const int r0 = ch * RQ, rn = std::min(RQ, LQ - r0), blk = r0 / QBS, hk = h / G;
        const int64_t bh = (int64_t)(b * HQ + h) * LQ;
        load_rows(Q + bh * D, r0, rn, D, SCALE, Qs);
        load_rows(dO + bh * DV, r0, rn, DV, T(1), dOs);
        std::fill(acc, acc + RQ * D, T(0));
        auto visit = [&](int kb, bool full) {{
            const int j0 = kb * KBS, jn = std::min(KBS, LKV - j0);
            if (jn <= 0) return;
            const int64_t kv = (int64_t)(b * HKV + hk) * LKV + j0;
            load_t<D>(K + kv * D, jn, Kt);
            load_t<DV>(V + kv * DV, jn, Vt);
            tile_abt<D>((const T (*)[D])Qs, Kt, S);
            tile_abt<DV>((const T (*)[DV])dOs, Vt, dP);
            grad_tile(b, h, r0, rn, j0, jn, full, true);
            tile_pm<RQ, D, KBP>(dP, K + kv * D, D, jn, (T (*)[D])acc);
        }};
        {_mask_walk()}
        for (int r = 0; r < rn; ++r)
            for (int d = 0; d < D; ++d) dQ[(bh + r0 + r) * D + d] = acc[r * D + d] * SCALE;
    }}
    // dK, dV: tasks over (b, kv head, kv block)
    #pragma omp for schedule(dynamic, 1)
    for (int t = 0; t < B * HKV * NKB; ++t)
        kv_block(t / (NKB * HKV), (t / NKB) % HKV, NKB - 1 - t % NKB, false);
    }}
    {acc_sum}
    delete[] Qs; delete[] dOs; delete[] acc; delete[] S; delete[] dP; delete[] Kt; delete[] Vt;
    delete[] Pt; delete[] DSt; delete[] dKa; delete[] dVa;
    }}
}}
"""
