"""fp16 loads and stores (cpp_prelude's half_to_float / float_to_half): bit-exact with torch's
conversions over every fp16 value and over float values of every kind (nan payloads, overflow,
rounding ties, denormals), and vectorizable: no scalar conversion instruction or libgcc call in
the loops (g++ 12 vectorizes no _Float16 conversion; fp16 kernels ran 5-30x slower than eager).
The chunk conversions of staged simd loops (cpp_prelude.STAGED: F16C / AVX512 instructions
where the target has them) are bit-exact with those, and compiled fp16/bf16 kernels take them."""
import ctypes
import re
import subprocess

import pytest
import torch

from ember.codegen.cpp_prelude import PRELUDE, STAGED
from ember.runtime.build import FLAGS, LIBS

SRC = PRELUDE + """
extern "C" void to_float(const ember_half* a, float* out, int64_t n) {
    #pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = ember::half_to_float(a[i]);
}
extern "C" void to_half(const float* a, ember_half* out, int64_t n) {
    #pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = ember::float_to_half(a[i]);
}
"""


def _build(tmp_path_factory, name, src):
    """(the loaded library built from `src` with the kernels' flags, its disassembly, g++'s
    report of the loops it vectorized)."""
    d = tmp_path_factory.mktemp(name)
    (d / "k.cpp").write_text(src)
    report = subprocess.run(["g++", *FLAGS, "-fopt-info-vec-optimized", str(d / "k.cpp"), "-o",
                             str(d / "k.so"), *LIBS], check=True, capture_output=True, text=True)
    asm = subprocess.run(["objdump", "-d", str(d / "k.so")], capture_output=True, text=True).stdout
    return ctypes.CDLL(str(d / "k.so")), asm, report.stderr


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return _build(tmp_path_factory, "half", SRC)


def _run(fn, x, dtype):
    out = torch.empty(x.shape, dtype=dtype)
    fn(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(out.data_ptr()), ctypes.c_int64(x.numel()))
    return out


def test_every_half_value_converts_as_torch(lib):
    every = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16)
    got = _run(lib[0].to_float, every, torch.float32)
    assert torch.equal(got.view(torch.int32), every.float().view(torch.int32))


def test_float_values_round_to_half_as_torch(lib):
    g = torch.Generator().manual_seed(0)
    edges = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), -float("nan"),
                          65504.0, 65519.99, 65520.0, 1e5, 3.4e38, 6.1035156e-05, 6.1e-05,
                          5.9604645e-08, 2.9802322e-08, 2.9802326e-08, 1e-45, 1.0009766, 1.0004883,
                          1.0014648, 2049.0, 2051.0])
    any_bits = torch.randint(-2**31, 2**31, (1 << 21,), generator=g, dtype=torch.int64)
    x = torch.cat([edges, -edges, any_bits.to(torch.int32).view(torch.float32),
                   torch.randn(1 << 18, generator=g) * 1e4, torch.randn(1 << 18, generator=g) * 1e-6,
                   torch.linspace(-70000, 70000, 1 << 18)])
    got = _run(lib[0].to_half, x, torch.float16)
    want = x.half()
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_conversions_vectorize(lib):
    """g++ vectorizes both loops and calls no scalar conversion. The vector width is the cost
    model's choice for the target (zmm on Sapphire Rapids; 8-byte vectors on Zen 4 with g++ 12,
    which reads it as znver3), so it is not asserted."""
    asm, report = lib[1], lib[2]
    for fn in ("to_float", "to_half"):
        body = asm[asm.index(f"<{fn}>:"):]
        body = body[:body.index("\n\n")]
        assert "vcvtsh2ss" not in body and "vcvtss2sh" not in body and "hf2" not in body, fn
        line = 1 + SRC[:SRC.index(f"void {fn}(")].count("\n") + 2     # the loop's line
        assert re.search(rf"k\.cpp:{line}:\d+: optimized: loop vectorized", report), (fn, report)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("also_computed", [False, True])
