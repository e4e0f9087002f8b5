"""libm functions ember has no polynomial for (sin, cos, tan, atan2, pow, ...) call glibc's
libmvec a vector at a time inside `#pragma omp simd` loops (cpp_prelude's EMBER_LIBMVEC block):
values within 4 ulp of the fp64 answer over their whole range, special values (nan, +-inf, +-0,
huge arguments) exactly as eager, and the loops really call the vector forms."""
import ctypes
import subprocess

import pytest
import torch

from ember.codegen.cpp_prelude import PRELUDE
from ember.runtime.build import FLAGS, LIBS

pytestmark = pytest.mark.skipif(not LIBS, reason="no libmvec on this machine")

UNARY = {"sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "asin": torch.asin,
         "acos": torch.acos, "atan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh,
         "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh, "exp2": torch.exp2,
         "log2": torch.log2, "log10": torch.log10, "erfc": torch.erfc}
BINARY = {"atan2": torch.atan2, "hypot": torch.hypot, "pow": torch.pow}


def _source(t):
    one = "".join(f"""
extern "C" void k_{f}(const {t}* a, {t}* out, int64_t n) {{
    #pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = std::{f}(a[i]);
}}""" for f in UNARY)
    two = "".join(f"""
extern "C" void k_{f}(const {t}* a, const {t}* b, {t}* out, int64_t n) {{
    #pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = std::{f}(a[i], b[i]);
}}""" for f in BINARY)
    return PRELUDE + one + two


@pytest.fixture(scope="module", params=["float", "double"])
def lib(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"libm_{request.param}")
    (d / "k.cpp").write_text(_source(request.param))
    subprocess.run(["g++", *FLAGS, str(d / "k.cpp"), "-o", str(d / "k.so"), *LIBS], check=True)
    asm = subprocess.run(["objdump", "-d", str(d / "k.so")], capture_output=True, text=True).stdout
    dtype = torch.float32 if request.param == "float" else torch.float64
    return ctypes.CDLL(str(d / "k.so")), asm, dtype


def _call(lib, name, *xs):
    out = torch.empty_like(xs[0])
    getattr(lib, name)(*[ctypes.c_void_p(x.data_ptr()) for x in (*xs, out)],
                       ctypes.c_int64(out.numel()))
    return out


def _values(dtype):
    mags = torch.logspace(-40, 38, 40001, dtype=torch.float64)
    special = torch.tensor([0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 1e-45, 1.1754944e-38, 3.4028235e38,
                            float("inf"), float("-inf"), float("nan")], dtype=torch.float64)
    x = torch.cat([mags, -mags, special, torch.randn(8000, dtype=torch.float64) * 4,
                   torch.rand(8000, dtype=torch.float64) * 2 - 1])
    return x.to(dtype)


def _check(got, x_eager, want, dtype):
    """got within 4 ulp of the fp64 answer `want` (denormal results: within 4 ulp of the
    smallest normal); where eager's own result is not finite (overflow, poles, nan) or the
    answer is exactly zero, eager's."""
    eps = torch.finfo(dtype).eps
    tiny = torch.finfo(dtype).tiny
    got, eager = got.double(), x_eager.double()
    special = ~eager.isfinite() | (want == 0)
    same = (got == eager) | (got.isnan() & eager.isnan())
    # eager's double sinh/cosh overflow a little early (e^x / 2 past e^709.78): libmvec's finite
    # answer there is the right one
    huge = torch.finfo(torch.float64).max / 2
    same |= eager.isinf() & (got.abs() >= huge) & (got.sign() == eager.sign())
    assert same[special].all(), (got[special & ~same][:8], eager[special & ~same][:8])
    ok = ~special & want.isfinite()
    err = (got - want).abs()[ok] / want.abs()[ok].clamp_min(tiny)
    assert float(err.max()) <= 4 * eps, float(err.max()) / eps


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_accuracy_and_specials(lib, name):
    so, _, dtype = lib
    x = _values(dtype)
    _check(_call(so, f"k_{name}", x), UNARY[name](x), UNARY[name](x.double()), dtype)


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_accuracy_and_specials(lib, name):
    so, _, dtype = lib
    g = torch.Generator().manual_seed(0)
    x = _values(dtype)
    y = x[torch.randperm(x.numel(), generator=g)]
    if name == "pow":             # bases > 0 over the whole range; any base with small exponents
        x, y = torch.cat([x.abs(), x]), torch.cat([y.clamp(-30, 30), torch.randint(-8, 8, y.shape,
                                                                                  generator=g).to(dtype)])
    _check(_call(so, f"k_{name}", x, y), BINARY[name](x, y), BINARY[name](x.double(), y.double()),
           dtype)


def test_sin_and_cos_of_one_value_stay_vector_calls(tmp_path):
    """g++ merges std::sin(x) and std::cos(x) into one scalar sincos call that no loop
    vectorizes (RoPE's cos/sin cache ran 3.4x slower than eager): ember::sin_/cos_ are not
    merged, call the vector forms, and give the same values as eager."""
    src = PRELUDE + """
extern "C" void k(const float* a, float* s, float* c, int64_t n) {
    #pragma omp simd
    for (int64_t i = 0; i < n; ++i) { s[i] = ember::sin_(a[i]); c[i] = ember::cos_(a[i]); }
}"""
    (tmp_path / "k.cpp").write_text(src)
    subprocess.run(["g++", *FLAGS, str(tmp_path / "k.cpp"), "-o", str(tmp_path / "k.so"), *LIBS],
                   check=True)
    asm = subprocess.run(["objdump", "-d", str(tmp_path / "k.so")], capture_output=True,
                         text=True).stdout
    assert "sincos" not in asm and "v_sinf@plt>" in asm and "v_cosf@plt>" in asm
    x = _values(torch.float32)
    s, c = torch.empty_like(x), torch.empty_like(x)
    ctypes.CDLL(str(tmp_path / "k.so")).k(*[ctypes.c_void_p(t.data_ptr()) for t in (x, s, c)],
                                           ctypes.c_int64(x.numel()))
    _check(s, torch.sin(x), torch.sin(x.double()), torch.float32)
    _check(c, torch.cos(x), torch.cos(x.double()), torch.float32)


def test_loops_call_the_vector_forms(lib):
    _, asm, dtype = lib
    suffix = "f" if dtype == torch.float32 else ""
    for name in (*UNARY, *BINARY):
        assert f"_{name}{suffix}@plt>" in asm and "_ZGV" in asm, name
    scalar_only = [n for n in (*UNARY, *BINARY)
                   if not any(f"v_{n}{suffix}@plt>" in line for line in asm.splitlines())]
    assert scalar_only == [], scalar_only
