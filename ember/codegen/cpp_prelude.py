"""Stage 6, codegen: the C++ prelude every translation unit starts with.

Plain C++17, no torch headers. float math (exp, log, erf, tanh, sigmoid) is written as
branch-free polynomials (Cephes / Eigen coefficients, ~1-2 ulp) so `#pragma omp simd` loops
vectorize without -ffast-math; the rest of <cmath> (sin, pow, atan2, ..., and double) is called
in vector form from glibc's libmvec where the build links it (EMBER_LIBMVEC; a scalar libm call a
lane made sin 10x and atan 20x slower than eager). NaN propagates like eager (max/min).

Consumes: nothing. Produces: PRELUDE (a string), and STAGED: the conversions of staged simd loops.
"""

PRELUDE = r"""
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <algorithm>
#include <type_traits>
#include <omp.h>

#if defined(EMBER_LIBMVEC) && defined(__GLIBC__)
// glibc's libmvec has vector forms of these (<= 4 ulp; special values go to the scalar code):
// declared `omp declare simd`, a vectorized loop calls them a vector at a time (glibc itself
// declares them so only under -ffast-math). exp, log, tanh, erf, expm1, log1p of float are
// ember's own polynomials below.
#define EMBER_SIMD(name) _Pragma("omp declare simd notinbranch") float name##f(float); \
    _Pragma("omp declare simd notinbranch") double name(double);
#define EMBER_SIMD2(name) _Pragma("omp declare simd notinbranch") float name##f(float, float); \
    _Pragma("omp declare simd notinbranch") double name(double, double);
// (C linkage: a redeclaration inherits math.h's)
EMBER_SIMD(sin) EMBER_SIMD(cos) EMBER_SIMD(exp) EMBER_SIMD(log) EMBER_SIMD2(pow)
#if __GLIBC_PREREQ(2, 35)
EMBER_SIMD(tan) EMBER_SIMD(asin) EMBER_SIMD(acos) EMBER_SIMD(atan) EMBER_SIMD(sinh)
EMBER_SIMD(cosh) EMBER_SIMD(tanh) EMBER_SIMD(asinh) EMBER_SIMD(acosh) EMBER_SIMD(atanh)
EMBER_SIMD(exp2) EMBER_SIMD(log2) EMBER_SIMD(log10) EMBER_SIMD(erf) EMBER_SIMD(erfc)
EMBER_SIMD(expm1) EMBER_SIMD(log1p) EMBER_SIMD2(atan2) EMBER_SIMD2(hypot)
#endif
#undef EMBER_SIMD
#undef EMBER_SIMD2
namespace ember {
// sin and cos of one value: g++ merges std::sin and std::cos into one scalar sincos call, which
// no loop vectorizes (RoPE's cos/sin cache); names of their own for the same symbols are not
// merged
#pragma omp declare simd notinbranch
float sin_(float) __asm__("sinf");
#pragma omp declare simd notinbranch
double sin_(double) __asm__("sin");
#pragma omp declare simd notinbranch
float cos_(float) __asm__("cosf");
#pragma omp declare simd notinbranch
double cos_(double) __asm__("cos");
}
#else
namespace ember {
template <typename T> static inline T sin_(T x) { return std::sin(x); }
template <typename T> static inline T cos_(T x) { return std::cos(x); }
}
#endif

typedef uint16_t ember_bf16;
typedef _Float16 ember_half;

namespace ember {

static inline float bf16_to_float(uint16_t v) {
    uint32_t bits = static_cast<uint32_t>(v) << 16; float f; std::memcpy(&f, &bits, 4); return f;
}
static inline uint16_t float_to_bf16(float f) {
    uint32_t bits; std::memcpy(&bits, &f, 4);
    uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    return f != f ? static_cast<uint16_t>(0x7fc0u) : static_cast<uint16_t>(rounded);
}
static inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }
// fp16 <-> float with integer and float ops, bit-exact with torch's conversions (nan payloads
// kept and quieted, round to nearest even, denormals): g++ 12 vectorizes no loop that converts
// _Float16, even with AVX512-FP16 (scalar vcvtsh2ss; without it a libgcc call a value), which
// made fp16 kernels 5-30x slower than eager
static inline float half_to_float(ember_half h) {
    uint16_t v; std::memcpy(&v, &h, 2);
    uint32_t em = static_cast<uint32_t>(v & 0x7fffu) << 13;
    float f; std::memcpy(&f, &em, 4);
    f *= 5.192296858534828e33f;                       // 2^112: rebias; denormals come out exact
    uint32_t bits; std::memcpy(&bits, &f, 4);
    bits |= em >= (0x7c00u << 13) ? 0x7f800000u : 0u;   // inf, nan
    bits |= em > (0x7c00u << 13) ? 0x00400000u : 0u;    // nan: quieted
    bits |= static_cast<uint32_t>(v & 0x8000u) << 16;
    std::memcpy(&f, &bits, 4);
    return f;
}
static inline ember_half float_to_half(float f) {
    uint32_t u; std::memcpy(&u, &f, 4);
    uint32_t sign = u & 0x80000000u;
    u ^= sign;
    uint32_t normal = (u - (112u << 23) + 0xfffu + ((u >> 13) & 1u)) >> 13;   // nearest even
    float fu; std::memcpy(&fu, &u, 4);
    float sub = fu + 0.5f;                            // below 2^-14: the fp16 denormal's bits
    uint32_t sb; std::memcpy(&sb, &sub, 4);
    uint32_t o = u < (113u << 23) ? sb - 0x3f000000u : normal;
    o = u >= (143u << 23) ? (u > 0x7f800000u ? 0x7e00u | ((u >> 13) & 0x3ffu) : 0x7c00u) : o;
    uint16_t v = static_cast<uint16_t>(o | (sign >> 16));
    ember_half h; std::memcpy(&h, &v, 2);
    return h;
}
// f rounded to the nearest fp16 value, as float (half_to_float(float_to_half(f)) bit for bit,
// checked over all 2^32 floats): f plus and minus a float whose ulp is the fp16 quantum at f's
// exponent (2^-24 below 2^-14) rounds to nearest even in one float add; 10 vector ops where
// the round trip took ~30 (fp16 silu(x) * y, whose silu is rounded, ran at 0.8x eager)
static inline float round_half(float f) {
    uint32_t u; std::memcpy(&u, &f, 4);
    uint32_t sign = u & 0x80000000u, a = u ^ sign;
    uint32_t mb = std::max<uint32_t>((a & 0x7f800000u) + (13u << 23), 0x3f000000u);
    float m, af; std::memcpy(&m, &mb, 4); std::memcpy(&af, &a, 4);
    float r = (af + m) - m;
    uint32_t rb; std::memcpy(&rb, &r, 4);
    // nan: quieted, payload cut to fp16's 10 bits; above 65504 after rounding: inf
    rb = a > 0x7f800000u ? (a | 0x00400000u) & 0xffffe000u : (rb > 0x477fe000u ? 0x7f800000u : rb);
    rb |= sign;
    std::memcpy(&f, &rb, 4);
    return f;
}

// a kernel's per-thread row scratch too long for the stack (kernel-local rows, schedule/memory.py):
// allocated once per thread and kept (aligned for the simd loops)
template <typename T> struct RowScratch {
    T* p = nullptr;
    int64_t n = 0;
    T* get(int64_t m) {
        if (m > n) {
            std::free(p);
            p = static_cast<T*>(std::aligned_alloc(64, (m * sizeof(T) + 63) / 64 * 64));
            n = m;
        }
        return p;
    }
    ~RowScratch() { std::free(p); }
};

// per-thread partials of column sums in a row kernel (codegen/cpp_columns.py), zeroed
template <typename T> struct Zeroed {
    T* p;
    explicit Zeroed(int64_t n) : p(static_cast<T*>(std::calloc(n > 0 ? n : 1, sizeof(T)))) {}
    ~Zeroed() { std::free(p); }
};

template <typename T> static inline T max_nan(T a, T b) { return (a != a || a > b) ? a : b; }
template <typename T> static inline T min_nan(T a, T b) { return (a != a || a < b) ? a : b; }
template <typename T> static inline T maximum(T a, T b) { return (a != a) ? a : ((b != b) ? b : (a > b ? a : b)); }
template <typename T> static inline T minimum(T a, T b) { return (a != a) ? a : ((b != b) ? b : (a < b ? a : b)); }
template <typename T> static inline T abs_(T a) { return a < 0 ? -a : a; }
static inline float abs_(float a) { return std::fabs(a); }
static inline double abs_(double a) { return std::fabs(a); }
template <typename T> static inline T relu(T a) { return a < 0 ? T(0) : a; }
template <typename T> static inline T sign(T a) { return static_cast<T>((T(0) < a) - (a < T(0))); }
template <typename T> static inline bool isnan_(T a) { return a != a; }
template <typename T> static inline T bitwise_not(T a) { return ~a; }
static inline bool bitwise_not(bool a) { return !a; }
template <typename T> static inline T reciprocal(T a) { return T(1) / a; }
template <typename T> static inline T rsqrt(T a) { return T(1) / std::sqrt(a); }
static inline float floordiv(float a, float b) { return std::floor(a / b); }
static inline double floordiv(double a, double b) { return std::floor(a / b); }
static inline float remainder(float a, float b) {
    float r = std::fmod(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static inline double remainder(double a, double b) {
    double r = std::fmod(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
template <typename T> static inline T pow_(T a, T b) { return std::pow(a, b); }

// m ? a : b for an m that is the same in every iteration of the simd loop: g++ 12 does not
// vectorize a select on a loop-invariant bool (masked pooling windows, padding), but it does
// vectorize these bit operations (the mask k is hoisted and broadcast).
template <typename T> static inline T pick(bool m, T a, T b) {
    if constexpr (std::is_same_v<T, bool>) {
        return (m & a) | (!m & b);
    } else {
        using U = std::conditional_t<sizeof(T) == 8, uint64_t, std::conditional_t<sizeof(T) == 4,
                  uint32_t, std::conditional_t<sizeof(T) == 2, uint16_t, uint8_t>>>;
        U k = static_cast<U>(-static_cast<U>(m));
        return __builtin_bit_cast(T, static_cast<U>((__builtin_bit_cast(U, a) & k)
                                                    | (__builtin_bit_cast(U, b) & ~k)));
    }
}

// ---- integer arithmetic that wraps like eager (signed overflow is UB in C++) ----
// computed in an unsigned type at least as wide as int (uint16 * uint16 promotes to signed
// int and can overflow it), then narrowed, which is modular
template <typename T> using uwide = std::conditional_t<(sizeof(T) < 4), uint32_t, std::make_unsigned_t<T>>;
template <typename T> static inline T wadd(T a, T b) { return static_cast<T>(static_cast<uwide<T>>(a) + static_cast<uwide<T>>(b)); }
template <typename T> static inline T wsub(T a, T b) { return static_cast<T>(static_cast<uwide<T>>(a) - static_cast<uwide<T>>(b)); }
template <typename T> static inline T wmul(T a, T b) { return static_cast<T>(static_cast<uwide<T>>(a) * static_cast<uwide<T>>(b)); }
template <typename T> static inline T wneg(T a) { return static_cast<T>(uwide<T>(0) - static_cast<uwide<T>>(a)); }
template <typename T> static inline T wabs(T a) { return a < 0 ? wneg(a) : a; }
// eager's powi: square-and-multiply in the type; a negative exponent gives 1, +-1 or 0
template <typename T> static inline T ipow(T a, T b) {
    if (std::is_signed_v<T> && b < 0) return a == 1 ? T(1) : (a == T(-1) ? ((b & 1) ? T(-1) : T(1)) : T(0));
    uwide<T> r = 1, x = static_cast<uwide<T>>(a);
    for (uwide<T> e = static_cast<uwide<T>>(b); e != 0; e >>= 1) { if (e & 1) r *= x; x *= x; }
    return static_cast<T>(r);
}
// eager's shifts: a shift by the width or more (or negative) gives 0 / the sign fill
template <typename T> static inline T ishl(T a, T b) {
    if (b < 0 || static_cast<int64_t>(b) >= static_cast<int64_t>(sizeof(T) * 8)) return T(0);
    return static_cast<T>(static_cast<uwide<T>>(a) << b);
}
template <typename T> static inline T ishr(T a, T b) {
    constexpr int64_t w = sizeof(T) * 8;
    if (b < 0 || static_cast<int64_t>(b) >= w - (std::is_signed_v<T> ? 1 : 0))
        return std::is_signed_v<T> ? static_cast<T>(a < 0 ? -1 : 0) : T(0);
    return static_cast<T>(a >> b);
}
// errors eager raises from inside an op, which a kernel cannot raise: a zero integer divisor
// (eager: RuntimeError("ZeroDivisionError"); x86 traps and SIGFPE kills the process) and an
// index outside its dim (eager: IndexError; a kernel would read or write outside the buffer).
// The kernel sets a bit of this flag and goes on safely (0 for the quotient, index 0), and the
// caller raises after the kernel (runtime/build.py). MIN / -1 wraps, as eager's does.
static int kernel_error = 0;
constexpr int ZERO_DIV = 1, INDEX_OOB = 2;
template <typename T> static inline bool div_ok(T b) {
    if (b == 0) { __atomic_fetch_or(&kernel_error, ZERO_DIV, __ATOMIC_RELAXED); return false; }
    return true;
}
// a gathered/scattered index already wrapped (i < 0: i + n): in [0, n), or flagged and 0
[[gnu::cold, gnu::noinline]] static void flag_index_oob() {
    __atomic_fetch_or(&kernel_error, INDEX_OOB, __ATOMIC_RELAXED);
}
static inline int64_t bound(int64_t i, int64_t n) {
    if (__builtin_expect(static_cast<uint64_t>(i) >= static_cast<uint64_t>(n), 0)) {
        flag_index_oob();
        return 0;
    }
    return i;
}
template <typename T> static inline T itruncdiv(T a, T b) {
    if (!div_ok(b)) return T(0);
    return (std::is_signed_v<T> && b == T(-1)) ? wneg(a) : static_cast<T>(a / b);
}
template <typename T> static inline T imod(T a, T b) {      // C's %: eager's fmod
    if (!div_ok(b)) return T(0);
    return (std::is_signed_v<T> && b == T(-1)) ? T(0) : static_cast<T>(a % b);
}
template <typename T> static inline T ifloordiv(T a, T b) {
    T q = itruncdiv(a, b);
    return (b != 0 && imod(a, b) != 0 && ((a < 0) != (b < 0))) ? static_cast<T>(q - 1) : q;
}
template <typename T> static inline T iremainder(T a, T b) {
    T r = imod(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? static_cast<T>(r + b) : r;
}

// a*b + c in one rounding where the target has FMA (-march=native): the polynomials below
// are then shorter and more accurate. Only inside these functions: generated code keeps
// -ffp-contract=off, so eager's separately rounded multiplies and adds are reproduced.
static inline float fmadd(float a, float b, float c) {
#ifdef __FMA__
    return std::fma(a, b, c);
#else
    return a * b + c;
#endif
}

// ---- vectorizable float math ----
// x - z ln2 in two steps (Cephes' split of ln2) and P(r) with exp(r) = 1 + r + r^2 P(r) on
// |r| <= ln2 / 2 (Cephes' coefficients): shared by exp and expm1
static inline float exp_reduce(float x, float z) {
    return fmadd(z, 2.12194440e-4f, fmadd(z, -0.693359375f, x));
}
static inline float exp_poly(float r) {
    float p = 1.9875691500E-4f;
    p = fmadd(p, r, 1.3981999507E-3f);
    p = fmadd(p, r, 8.3334519073E-3f);
    p = fmadd(p, r, 4.1665795894E-2f);
    p = fmadd(p, r, 1.6666665459E-1f);
    return fmadd(p, r, 5.0000001201E-1f);
}
// expm1's range reduction x = z ln2 + r and expm1(r) = r + r^2 P(r); the caller clamps x, so
// z stays in [-150, 128]
static inline float expm1_reduced(float x, float& z) {
    z = std::nearbyint(x * 1.44269504088896341f);
    float r = exp_reduce(x, z);
    return fmadd(exp_poly(r), r * r, r);
}

static inline float exp(float x) {
    // z = round(x / ln2) by adding 1.5*2^23 + 254 (t's low mantissa bits then hold w = z + 254),
    // exp(r) on |r| <= ln2/2 as one degree-7 Horner chain (Cephes' coefficients), and 2^z as
    // two factors 2^(z>>1) * 2^(z - (z>>1)) so that results down to the denormals come out
    // (their exponent fields are (w>>1) << 23 and (w << 23) minus that: four integer ops, no
    // clamp of z). Beyond [-104, 88.7] two selects give 0 and inf; NaN stays NaN through r.
    // 30 loop instructions where the clamped form took 38: 0.48x -> 0.69x eager (MKL) in cache (#23)
    float t = fmadd(x, 1.44269504088896341f, 12583166.0f);
    float z = t - 12583166.0f;
    float r = exp_reduce(x, z);
    float p = fmadd(fmadd(exp_poly(r), r, 1.0f), r, 1.0f);
    uint32_t tb; std::memcpy(&tb, &t, 4);
    uint32_t b1 = (tb >> 1) << 23, b2 = (tb << 23) - b1;
    float s1, s2; std::memcpy(&s1, &b1, 4); std::memcpy(&s2, &b2, 4);
    float y = (p * s1) * s2;
    y = x > 88.72283935546875f ? std::numeric_limits<float>::infinity() : y;
    return x < -104.0f ? 0.0f : y;
}
static inline double exp(double x) { return std::exp(x); }

static inline float log(float x) {
    // branch-free and call-free so that g++ vectorizes it (a libm call in a select, even one
    // taken only for zero/denormals/negatives, made every loop using log scalar). x = 2^e m
    // with m in [sqrt(1/2), sqrt(2)) straight from the bits (subtracting sqrt(1/2)'s bits moves
    // the exponent step there: no select on m); denormals are scaled by k = 2^23 first, and
    // subtracting k's bits takes the 23 off e in the same integer op
    float k = x < 1.17549435e-38f ? 8388608.0f : 1.0f;
    float xs = x * k;
    int32_t ix, ik; std::memcpy(&ix, &xs, 4); std::memcpy(&ik, &k, 4);
    ix = ix - ik + (0x3f800000 - 0x3f3504f3);
    int32_t mb = (ix & 0x007fffff) + 0x3f3504f3;
    float m; std::memcpy(&m, &mb, 4);
    m -= 1.0f;
    float fe = static_cast<float>(ix >> 23);
    float z = m * m;
    float y = 7.0376836292E-2f;
    y = fmadd(y, m, -1.1514610310E-1f);
    y = fmadd(y, m, 1.1676998740E-1f);
    y = fmadd(y, m, -1.2420140846E-1f);
    y = fmadd(y, m, 1.4249322787E-1f);
    y = fmadd(y, m, -1.6668057665E-1f);
    y = fmadd(y, m, 2.0000714765E-1f);
    y = fmadd(y, m, -2.4999993993E-1f);
    y = fmadd(y, m, 3.3333331174E-1f);
    y = y * m * z;
    y = fmadd(fe, -2.12194440e-4f, y);
    y = fmadd(-0.5f, z, y);
    float r = fmadd(fe, 0.693359375f, m + y);
    r = x == std::numeric_limits<float>::infinity() ? x : r;
    r = x == 0.0f ? -std::numeric_limits<float>::infinity() : r;
    return x >= 0.0f ? r : std::numeric_limits<float>::quiet_NaN();   // negative, NaN
}
static inline double log(double x) { return std::log(x); }

static inline float erf(float x) {
    float c = std::min(std::max(x, -4.0f), 4.0f);
    float x2 = c * c;
    float p = -2.72614225801306e-10f;
    p = fmadd(p, x2, 2.77068142495902e-08f);
    p = fmadd(p, x2, -2.10102402082508e-06f);
    p = fmadd(p, x2, -5.69250639462346e-05f);
    p = fmadd(p, x2, -7.34990630326855e-04f);
    p = fmadd(p, x2, -2.95459980854025e-03f);
    p = fmadd(p, x2, -1.60960333262415e-02f);
    p = p * c;
    float q = -1.45660718464996e-05f;
    q = fmadd(q, x2, -2.13374055278905e-04f);
    q = fmadd(q, x2, -1.68282697438203e-03f);
    q = fmadd(q, x2, -7.37332916720468e-03f);
    q = fmadd(q, x2, -1.42647390514189e-02f);
    float r = p / q;
    return x != x ? x : r;
}
static inline double erf(double x) { return std::erf(x); }

static inline float tanh(float x) {
    float c = std::min(std::max(x, -7.90531110763549805f), 7.90531110763549805f);
    float x2 = c * c;
    float p = -2.76076847742355e-16f;
    p = fmadd(p, x2, 2.00018790482477e-13f);
    p = fmadd(p, x2, -8.60467152213735e-11f);
    p = fmadd(p, x2, 5.12229709037114e-08f);
    p = fmadd(p, x2, 1.48572235717979e-05f);
    p = fmadd(p, x2, 6.37261928875436e-04f);
    p = fmadd(p, x2, 4.89352455891786e-03f);
    p = p * c;
    float q = 1.19825839466702e-06f;
    q = fmadd(q, x2, 1.18534705686654e-04f);
    q = fmadd(q, x2, 2.26843463243900e-03f);
    q = fmadd(q, x2, 4.89352518554385e-03f);
    float r = p / q;
    r = std::fabs(x) < 0.0004f ? x : r;
    return x != x ? x : r;
}
static inline double tanh(double x) { return std::tanh(x); }

static inline float sigmoid(float x) { return 1.0f / (1.0f + ember::exp(-x)); }
static inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
static inline float expm1(float x) {
    // expm1(x) = 2^z expm1(r) + (2^z - 1), expm1(r) never formed as exp(r) - 1: exact where
    // z = 0 (|x| < ln2 / 2, the cancellation range), and call-free so simd loops over it
    // vectorize (a std::expm1 in a select made every ELU/SELU loop scalar). s = 2^(z-1),
    // doubled at the end, so z = 128 (x up to 88.72) needs no special case; x < -87 gives -1.
    float z;
    float e = expm1_reduced(std::min(std::max(x, -87.0f), 88.72283935546875f), z);
    int32_t b = (static_cast<int32_t>(z) - 1 + 127) << 23;
    float s; std::memcpy(&s, &b, 4);
    float y = 2.0f * fmadd(s, e, s - 0.5f);
    y = x > 88.72283935546875f ? std::numeric_limits<float>::infinity() : y;
    y = x == 0.0f ? x : y;          // keeps -0
    return x != x ? x : y;
}
static inline double expm1(double x) { return std::expm1(x); }
static inline float log1p(float x) {
    // log(u) * x / (u - 1) with u = 1 + x rounded: the factor corrects log's argument for the
    // rounding of 1 + x (Goldberg 1991); vectorizes through ember::log, unlike std::log1p
    float u = 1.0f + x, d = u - 1.0f;
    float r = ember::log(u) * (x / (d == 0.0f ? 1.0f : d));
    r = d == 0.0f ? x : r;
    r = x == std::numeric_limits<float>::infinity() ? x : r;
    return x != x ? x : r;
}
static inline double log1p(double x) { return std::log1p(x); }
template <typename T> static inline T exp(T x) { return std::exp(x); }
template <typename T> static inline T log(T x) { return std::log(x); }

}  // namespace ember

extern "C" int ember_take_error() {
    return __atomic_exchange_n(&ember::kernel_error, 0, __ATOMIC_RELAXED);
}

#pragma omp declare reduction(emax : float : omp_out = ember::max_nan(omp_out, omp_in)) initializer(omp_priv = -std::numeric_limits<float>::infinity())
#pragma omp declare reduction(emin : float : omp_out = ember::min_nan(omp_out, omp_in)) initializer(omp_priv = std::numeric_limits<float>::infinity())
#pragma omp declare reduction(emax : double : omp_out = ember::max_nan(omp_out, omp_in)) initializer(omp_priv = -std::numeric_limits<double>::infinity())
#pragma omp declare reduction(emin : double : omp_out = ember::min_nan(omp_out, omp_in)) initializer(omp_priv = std::numeric_limits<double>::infinity())
"""