def test_a_value_rounded_for_a_store_converts_once(tmp_path, monkeypatch, dtype, also_computed):
    """A cast to fp16/bf16 whose value is only stored is converted once, by the store (round to
    half and back, then to half again was three conversions a value); a rounded value that is
    also computed with keeps its rounding there. Bits equal eager's either way."""
    import ember
    monkeypatch.setenv("EMBER_DEBUG_DIR", str(tmp_path / "dump"))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))     # compiled, not loaded

    def f(x):
        y = (x.float() * 1.7).to(dtype)
        return (y, y.float() * 3.0) if also_computed else y
    x = torch.randn(4, 1000).to(dtype)
    got, want = ember.compile(f)(x), f(x)
    for g, w in zip(*(o if also_computed else (o,) for o in (got, want))):
        bits = (lambda t: t.view(torch.int16) if t.dtype == dtype else t)
        assert torch.equal(bits(g), bits(w))
    src = "".join(p.read_text() for p in (tmp_path / "dump").rglob("*kernels.cpp"))
    kernels = src[src.index('extern "C" void'):]
    fn = "half" if dtype == torch.float16 else "bf16"
    # (converted in the loop, or a chunk at a time after it: a staged loop, cpp_loops.py)
    assert kernels.count(f"ember::float_to_{fn}(") + kernels.count(f"ember::store_{fn}(") == 1, \
        kernels
    assert kernels.count(f"ember::round_{fn}(") == int(also_computed), kernels


STAGED_SRC = PRELUDE + STAGED + """
extern "C" void ld_half(const ember_half* a, float* out, int64_t n) { ember::load_half(a, out, n); }
extern "C" void st_half(const float* a, ember_half* out, int64_t n) { ember::store_half(a, out, n); }
extern "C" void ld_bf16(const ember_bf16* a, float* out, int64_t n) { ember::load_bf16(a, out, n); }
extern "C" void st_bf16(const float* a, ember_bf16* out, int64_t n) { ember::store_bf16(a, out, n); }
extern "C" void rnd_half(const float* a, float* out, int64_t n) {
    #pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = ember::round_half(a[i]);
}
extern "C" void trip_half(const float* a, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = ember::half_to_float(ember::float_to_half(a[i]));
}
extern "C" void st_half_scalar(const float* a, ember_half* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = ember::float_to_half(a[i]);
}
extern "C" void st_bf16_scalar(const float* a, ember_bf16* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = ember::float_to_bf16(a[i]);
}
"""


def _target_defines() -> str:
    """The predefined macros of g++ with the kernels' flags (-march=native: F16C, AVX512...)."""
    return subprocess.run(["g++", *FLAGS, "-dM", "-E", "-x", "c++", "/dev/null"],
                          capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    return _build(tmp_path_factory, "staged", STAGED_SRC)


def _floats():
    g = torch.Generator().manual_seed(1)
    edges = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), -float("nan"),
                          65504.0, 65519.99, 65520.0, 3.4e38, 3.3961776e38, 1e-40, -1e-40,
                          1.1754942e-38, 5.9604645e-08, 2.9802322e-08, 1e-45, 1.0009766,
                          1.0004883, 1.00390625, 1.005859375, 2049.0, 2051.0])
    any_bits = torch.randint(-2**31, 2**31, (1 << 20,), generator=g, dtype=torch.int64)
    return torch.cat([edges, -edges, any_bits.to(torch.int32).view(torch.float32),
                      torch.randn(1 << 16, generator=g) * 1e3, torch.randn(1 << 16, generator=g) * 1e-39])


def _every(dtype):
    return torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)


def _assert_bits(got, exact, want):
    """`got` is `exact` (ember's in-loop conversion) bit for bit, and torch's `want` bit for bit
    where that is not nan (torch's nan bits differ between its own conversion paths)."""
    ints = {2: torch.int16, 4: torch.int32}[got.element_size()]
    assert torch.equal(got.view(ints), exact.view(ints))
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got[~nan].view(ints), want[~nan].view(ints))


@pytest.mark.parametrize("dtype,name", [(torch.float16, "half"), (torch.bfloat16, "bf16")])
@pytest.mark.parametrize("n", [None, 1, 15, 16, 37, 255])    # None: all of them (tails: n % 16)
def test_staged_conversions_match_torch_bits(staged, dtype, name, n):
    """Every fp16/bf16 value loads as torch converts it; floats of every kind (nan payloads,
    overflow, ties, denormals: vcvtneps2bf16 would flush them) store as the in-loop conversion
    (float_to_bf16: nan -> 0x7fc0) and as torch's values."""
    every, x = _every(dtype), _floats()
    every, x = (every, x) if n is None else (every[7:7 + n], x[3:3 + n])
    got = _run(getattr(staged[0], f"ld_{name}"), every, torch.float32)
    assert torch.equal(got.view(torch.int32), every.float().view(torch.int32))
    _assert_bits(_run(getattr(staged[0], f"st_{name}"), x, dtype),
                 _run(getattr(staged[0], f"st_{name}_scalar"), x, dtype), x.to(dtype))


