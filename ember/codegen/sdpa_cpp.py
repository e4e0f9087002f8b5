"""Stage 6, codegen: ember's fused CPU attention kernel for inference (fp32, no grad) as C++.

Consumes an `SdpaSpec` (head dims, the mask's kind: none, additive float or bool, causality). Produces one
translation unit with `sdpa_fwd(Q, K, V, MASK, O, sizes, scale)`: O = softmax(scale Q·Kᵀ + MASK)·V.

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
- with a mask, a row tile first finds the keys [lo, hi) outside which the mask makes every
  softmax weight of its rows exactly 0 (`live_keys`: exact for any mask; causal, sliding-window
  and padding masks then skip as `is_causal` does, docs/design/091-causal-masks.md);
- O[R][DV] = P·V with R x DV register tiles, times 1/sum at the store. A row whose mask is -inf
  everywhere gives 0, as ATen's flash kernel does.
O is written in flash's layout: [B, Lq, H, DV] memory seen as [B, H, Lq, DV].
Head dims, mask and causality are compiled in, and the key length when it is short (`FIXED_LK`:
its loops unroll); other sizes, strides and the scale are arguments, so one kernel serves every
layer of a model.
"""
from __future__ import annotations

import dataclasses

from .cpp_prelude import PRELUDE


@dataclasses.dataclass(frozen=True)
class SdpaSpec:
    """What a kernel is compiled for; sizes, strides and the scale are run-time arguments."""
    D: int
    DV: int
    mask: str                 # "": none, "float": additive, "bool": True keeps (False: -inf)
    causal: bool              # query i attends keys 0..i (sdpa's is_causal: top-left aligned)
    lk: int = 0               # the key length compiled in (short rows: loops unrolled), 0: any


#: the run-time arguments, in the order of sdpa_fwd's int64 array
SIZES = ("B", "H", "LQ", "LK", "QSB", "QSH", "QSL", "KSB", "KSH", "KSL", "VSB", "VSH", "VSL",
         "MSB", "MSH", "MSQ", "MSK")


#: key lengths up to this are compiled into the kernel (measured: 49x32 windows 1.22x -> 1.26x,
#: CLIP's 77x64 1.17x -> 1.29x of flash)
FIXED_LK = 256


#: query rows per register tile: R x 2 vectors of scores, R x DV/16 vectors of output
def rows_per_tile(dv: int) -> int:
    return 12 if dv <= 32 else 6 if dv <= 64 else 3