#: The fp16/bf16 operands of a staged simd loop (cpp_loops.stage_chunks): a chunk of n contiguous
#: values converted to / from a float array before / after the loop. Appended to PRELUDE only in a
#: translation unit that uses them (<immintrin.h> adds ~0.2 s of g++ time to a TU).
STAGED = r"""
#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
namespace ember {
// With F16C (and AVX512F) vcvtph2ps / vcvtps2ph convert 8 (16) lanes an instruction, where the
// integer sequences of half_to_float / float_to_half take ~10 (~20) vector ops per 8 lanes; the
// hardware conversions are bit-exact with them (round to nearest even, denormals, nan payloads
// kept and quieted). A chunk is stored 16 floats at a time as its simdlen(16) loop reads it:
// a load that is narrower or wider than the store before it is not forwarded from the store
// buffer (8-lane stores read by 16-lane loads made the staged gelu 1.7x slower).
static inline void load_half(const ember_half* s, float* d, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i))));
#elif defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
#endif
    #pragma omp simd simdlen(16)
    for (int64_t j = i; j < n; ++j) d[j] = half_to_float(s[j]);
}
static inline void store_half(const float* s, ember_half* d, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    #pragma omp simd simdlen(16)
    for (int64_t j = i; j < n; ++j) d[j] = float_to_half(s[j]);
}
// bf16 <-> float is a shift (and a rounding add): the plain loops vectorize, but g++ writes
// their floats 8 at a time (the 16-bit side fills a 32-byte vector), which the 16-lane loop
// then cannot read from the store buffer (bf16 LayerNorm ran 0.55x eager): 16 at a time here
static inline void load_bf16(const ember_bf16* s, float* d, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(d + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i))), 16)));
#endif
    #pragma omp simd simdlen(16)
    for (int64_t j = i; j < n; ++j) d[j] = bf16_to_float(s[j]);
}
static inline void store_bf16(const float* s, ember_bf16* d, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512BF16__) && defined(__AVX512DQ__)
    // vcvtneps2bf16 rounds to nearest even like float_to_bf16 but treats denormal inputs as 0
    // and keeps nan payloads: a vector holding either goes the integer way from there on
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(s + i);
        if (_mm512_fpclass_ps_mask(x, 0xa1))          // qnan | denormal | snan
            break;
        __m256bh h = _mm512_cvtneps_pbh(x);
        std::memcpy(d + i, &h, 32);
    }
#endif
#if defined(__AVX512F__)
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff);
    const __m512i qnan = _mm512_set1_epi32(0x7fc0);
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(s + i);
        __m512i b = _mm512_castps_si512(x);
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b, half),
                                      _mm512_and_si512(_mm512_srli_epi32(b, 16), one)), 16);
        r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), qnan);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), _mm512_cvtepi32_epi16(r));
    }
#endif
    #pragma omp simd simdlen(16)
    for (int64_t j = i; j < n; ++j) d[j] = float_to_bf16(s[j]);
}
// a chunk of a float output larger than most of the cache that no kernel of the graph reads
// (cpp.STREAM_MIN): the 64-byte-aligned part stored non-temporally, which skips each line's
// read-for-ownership (a third of a pointwise kernel's traffic). The stores are weakly ordered:
// the kernel ends with stream_fence (its calling thread), and OpenMP's other threads reach the
// region's closing barrier through locked instructions, which drain write-combining buffers
// too (Intel SDM vol. 3 11.3.1, AMD APM vol. 2 7.4). Not a fence a chunk: one every 1 KB
// waited on memory each time (4096 x 768 in C: 1.27 ms plain, 0.83 streamed, 1.88 with it).
static inline void store_stream(const float* s, float* d, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i < n && (reinterpret_cast<uintptr_t>(d + i) & 63); ++i) d[i] = s[i];
    for (; i + 16 <= n; i += 16) _mm512_stream_ps(d + i, _mm512_loadu_ps(s + i));
#endif
    for (; i < n; ++i) d[i] = s[i];
}
static inline void stream_fence() {
#if defined(__AVX512F__)
    _mm_sfence();
#endif
}
}
"""


