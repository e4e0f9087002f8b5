"""Stage 6, codegen: ember's fused CPU attention kernel for inference (fp32, no grad) as C++.

Consumes an `SdpaSpec` (sizes, strides, scale, additive mask strides). Produces one translation
unit with `sdpa_fwd(Q, K, V, MASK, O)`: O = softmax(scale Q·Kᵀ + MASK)·V, every size and stride a
compile-time constant, so each shape gets a kernel whose loops the compiler fully unrolls.

Why its own kernel (docs/design/085-small-attention-kernel.md): ATen's CPU flash kernel blocks
over queries and keys with fixed block sizes and calls a GEMM per block; at short key lengths
and small head dims (swin's 49x32 windows, ViT's 197x64, CLIP's 77x64) that overhead dominates.
Here the whole key row fits in cache, so no online softmax is needed:

- a task is (batch, head, QB query rows); its thread transposes K of that (batch, head) once into
  Kt[D][LKP] (kept while the next task has the same (batch, head)), LKP = Lk rounded up to 16;
- per R query rows: S[R][LKP] = (scale Q)·Kt with R x 32 register tiles (GCC vector types of 16
  floats, one zmm each on AVX-512), plus the mask row, then the row's max, exp and sum over the
  Lk real columns (ember::exp, vectorized by `omp simd`); causal (`is_causal`) rows stop at the
  tile's last row, so the keys above the diagonal are neither multiplied nor summed;
- O[R][DV] = P·V with R x DV register tiles, times 1/sum at the store. A row whose mask is -inf
  everywhere gives 0, as ATen's flash kernel does.
O is written in flash's layout: [B, Lq, H, DV] memory seen as [B, H, Lq, DV].
"""
from __future__ import annotations

import dataclasses

from .cpp_prelude import PRELUDE


@dataclasses.dataclass(frozen=True)
class SdpaSpec:
    B: int
    H: int
    LQ: int
    LK: int
    D: int
    DV: int
    scale: float
    q_strides: tuple          # (batch, head, row) element strides; the last dim's is 1
    k_strides: tuple
    v_strides: tuple
    m_strides: tuple | None   # (batch, head, row, column) of the additive mask, 0 = broadcast
    causal: bool = False      # query i attends keys 0..i (sdpa's is_causal: top-left aligned)


#: query rows per register tile: R x 2 vectors of scores, R x DV/16 vectors of output
def rows_per_tile(dv: int) -> int:
    return 12 if dv <= 32 else 6 if dv <= 64 else 3