def source(spec: SdpaSpec) -> str:
    """`sdpa_fwd(Q, K, V, MASK, O, sizes, scale)`: `sizes` is int64[len(SIZES)] (element strides
    of q, k, v as (batch, head, row), of the mask as (batch, head, row, column), 0 = broadcast);
    MASK is read only when spec has one."""
    R = rows_per_tile(spec.DV)
    fields = " ".join(f"int64_t {n};" for n in SIZES)
    return PRELUDE + f"""
#include <vector>
#ifdef __AVX512F__
#include <immintrin.h>
#endif
namespace {{
constexpr int64_t D = {spec.D}, DV = {spec.DV}, R = {R}, QB = 8 * R;
constexpr bool HAS_MASK = {"true" if spec.mask else "false"};
constexpr bool BOOL_MASK = {"true" if spec.mask == "bool" else "false"};
typedef {"uint8_t" if spec.mask == "bool" else "float"} mask_t;   // (a bool: 0 or 1)
constexpr bool CAUSAL = {"true" if spec.causal else "false"};
constexpr int64_t LKC = {spec.lk};
struct Sz {{ {fields} int64_t LKP; float scale; }};
typedef float vf __attribute__((vector_size(64)));
typedef float vfu __attribute__((vector_size(64), aligned(4)));
static inline vf ld(const float* p) {{ return *reinterpret_cast<const vfu*>(p); }}
static inline void st(float* p, vf x) {{ *reinterpret_cast<vfu*>(p) = x; }}

// S[r][j..j+16NJ) = qs[r]·Kt[:, j..j+16NJ) for the R' rows of qs (scaled queries, [R'][D])
template <int RR, int NJ>
static inline void qk_tile(const float* __restrict__ qs, const float* __restrict__ Kt,
                           float* __restrict__ S, int64_t j, const int64_t LKP) {{
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

// max over keys of |k_c| (from Kt, whose padding columns are 0): live_keys' bound
static float key_norm(const Sz& z, const float* __restrict__ kt) {{
    const int64_t LKP = LKC ? (LKC + 15) / 16 * 16 : z.LKP;
    std::vector<float> n2(LKP, 0.0f);
    for (int64_t d = 0; d < D; ++d) {{
        #pragma omp simd
        for (int64_t c = 0; c < LKP; ++c) n2[c] += kt[d * LKP + c] * kt[d * LKP + c];
    }}
    float mx = 0.0f;
    for (int64_t c = 0; c < LKP; ++c) mx = n2[c] > mx ? n2[c] : mx;
    return std::sqrt(mx);
}}

// The keys [lo, hi) outside which the mask gives every one of the RR rows a softmax weight of
// exactly 0 (so those keys are neither multiplied nor summed: causal, sliding-window and padding
// masks, found at run time for any mask). B = scale |q_r| max_c |k_c| bounds |score| of every
// key (Cauchy-Schwarz); A bool mask's False is -inf. Key c is dead for
// row r when M[c] = -inf, or, for a float mask whose row maximum mx and B are at most 2^20,
// when M[c] < mx - 2 B - 128: its score + M[c] then lies more than 128 below that of the row's
// largest-mask key (float rounding of the scores and sums moves them by at most
// 2^-24 (D + 2) 2^21 < 17 there), so more than 105 below the row's max, where the exp gives
// exactly 0 (cpp_prelude's ember::exp below -104, as flash's).
// A NaN in the mask is never dead; a non-finite B (q or k not finite) skips nothing, so NaNs
// come out as in eager.
template <int RR>
static inline void live_keys(const Sz& z, const mask_t* __restrict__ Mp, const float* qs,
                             const float* __restrict__ Kt, float& kmax, const int64_t LK,
                             int64_t& lo, int64_t& hi) {{
    constexpr float BIG = 1048576.0f;
    const int64_t MSK = z.MSK;
    // first a cheap look at the end keys: only a mask at most -1024 (or False) there for every
    // row can have dead keys at that end worth finding (bias masks and none stop here)
    auto low = [&](int64_t c) {{
        for (int r = 0; r < RR; ++r) {{
            const mask_t m = Mp[r * z.MSQ + c * MSK];
            if (BOOL_MASK ? m : !(m <= -1024.0f)) return false;
        }}
        return true;
    }};
    const bool at_hi = hi > lo && low(hi - 1), at_lo = hi > lo && low(lo);
    if (!at_hi && !at_lo) return;
    if (kmax < 0.0f) kmax = key_norm(z, Kt);
    float thr[RR], mx = -INFINITY;
    for (int r = 0; r < RR; ++r) {{
        float n2 = 0.0f;
        #pragma omp simd reduction(+:n2)
        for (int64_t d = 0; d < D; ++d) n2 += qs[r * D + d] * qs[r * D + d];
        const float b = std::sqrt(n2) * kmax * 1.001f;
        if (!std::isfinite(b)) return;
        if constexpr (!BOOL_MASK) {{
            const mask_t* __restrict__ Mr = Mp + r * z.MSQ;
            if (r == 0 || z.MSQ != 0) {{          // (a mask broadcast over queries: one row)
                mx = -INFINITY;
                if (MSK == 1) {{
                    #pragma omp simd reduction(max:mx)
                    for (int64_t c = 0; c < LK; ++c) mx = Mr[c] > mx ? Mr[c] : mx;
                }} else {{
                    for (int64_t c = 0; c < LK; ++c) mx = Mr[c * MSK] > mx ? Mr[c * MSK] : mx;
                }}
            }}
            thr[r] = b <= BIG && std::fabs(mx) <= BIG ? mx - 2.0f * b - 128.0f : -INFINITY;
        }}
    }}
    // whether any of the RR rows gives key c a weight
    auto live = [&](int r, int64_t c) {{
        const mask_t m = Mp[r * z.MSQ + c * MSK];
        if constexpr (BOOL_MASK) return m;
        else return !(m < thr[r]) && m != -INFINITY;
    }};
    auto dead = [&](int64_t c) {{
        for (int r = 0; r < RR; ++r)
            if (live(r, c)) return false;
        return true;
    }};
    auto dead16 = [&](int64_t c0) {{    // keys [c0, c0 + 16) of an inner-dense mask, 16 lanes
        if constexpr (BOOL_MASK) {{
            uint64_t any[2] = {{0, 0}};
            for (int r = 0; r < RR; ++r) {{
                uint64_t w[2];
                std::memcpy(w, Mp + r * z.MSQ + c0, 16);
                any[0] |= w[0];
                any[1] |= w[1];
            }}
            return (any[0] | any[1]) == 0;
        }} else {{
            typedef int32_t vi __attribute__((vector_size(64)));
            vi any = {{}};
            for (int r = 0; r < RR; ++r) {{
                const vf m = ld(reinterpret_cast<const float*>(Mp + r * z.MSQ + c0));
                any |= ~(m < thr[r]) & (m != -INFINITY);
            }}
            for (int i = 0; i < 16; ++i)
                if (any[i]) return false;
            return true;
        }}
    }};
    if (at_hi && dead(hi - 1)) {{
        if (MSK == 1)
            while (hi - 16 >= lo && dead16(hi - 16)) hi -= 16;
        while (hi > lo && dead(hi - 1)) --hi;
    }}
    if (at_lo && lo < hi && dead(lo)) {{
        if (MSK == 1)
            while (lo + 16 <= hi && dead16(lo)) lo += 16;
        while (lo < hi && dead(lo)) ++lo;
    }}
}}

// RR query rows from row of (b, h) (scaled queries in qs) over the keys [lo, lk): scores,
// softmax, P·V, stored to O. ALL: every key (lo = 0, lk = LK: a compiled-in key length then
// gives constant loop bounds, which unroll)
template <int RR, bool ALL>
static void attend(const Sz& z, const float* __restrict__ Kt, const float* __restrict__ Vp,
                   const mask_t* __restrict__ Mp, float* __restrict__ Op,
                   const float* __restrict__ qs, float* __restrict__ S, int64_t row,
                   int64_t lo, int64_t lk) {{
    const int64_t LKP = LKC ? (LKC + 15) / 16 * 16 : z.LKP;
    if constexpr (ALL) {{
        lo = 0;
        lk = LKC ? LKC : z.LK;
    }}
    const int64_t lkp = (lk + 15) / 16 * 16;
    int64_t j = lo / 16 * 16;
    for (; j + 32 <= lkp; j += 32) qk_tile<RR, 2>(qs, Kt, S, j, LKP);
    if (j < lkp) qk_tile<RR, 1>(qs, Kt, S, j, LKP);
    float inv[RR];
    for (int r = 0; r < RR; ++r) {{
        float* __restrict__ Sr = S + r * LKP;
        if constexpr (BOOL_MASK) {{
            const mask_t* __restrict__ Mr = Mp + r * z.MSQ;
            if (z.MSK == 1) {{
                #pragma omp simd
                for (int64_t c = lo; c < lk; ++c) Sr[c] = Mr[c] ? Sr[c] : -INFINITY;
            }} else {{
                for (int64_t c = lo; c < lk; ++c) Sr[c] = Mr[c * z.MSK] ? Sr[c] : -INFINITY;
            }}
        }} else if constexpr (HAS_MASK) {{
            const mask_t* __restrict__ Mr = Mp + r * z.MSQ;
            if (z.MSK == 1) {{
                #pragma omp simd
                for (int64_t c = lo; c < lk; ++c) Sr[c] += Mr[c];
            }} else {{
                for (int64_t c = lo; c < lk; ++c) Sr[c] += Mr[c * z.MSK];
            }}
        }}
        if constexpr (CAUSAL)
            for (int64_t c = row + r + 1; c < lk; ++c) Sr[c] = -INFINITY;
        float mx = -INFINITY;
        #pragma omp simd reduction(max:mx)
        for (int64_t c = lo; c < lk; ++c) mx = Sr[c] > mx ? Sr[c] : mx;
        float sum = 0.0f;
        if (mx == -INFINITY) {{            // every key masked: the row is 0, as flash gives
            for (int64_t c = lo; c < lk; ++c) Sr[c] = 0.0f;
        }} else {{
            #pragma omp simd reduction(+:sum)
            for (int64_t c = lo; c < lk; ++c) {{
                const float p = ember::exp(Sr[c] - mx);
                Sr[c] = p;
                sum += p;
            }}
        }}
        inv[r] = sum > 0.0f ? 1.0f / sum : 0.0f;
    }}
    constexpr int NV = DV / 16;
    vf acc[RR][NV] = {{}};
    for (int64_t c = lo; c < lk; ++c) {{
        vf vv[NV];
        for (int n = 0; n < NV; ++n) vv[n] = ld(Vp + c * z.VSL + 16 * n);
        for (int r = 0; r < RR; ++r) {{
            const vf pv = vf{{}} + S[r * LKP + c];
            for (int n = 0; n < NV; ++n) acc[r][n] += pv * vv[n];
        }}
    }}
    for (int r = 0; r < RR; ++r)
        for (int n = 0; n < NV; ++n) st(Op + r * z.H * DV + 16 * n, acc[r][n] * inv[r]);
}}

// RR query rows from row of (b, h): the keys that count (causal: those below row + RR; with a
// mask: live_keys), then attend
template <int RR>
static void rows(const Sz& z, const float* __restrict__ Qp, const float* __restrict__ Kt,
                 const float* __restrict__ Vp, const mask_t* __restrict__ Mp,
                 float* __restrict__ Op, float* __restrict__ qs, float* __restrict__ S,
                 int64_t row, float& kmax) {{
    const int64_t LK = LKC ? LKC : z.LK;
    int64_t lo = 0, lk = CAUSAL ? std::min<int64_t>(LK, row + RR) : LK;
    for (int r = 0; r < RR; ++r)
        for (int64_t d = 0; d < D; ++d) qs[r * D + d] = Qp[r * z.QSL + d] * z.scale;
    if constexpr (HAS_MASK) live_keys<RR>(z, Mp, qs, Kt, kmax, LK, lo, lk);
    if (!CAUSAL && lo == 0 && lk == LK) attend<RR, true>(z, Kt, Vp, Mp, Op, qs, S, row, lo, lk);
    else attend<RR, false>(z, Kt, Vp, Mp, Op, qs, S, row, lo, lk);
}}

// Kt[d][c] = Kp[c][d]: 16x16 blocks in registers on AVX-512 (unpack, then lane shuffles)
static void transpose_k(const Sz& z, const float* __restrict__ Kp, float* __restrict__ kt) {{
    const int64_t LK = LKC ? LKC : z.LK, LKP = LKC ? (LKC + 15) / 16 * 16 : z.LKP, KSL = z.KSL;
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
static void tail(const Sz& z, int rn, const float* Qp, const float* Kt, const float* Vp,
                 const mask_t* Mp, float* Op, float* qs, float* S, int64_t row, float& kmax) {{
    if constexpr (RR > 0) {{
        if (rn == RR) rows<RR>(z, Qp, Kt, Vp, Mp, Op, qs, S, row, kmax);
        else tail<RR - 1>(z, rn, Qp, Kt, Vp, Mp, Op, qs, S, row, kmax);
    }}
}}
}}  // namespace

extern "C" void sdpa_fwd(const float* __restrict__ Q, const float* __restrict__ K,
                         const float* __restrict__ V, const void* M,
                         float* __restrict__ O, const int64_t* sizes, float scale) {{
    Sz z;
    std::memcpy(&z, sizes, sizeof(int64_t) * {len(SIZES)});
    z.LKP = (z.LK + 15) / 16 * 16;
    z.scale = scale;
    const int64_t NQB = (z.LQ + QB - 1) / QB;
    #pragma omp parallel
    {{
    std::vector<float> kt(D * z.LKP, 0.0f), qs(R * D), s(R * z.LKP);
    int64_t held = -1;                  // the (batch, head) whose K is in kt
    float kmax = -1.0f;                 // max_c |k_c| of that (batch, head), once live_keys asks
    #pragma omp for schedule(static)
    for (int64_t t = 0; t < z.B * z.H * NQB; ++t) {{
        const int64_t bh = t / NQB, b = bh / z.H, h = bh % z.H, q0 = (t % NQB) * QB;
        const int64_t qn = std::min(QB, z.LQ - q0);
        if (bh != held) {{
            transpose_k(z, K + b * z.KSB + h * z.KSH, kt.data());
            held = bh;
            kmax = -1.0f;
        }}
        const float* Vp = V + b * z.VSB + h * z.VSH;
        for (int64_t r0 = q0; r0 < q0 + qn; r0 += R) {{
            const float* Qp = Q + b * z.QSB + h * z.QSH + r0 * z.QSL;
            const mask_t* Mp = HAS_MASK ? static_cast<const mask_t*>(M) + b * z.MSB + h * z.MSH +
                                          r0 * z.MSQ : nullptr;
            float* Op = O + ((b * z.LQ + r0) * z.H + h) * DV;
            const int rn = (int)std::min<int64_t>(R, q0 + qn - r0);
            if (rn == R) rows<R>(z, Qp, kt.data(), Vp, Mp, Op, qs.data(), s.data(), r0, kmax);
            else tail<R - 1>(z, rn, Qp, kt.data(), Vp, Mp, Op, qs.data(), s.data(), r0, kmax);
        }}
    }}
    }}
}}
"""