#: The row tiles of a column reduction (cpp_column_reduction.py _row_tiles): nj columns of ni contiguous values
#: each, copied transposed into a tile. Appended to PRELUDE only in a translation unit that
#: uses it (<immintrin.h>). A full 16 x 16 float tile is transposed in zmm registers (the scalar
#: copy's 256 strided stores made the transposed sum 2-4x slower: benchmarks/tstride_micro.py,
#: design 068); the shuffle sequence is the usual 4-stage one (unpack, shuffle_ps,
#: 2x shuffle_f32x4).
TRANSPOSE = r"""
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
namespace ember {
// dst[i * ds + j] = src[j * ss + i] for j < nj, i < ni
template <typename T>
static inline void transpose_tile(const T* src, int64_t ss, T* dst, int64_t ds, int64_t nj,
                                  int64_t ni) {
    for (int64_t j = 0; j < nj; ++j)
        for (int64_t i = 0; i < ni; ++i) dst[i * ds + j] = src[j * ss + i];
}
#if defined(__AVX512F__)
// the 16 x 16 transpose of r in place (r[i] = row i of the tile on entry, column i on exit)
static inline void transpose16(__m512* r) {
    __m512 t[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {
        r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int i = 0; i < 4; ++i) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0x88);
        t[4 + i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0xDD);
        t[8 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0x88);
        t[12 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0xDD);
    }
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
        r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xDD);
        r[4 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0x88);
        r[12 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0xDD);
    }
}
// one tile of up to 16 x 16 values of 32 or fewer bits, in 16 zmm registers: load(p, m) gives
// the 16 lanes of a source row (lanes not in m zero), store(p, m, v) writes the lanes in m of a
// destination row. A ragged tile (nj or ni < 16: the edge of a row or of a block of positions)
// goes the same way with masked loads and stores (they do not touch the masked-out memory).
template <typename T, typename Load, typename Store>
static inline void transpose16_tile(const T* src, int64_t ss, T* dst, int64_t ds, int64_t nj,
                                    int64_t ni, Load load, Store store) {
    if (nj > 16 || ni > 16 || nj <= 0 || ni <= 0) {
        transpose_tile<T>(src, ss, dst, ds, nj, ni);
        return;
    }
    const __mmask16 mi = static_cast<__mmask16>((1u << ni) - 1u);
    const __mmask16 mj = static_cast<__mmask16>((1u << nj) - 1u);
    __m512 r[16];
    for (int i = 0; i < 16; ++i) r[i] = i < nj ? load(src + i * ss, mi) : _mm512_setzero_ps();
    transpose16(r);
    for (int i = 0; i < ni; ++i) store(dst + i * ds, mj, r[i]);
}
static inline void transpose_tile(const float* src, int64_t ss, float* dst, int64_t ds,
                                  int64_t nj, int64_t ni) {
    transpose16_tile(src, ss, dst, ds, nj, ni,
                     [](const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); },
                     [](float* p, __mmask16 m, __m512 v) {
                         if (m == 0xffff) _mm512_storeu_ps(p, v);
                         else _mm512_mask_storeu_ps(p, m, v);
                     });
}
// float64: each 8 x 8 piece in zmm registers (pairs by unpack, then two rounds of 128-bit lane
// shuffles), masked the same way
static inline void transpose8(const double* src, int64_t ss, double* dst, int64_t ds,
                              int64_t nj, int64_t ni) {
    const __mmask8 mi = static_cast<__mmask8>((1u << ni) - 1u);
    const __mmask8 mj = static_cast<__mmask8>((1u << nj) - 1u);
    __m512d r[8], t[8];
    for (int i = 0; i < 8; ++i)
        r[i] = i < nj ? _mm512_maskz_loadu_pd(mi, src + i * ss) : _mm512_setzero_pd();
    for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm512_unpacklo_pd(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_pd(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i)
        for (int k = 0; k < 2; ++k) {
            r[4 * i + 2 * k] = _mm512_shuffle_f64x2(t[4 * i + k], t[4 * i + k + 2], 0x88);
            r[4 * i + 2 * k + 1] = _mm512_shuffle_f64x2(t[4 * i + k], t[4 * i + k + 2], 0xDD);
        }
    // r[0]: columns 0 and 4 of rows 0-3, r[1]: 2 and 6, r[2]: 1 and 5, r[3]: 3 and 7
    static const int col[4][2] = {{0, 4}, {2, 6}, {1, 5}, {3, 7}};
    for (int k = 0; k < 4; ++k) {
        t[col[k][0]] = _mm512_shuffle_f64x2(r[k], r[4 + k], 0x88);
        t[col[k][1]] = _mm512_shuffle_f64x2(r[k], r[4 + k], 0xDD);
    }
    for (int i = 0; i < ni; ++i) _mm512_mask_storeu_pd(dst + i * ds, mj, t[i]);
}
static inline void transpose_tile(const double* src, int64_t ss, double* dst, int64_t ds,
                                  int64_t nj, int64_t ni) {
    if (nj > 16 || ni > 16 || nj <= 0 || ni <= 0) {
        transpose_tile<double>(src, ss, dst, ds, nj, ni);
        return;
    }
    for (int64_t j = 0; j < nj; j += 8)
        for (int64_t i = 0; i < ni; i += 8)
            transpose8(src + j * ss + i, ss, dst + i * ds + j, ds, std::min<int64_t>(8, nj - j),
                       std::min<int64_t>(8, ni - i));
}
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
// 16-bit values (bf16, fp16) as their bits: widened to 32-bit lanes, transposed by the float
// form's shuffles, narrowed back (exact: only bits move)
static inline void transpose_tile(const uint16_t* src, int64_t ss, uint16_t* dst, int64_t ds,
                                  int64_t nj, int64_t ni) {
    transpose16_tile(src, ss, dst, ds, nj, ni,
                     [](const uint16_t* p, __mmask16 m) {
                         return _mm512_castsi512_ps(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)));
                     },
                     [](uint16_t* p, __mmask16 m, __m512 v) {
                         _mm256_mask_storeu_epi16(p, m, _mm512_cvtepi32_epi16(_mm512_castps_si512(v)));
                     });
}
static inline void transpose_tile(const ember_half* src, int64_t ss, ember_half* dst,
                                  int64_t ds, int64_t nj, int64_t ni) {
    transpose_tile(reinterpret_cast<const uint16_t*>(src), ss, reinterpret_cast<uint16_t*>(dst),
                   ds, nj, ni);
}
#endif
}
"""
