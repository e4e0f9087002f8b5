"""Strided rows staged through transposed tiles (cpp_row_staging.py, design 077): a row kernel
whose input is contiguous along the outer positions and strided along the row (LayerNorm over
the channels of NCHW, ConvNeXt's LayerNorm2d, forward statistics and backward) walks the
positions in blocks of 16 and reads the rows from a tile; a layout conversion's tile (a
pointwise NCHW -> NHWC store) reads its transposed input from a tile. Values and gradients
against eager at ragged and odd sizes."""
import re

import pytest
import torch

import ember


from .test_cpp_row_tiles import _kernels, dirs  # noqa: F401 (dirs: a fixture)


class LN2d(torch.nn.Module):
    def __init__(self, c, dtype=torch.float32):
        super().__init__()
        self.ln = torch.nn.LayerNorm(c, dtype=dtype)
        with torch.no_grad():
            self.ln.weight.uniform_(0.5, 1.5)
            self.ln.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.ln(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _pair(c, dtype=torch.float32):
    ref = LN2d(c, dtype)
    got = LN2d(c, dtype)
    got.load_state_dict(ref.state_dict())
    return ref, ember.compile(got, dynamic=False, options={"speed_check": False})


def _train(ref, got, x, grad):
    outs = []
    for m in (ref, got):
        xi = x.detach().clone().requires_grad_(True)
        y = m(xi)
        y.backward(grad)
        outs.append((y, xi.grad, m.ln.weight.grad, m.ln.bias.grad))
    return outs


# [N, C, H, W]: C = 16 over 7 x 9 positions (the brief's [2, 7, 9, 16] output, a ragged last
# block of 15), C not a multiple of 16 (40, 24), 5 x 7 positions (the last outer dim < 16: the
# statistics stay row kernels, staged over the flat 35), and a power-of-two plane
@pytest.mark.parametrize("shape", [(2, 16, 7, 9), (2, 40, 5, 7), (3, 24, 8, 8), (2, 64, 16, 16)])
def test_layernorm_over_channels_train(dirs, shape):
    torch.manual_seed(0)
    ref, got = _pair(shape[1])
    # the gradient in the output's own (NHWC) layout: the backward traced for it (an NCHW one
    # gets a backward compiled for NCHW, all in one layout: docs/design/086-tangent-layouts.md)
    x, grad = torch.randn(shape), torch.randn(shape).to(memory_format=torch.channels_last)
    (y0, gx0, gw0, gb0), (y1, gx1, gw1, gb1) = _train(ref, got, x, grad)
    torch.testing.assert_close(y1, y0, atol=1e-5, rtol=1e-5)
    assert y1.stride() == y0.stride()
    torch.testing.assert_close(gx1, gx0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gw1, gw0, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(gb1, gb0, atol=1e-4, rtol=1e-5)
    fw = _kernels(dirs, "*[0-9]_kernels.cpp")
    bw = _kernels(dirs, "*backward_kernels.cpp")
    # forward: the normalize's NCHW -> NHWC store reads its input from a transposed tile
    assert "ember::transpose_tile(" in fw, fw
    # backward: the row sums over C (strided by H*W in the saved input) are staged rows where
    # W < 16 (the column form needs >= 16; at 16 x 16 they are columns over transposed tiles);
    # dx, stored NCHW as x (086), is a layout conversion reading transposed tiles
    assert "ember::transpose_tile(" in bw, bw
    assert ("qb0_lo" in bw) == (shape[3] < 16), bw


def test_layernorm_over_channels_grad_from_channels_last_tangent(dirs):
    # the tangent arriving channels-last (a conv's input gradient) as the output's own layout
    torch.manual_seed(1)
    ref, got = _pair(40)
    x = torch.randn(2, 40, 6, 11)
    grad = torch.randn(2, 6, 11, 40).permute(0, 3, 1, 2)
    (y0, gx0, gw0, gb0), (y1, gx1, gw1, gb1) = _train(ref, got, x, grad)
    for a, b in ((y1, y0), (gx1, gx0), (gw1, gw0), (gb1, gb0)):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-5)


def test_statistics_rows_staged_in_inference(dirs):
    # 14 x 14 positions: the last outer dim (14) is too short for the column form, so the
    # statistics are a row kernel reading C at stride 196; staged over the flat 196 positions
    torch.manual_seed(2)
    ref, got = _pair(48)
    x = torch.randn(2, 48, 14, 14)
    with torch.no_grad():
        torch.testing.assert_close(got(x), ref(x), atol=1e-5, rtol=1e-5)
    k = _kernels(dirs)
    assert "const int64_t v1 = (qb0_lo + pr1) / 14;" in k, k
    # one staged tile, read by the statistics pass and by the normalize pass
    assert k.count("ember::transpose_tile(") == 1, k
    assert len(re.findall(r"tile\d+\[pr\d+ \* 64 \+ v3\]", k)) == 2, k


def test_float64_and_permute_copy_exact(dirs):
    torch.manual_seed(3)
    ref, got = _pair(24, torch.float64)
    x = torch.randn(2, 24, 5, 9, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(got(x), ref(x))
    assert "double tile" in _kernels(dirs)
    # a plain transposed copy (ragged 32 x 32 tiles) is exact
    x = torch.randn(3, 37, 11, 13)
    f = ember.compile(lambda t: t.permute(0, 2, 3, 1).contiguous() + 1,
                      options={"speed_check": False})
    assert torch.equal(f(x), x.permute(0, 2, 3, 1).contiguous() + 1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_rows_staged_as_bits(dirs, dtype):
    # bf16 / fp16 rows are staged as 16-bit tiles (transpose_tile's 16-bit register form), each
    # element converted to float where the row reads it; values as eager's within its rounding
    torch.manual_seed(4)
    ref, got = _pair(32, dtype)
    x = torch.randn(2, 32, 6, 6, dtype=dtype)
    with torch.no_grad():
        torch.testing.assert_close(got(x).float(), ref(x).float(), atol=2e-2, rtol=2e-2)
    k = _kernels(dirs)
    assert f"{'ember_bf16' if dtype == torch.bfloat16 else 'ember_half'} tile" in k, k
