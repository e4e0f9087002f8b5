"""ember::transpose_tile's register forms (cpp_prelude.TRANSPOSE: float32 16 x 16, float64 in
8 x 8 pieces, 16-bit values widened into the float shuffles) against the plain copy: every tile
shape 1..16 x 1..16 (and the generic form beyond 16), between strided rows, bit for bit, and
nothing written outside the tile."""
import ctypes
import subprocess

import pytest
import torch

from ember.codegen.cpp_prelude import PRELUDE, TRANSPOSE
from ember.runtime.build import FLAGS

TYPES = {torch.float32: "float", torch.float64: "double", torch.bfloat16: "ember_bf16",
         torch.float16: "ember_half"}
SRC = PRELUDE + TRANSPOSE + "".join(f"""
extern "C" void t_{c}(const {c}* s, int64_t ss, {c}* d, int64_t ds, int64_t nj, int64_t ni) {{
    ember::transpose_tile(s, ss, d, ds, nj, ni);
}}""" for c in TYPES.values())


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    d = tmp_path_factory.mktemp("transpose")
    (d / "t.cpp").write_text(SRC)
    subprocess.run(["g++", *FLAGS, str(d / "t.cpp"), "-o", str(d / "t.so")], check=True)
    return ctypes.CDLL(str(d / "t.so"))


@pytest.mark.parametrize("dtype", list(TYPES))
def test_every_tile_shape_bit_exact(lib, dtype):
    fn = getattr(lib, f"t_{TYPES[dtype]}")
    ss, ds = 37, 29          # row strides longer than any tile, not multiples of 16
    # bit patterns of every kind (nan payloads, denormals, -0) move unchanged
    src = torch.randint(-2**15, 2**15, (20 * ss * torch.finfo(dtype).bits // 16,),
                        dtype=torch.int16).view(dtype)[:20 * ss]
    for nj in range(1, 21):
        for ni in range(1, 21):
            dst = torch.full((20 * ds,), 7, dtype=dtype)
            fn(ctypes.c_void_p(src.data_ptr()), ctypes.c_int64(ss), ctypes.c_void_p(dst.data_ptr()),
               ctypes.c_int64(ds), ctypes.c_int64(nj), ctypes.c_int64(ni))
            want = torch.full((20 * ds,), 7, dtype=dtype)
            want.view(20, ds)[:ni, :nj] = src.view(20, ss)[:nj, :ni].t()
            bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
            assert torch.equal(dst.view(bits), want.view(bits)), (nj, ni)
