"""Layout conversions with staged transposed loads (cpp_row_staging.py staged_tile_loads /
stage_tile_loads, designs 077 and 080): a tiled pointwise kernel copies each load that is
contiguous along the tile's outer dim and strided along the simd dim into a small tile
(ember::transpose_tile, 16 x 16 register transposes), and the simd loop reads the tile. Values
against eager at ragged and odd sizes; loads that must stay in place (masked, gathered) are not
staged."""
import pytest
import torch

import ember
from tests.unit.codegen.test_cpp_row_tiles import _kernels, dirs  # noqa: F401 - fixture


def _compiled(fn):
    return ember.compile(fn, dynamic=False, options={"speed_check": False})


def head_sum(x):
    # DeBERTa's backward: a bmm output [4 * 8, 64, 512] summed over the 4 copies of a
    # broadcast weight, stored [512, 8, 64]: four transposed streams 1 MB apart
    return x.view(4, 8, 64, x.shape[-1]).sum(0).permute(2, 0, 1).contiguous()


@pytest.mark.parametrize("n", [512, 100, 37])
def test_head_sum_stages_each_transposed_stream(dirs, n):
    x = torch.randn(32, 64, n)
    torch.testing.assert_close(_compiled(head_sum)(x), head_sum(x), atol=1e-5, rtol=1e-5)
    assert _kernels(dirs).count("alignas(64) float tile") == 4


# NCHW <-> NHWC at sizes whose tiles are ragged (29 x 31 planes, 37 and 3 channels)
@pytest.mark.parametrize("shape", [(2, 37, 29, 31), (3, 64, 7, 33), (1, 40, 40, 3)])
@pytest.mark.parametrize("to_cl", [True, False])
def test_layout_conversions(dirs, shape, to_cl):
    x = torch.randn(*shape)
    if to_cl:
        fn = lambda t: t.contiguous(memory_format=torch.channels_last) * 2
    else:
        x = x.contiguous(memory_format=torch.channels_last)
        fn = lambda t: t.contiguous() * 2
    got = _compiled(fn)(x)
    torch.testing.assert_close(got, fn(x))
    assert got.stride() == fn(x).stride()


def test_staged_and_plain_loads_mix(dirs):
    # x read transposed (staged), y along the store (in place), z broadcast along the simd dim
    x, y, z = torch.randn(3, 96, 70), torch.randn(3, 70, 96), torch.randn(3, 70, 1)

    def f(x, y, z):
        return x.transpose(1, 2) * y + z.exp()
    torch.testing.assert_close(_compiled(f)(x, y, z), f(x, y, z))
    k = _kernels(dirs)
    assert k.count("alignas(64) float tile") == 1, k


def test_float64_exact_masked_and_negative_strides_stay_in_place(dirs):
    # float64 (staged through transpose_tile's generic form since the merge with design 077:
    # values exact); a transposed read under a pad's mask and a flipped transposed read: no
    # float tile, values exact
    xd = torch.randn(2, 64, 48, dtype=torch.float64)
    fd = lambda t: t.transpose(1, 2).contiguous() + 1
    torch.testing.assert_close(_compiled(fd)(xd), fd(xd))
    x = torch.randn(2, 64, 48)
    fp = lambda t: torch.nn.functional.pad(t, (0, 0, 3, 5)).transpose(1, 2).contiguous()
    torch.testing.assert_close(_compiled(fp)(x), fp(x))
    ff = lambda t: t.flip(-1).transpose(1, 2).contiguous()
    torch.testing.assert_close(_compiled(ff)(x), ff(x))
    assert "float tile" not in _kernels(dirs)


def test_grads_through_transposed_sum(dirs):
    # the sum's gradient flows back through bmm; eager's own float32 error vs float64 is
    # ~5e-5 here (sums of 64-256 products), hence the tolerance
    torch.manual_seed(0)
    fn = lambda x, w: head_sum(torch.bmm(x, w.repeat(4, 1, 1))).tanh()
    leaves = [torch.randn(32, 64, 64).requires_grad_(), torch.randn(8, 64, 100).requires_grad_()]
    ref_out = fn(*leaves)
    g_out = torch.randn_like(ref_out)
    ref = torch.autograd.grad(ref_out, leaves, g_out)
    out = _compiled(fn)(*leaves)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    for g, r in zip(torch.autograd.grad(out, leaves, g_out), ref):
        torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-4)
    assert "ember::transpose_tile(" in _kernels(dirs)


def _with_nan_payloads(x):
    # a signaling NaN and NaNs with payloads, as bits: a copy must move them unchanged
    bits = x.view(torch.int16).flatten()
    nans = [0x7c01, 0x7e05, -0x03ff] if x.dtype == torch.float16 else [0x7f81, 0x7fc5, -0x007f]
    bits[:len(nans)] = torch.tensor(nans, dtype=torch.int16)
    return x


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 37, 29, 31), (1, 40, 40, 3)])
@pytest.mark.parametrize("to_cl", [True, False])
def test_16bit_layout_conversions_move_bits(dirs, dtype, shape, to_cl):
    # 16-bit tiles (transpose_tile's 16-bit register form), and the simd loop copies the bits:
    # no float round trip (which quieted fp16 signaling NaNs and set every bf16 NaN to 0x7fc0)
    x = torch.randn(*shape).to(dtype)
    if to_cl:
        fn = lambda t: t.contiguous(memory_format=torch.channels_last)
    else:
        x = x.contiguous(memory_format=torch.channels_last)
        fn = lambda t: t.contiguous()
    x = _with_nan_payloads(x)
    got, want = _compiled(fn)(x), fn(x)
    assert got.stride() == want.stride()
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    k = _kernels(dirs)
    assert f"{'ember_half' if dtype == torch.float16 else 'ember_bf16'} tile" in k, k
    assert "_to_float(" not in k.split('extern "C" void kernel')[-1], k


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_strided_copies_move_bits_and_arithmetic_converts(dirs, dtype):
    # a strided read stored unchanged moves bits; a scaled copy converts and rounds as eager does
    x = _with_nan_payloads(torch.randn(4, 3, 66).to(dtype))
    step = lambda t: t[..., ::2].contiguous()
    got, want = _compiled(step)(x), step(x)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    x = torch.randn(2, 48, 40).to(dtype)
    scaled = lambda t: t.transpose(1, 2).contiguous() * 3
    torch.testing.assert_close(_compiled(scaled)(x), scaled(x), atol=0, rtol=0)
