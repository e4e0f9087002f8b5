"""Complex values in a graph: kernels are written for real dtypes (C++ codegen raised
KeyError torch.complex64 on any complex buffer). Complex math is rewritten to real pairs before
lowering (decomp/complex.py, tests/unit/decomp/test_complex_pairs.py); what stays complex (FFT)
runs as aten externs and the real ops around it still become kernels."""
import torch

from tests.unit.lower.helpers import check


def test_complex_add_and_real_kernels():
    a, b = torch.randn(4, dtype=torch.complex64), torch.randn(4, dtype=torch.complex64)
    c = torch.randn(3)
    stats = check(lambda a, b, c: (a + b, (a * b).abs() + 1, c * 2 + 1), a, b, c)
    assert stats["kernels"] >= 1, stats


def test_rope_through_view_as_complex():
    x, f = torch.randn(2, 8, 16), torch.polar(torch.ones(8, 8), torch.randn(8, 8))

    def rope(x, f):
        xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * f).flatten(-2).relu() + 1
    assert check(rope, x, f)["kernels"] >= 1


def test_fft_round_trip():
    check(lambda x: torch.fft.irfft(torch.fft.rfft(x) * 2, n=16) + x, torch.randn(4, 16),
          atol=1e-4, rtol=1e-4)