def source(spec: SdpaSpec) -> str:
    """`sdpa_fwd(Q, K, V, MASK, O)` for `spec` (MASK is read only when spec has one)."""
    R = rows_per_tile(spec.DV)
    qb = 8 * R
    ms = spec.m_strides or (0, 0, 0, 0)
    consts = "\n".join(f"constexpr int64_t {n} = {v};" for n, v in zip(
        ("B", "H", "LQ", "LK", "D", "DV", "R", "QB", "QSB", "QSH", "QSL", "KSB", "KSH", "KSL",
         "VSB", "VSH", "VSL", "MSB", "MSH", "MSQ", "MSK"),
        (spec.B, spec.H, spec.LQ, spec.LK, spec.D, spec.DV, R, qb, *spec.q_strides,
         *spec.k_strides, *spec.v_strides, *ms)))
    return PRELUDE + f"""
#include <vector>
#ifdef __AVX512F__
#include <immintrin.h>
#endif
namespace {{
{consts}
constexpr bool HAS_MASK = {"true" if spec.m_strides else "false"};
constexpr bool CAUSAL = {"true" if spec.causal else "false"};
constexpr float SCALE = {float.hex(spec.scale)}f;
constexpr int64_t LKP = (LK + 15) / 16 * 16, NQB = (LQ + QB - 1) / QB;
typedef float vf __attribute__((vector_size(64)));
typedef float vfu __attribute__((vector_size(64), aligned(4)));
static inline vf ld(const float* p) {{ return *reinterpret_cast<const vfu*>(p); }}
static inline void st(float* p, vf x) {{ *reinterpret_cast<vfu*>(p) = x; }}

// S[r][j..j+16NJ) = qs[r]·Kt[:, j..j+16NJ) for the R' rows of qs (scaled queries, [R'][D])
template <int RR, int NJ>
static inline void qk_tile(const float* __restrict__ qs, const float* __restrict__ Kt,
                           float* __restrict__ S, int64_t j) {{
    vf acc[RR][NJ] = {{}};
    for (int64_t d = 0; d < D; ++d) {{
        vf kv[NJ];
        for (int n = 0; n < NJ; ++n) kv[n] = ld(Kt + d * LKP + j + 16 * n);
        for (int r = 0; r < RR; ++r) {{
            const vf qv = vf{{}} + qs[r * D + d];
            for (int n = 0; n < NJ; ++n) acc[r][n] += qv * kv[n];
        }}
    }}
    for (int r = 0; r < RR; ++r)
        for (int n = 0; n < NJ; ++n) st(S + r * LKP + j + 16 * n, acc[r][n]);
}}

// RR query rows from qrow0 of (b, h): scores, softmax, P·V, stored to O
template <int RR>
static void rows(const float* __restrict__ Qp, const float* __restrict__ Kt,
                 const float* __restrict__ Vp, const float* __restrict__ Mp,
                 float* __restrict__ Op, float* __restrict__ qs, float* __restrict__ S,
                 int64_t row) {{
    // causal: these rows see keys below row + RR only, row + r the keys up to row + r
    const int64_t lk = CAUSAL ? std::min<int64_t>(LK, row + RR) : LK, lkp = (lk + 15) / 16 * 16;
    for (int r = 0; r < RR; ++r)
        for (int64_t d = 0; d < D; ++d) qs[r * D + d] = Qp[r * QSL + d] * SCALE;
    int64_t j = 0;
    for (; j + 32 <= lkp; j += 32) qk_tile<RR, 2>(qs, Kt, S, j);
    if (j < lkp) qk_tile<RR, 1>(qs, Kt, S, j);
    float inv[RR];
    for (int r = 0; r < RR; ++r) {{
        float* __restrict__ Sr = S + r * LKP;
        if constexpr (HAS_MASK) {{
            const float* __restrict__ Mr = Mp + r * MSQ;
            #pragma omp simd
            for (int64_t c = 0; c < lk; ++c) Sr[c] += Mr[c * MSK];
        }}
        if constexpr (CAUSAL)
            for (int64_t c = row + r + 1; c < lk; ++c) Sr[c] = -INFINITY;
        float mx = -INFINITY;
        #pragma omp simd reduction(max:mx)
        for (int64_t c = 0; c < lk; ++c) mx = Sr[c] > mx ? Sr[c] : mx;
        float sum = 0.0f;
        if (mx == -INFINITY) {{            // every key masked: the row is 0, as flash gives
            for (int64_t c = 0; c < lk; ++c) Sr[c] = 0.0f;
        }} else {{
            #pragma omp simd reduction(+:sum)
            for (int64_t c = 0; c < lk; ++c) {{ const float p = ember::exp(Sr[c] - mx); Sr[c] = p; sum += p; }}
        }}
        inv[r] = sum > 0.0f ? 1.0f / sum : 0.0f;
    }}
    constexpr int NV = DV / 16;
    vf acc[RR][NV] = {{}};
    for (int64_t c = 0; c < lk; ++c) {{
        vf vv[NV];
        for (int n = 0; n < NV; ++n) vv[n] = ld(Vp + c * VSL + 16 * n);
        for (int r = 0; r < RR; ++r) {{
            const vf pv = vf{{}} + S[r * LKP + c];
            for (int n = 0; n < NV; ++n) acc[r][n] += pv * vv[n];
        }}
    }}
    for (int r = 0; r < RR; ++r)
        for (int n = 0; n < NV; ++n) st(Op + r * H * DV + 16 * n, acc[r][n] * inv[r]);
}}

// Kt[d][c] = Kp[c][d]: 16x16 blocks in registers on AVX-512 (unpack, then lane shuffles)
static void transpose_k(const float* __restrict__ Kp, float* __restrict__ kt) {{
    int64_t c0 = 0;
#ifdef __AVX512F__
    for (; c0 + 16 <= LK; c0 += 16)
        for (int64_t d0 = 0; d0 < D; d0 += 16) {{
            __m512 r[16], t[16];
            for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(Kp + (c0 + i) * KSL + d0);
            for (int i = 0; i < 8; ++i) {{
                t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
                t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
            }}
            for (int i = 0; i < 4; ++i) {{        // r[4i + j]: lane L holds column 4L + j of 4 rows
                const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 2]);
                const __m512d e = _mm512_castps_pd(t[4 * i + 1]), f = _mm512_castps_pd(t[4 * i + 3]);
                r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
                r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
                r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(e, f));
                r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(e, f));
            }}
            for (int j = 0; j < 4; ++j) {{
                t[j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);
                t[4 + j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xdd);
                t[8 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
                t[12 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xdd);
            }}
            float* o = kt + d0 * LKP + c0;
            for (int j = 0; j < 4; ++j) {{
                _mm512_storeu_ps(o + j * LKP, _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88));
                _mm512_storeu_ps(o + (8 + j) * LKP, _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd));
                _mm512_storeu_ps(o + (4 + j) * LKP, _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0x88));
                _mm512_storeu_ps(o + (12 + j) * LKP, _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0xdd));
            }}
        }}
#endif
    for (int64_t c = c0; c < LK; ++c)
        for (int64_t d = 0; d < D; ++d) kt[d * LKP + c] = Kp[c * KSL + d];
}}

template <int RR>
static void tail(int rn, const float* Qp, const float* Kt, const float* Vp, const float* Mp,
                 float* Op, float* qs, float* S, int64_t row) {{
    if constexpr (RR > 0) {{
        if (rn == RR) rows<RR>(Qp, Kt, Vp, Mp, Op, qs, S, row);
        else tail<RR - 1>(rn, Qp, Kt, Vp, Mp, Op, qs, S, row);
    }}
}}
}}  // namespace

extern "C" void sdpa_fwd(const float* __restrict__ Q, const float* __restrict__ K,
                         const float* __restrict__ V, const float* __restrict__ M,
                         float* __restrict__ O) {{
    #pragma omp parallel
    {{
    std::vector<float> kt(D * LKP, 0.0f), qs(R * D), s(R * LKP);
    int64_t held = -1;                  // the (batch, head) whose K is in kt
    #pragma omp for schedule(static)
    for (int64_t t = 0; t < B * H * NQB; ++t) {{
        const int64_t bh = t / NQB, b = bh / H, h = bh % H, q0 = (t % NQB) * QB;
        const int64_t qn = std::min(QB, LQ - q0);
        if (bh != held) {{
            transpose_k(K + b * KSB + h * KSH, kt.data());
            held = bh;
        }}
        const float* Vp = V + b * VSB + h * VSH;
        for (int64_t r0 = q0; r0 < q0 + qn; r0 += R) {{
            const float* Qp = Q + b * QSB + h * QSH + r0 * QSL;
            const float* Mp = HAS_MASK ? M + b * MSB + h * MSH + r0 * MSQ : nullptr;
            float* Op = O + ((b * LQ + r0) * H + h) * DV;
            const int rn = (int)std::min<int64_t>(R, q0 + qn - r0);
            if (rn == R) rows<R>(Qp, kt.data(), Vp, Mp, Op, qs.data(), s.data(), r0);
            else tail<R - 1>(rn, Qp, kt.data(), Vp, Mp, Op, qs.data(), s.data(), r0);
        }}
    }}
    }}
}}
"""