def test_round_half_matches_torch_bits(staged):
    """round_half (a value cast to fp16 and computed with in float) is float(half(x)) bit for bit
    (the prelude's comment: checked over all 2^32 floats once)."""
    every = _every(torch.float16).float()
    x = torch.cat([_floats(), every, every.nextafter(torch.tensor(float("inf"))),
                   every.nextafter(torch.tensor(float("-inf")))])
    _assert_bits(_run(staged[0].rnd_half, x, torch.float32),
                 _run(staged[0].trip_half, x, torch.float32), x.half().float())


def test_staged_conversions_use_the_hardware_conversions(staged):
    """With F16C / AVX512F / AVX512-BF16 in the target, the chunk conversions are vcvtph2ps,
    vcvtps2ph and vcvtneps2bf16 on 8 or 16 lanes (not the integer sequences)."""
    defines, asm = _target_defines(), staged[1]

    def body(fn):
        b = asm[asm.index(f"<{fn}>:"):]
        return b[:b.index("\n\n")]
    if "__F16C__" not in defines:
        pytest.skip("the kernels' target has no F16C")
    wide = "zmm" if "__AVX512F__" in defines else "ymm"
    assert re.search(rf"vcvtph2ps\s.*{wide}", body("ld_half")), body("ld_half")
    assert re.search(rf"vcvtps2ph\s.*{wide}", body("st_half")), body("st_half")
    if "__AVX512BF16__" in defines and "__AVX512DQ__" in defines:
        assert "vcvtneps2bf16" in body("st_bf16")


LOWP_CASES = {
    "gelu": (lambda x, y, w: torch.nn.functional.gelu(x), None),
    "add_relu": (lambda x, y, w: torch.relu(x + y), 0),
    "silu_mul": (lambda x, y, w: torch.nn.functional.silu(x) * y, None),
    "layer_norm": (lambda x, y, w: torch.nn.functional.layer_norm(x, x.shape[-1:], w, w), None),
    "softmax": (lambda x, y, w: torch.softmax(x, -1), None),
    "rmsnorm": (lambda x, y, w: w * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, True)
                                                             + 1e-6)).to(x.dtype), None),
    "transposed_add": (lambda x, y, w: x.transpose(0, 1) + 1, 0),      # strided: in the loop
    "pad_last": (lambda x, y, w: torch.nn.functional.pad(x, (3, 5)) * 2, 0),   # masked loads
    "sum_all": (lambda x, y, w: x.sum(), None),     # a parallel reduction loop, staged
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case,shape", [(c, (4, 37, 300)) for c in LOWP_CASES] + [
    (c, (2, 8, 4096)) for c in ("gelu", "layer_norm", "softmax", "sum_all")])
def test_lowp_kernels_match_eager(tmp_path, monkeypatch, dtype, case, shape):
    """fp16/bf16 pointwise, norm and softmax kernels (staged loops, rows not a multiple of the
    16 lanes or of the chunk, flat loops split over threads) against eager: within the
    low-precision tolerance of tests/unit/lower/helpers.check (2e-2), exact where the math is
    one rounding of a float result (`tol` 0); the loops stage their operands."""
    import ember
    monkeypatch.setenv("EMBER_DEBUG_DIR", str(tmp_path / "dump"))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    fn, tol = LOWP_CASES[case]
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(shape, generator=g).to(dtype) for _ in range(2))
    w = torch.randn(shape[-1], generator=g).to(dtype)
    got, want = ember.compile(fn, options={"speed_check": False})(x, y, w), fn(x, y, w)
    assert got.dtype == want.dtype and got.shape == want.shape
    if tol == 0:
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    src = "".join(p.read_text() for p in (tmp_path / "dump").rglob("*kernels.cpp"))
    fn_name = "half" if dtype == torch.float16 else "bf16"
    if case != "transposed_add":       # (its load strides along the loop: converted in it)
        assert f"ember::load_{fn_name}(" in src, src
    if case == "gelu" and dtype == torch.float16 and "__F16C__" in _target_defines():
        so = [p for p in (tmp_path / "cache").rglob("*.so") if "ember::load_half(" in
              p.with_suffix(".cpp").read_text()]
        asm = subprocess.run(["objdump", "-d", str(so[0])], capture_output=True, text=True).stdout
        assert "vcvtph2ps" in asm and "vcvtps2ph" in asm
